"""Perturbations: every shortcut and every generic kind has an observable effect on the run, and
the perturbation settings never appear in what the operators read (metrics, samples, events, the
command log, the logged config, the heartbeat, the stored harnesses).

worker_kill really SIGKILLs the worker, so it runs `python -m trainer.entry` in a subprocess."""
from __future__ import annotations

import collections
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest
import yaml

from trainer.config import ConfigError, Perturbation, RunConfig
from trainer.control import send_command
from trainer.loop import Trainer
from trainer.perturb import SHORTCUTS, expand, noisy_label
from trainer.rollout import score
from trainer.runlog import read_heartbeat, read_jsonl
from trainer.tasks import make_task
from trainer.tasks.base import Verdict

REPO = pathlib.Path(__file__).resolve().parents[1]
OBSERVED = ("metrics.jsonl", "samples.jsonl", "events.jsonl", "command_log.jsonl", "config.yaml", "heartbeat.json")


def step_rows(run_dir):
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if not r.get("final")]


def assert_hidden(cfg: RunConfig, *values: str) -> None:
    """No shortcut name, no word 'perturb', none of `values` in the files operators read; the logged
    config is the run's config without its perturbations."""
    files = [cfg.run_dir / n for n in OBSERVED] + sorted((cfg.run_dir / "harnesses").glob("*.yaml"))
    pattern = re.compile("|".join([rf"\b{re.escape(s)}\b" for s in SHORTCUTS] + ["perturb"]
                                  # a value counts only as a whole token (0.05 must not match 0.0523)
                                  + [rf"(?<![\w.]){re.escape(v)}(?![\w.])" for v in values]))
    for f in files:
        if f.exists():
            text = f.read_text().replace(cfg.out_dir, "<out_dir>")  # the temp path holds the test's name
            if f.name == "config.yaml":  # its schema has a `perturbations` key; it must be empty
                text = text.replace("perturbations: []", "")
            hit = pattern.search(text)
            assert hit is None, f"{f.name} reveals {hit.group(0)!r}"
    logged = RunConfig.parse(yaml.safe_load((cfg.run_dir / "config.yaml").read_text()))
    assert logged == cfg.model_copy(update={"perturbations": []})


def run(cfg_dict, warm=None, **run_kw):
    cfg = RunConfig.parse(cfg_dict)
    tr = Trainer(cfg)
    if warm is not None:
        tr.policy.model.load_state_dict(warm)
    return cfg, tr, tr.run(**run_kw)


CONST = {"schedule": "constant", "warmup_steps": 0}


# ---- overrides ------------------------------------------------------------------------------------


def test_lr_spike(make_cfg):
    cfg, _, _ = run(make_cfg(recipe={**CONST, "steps": 4}, perturbations=[{"shortcut": "lr_spike", "at_step": 2}]))
    assert [r["lr"] for r in step_rows(cfg.run_dir)] == [1e-2, 1e-2, 0.5, 0.5]
    assert_hidden(cfg)


def test_shortcut_fields_can_be_overridden(make_cfg):
    cfg, _, _ = run(make_cfg(recipe={**CONST, "steps": 3},
                             perturbations=[{"shortcut": "lr_spike", "at_step": 1, "set": {"recipe.lr": 2.0}}]))
    assert [r["lr"] for r in step_rows(cfg.run_dir)] == [1e-2, 2.0, 2.0]
    assert_hidden(cfg)


def test_generic_override_of_any_field(make_cfg):
    cfg, _, _ = run(make_cfg(recipe={"steps": 4},
                             perturbations=[{"kind": "override", "at_step": 2,
                                             "set": {"recipe.batch_size": 2, "harness.sampling.max_new_tokens": 3}}]))
    rows = step_rows(cfg.run_dir)
    assert rows[1]["tokens"] > 3 * rows[2]["tokens"]  # 8 → 2 examples per step
    assert rows[1]["response_len"] > 3 and all(r["response_len"] <= 3 for r in rows[2:])
    # the rows name the recipe and harness they trained with: a silent change shows as a new version
    assert rows[0]["recipe_version"] == rows[1]["recipe_version"] != rows[2]["recipe_version"] == rows[3]["recipe_version"]
    assert rows[1]["recipe_version"] == cfg.recipe.version
    assert rows[1]["harness_version"] != rows[2]["harness_version"]
    assert_hidden(cfg)


def test_the_recipe_version_leaves_out_how_long_the_run_goes():
    """A controller sets steps and the early stop from its budget and target: the recipe it knows
    and the one it launched differ there and are the same recipe; any training field is not."""
    from trainer.config import Recipe

    base = Recipe(lr=1e-3, batch_size=16)
    assert base.version == Recipe(lr=1e-3, batch_size=16, steps=5000, stop_at_heldout=0.9).version
    assert base.version != Recipe(lr=1e-3, batch_size=6).version != Recipe(lr=1e-3, batch_size=16, weight_decay=0.1).version


