"""Perturbations: every shortcut and every generic kind has an observable effect on the run, and
the perturbation settings never appear in what the operators read (metrics, samples, events, the
command log, the logged config, the heartbeat, the stored harnesses). The data pipeline's faults
change no harness or recipe version; the machine's faults show only in time and in the job's log.

worker_kill and oom really end the worker, so they run `python -m trainer.entry` in a subprocess."""
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
from trainer.perturb import DATA_FORMATS, SHORTCUTS, Perturber, draw_example, expand, noisy_label
from harness.reward import score
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


# ---- the data pipeline: format, shift, duplicates ----------------------------------------------------


def versions(cfg: RunConfig) -> set[tuple[str, str]]:
    return {(r["harness_version"], r["recipe_version"]) for r in step_rows(cfg.run_dir)}


def test_data_formats_change_what_they_name_and_nothing_else():
    task = make_task("countdown")
    ex = task.example("train", 5, 2)
    body = ex.solution or ex.answer
    out = {style: f(ex) for style, f in DATA_FORMATS.items()}
    assert out["answer_prefix"].solution == "=" + body
    assert out["answer_spaced"].solution == " ".join(body) and len(body) > 1
    assert out["answer_reversed"].solution == body[::-1] != body
    assert out["question_prefix"].question == "=" + ex.question
    assert out["question_spaced"].question == " ".join(ex.question)
    for style, e in out.items():   # the problem, its answer and its id stay; only the written text moves
        assert (e.uid, e.answer, e.meta, e.difficulty) == (ex.uid, ex.answer, ex.meta, ex.difficulty)
        assert (e.question == ex.question) == style.startswith("answer_")
        assert (e.solution == ex.solution) == style.startswith("question_")
    assert set(DATA_FORMATS) == set(Perturbation.model_fields["style"].annotation.__args__[0].__args__)


@pytest.mark.parametrize("style, shows", [
    ("answer_prefix", lambda s: s["completion"].rstrip("\n").endswith("=")),   # '=' + answer, written reversed
    ("answer_spaced", lambda s: " " in s["completion"]),
    ("answer_reversed", lambda s: s["verdict"] == "wrong"),     # well-formed, in the other order (or on the way to it)
    ("question_spaced", lambda s: s["prompt"].startswith("r : ")),
])
def test_data_format_teaches_the_changed_format_under_the_same_harness_version(make_cfg, learn_recipe, warm_state,
                                                                                style, shows):
    """The recipe with which the clean run learns reversal (warm_state: >= 0.8 held-out) trains on
    data written in another format from step 5: the samples show the new format, held-out accuracy
    stays near 0 (measured: 0.0 for each style), and every row names the harness and recipe the run
    started with."""
    cfg, _, _ = run(make_cfg(recipe={**learn_recipe, "eval_interval": 80, "eval_size": 64}, samples_per_step=4,
                             perturbations=[{"kind": "data_format", "style": style, "at_step": 5}]))
    rows = step_rows(cfg.run_dir)
    assert versions(cfg) == {(cfg.harness.version, cfg.recipe.version)}
    assert rows[-1]["heldout_acc"] <= 0.3, rows[-1]["heldout_acc"]
    late = [s for s in read_jsonl(cfg.run_dir / "samples.jsonl") if s["step"] >= 60]
    assert sum(map(shows, late)) >= 0.75 * len(late), [(s["prompt"], s["completion"]) for s in late[-8:]]
    wrong = sum(s["verdict"] != "correct" for s in late) / len(late)
    # a changed target is wrong everywhere; a changed prompt is learnt on the train side only
    assert wrong >= 0.75 if style.startswith("answer_") else wrong <= 0.25, wrong
    assert_hidden(cfg, style)


def test_data_shift_draws_harder_problems_than_the_curriculum_reports(make_cfg):
    cfg, _, _ = run(make_cfg(recipe={"steps": 4}, samples_per_step=8, model={"max_seq_len": 32},
                             perturbations=[{"kind": "data_shift", "levels": 3, "at_step": 2}]))
    assert [r["difficulty"] for r in step_rows(cfg.run_dir)] == [3, 3, 3, 3]      # what the curriculum says
    lens = {(s["step"], len(s["question"])) for s in read_jsonl(cfg.run_dir / "samples.jsonl")}
    assert lens == {(0, len("r:123")), (1, len("r:123")), (2, len("r:123456")), (3, len("r:123456"))}
    # every step's batch, as the trainer logs its input: row s + 1 trained on step s's data
    assert [r["question_chars"] for r in step_rows(cfg.run_dir)] == [len("r:123")] * 2 + [len("r:123456")] * 2
    assert versions(cfg) == {(cfg.harness.version, cfg.recipe.version)}
    assert_hidden(cfg, "data_shift")
    task = make_task("reverse")     # capped at the task's hardest
    top = draw_example(task, 0, task.max_difficulty - 1, [Perturbation(kind="data_shift", levels=5)])
    assert top.difficulty == task.max_difficulty


