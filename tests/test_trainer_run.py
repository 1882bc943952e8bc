"""Tiny end-to-end runs of the real trainer: SFT learns (held-out accuracy rises, every trainable
parameter changes), GRPO and distill complete and write every metric the issue lists, samples
every step and a heartbeat, the HF path trains a locally saved random model, and a non-finite
loss is recorded and handled per recipe."""
from __future__ import annotations

import json
import math
import string

import pytest
import torch
import yaml

from trainer.algorithms.core import ADVANTAGES, register_advantage
from trainer.config import RunConfig
from trainer.loop import Trainer
from trainer.runlog import read_heartbeat, read_jsonl
from trainer.tasks.base import Split

GRPO_FIELDS = ("loss", "reward_mean", "reward_std", "pass_rate", "entropy", "kl", "grad_norm", "response_len",
               "truncation_rate", "malformed_rate", "tokens_per_s", "t_generate", "t_logprob", "t_update", "t_data")
SAMPLE_FIELDS = ("prompt", "completion", "reward", "verdict")


def step_rows(run_dir):
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if not r.get("final")]


def warm_trainer(cfg: RunConfig, state) -> Trainer:
    tr = Trainer(cfg)
    tr.policy.model.load_state_dict(state)
    return tr


def test_sft_learns_and_changes_every_parameter(make_cfg, learn_recipe):
    cfg = RunConfig.parse(make_cfg(recipe={**learn_recipe, "eval_interval": 10, "eval_size": 32}))
    tr = Trainer(cfg)
    before = {n: p.detach().clone() for n, p in tr.policy.model.named_parameters() if p.requires_grad}
    summary = tr.run()
    assert summary["status"] == "completed" and summary["step"] == 80
    evals = [r["heldout_acc"] for r in step_rows(cfg.run_dir) if "heldout_acc" in r]
    assert len(evals) == 8
    assert evals[-1] > evals[0], evals
    assert evals[-1] >= 0.8, evals
    unchanged = [n for n, p in tr.policy.model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert not unchanged, f"parameters that never changed: {unchanged}"
    final = read_jsonl(cfg.run_dir / "metrics.jsonl")[-1]
    assert final["final"] is True and final["heldout_acc"] == summary["heldout_acc"]


def test_grpo_writes_every_metric_samples_and_heartbeat(make_cfg, warm_state, monkeypatch):
    import trainer.loop

    monkeypatch.setattr(trainer.loop, "HEARTBEAT_EVERY_S", 0.0)   # every step (the default: at most every 0.5 s)
    # a hot sampling temperature keeps the near-perfect warm policy's groups mixed (reward variance)
    cfg = RunConfig.parse(make_cfg(recipe={"algorithm": "grpo", "steps": 4, "batch_size": 4, "group_size": 8,
                                           "kl_coef": 0.1, "eval_interval": 2, "lr": 3e-3},
                                   harness={"sampling": {"temperature": 2.0}}, samples_per_step=3))
    tr = warm_trainer(cfg, warm_state)
    before = {n: p.detach().clone() for n, p in tr.policy.model.named_parameters()}
    beats = []
    tr.on_step = lambda row: beats.append(read_heartbeat(cfg.run_dir))
    summary = tr.run()
    assert summary["status"] == "completed"
    rows = step_rows(cfg.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        missing = [k for k in GRPO_FIELDS if k not in r]
        assert not missing, f"step {r['step']} lacks {missing}"
        assert all(isinstance(r[k], float) and math.isfinite(r[k]) for k in GRPO_FIELDS)
        assert r["tokens_per_s"] > 0 and r["t_generate"] > 0 and r["t_logprob"] > 0 and r["t_update"] > 0
        assert 0.0 <= r["pass_rate"] <= 1.0 and r["response_len"] > 0
        assert ("heldout_acc" in r) == (r["step"] % 2 == 0)
    # a warm policy: rewards vary, the policy moves, so the KL to the frozen reference turns positive
    assert any(r["reward_std"] > 0 for r in rows)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-7) and rows[-1]["kl"] > 0
    assert any(not torch.equal(p.detach(), before[n]) for n, p in tr.policy.model.named_parameters())
    samples = read_jsonl(cfg.run_dir / "samples.jsonl")
    for step in range(4):
        at = [s for s in samples if s["step"] == step]
        assert len(at) == 3
        for s in at:
            assert all(k in s for k in SAMPLE_FIELDS)
            assert s["prompt"].startswith("r:") and s["verdict"] in ("correct", "wrong", "malformed", "truncated")
    # heartbeat every step while running, final state at the end
    assert [b["step"] for b in beats] == [1, 2, 3, 4] and {b["state"] for b in beats} == {"running"}
    assert read_heartbeat(cfg.run_dir)["state"] == "completed"
    events = [e["event"] for e in read_jsonl(cfg.run_dir / "events.jsonl")]
    assert events[0] == "start" and events[-1] == "end"
    # the resolved config is logged and reproduces the run's config
    logged = RunConfig.parse(yaml.safe_load((cfg.run_dir / "config.yaml").read_text()))
    assert logged == cfg


def test_distill_trains_on_verified_successes(make_cfg, warm_state):
    cfg = RunConfig.parse(make_cfg(recipe={"algorithm": "distill", "steps": 3, "batch_size": 4, "group_size": 4,
                                           "lr": 3e-3}))
    tr = warm_trainer(cfg, warm_state)
    before = {n: p.detach().clone() for n, p in tr.policy.model.named_parameters()}
    assert tr.run()["status"] == "completed"
    rows = step_rows(cfg.run_dir)
    assert len(rows) == 3
    assert all(r["distill_kept"] > 0 and r["loss"] > 0 and r["skipped"] == 0.0 for r in rows)
    # it keeps only verified completions, deduplicated per prompt: never more than the group
    assert all(r["distill_kept"] <= 16 for r in rows)
    assert any(not torch.equal(p.detach(), before[n]) for n, p in tr.policy.model.named_parameters())


def test_distill_with_no_success_makes_no_update(make_cfg):
    cfg = RunConfig.parse(make_cfg(recipe={"algorithm": "distill", "steps": 2, "batch_size": 2, "group_size": 2}))
    tr = Trainer(cfg)  # random init: nothing verifies
    before = {n: p.detach().clone() for n, p in tr.policy.model.named_parameters()}
    tr.run()
    rows = step_rows(cfg.run_dir)
    assert all(r["skipped"] == 1.0 and r["distill_kept"] == 0 for r in rows)
    assert all(torch.equal(p.detach(), before[n]) for n, p in tr.policy.model.named_parameters())


@pytest.mark.parametrize("check", [False, True])
def test_sft_checks_its_labels_and_the_filter_trains_only_on_those_the_task_accepts(make_cfg, check):
    """Every label corrupted (label noise 1.0, off by one): `label_ok` is 0 on every step; with
    filters.check_labels the step has nothing left to learn from and makes no update."""
    cfg = RunConfig.parse(make_cfg(recipe={"algorithm": "sft", "steps": 3, "batch_size": 4},
                                   harness={"filters": {"check_labels": check}},
                                   perturbations=[{"kind": "label_noise", "at_step": 0, "fraction": 1.0,
                                                   "noise": "off_by_one"}]))
    tr = Trainer(cfg)
    before = {n: p.detach().clone() for n, p in tr.policy.model.named_parameters()}
    tr.run()
    rows = step_rows(cfg.run_dir)
    assert [r["label_ok"] for r in rows] == [0.0, 0.0, 0.0]
    same = all(torch.equal(p.detach(), before[n]) for n, p in tr.policy.model.named_parameters())
    assert same is check and all(r["skipped"] == (1.0 if check else 0.0) for r in rows)


def test_labels_are_checked_against_the_answer_worked_out_from_the_question():
    """A record whose stored answer is as wrong as its label (what a corrupt data source writes)
    fails the check: the answer is worked out again from the question. Where the task cannot work
    it out (a question not in its form), the label is not judged."""
    import dataclasses

    from harness.filters import labels_verify
    from harness.spec import HarnessSpec
    from trainer.tasks.base import make_task

    spec = HarnessSpec()
    for name, q, right, wrong in (("addition", "12+30", "42", "43"), ("sort", "s:312", "123", "132"),
                                  ("reverse", "r:312", "213", "231")):
        task = make_task(name)
        ex = task.example(Split.TRAIN, 0, 2)
        ex = dataclasses.replace(ex, question=q, answer=wrong, solution=None)    # the record itself is wrong
        assert labels_verify(task, spec, [ex, ex], [right, wrong]) == [True, False], name
        odd = dataclasses.replace(ex, question="=" + q)
        assert labels_verify(task, spec, [odd], [right]) == [None], name
    task = make_task("countdown")
    ex = task.example(Split.TRAIN, 0, 2)
    assert labels_verify(task, spec, [ex], [ex.solution]) == [True]
    assert labels_verify(task, spec, [dataclasses.replace(ex, meta={"numbers": [], "target": -1})], [ex.solution]) == [True]


def test_sft_labels_of_the_task_all_pass_the_check(make_cfg):
    cfg = RunConfig.parse(make_cfg(recipe={"algorithm": "sft", "steps": 2, "batch_size": 8},
                                   harness={"filters": {"check_labels": True}}))
    Trainer(cfg).run()
    rows = step_rows(cfg.run_dir)
    assert [r["label_ok"] for r in rows] == [1.0, 1.0] and all(r["skipped"] == 0.0 for r in rows)


def test_a_non_finite_loss_on_the_first_step_is_skipped_not_a_crash(make_cfg):
    """Before any backward the parameters have no gradient tensors: a non-finite first loss is
    still one skipped step, and the weights do not move."""
    tr = Trainer(RunConfig.parse(make_cfg(recipe={"steps": 1})))
    before = [p.detach().clone() for p in tr.params]
    out = tr.optimise(torch.tensor(float("nan"), requires_grad=True), {})
    assert out["skipped"] == 1.0 and out["nonfinite"] == 1.0 and not math.isfinite(out["grad_norm"])
    assert all(torch.equal(a, p) for a, p in zip(before, tr.params))


def test_a_batch_smaller_than_the_workers_is_refused_naming_both(make_cfg):
    from trainer.config import ConfigError

    with pytest.raises(ConfigError, match=r"recipe.batch_size=2 is less than num_workers=3"):
        RunConfig.parse(make_cfg(num_workers=3, recipe={"batch_size": 2}))
    RunConfig.parse(make_cfg(num_workers=2, recipe={"batch_size": 2}))


def test_hf_model_sft_and_grpo(make_cfg, tiny_hf_dir):
    base = dict(model={"kind": "hf", "path": str(tiny_hf_dir)}, harness={"answer": {"reverse_digits": False}})
    sft = RunConfig.parse(make_cfg(name="hf_sft", recipe={"steps": 3, "batch_size": 4, "eval_interval": 3,
                                                          "eval_size": 4}, **base))
    tr = Trainer(sft)
    assert tr.policy.is_hf
    before = {n: p.detach().clone() for n, p in tr.policy.model.named_parameters() if p.requires_grad}
    assert tr.run()["status"] == "completed"
    unchanged = [n for n, p in tr.policy.model.named_parameters() if p.requires_grad and torch.equal(p.detach(), before[n])]
    assert not unchanged, unchanged
    rows = step_rows(sft.run_dir)
    assert len(rows) == 3 and rows[-1]["loss"] < rows[0]["loss"] and "heldout_acc" in rows[-1]

    grpo = RunConfig.parse(make_cfg(name="hf_grpo", recipe={"algorithm": "grpo", "steps": 2, "batch_size": 2,
                                                            "group_size": 3, "kl_coef": 0.1}, **base))
    assert Trainer(grpo).run()["status"] == "completed"
    rows = step_rows(grpo.run_dir)
    assert len(rows) == 2 and all(all(k in r for k in GRPO_FIELDS) for r in rows)
    assert len(read_jsonl(grpo.run_dir / "samples.jsonl")) == 2 * 4


# ---- non-finite loss ----------------------------------------------------------------------------

_NAN_CALLS = {"n": 0}


def _nan_on_second_call(rewards):
    """A plug-in estimator that yields NaN advantages once (the 2nd call): a non-finite loss."""
    _NAN_CALLS["n"] += 1
    adv = ADVANTAGES["grpo"](rewards)
    return adv * float("nan") if _NAN_CALLS["n"] == 2 else adv


if "test_nan_once" not in ADVANTAGES:
    register_advantage("test_nan_once")(_nan_on_second_call)


@pytest.mark.parametrize("action", ["skip", "stop"])
def test_nonfinite_loss_is_recorded_and_handled(make_cfg, warm_state, action):
    _NAN_CALLS["n"] = 0
    cfg = RunConfig.parse(make_cfg(recipe={"algorithm": "grpo", "steps": 4, "batch_size": 2, "group_size": 4,
                                           "advantage": "test_nan_once", "on_nonfinite": action}))
    tr = warm_trainer(cfg, warm_state)
    snaps = []
    tr.on_step = lambda row: snaps.append({n: p.detach().clone() for n, p in tr.policy.model.named_parameters()})
    summary = tr.run()
    events = read_jsonl(cfg.run_dir / "events.jsonl")
    bad = [e for e in events if e["event"] == "nonfinite"]
    assert len(bad) == 1 and bad[0]["step"] == 1 and bad[0]["action"] == action
    assert bad[0]["loss"] == "nan"
    rows = step_rows(cfg.run_dir)
    if action == "skip":
        assert summary["status"] == "completed" and summary["step"] == 4
        assert rows[1]["nonfinite"] == 1.0 and rows[1]["skipped"] == 1.0 and rows[1]["loss"] == "nan"
        assert all(r["nonfinite"] == 0.0 for i, r in enumerate(rows) if i != 1)
        # the skipped step did not touch the weights; the next ones did
        assert all(torch.equal(snaps[0][n], snaps[1][n]) for n in snaps[0])
        assert any(not torch.equal(snaps[1][n], snaps[2][n]) for n in snaps[1])
        assert all(bool(torch.isfinite(p.detach()).all()) for p in tr.policy.model.parameters())
    else:
        assert summary["status"] == "stopped_nonfinite" and summary["step"] == 1
        assert [r["step"] for r in rows] == [1]
        assert read_heartbeat(cfg.run_dir)["state"] == "stopped_nonfinite"
        assert [e for e in events if e["event"] == "end"][0]["status"] == "stopped_nonfinite"


def test_nonfinite_weights_stop_an_sft_run(make_cfg):
    """NaN weights (as after a blown-up update) make every loss non-finite; `stop` ends the run."""
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 5, "on_nonfinite": "stop"}))
    tr = Trainer(cfg)

    def poison(row):
        if row["step"] == 2:
            with torch.no_grad():
                tr.policy.model.lm_head.weight[5, 0] = float("inf")

    tr.on_step = poison
    summary = tr.run()
    assert summary["status"] == "stopped_nonfinite" and summary["step"] == 2
    assert json.loads((cfg.run_dir / "heartbeat.json").read_text())["state"] == "stopped_nonfinite"