def test_broken_template(make_cfg, warm_state):
    cfg, _, _ = run(make_cfg(recipe={**CONST, "steps": 4, "lr": 1e-5, "eval_interval": 4},
                             perturbations=[{"shortcut": "broken_template", "at_step": 2}]), warm_state)
    rows = step_rows(cfg.run_dir)
    assert rows[0]["harness_version"] == rows[1]["harness_version"] != rows[2]["harness_version"]
    cut = collections.defaultdict(set)
    for s in read_jsonl(cfg.run_dir / "samples.jsonl"):
        assert s["prompt"].endswith("=")
        cut[s["step"]].add(s["prompt"] != s["question"] + "=")
    assert cut[0] == cut[1] == {False} and cut[2] == cut[3] == {True}  # "r:123=" → "r:1="
    # the policy cannot answer a question it no longer sees
    assert rows[1]["pass_rate"] >= 0.75 and rows[3]["pass_rate"] <= 0.25
    assert_hidden(cfg)


def test_too_hard(make_cfg):
    cfg, _, _ = run(make_cfg(recipe={"steps": 3}, perturbations=[{"shortcut": "too_hard", "at_step": 1}]))
    assert [r["difficulty"] for r in step_rows(cfg.run_dir)] == [3, 8, 8]
    lens = {s["step"]: len(s["prompt"]) for s in read_jsonl(cfg.run_dir / "samples.jsonl")}
    assert lens[0] == len("r:123=") and lens[2] == len("r:12345678=")
    assert_hidden(cfg)


def test_low_temperature(make_cfg, learn_recipe):
    """Sampling gets near-greedy: the completions of a group stop varying. (A half-trained policy:
    a random one is too flat, and a fully trained one too sure, for temperature to matter.)"""
    _, half, _ = run(make_cfg(name="half", recipe={**learn_recipe, "steps": 20}, samples_per_step=0))
    cfg, _, _ = run(make_cfg(recipe={"algorithm": "grpo", "steps": 4, "batch_size": 4, "group_size": 8, "lr": 1e-5},
                             samples_per_step=32, perturbations=[{"shortcut": "low_temperature", "at_step": 2}]),
                    half.policy.model.state_dict())
    groups = collections.defaultdict(set)
    for s in read_jsonl(cfg.run_dir / "samples.jsonl"):
        groups[(s["step"], s["uid"])].add(s["completion"])
    distinct = {step: sum(len(g) for (st, _), g in groups.items() if st == step) / 4 for step in range(4)}
    assert min(distinct[0], distinct[1]) >= 4, distinct  # measured: 7.5 of 8
    assert max(distinct[2], distinct[3]) <= 2, distinct  # measured: 1.25
    assert_hidden(cfg, "0.05")


def test_truncation(make_cfg, warm_state):
    cfg, _, _ = run(make_cfg(recipe={"steps": 4, "lr": 1e-5}, perturbations=[{"shortcut": "truncation", "at_step": 2}]),
                    warm_state)
    rows = step_rows(cfg.run_dir)
    assert rows[0]["truncation_rate"] == rows[1]["truncation_rate"] == 0.0
    assert rows[2]["truncation_rate"] == rows[3]["truncation_rate"] == 1.0
    assert all(r["response_len"] <= 2 for r in rows[2:])
    verdicts = {s["verdict"] for s in read_jsonl(cfg.run_dir / "samples.jsonl") if s["step"] >= 2}
    assert verdicts <= {"truncated", "wrong", "malformed"}
    assert_hidden(cfg)


def test_reward_hack_verifier_accepts_permutations_only_in_training():
    task = make_task("addition")
    from harness.spec import HarnessSpec

    h = HarnessSpec(reward={"verifier": "digits_any_order"})
    ex = task.example("train", 0, 3)
    perm = ex.answer[::-1] if ex.answer[::-1] != ex.answer else ex.answer[1:] + ex.answer[0]
    assert sorted(perm) == sorted(ex.answer) and perm != ex.answer
    res, reward = score(task, h, ex, perm + "\n", False, for_training=True)
    assert res.verdict == Verdict.CORRECT and reward == 1.0
    res, reward = score(task, h, ex, perm + "\n", False, for_training=False)
    assert res.verdict == Verdict.WRONG and reward == 0.0
    res, reward = score(task, h, ex, "9" * 7 + "\n", False, for_training=True)
    assert res.verdict != Verdict.CORRECT