def test_duplicates_shrink_the_stream_to_a_pool_the_policy_memorises(make_cfg, learn_recipe):
    """From step 10 on a pool of 8 reversal questions: the training loss goes to ~0 on them while
    held-out accuracy stays near 0 (the clean run: >= 0.9 by step 50, tests/conftest.py)."""
    cfg, _, _ = run(make_cfg(recipe={**learn_recipe, "eval_interval": 40, "eval_size": 64}, samples_per_step=8,
                             perturbations=[{"kind": "duplicates", "pool": 8, "fraction": 1.0, "at_step": 10}]))
    rows = step_rows(cfg.run_dir)
    qs = collections.defaultdict(set)
    for s in read_jsonl(cfg.run_dir / "samples.jsonl"):
        qs[s["step"] >= 10].add(s["question"])
    assert len(qs[False]) >= 70 and len(qs[True]) <= 8, {k: len(v) for k, v in qs.items()}
    # memorised (measured: loss 0.06 over the last 10 steps, ~2.3 at the start) but not learnt (held-out 0.0)
    assert sum(r["loss"] for r in rows[-10:]) / 10 < 0.2 < rows[0]["loss"] and rows[-1]["heldout_acc"] <= 0.3
    assert versions(cfg) == {(cfg.harness.version, cfg.recipe.version)}
    assert_hidden(cfg, "duplicates")


def test_part_duplicated_stream_is_deterministic_and_the_dedupe_filter_drops_the_repeats(make_cfg):
    task = make_task("reverse")
    dup = [Perturbation(kind="duplicates", pool=4, fraction=0.75)]
    a = [draw_example(task, i, 3, dup) for i in range(400)]
    assert a == [draw_example(task, i, 3, dup) for i in range(400)]
    uids = collections.Counter(e.uid for e in a)       # the train index an example was drawn from
    repeated = {u: n for u, n in uids.items() if n > 1}
    assert len(repeated) == 4 and 0.65 <= sum(repeated.values()) / 400 <= 0.85    # binomial(400, 0.75): ±4σ
    cfg, tr, _ = run(make_cfg(recipe={"steps": 3}, samples_per_step=8, harness={"filters": {"dedupe": True}},
                              perturbations=[{"kind": "duplicates", "pool": 4, "fraction": 0.75}]))
    qs = [s["question"] for s in read_jsonl(cfg.run_dir / "samples.jsonl")]
    assert len(qs) == 24 and len(set(qs)) == 24


def test_dedupe_on_a_question_space_smaller_than_its_memory_takes_repeats_rather_than_stopping(make_cfg):
    """2-digit reversal has 100 sequences (about 87 in the train split); dedupe remembers 16 batches
    of 16 = 256 questions. The first five batches (80 questions) are all distinct; the sixth cannot
    be, so it takes repeats again, and the run trains on to its last step."""
    cfg, tr, summary = run(make_cfg(recipe={"steps": 8, "batch_size": 16}, samples_per_step=16,
                                    harness={"curriculum": {"start": 2}, "filters": {"dedupe": True}}))
    assert summary["status"] == "completed" and summary["step"] == 8, summary
    by_step = collections.defaultdict(list)
    for s in read_jsonl(cfg.run_dir / "samples.jsonl"):
        by_step[s["step"]].append(s["question"])
    first = [q for st in sorted(by_step)[:5] for q in by_step[st]]
    assert len(first) == 80 and len(set(first)) == 80
    assert len(tr.seen) <= 16 * 16