def test_sft_warmup_then_grpo_with_the_reference_taken_at_the_switch(make_cfg):
    """`recipe.sft_warmup_steps`: SFT first (a GRPO run from scratch never gets reward), then the
    configured algorithm; with a KL term the reference is the warmed-up policy."""
    import torch

    cfg = RunConfig.parse(make_cfg(recipe={"algorithm": "grpo", "sft_warmup_steps": 3, "steps": 5, "batch_size": 4,
                                           "sft_warmup_batch_size": 12, "group_size": 4, "kl_coef": 0.1, "lr": 1e-2}))
    tr = Trainer(cfg)
    sizes = []
    step_examples = tr.next_examples
    tr.next_examples = lambda: sizes.append(len(exs := step_examples())) or exs
    seen = {}
    tr.on_step = lambda row: seen.setdefault(row["step"], (row["algorithm"],
                                                           {k: v.clone() for k, v in tr.policy.model.state_dict().items()}))
    tr.run()
    assert [seen[s][0] for s in range(1, 6)] == ["sft", "sft", "sft", "grpo", "grpo"]
    assert sizes == [12, 12, 12, 4, 4]   # the warm-up has its own batch size
    after_warmup = seen[3][1]
    assert all(torch.equal(after_warmup[k], v) for k, v in tr.ref_state.items())   # the reference = step-3 weights