@pytest.mark.parametrize("hack", [True, False])
def test_reward_hack_inflates_training_reward_not_heldout(make_cfg, warm_state, hack):
    """The warm policy writes the digits in input order; without `reverse_digits` that answer is a
    permutation of the truth. With reward_hack training counts it correct; held-out eval never does."""
    perturbations = [{"kind": "override", "at_step": 1, "set": {"harness.answer.reverse_digits": False}}]
    if hack:
        perturbations.append({"shortcut": "reward_hack", "at_step": 1})
    cfg, _, _ = run(make_cfg(recipe={"steps": 2, "lr": 1e-5, "eval_interval": 2, "eval_size": 32},
                             perturbations=perturbations), warm_state)
    last = step_rows(cfg.run_dir)[-1]
    assert last["heldout_acc"] <= 0.25
    if hack:
        assert last["pass_rate"] >= 0.75 and last["reward_mean"] >= 0.75
        assert_hidden(cfg, "digits_any_order")
    else:
        assert last["pass_rate"] <= 0.25


def test_label_noise(make_cfg, learn_recipe):
    """Corrupted SFT labels: the same run learns markedly worse (higher loss on its own data)."""
    def tail_loss(perturbations, name):
        cfg, _, _ = run(make_cfg(name=name, recipe=learn_recipe, samples_per_step=0, perturbations=perturbations))
        rows = step_rows(cfg.run_dir)
        return cfg, sum(r["loss"] for r in rows[-10:]) / 10

    _, clean = tail_loss([], "clean")
    cfg, noisy = tail_loss([{"shortcut": "label_noise", "fraction": 1.0}], "noisy")
    assert noisy > clean + 0.3, (clean, noisy)
    assert_hidden(cfg)


def test_noisy_label_is_deterministic_and_changes_one_char():
    labels = [(str(1000 + i), f"uid{i}") for i in range(200)]
    changed = [noisy_label(a, u, 0.4) != a for a, u in labels]
    assert 0.25 < sum(changed) / 200 < 0.55  # fraction by uid hash: binomial(200, 0.4) is within ±4σ
    for (a, u), c in zip(labels, changed):
        out = noisy_label(a, u, 0.4)
        assert out == noisy_label(a, u, 0.4) and len(out) == len(a)
        assert sum(x != y for x, y in zip(a, out)) == (1 if c else 0)
    assert all(noisy_label(a, u, 0.0) == a for a, u in labels)


def test_off_by_one_label_noise_is_systematic():
    labels = [(str(1000 + i), f"uid{i}") for i in range(200)]
    out = [noisy_label(a, u, 0.5, "off_by_one") for a, u in labels]
    # the same uids as random_char noise are corrupted, each by exactly +1
    assert [o != a for o, (a, _) in zip(out, labels)] == [noisy_label(a, u, 0.5) != a for a, u in labels]
    assert all(o == a or int(o) == int(a) + 1 for o, (a, _) in zip(out, labels))
    assert noisy_label("99", "uid3", 1.0, "off_by_one") == "100"
    assert noisy_label("ab", "uid3", 1.0, "off_by_one") != "ab"   # not an integer: one character changed
    with pytest.raises(ValueError, match="noise"):
        Perturbation.model_validate({"kind": "label_noise", "fraction": 0.5, "noise": "gaussian"})


def test_generic_label_noise_kind_from_a_step(make_cfg):
    """Identical runs until the noise starts at step 2, then the losses differ."""
    base = make_cfg(name="a", recipe={"steps": 4})
    ca, _, _ = run(base)
    cb, _, _ = run({**base, "name": "b", "perturbations": [{"kind": "label_noise", "fraction": 1.0, "at_step": 2}]})
    la, lb = [r["loss"] for r in step_rows(ca.run_dir)], [r["loss"] for r in step_rows(cb.run_dir)]
    assert la[:2] == lb[:2] and la[2] != lb[2]
    assert_hidden(cb)


# ---- stall, kill, checkpoint corruption ------------------------------------------------------------