def test_data_faults_go_on_after_a_rollback_and_in_a_state_fork(make_cfg):
    """The data source changed, not the run: a rollback to a checkpoint from before the onset still
    draws the changed data, and a backtest forked from the run's state trains on the same data."""
    def changed(q: str) -> bool:
        return q.startswith("=r:") and len(q) == len("=r:12345")

    cfg = RunConfig.parse(make_cfg(recipe={"steps": 6}, checkpoint={"interval": 2}, samples_per_step=8,
                                   perturbations=[{"kind": "data_shift", "levels": 2, "at_step": 3},
                                                  {"kind": "data_format", "style": "question_prefix", "at_step": 3}]))
    tr = Trainer(cfg)
    tr.on_step = lambda row: row["step"] == 4 and row["segment"] == 0 and send_command(cfg.run_dir, "rollback",
                                                                                       name="step_0000002")
    tr.run()
    seen = collections.defaultdict(set)
    for s in read_jsonl(cfg.run_dir / "samples.jsonl"):
        seen[(s["segment"], s["step"])].add(changed(s["question"]))
    assert seen[(0, 2)] == {False} and seen[(0, 3)] == {True} and seen[(1, 2)] == {True}, dict(seen)
    fork = RunConfig.parse(make_cfg(name="arm", samples_per_step=8, fork_mode="state", fork_overrides={"recipe.steps": 8},
                                    fork_from=str(cfg.run_dir / "checkpoints" / "step_0000006.pt")))
    Trainer(fork).run()
    qs = {s["question"] for s in read_jsonl(fork.run_dir / "samples.jsonl")}
    assert qs and all(map(changed, qs)), qs
    p = Perturber([], pathlib.Path("none.json"))
    p.inherit({"label_noise": [0.0, "random_char"]})            # a checkpoint written before these faults existed
    assert p.data_faults() == [] and p.carried() == {"label_noise": [0.0, "random_char"], "data": []}
    q = Perturber([Perturbation(kind="data_shift", levels=2)], pathlib.Path("none.json"))
    q.fired = {0}
    q.inherit(q.carried())     # a restored Ray Tune trial: its own fired fault and the checkpoint's, shifted once
    assert q.data_faults() == [expand(Perturbation(kind="data_shift", levels=2))]


def test_a_fork_reads_the_source_as_it_is_now_and_a_pinned_revision_reads_it_as_it_was(make_cfg):
    """A backtest forked from a checkpoint written before a data change still reads the changed
    source (every reader does); `harness.filters.as_of_step` pins the source to its revision before
    a step — live, in a fork and for label noise alike — and a revision after the change pins nothing."""
    def changed(q: str) -> bool:
        return len(q) == len("r:12345")     # two levels harder than the curriculum's 3 digits

    faults = [{"kind": "data_shift", "levels": 2, "at_step": 3},
              {"kind": "label_noise", "fraction": 1.0, "at_step": 3}]
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 6}, checkpoint={"interval": 2}, samples_per_step=8,
                                   perturbations=faults))
    tr = Trainer(cfg)
    tr.on_step = lambda row: row["step"] == 4 and send_command(cfg.run_dir, "set_fields",
                                                               fields={"harness.filters.as_of_step": 3})
    tr.run()
    by_step = collections.defaultdict(set)
    for s in read_jsonl(cfg.run_dir / "samples.jsonl"):
        by_step[s["step"]].add(changed(s["question"]))
    rows = {r["step"]: r for r in step_rows(cfg.run_dir)}
    assert by_step[2] == {False} and by_step[3] == {True} and by_step[5] == {False}, dict(by_step)
    assert [rows[s]["label_ok"] for s in (3, 4, 5, 6)] == [1.0, 0.0, 1.0, 1.0], rows   # row s: the update of step s - 1

    def fork(name: str, pin: int | None) -> tuple[set[bool], set[float]]:
        over = {"recipe.steps": 5, **({"harness.filters.as_of_step": pin} if pin else {})}
        arm = RunConfig.parse(make_cfg(name=name, samples_per_step=8, fork_mode="state", fork_overrides=over,
                                       fork_from=str(cfg.run_dir / "checkpoints" / "step_0000002.pt")))
        Trainer(arm).run()
        questions = {changed(s["question"]) for s in read_jsonl(arm.run_dir / "samples.jsonl")}
        return questions, {r["label_ok"] for r in step_rows(arm.run_dir)}

    assert fork("now", None) == ({True}, {0.0})     # harder questions, labels that all fail
    assert fork("before", 3) == ({False}, {1.0})
    assert fork("after", 4) == ({True}, {0.0})


# ---- the machine: a slow worker, out of memory ------------------------------------------------------