def test_heartbeat_is_throttled_while_running_and_always_written_on_state_changes(make_cfg, monkeypatch):
    """While running, the heartbeat file is rewritten at most every HEARTBEAT_EVERY_S; the end state
    is written regardless."""
    import trainer.loop

    monkeypatch.setattr(trainer.loop, "HEARTBEAT_EVERY_S", 3600.0)
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 5, "eval_interval": 0}))
    tr = Trainer(cfg)
    beats = []
    tr.on_step = lambda row: beats.append(read_heartbeat(cfg.run_dir))
    tr.run()
    assert [b["step"] for b in beats] == [1] * 5 and {b["state"] for b in beats} == {"running"}
    end = read_heartbeat(cfg.run_dir)
    assert end["state"] == "completed" and end["step"] == 5


def test_a_custom_charset_must_cover_what_the_task_and_harness_write(make_cfg):
    """model.charset: the built-in tokenizer's characters; one the task or harness writes but the
    charset lacks is a config error naming it (it would silently become <unk>)."""
    from trainer.config import ConfigError

    from trainer.policy import Policy

    base = Trainer(RunConfig.parse(make_cfg(name="full", recipe={"steps": 1})))
    text = base.harness.render(base.task.example(Split.TRAIN, 0, 3).question)
    chars = "".join(sorted(set(text) | set(string.digits) | set(base.harness.answer.render("123"))))
    base.close()
    tr = Trainer(RunConfig.parse(make_cfg(name="small", model={"charset": chars}, recipe={"steps": 2})))
    assert tr.policy.tok.vocab_size == 4 + len(chars) < Policy.build(base.cfg.model).tok.vocab_size
    assert tr.run()["step"] == 2
    missing = chars.replace("=", "") if "=" in chars else chars[1:]
    with pytest.raises(ConfigError, match="model.charset lacks"):
        Trainer(RunConfig.parse(make_cfg(name="bad", model={"charset": missing})))
    with pytest.raises(ValueError, match="each once"):
        RunConfig.parse(make_cfg(model={"charset": "00"}))