@pytest.mark.parametrize("spec", [{"shortcut": "hang", "seconds": 1.5}, {"kind": "stall", "seconds": 1.5}])
def test_hang_shows_as_a_heartbeat_gap(make_cfg, spec):
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 4}, perturbations=[{**spec, "at_step": 2}]))
    tr = Trainer(cfg)
    worst = {"age": 0.0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            hb = read_heartbeat(cfg.run_dir)
            if hb and hb["state"] == "running":
                worst["age"] = max(worst["age"], time.time() - hb["time"])
            time.sleep(0.05)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    try:
        assert tr.run()["status"] == "completed"
    finally:
        done.set()
        th.join(5)
    assert worst["age"] >= 1.3, worst
    rows = step_rows(cfg.run_dir)
    gaps = [b["time"] - a["time"] for a, b in zip(rows, rows[1:])]
    assert gaps[1] >= 1.5 and max(gaps[0], gaps[2]) < 1.0
    assert_hidden(cfg, "stall")


def _entry(cfg_path: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.entry", str(cfg_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_worker_kill_sigkills_once_and_the_rerun_resumes(make_cfg, tmp_path):
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 5}, checkpoint={"interval": 2},
                                   perturbations=[{"shortcut": "worker_kill", "at_step": 3}]))
    path = tmp_path / "cfg.yaml"
    path.write_text(cfg.to_yaml())
    first = _entry(path)
    assert first.returncode == -9, first.stderr[-2000:]
    assert read_heartbeat(cfg.run_dir)["state"] == "running"  # a killed worker says nothing more
    assert [r["step"] for r in step_rows(cfg.run_dir)] == [1, 2, 3]
    second = _entry(path)
    assert second.returncode == 0, second.stderr[-2000:]
    assert '"status": "completed"' in second.stdout.strip().splitlines()[-1]
    rows = step_rows(cfg.run_dir)
    assert [(r["step"], r["segment"]) for r in rows] == [(1, 0), (2, 0), (3, 0), (3, 1), (4, 1), (5, 1)]
    events = read_jsonl(cfg.run_dir / "events.jsonl")
    assert [e["event"] for e in events if e["event"] in ("start", "resume", "end")] == ["start", "resume", "end"]
    assert_hidden(cfg, "kill")


def test_corrupt_checkpoint(make_cfg):
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 6}, checkpoint={"interval": 2},
                                   perturbations=[{"shortcut": "corrupt_checkpoint", "at_step": 4}]))
    Trainer(cfg).run(until=5)  # step 4's checkpoint is damaged just after it is written
    summary = Trainer(cfg).run()
    assert summary["status"] == "completed" and summary["step"] == 6
    events = read_jsonl(cfg.run_dir / "events.jsonl")
    assert [e["name"] for e in events if e["event"] == "checkpoint_corrupt"] == ["step_0000004"]
    assert [e["step"] for e in events if e["event"] == "resume"] == [2]
    assert_hidden(cfg)


# ---- invalid perturbations and leaks through the control channel ------------------------------------


@pytest.mark.parametrize("spec,needle", [
    ({"shortcut": "nope"}, "nope"),
    ({"kind": "override", "set": {"recipe.nope": 1}}, "recipe.nope"),
    ({"kind": "override", "set": {"recipe.lr": -1}}, "recipe.lr=-1"),
    ({"kind": "override", "set": {"seed": 3}}, "seed"),
    ({"shortcut": "hang", "kind": "kill"}, "hang"),
    ({}, "kind or a shortcut"),
])
def test_invalid_perturbation_is_a_config_error_before_anything_starts(make_cfg, spec, needle):
    cfg = RunConfig.parse(make_cfg(perturbations=[spec]))
    with pytest.raises(ConfigError, match=re.escape(needle)) as e:
        Trainer(cfg)
    assert "perturbations[0]" in str(e.value) and "\n" not in str(e.value)
    assert not pathlib.Path(cfg.out_dir).exists()


def test_expand_fills_shortcut_defaults():
    from trainer.config import Perturbation

    assert expand(Perturbation(shortcut="hang")).seconds == 60.0
    assert expand(Perturbation(shortcut="hang", seconds=2)).seconds == 2
    assert expand(Perturbation(shortcut="reward_hack")).set == {"harness.reward.verifier": "digits_any_order"}
    assert set(SHORTCUTS) == {"lr_spike", "worker_kill", "hang", "broken_template", "label_noise", "too_hard",
                              "low_temperature", "truncation", "reward_hack", "corrupt_checkpoint"}


def test_perturbed_harness_does_not_leak_through_commands_or_resume(make_cfg):
    """An operator's set_recipe after a harness perturbation, and a resume, must not store the
    perturbed harness where operators read harness versions."""
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 4}, checkpoint={"interval": 2},
                                   perturbations=[{"shortcut": "reward_hack", "at_step": 1}]))
    tr = Trainer(cfg)
    tr.on_step = lambda row: row["step"] == 2 and send_command(cfg.run_dir, "set_recipe", fields={"lr": 5e-3})
    tr.run(until=3)
    assert read_jsonl(cfg.run_dir / "command_log.jsonl")[0]["status"] == "applied"
    Trainer(cfg).run()
    assert_hidden(cfg, "digits_any_order")


def test_shortcut_survives_a_config_round_trip():
    """A full dump marks every field as set; the shortcut's own settings must still apply."""
    cfg = RunConfig.parse({"perturbations": [{"shortcut": "truncation", "at_step": 3}]})
    again = RunConfig.parse(cfg.model_dump(mode="json"))
    p = expand(again.perturbations[0])
    assert p.kind == "override" and p.set == {"harness.sampling.max_new_tokens": 2} and p.at_step == 3