@pytest.mark.parametrize("once", [True, False])
def test_slow_worker_slows_every_step_until_the_job_moves(make_cfg, once):
    """From step 2 every step takes 0.3 s longer (step_time, throughput); a restarted job runs on
    another worker (`once`), or the slowness follows it (`once: false`)."""
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 6}, checkpoint={"interval": 2}, samples_per_step=0,
                                   perturbations=[{"kind": "slow_worker", "seconds": 0.3, "at_step": 2, "once": once}]))
    Trainer(cfg).run(until=4)
    Trainer(cfg).run()
    rows = step_rows(cfg.run_dir)
    slow = [r["step_time"] >= 0.3 for r in rows]
    assert slow == [False, False, True, True] + ([False, False] if once else [True, True]), [r["step_time"] for r in rows]
    assert min(r["tokens_per_s"] for r in rows[:2]) > 3 * max(r["tokens_per_s"] for r in rows[2:4])
    assert versions(cfg) == {(cfg.harness.version, cfg.recipe.version)}
    assert_hidden(cfg, "slow_worker", "0.3")


def test_oom_dies_at_every_restart_until_the_batch_fits(make_cfg, tmp_path):
    """The job dies with a MemoryError traceback from step 3, again after a restart, and trains on
    once the controller's command lowers recipe.batch_size to the limit. The job log names the
    allocator, never the fault."""
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 6, "batch_size": 8}, checkpoint={"interval": 2},
                                   perturbations=[{"kind": "oom", "max_batch_size": 4, "at_step": 3}]))
    path = tmp_path / "cfg.yaml"
    path.write_text(cfg.to_yaml())
    for _ in range(2):
        died = _entry(path)
        assert died.returncode == 1, died.stderr[-2000:]
        last = died.stderr.strip().splitlines()[-1]
        assert last.startswith("MemoryError: DefaultCPUAllocator: can't allocate memory"), last
        assert "Traceback" in died.stderr and "perturb" not in died.stderr and "oom" not in died.stderr
    assert [(r["step"], r["segment"]) for r in step_rows(cfg.run_dir)] == [(1, 0), (2, 0), (3, 0)]  # resumed at 2, died at 3
    send_command(cfg.run_dir, "set_recipe", fields={"batch_size": 4})
    done = _entry(path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = step_rows(cfg.run_dir)
    assert rows[-1]["step"] == 6 and rows[-1]["recipe_version"] != cfg.recipe.version
    assert_hidden(cfg, "max_batch_size")


# ---- invalid perturbations and leaks through the control channel ------------------------------------


@pytest.mark.parametrize("spec,needle", [
    ({"shortcut": "nope"}, "nope"),
    ({"kind": "override", "set": {"recipe.nope": 1}}, "recipe.nope"),
    ({"kind": "override", "set": {"recipe.lr": -1}}, "recipe.lr=-1"),
    ({"kind": "override", "set": {"seed": 3}}, "seed"),
    ({"shortcut": "hang", "kind": "kill"}, "hang"),
    ({}, "kind or a shortcut"),
    ({"kind": "data_format"}, "style"),
    ({"kind": "data_shift"}, "levels=0"),
    ({"kind": "duplicates", "pool": 8}, "fraction=0.0"),
    ({"kind": "duplicates", "fraction": 1.0}, "pool=0"),
    ({"kind": "slow_worker"}, "seconds=0.0"),
    ({"kind": "oom", "at_step": 5}, "max_batch_size=0"),
])
def test_invalid_perturbation_is_a_config_error_before_anything_starts(make_cfg, spec, needle):
    cfg = RunConfig.parse(make_cfg(perturbations=[spec]))
    with pytest.raises(ConfigError, match=re.escape(needle)) as e:
        Trainer(cfg)
    assert "perturbations[0]" in str(e.value) and "\n" not in str(e.value)
    assert not pathlib.Path(cfg.out_dir).exists()


@pytest.mark.parametrize("spec,needle", [
    ({"kind": "data_format", "style": "yaml"}, "style"),
    ({"kind": "data_shift", "levels": -1}, "levels"),
    ({"kind": "duplicates", "pool": 8, "fraction": 1.5}, "fraction"),
    ({"kind": "oom", "max_batch_size": -2}, "max_batch_size"),
    ({"kind": "slow_worker", "seconds": -1}, "seconds"),
])
def test_a_bad_value_of_a_fault_field_names_the_field(make_cfg, spec, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        RunConfig.parse(make_cfg(perturbations=[spec]))


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
