"""Detectors: each fires on a synthetic evidence window built to show its problem and stays quiet on
healthy windows (SFT and GRPO, job running with a fresh heartbeat); and on REAL short trainer runs
(the built-in model on addition, perturbed by trainer/perturb.py) the right detector fires while a
healthy run of the same config stays quiet.

The synthetic windows are hand-built metric rows, shaped like the trainer's (`trainer/loop.py`).
"""
from __future__ import annotations

import dataclasses

import copy
import math
import random

import pytest
import torch

from agents.detection import DETECTORS, THRESHOLDS, Known, Thresholds, run_detectors
from agents.evidence import Evidence, collect

HARNESS = {"template": "{question}=", "answer": {"reverse_digits": True, "stop": "\n"},
           "sampling": {"temperature": 1.0, "max_new_tokens": 6}, "curriculum": {"start": 3}}
KNOWN = Known(eval_difficulty=3, target_threshold=0.95)


def sft_rows(n: int = 60, seed: int = 0) -> list[dict]:
    """A healthy SFT run: loss falls from ~2 to ~0.1, pass rate climbs to 0.93, an eval every 10 steps."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        s = i + 1
        pr = round(min(0.95, 0.1 + i / 45), 2)
        row = {"step": s, "segment": 0, "time": 1000.0 + s, "lr": 3e-3, "difficulty": 3, "harness_version": "aaaa",
               "algorithm": "sft", "loss": 0.05 + 2.0 * math.exp(-i / 15) + rng.uniform(-0.01, 0.01),
               "grad_norm": 0.5 + rng.uniform(0, 0.2), "entropy": 0.3 * math.exp(-i / 20), "reward_mean": pr,
               "reward_std": 0.3, "pass_rate": pr, "malformed_rate": 0.0, "truncation_rate": 0.0, "response_len": 5.0,
               "tokens": 2000.0, "tokens_per_s": 8000 + rng.uniform(-300, 300), "step_time": 0.25}
        if s % 10 == 0:
            row.update(heldout_acc=max(0.0, pr - 0.03), heldout_malformed=0.0, heldout_truncated=0.0, step_time=1.5)
        rows.append(row)
    return rows


def grpo_rows(n: int = 60, seed: int = 0) -> list[dict]:
    """A healthy GRPO run: surrogate loss near 0, KL small and slowly rising, entropy ~0.5, pass rate 0.5 → 0.8."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        s = i + 1
        pr = round(0.5 + 0.3 * i / n, 2)
        row = {"step": s, "segment": 0, "time": 1000.0 + s, "lr": 5e-4, "difficulty": 3, "harness_version": "bbbb",
               "algorithm": "grpo", "loss": rng.uniform(-0.05, 0.05), "grad_norm": 0.3 + rng.uniform(0, 0.1),
               "entropy": 0.6 - 0.1 * i / n + rng.uniform(-0.02, 0.02), "kl": 0.005 + 0.02 * i / n,
               "reward_mean": pr, "reward_std": 0.45, "pass_rate": pr, "malformed_rate": 0.02, "truncation_rate": 0.0,
               "response_len": 6.0, "tokens": 3000.0, "tokens_per_s": 4000 + rng.uniform(-100, 100), "step_time": 0.8}
        if s % 10 == 0:
            row.update(heldout_acc=pr + 0.05, heldout_malformed=0.0, heldout_truncated=0.0, step_time=2.0)
        rows.append(row)
    return rows


def samples(rows: list[dict], group: int = 1, prompt: str = "123+456=", completion: str = "975\n") -> list[dict]:
    """Sampled rollouts for the last 4 steps: 4 per step, `group` completions per prompt (distinct digits)."""
    out = []
    for r in rows[-4:]:
        for k in range(4):
            uid = f"u{r['step']}-{k // group}"
            comp = completion if group == 1 else f"{k % 10}{completion}"
            out.append({"step": r["step"] - 1, "segment": 0, "uid": uid, "prompt": prompt, "completion": comp,
                        "reward": 1.0, "verdict": "correct", "truncated": False})
    return out


def make_ev(rows: list[dict], smp: list[dict] | None = None, **kw) -> Evidence:
    data = {"run_dir": "/nonexistent", "job_status": "RUNNING", "step": rows[-1]["step"] if rows else 0,
            "metrics": rows, "evals": [r for r in rows if "heldout_acc" in r],
            "samples": samples(rows) if smp is None else smp, "events": [{"event": "start", "step": 0}],
            "heartbeat_age_s": 0.5, "heartbeat_state": "running", "harness": HARNESS}
    data.update(kw)
    return Evidence(**data)


def healthy_sft() -> Evidence:
    return make_ev(sft_rows())


def healthy_grpo() -> Evidence:
    rows = grpo_rows()
    return make_ev(rows, samples(rows, group=4))


def names(ev: Evidence, known: Known = KNOWN) -> set[str]:
    return {d.name for d in run_detectors(ev, known=known)}


# ---- healthy windows are quiet ------------------------------------------------------------------


@pytest.mark.parametrize("build", [healthy_sft, healthy_grpo], ids=["sft", "grpo"])
def test_healthy_windows_are_quiet(build):
    ev = build()
    assert run_detectors(ev, known=KNOWN) == []
    assert run_detectors(ev) == []          # without the controller's knowledge too


def test_job_states_that_are_fine_are_quiet():
    rows = sft_rows()
    for kw in ({"job_status": "PENDING", "heartbeat_age_s": None, "heartbeat_state": None},
               {"job_status": "SUCCEEDED", "heartbeat_age_s": 500.0, "heartbeat_state": "completed",
                "events": [{"event": "end", "step": 60}]},
               {"job_status": "RUNNING", "heartbeat_age_s": 0.1, "heartbeat_state": "paused"},
               {"job_status": "RUNNING", "heartbeat_age_s": 20.0}):
        assert names(make_ev(rows, **kw)) == set(), kw


def test_registry_and_thresholds():
    assert len(DETECTORS) == 35
    for name, fn in DETECTORS.items():
        assert fn.__doc__ and len(fn.__doc__) > 40, f"{name} needs a docstring saying what it looks at and why"
    with pytest.raises(ValueError, match="spike_z"):
        Thresholds(spike_z=-1)
    with pytest.raises(ValueError, match="input_share"):
        Thresholds(input_share=0.1)          # not above input_share_before
    with pytest.raises(ValueError, match="input_slowdown"):
        Thresholds(input_slowdown=0.9)
    with pytest.raises(ValueError, match="unknown detector"):
        run_detectors(healthy_sft(), names=["nope"])


# ---- each detector fires on its problem ---------------------------------------------------------


def fired(ev: Evidence, name: str, known: Known = KNOWN, th: Thresholds = THRESHOLDS):
    d = DETECTORS[name](ev, th, known)
    assert d is not None, f"{name} did not fire"
    assert d.name == name and d.summary and d.evidence
    return d


def test_nonfinite_loss():
    rows = sft_rows()
    for r in rows[-3:]:
        r.update(loss=float("nan"), grad_norm=float("nan"), nonfinite=1.0, skipped=1.0)
    d = fired(make_ev(rows), "nonfinite_loss")
    assert d.severity == "critical" and d.evidence["onset_step"] == 58
    one = sft_rows()
    one[-10].update(loss=float("nan"), nonfinite=1.0, skipped=1.0)  # one skipped step, then fine
    assert DETECTORS["nonfinite_loss"](make_ev(one), THRESHOLDS, KNOWN) is None


def test_loss_spike_reports_onset_and_lr_jump():
    rows = sft_rows()
    for r in rows[49:]:
        r.update(loss=3.0 + random.Random(r["step"]).uniform(0, 0.5), lr=0.5)
    d = fired(make_ev(rows), "loss_spike")
    assert d.evidence["onset_step"] == 50
    assert d.evidence["lr_before"] == pytest.approx(3e-3) and d.evidence["lr_now"] == 0.5
    assert d.evidence["z"] >= THRESHOLDS.spike_z and d.evidence["threshold_z"] == THRESHOLDS.spike_z


def test_loss_spike_ignores_recovered_spikes_curriculum_steps_and_grpo():
    rows = sft_rows()
    rows[50]["loss"] = 3.0  # one bad batch, then back on track
    assert DETECTORS["loss_spike"](make_ev(rows), THRESHOLDS, KNOWN) is None
    rows = sft_rows()
    for r in rows[45:]:
        r.update(difficulty=4, loss=r["loss"] + 1.0)  # harder problems cost more loss: not a spike
    assert DETECTORS["loss_spike"](make_ev(rows), THRESHOLDS, Known(eval_difficulty=4)) is None
    rows = grpo_rows()
    for r in rows[50:]:
        r["loss"] = 5.0
    assert DETECTORS["loss_spike"](make_ev(rows), THRESHOLDS, KNOWN) is None


def test_grad_norm_explosion():
    rows = sft_rows()
    for r in rows[50:]:
        r["grad_norm"] = 40.0 + r["step"]
    d = fired(make_ev(rows), "grad_norm_explosion")
    assert d.evidence["onset_step"] == 51 and d.evidence["baseline_median"] < 1


def test_grad_norm_after_zero_gradients_is_no_explosion():
    rows = grpo_rows()
    for r in rows:
        r["grad_norm"] = 0.0   # all-agreeing groups: no advantage, no gradient
    rows[-1]["grad_norm"] = 0.02
    assert DETECTORS["grad_norm_explosion"](make_ev(rows, samples(rows, group=4)), THRESHOLDS, KNOWN) is None
    for r in rows[-12:]:   # a fix makes the groups disagree: the policy learns, its gradient is no explosion
        r["grad_norm"] = 5.0
    assert DETECTORS["grad_norm_explosion"](make_ev(rows, samples(rows, group=4)), THRESHOLDS, KNOWN) is None


def test_plateau_on_evals_and_on_loss():
    rows = sft_rows(80)
    for r in rows:
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.5 if r["step"] >= 30 else 0.2
    d = fired(make_ev(rows), "plateau")
    assert d.severity == "info" and d.evidence["metric"] == "heldout_acc"
    reached = copy.deepcopy(rows)
    for r in reached:
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.97
    assert DETECTORS["plateau"](make_ev(reached), THRESHOLDS, KNOWN) is None  # at target: not stuck
    flat = [{k: v for k, v in r.items() if not k.startswith("heldout")} for r in sft_rows(80)]
    for r in flat:
        r["loss"] = 1.2
    assert fired(make_ev(flat), "plateau").evidence["metric"] == "loss"


def test_entropy_collapse():
    rows = grpo_rows()
    for r in rows[-6:]:
        r.update(entropy=0.01, pass_rate=0.4)
    d = fired(make_ev(rows, samples(rows, group=4)), "entropy_collapse")
    assert d.evidence["entropy_early_median"] > 0.5
    solved = grpo_rows()
    for r in solved[-6:]:
        r.update(entropy=0.01, pass_rate=0.97)  # confident and right: fine
    assert DETECTORS["entropy_collapse"](make_ev(solved, samples(solved, group=4)), THRESHOLDS, KNOWN) is None


def test_kl_blowup():
    rows = grpo_rows()
    for r in rows[-5:]:
        r["kl"] = 0.9
    assert fired(make_ev(rows, samples(rows, group=4)), "kl_blowup").evidence["kl_recent"] == [0.9] * 5
    rows = grpo_rows()
    for r in rows[-5:]:
        r["kl"] = 0.3  # ~12× its trailing median and above kl_min
    fired(make_ev(rows, samples(rows, group=4)), "kl_blowup")


def test_truncation_and_its_lengths():
    rows = sft_rows()
    for r in rows[-8:]:
        r.update(truncation_rate=1.0, response_len=2.0, pass_rate=0.0)
    rows[-1]["heldout_truncated"] = 1.0   # greedy held-out answers are cut off as well
    smp = samples(rows, completion="97")
    for s in smp:
        s.update(truncated=True, verdict="truncated", reward=0.0)
    d = fired(make_ev(rows, smp), "truncation")
    assert d.evidence["response_len_max"] == 2.0 and d.evidence["samples_truncated"] == len(smp)
    # too-long training answers at a difficulty above the eval's, with untruncated evals: not the limit
    rows[-1]["heldout_truncated"] = 0.0
    for r in rows:
        r["difficulty"] = 8
    assert DETECTORS["truncation"](make_ev(rows, smp), THRESHOLDS, KNOWN) is None


def test_truncation_waits_for_the_first_held_out_eval():
    """The first steps of a model still learning its answer format run on past any limit: before a
    held-out eval says whether greedy answers fit, cut-off training samples are no finding."""
    rows = [r for r in sft_rows()[:12] if "heldout_acc" not in r]
    for r in rows:
        r.update(truncation_rate=1.0, response_len=4.0, pass_rate=0.0)
    smp = samples(rows, completion="9713")
    for x in smp:
        x.update(truncated=True, verdict="truncated", reward=0.0)
    ev = make_ev(rows, smp)
    assert not ev.evals and DETECTORS["truncation"](ev, THRESHOLDS, KNOWN) is None
    rows[-1].update(heldout_acc=0.0, heldout_truncated=1.0)       # the first eval: greedy answers are cut off too
    fired(make_ev(rows, smp), "truncation")


def test_malformed_rate_jump_and_persistent():
    rows = sft_rows()
    for r in rows[-5:]:
        r["malformed_rate"] = 0.6
    assert fired(make_ev(rows), "malformed_rate").evidence["malformed_best"] == 0.0
    rows = sft_rows()
    for r in rows:
        r["malformed_rate"] = 0.9
    fired(make_ev(rows), "malformed_rate")


def test_reward_hacking():
    rows = grpo_rows()
    for r in rows[-12:]:
        r.update(pass_rate=0.9, reward_mean=0.9)
    rows[-1]["heldout_acc"] = 0.2
    d = fired(make_ev(rows, samples(rows, group=4)), "reward_hacking")
    assert d.evidence["gap"] == pytest.approx(0.7) and d.severity == "critical"
    # training easier than the eval: a gap is expected
    for r in rows:
        r["difficulty"] = 2
    assert DETECTORS["reward_hacking"](make_ev(rows, samples(rows, group=4)), THRESHOLDS, KNOWN) is None


def test_reward_hacking_quiet_under_sft():
    """SFT optimises the reference answers, not the reward: sampled answers passing well ahead of
    the last held-out eval while the model learns fast is not reward hacking (it fired on the
    healthy example before this rule)."""
    rows = sft_rows()
    for r in rows[-12:]:
        r.update(pass_rate=0.9, reward_mean=0.9)
    rows[-1]["heldout_acc"] = 0.2
    assert all(r["algorithm"] == "sft" for r in rows)
    assert "reward_hacking" not in names(make_ev(rows))
    for r in rows:   # the same numbers from a run trained on the reward do fire
        r["algorithm"] = "grpo"
    assert "reward_hacking" in names(make_ev(rows))


def test_throughput_drop():
    rows = sft_rows()
    for r in rows[-6:]:
        if "heldout_acc" not in r:
            r["tokens_per_s"] = 1500.0
    d = fired(make_ev(rows), "throughput_drop")
    assert d.severity == "info" and d.evidence["ratio"] < 0.5


def test_stale_heartbeat_reads_the_goals_threshold_and_gives_every_launch_a_grace():
    rows = sft_rows()
    ev = make_ev(rows, heartbeat_age_s=25.0)
    assert DETECTORS["stale_heartbeat"](ev, THRESHOLDS, KNOWN) is None                     # the 30 s floor
    goal = dataclasses.replace(KNOWN, stale_heartbeat_s=20.0)
    assert fired(ev, "stale_heartbeat", goal).evidence["threshold_s"] == 20.0               # swarm.stale_heartbeat_s
    # a job launched 10 s ago, whose heartbeat file is still the dead worker's: not stale yet
    fresh = dataclasses.replace(goal, since_launch_s=10.0)
    assert DETECTORS["stale_heartbeat"](make_ev(rows, heartbeat_age_s=300.0), THRESHOLDS, fresh) is None
    assert DETECTORS["crashed_job"](make_ev(rows, job_status="UNKNOWN", heartbeat_age_s=300.0), THRESHOLDS, fresh) is None
    # still starting (no heartbeat of its own yet) 45 s after its launch: not hung; after the startup grace it is
    starting = dataclasses.replace(goal, since_launch_s=45.0)
    assert DETECTORS["stale_heartbeat"](make_ev(rows, heartbeat_age_s=300.0), THRESHOLDS, starting) is None
    late = dataclasses.replace(goal, since_launch_s=130.0)
    assert fired(make_ev(rows, heartbeat_age_s=300.0), "stale_heartbeat", late)
    # a job launched long ago whose heartbeat stopped 25 s ago
    assert fired(make_ev(rows, heartbeat_age_s=25.0), "stale_heartbeat", dataclasses.replace(goal, since_launch_s=600.0))


def test_what_the_trainer_noticed_becomes_findings():
    rows = sft_rows()
    assert names(make_ev(rows)) & {"checkpoint_corrupt", "command_refused", "skipped_steps", "job_restarted"} == set()
    ev = make_ev(rows, events=[{"event": "start", "step": 0},
                               {"event": "checkpoint_corrupt", "step": 50, "name": "step-000050", "error": "checksum mismatch"},
                               {"event": "resume", "step": 40}],
                 acks=[{"id": "a1-apply", "cmd": "set_fields", "status": "rejected", "step": 55,
                        "reason": "task 'addition': difficulty=0 outside [1, 12]"}])
    d = fired(ev, "checkpoint_corrupt")
    assert d.severity == "warning" and d.evidence["checkpoints"] == ["step-000050"] and "checksum" in d.evidence["errors"][0]
    d = fired(ev, "command_refused")
    assert "difficulty=0 outside" in d.summary and d.evidence["ids"] == ["a1-apply"]
    assert fired(ev, "job_restarted").evidence["resumed_at_steps"] == [40]
    rows[-3]["skipped"], rows[-3]["nonfinite"] = 1.0, 1.0
    d = fired(make_ev(rows), "skipped_steps")
    assert d.evidence["nonfinite"] == 1 and d.severity == "info"
    assert "nonfinite_loss" not in names(make_ev(rows))       # one skipped step is not a divergence


def test_stale_heartbeat_threshold_scales_with_step_time():
    rows = sft_rows()
    d = fired(make_ev(rows, heartbeat_age_s=120.0), "stale_heartbeat")
    assert d.evidence["threshold_s"] == THRESHOLDS.stale_heartbeat_s
    slow = sft_rows()
    for r in slow:
        r["step_time"] = 20.0  # 20 s steps: 120 s without a heartbeat is within 10 step times
    assert DETECTORS["stale_heartbeat"](make_ev(slow, heartbeat_age_s=120.0), THRESHOLDS, KNOWN) is None


def test_crashed_job():
    rows = sft_rows()
    assert fired(make_ev(rows, job_status="FAILED", heartbeat_age_s=5.0), "crashed_job").severity == "critical"
    d = fired(make_ev(rows, job_status="UNKNOWN", heartbeat_age_s=300.0), "crashed_job")
    assert d.evidence["end_event"] is False
    ended = make_ev(rows, job_status="UNKNOWN", heartbeat_age_s=300.0, heartbeat_state="completed",
                    events=[{"event": "end", "step": 60}])
    assert DETECTORS["crashed_job"](ended, THRESHOLDS, KNOWN) is None


OOM_CPU = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes."
OOM_CUDA = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 8.00 GiB"


def test_out_of_memory_names_a_worker_that_died_allocating_and_only_its_newest_life():
    rows = sft_rows()
    start = {"event": "start", "step": 0}
    for err, msg in (("MemoryError", OOM_CPU), ("OutOfMemoryError", OOM_CUDA), ("RuntimeError", OOM_CUDA)):
        died = [start, {"event": "error", "step": 60, "error": err, "message": msg}]
        d = fired(make_ev(rows, job_status="FAILED", events=died), "out_of_memory")
        assert d.severity == "critical" and d.evidence["at_step"] == 60 and d.evidence["memory_errors"] == 1
    # another error is a crash, not out-of-memory
    other = [start, {"event": "error", "step": 60, "error": "KeyError", "message": "'question'"}]
    assert DETECTORS["out_of_memory"](make_ev(rows, job_status="FAILED", events=other), THRESHOLDS, KNOWN) is None
    # a worker that started again after an OOM and has not died since is not out of memory
    again = [start, {"event": "error", "step": 60, "error": "MemoryError", "message": OOM_CPU},
             {"event": "resume", "step": 50}]
    assert DETECTORS["out_of_memory"](make_ev(rows, events=again), THRESHOLDS, KNOWN) is None
    twice = again + [{"event": "error", "step": 60, "error": "MemoryError", "message": OOM_CPU}]
    assert fired(make_ev(rows, job_status="FAILED", events=twice), "out_of_memory").evidence["memory_errors"] == 2
    # the job's status unknown (a restarted controller) but the worker wrote that it failed: crashed
    failed = make_ev(rows, job_status="UNKNOWN", heartbeat_state="failed", heartbeat_age_s=2.0, events=twice)
    assert fired(failed, "crashed_job").summary.startswith("the worker wrote that it failed")


def questions(steps: range, draw) -> list[dict]:
    """Sampled questions: 4 per step, each `draw(step, k)`."""
    return [{"step": s, "segment": 0, "question": draw(s, k)} for s in steps for k in range(4)]


def shifted(at: int, grow: bool = True, drop: bool = True, key_change: bool = False):
    """SFT rows and sampled questions: from step `at` the questions are 9 characters instead of 5
    (`grow`) and the pass rate falls from 0.9 to 0.3 (`drop`); `key_change`: the curriculum's
    difficulty rose with them (a curriculum change, not the data's)."""
    rows = sft_rows(100)
    for r in rows:
        after = r["step"] > at
        r.update(pass_rate=0.3 if after and drop else 0.9, difficulty=4 if after and key_change else 2,
                 harness_version="h1", recipe_version="r1")
    qs = questions(range(0, 100), lambda s, k: f"{s:03d}+{k}" + ("4567" if s + 1 > at and grow else "4"))
    return rows, qs


def test_harder_data_fires_when_questions_lengthen_and_pass_rate_falls_at_an_unchanged_config():
    rows, qs = shifted(60)
    d = fired(make_ev(rows, questions=qs), "harder_data")
    assert d.evidence["question_chars_then"] == 6 and d.evidence["question_chars_now"] == 9
    assert d.evidence["difficulty"] == 2 and d.evidence["pass_rate_then"] == 0.9
    # the first step whose data may have changed: at or before the first longer question (step 60)
    assert 50 <= d.evidence["good_before_step"] <= 60
    for kw in ({"grow": False}, {"drop": False}, {"key_change": True}):    # only one of the two, or the curriculum's
        rows, qs = shifted(60, **kw)
        assert DETECTORS["harder_data"](make_ev(rows, questions=qs), THRESHOLDS, KNOWN) is None, kw
    rows, qs = shifted(95)                                                  # too few steps since the change
    assert DETECTORS["harder_data"](make_ev(rows, questions=qs), THRESHOLDS, KNOWN) is None
    assert "harder_data" not in names(make_ev(sft_rows(100), questions=shifted(200)[1]))


def test_harder_data_from_the_start_is_held_against_the_tasks_own_lengths():
    """A stream that drew harder problems before anything was learnt shows no fall and no earlier
    block: its questions are held against the task's own length at the difficulty asked for."""
    lens = {1: 3.0, 2: 5.0, 3: 7.0, 4: 9.0}                  # the task's own: 2-digit sums are 5 characters
    knows = dataclasses.replace(KNOWN, question_chars=lens)
    rows, qs = shifted(0, drop=False)                        # 9-character questions from the first step
    for r in rows:
        r["pass_rate"] = 0.0                                 # nothing learnt: no fall to see
    d = DETECTORS["harder_data"](make_ev(rows, questions=qs), THRESHOLDS, knows)
    assert d is not None and d.evidence["question_chars_now"] == 9 and d.evidence["nearest_task_difficulty"] == 4
    assert d.evidence["difficulty"] == 2 and d.evidence["task_question_chars"] == 5.0
    assert "good_before_step" not in d.evidence             # long from the first sampled step: no step it changed from
    assert DETECTORS["harder_data"](make_ev(rows, questions=qs), THRESHOLDS, KNOWN) is None     # lengths unknown
    rows, qs = shifted(0, grow=False, drop=False)            # 6 characters: 1.2x the task's 5, but nearest difficulty 2
    assert DETECTORS["harder_data"](make_ev(rows, questions=qs), THRESHOLDS, knows) is None
    rows, qs = shifted(200)                                  # the task's own stream (6 characters)
    assert DETECTORS["harder_data"](make_ev(rows, questions=qs), THRESHOLDS, dataclasses.replace(
        KNOWN, question_chars={1: 4.0, 2: 6.0, 3: 8.0})) is None


def test_template_mismatch_from_prompt_shape():
    rows = sft_rows()
    d = fired(make_ev(rows, samples(rows, prompt="123+456")), "template_mismatch")
    assert d.evidence["mode"] == "prompt_shape" and d.evidence["mismatch_fraction"] == 1.0
    assert "123" not in str(d.model_dump())  # the prompt's text never enters a diagnosis


def test_template_mismatch_when_the_template_cuts_the_question():
    rows = sft_rows()
    smp = [dict(s, question="123+456", prompt="123=") for s in samples(rows)]  # separator kept, question cut
    d = fired(make_ev(rows, smp), "template_mismatch")
    assert d.evidence["mode"] == "question_lost" and d.evidence["samples_checked"] == 16
    assert d.evidence["harness_changed_at_step"] is None       # cut from the start: no change to point at
    assert "123" not in str(d.model_dump())
    ok = [dict(s, question="123+456", prompt="123+456=") for s in samples(rows)]
    assert DETECTORS["template_mismatch"](make_ev(rows, ok), THRESHOLDS, KNOWN) is None


def test_question_lost_whatever_template_the_controller_knows():
    """A template that cuts the question written in the goal itself: the controller's template is
    the cutting one, so prompts match it; the samples still show prompts without their question."""
    rows = sft_rows()
    smp = [dict(s, question="123+456", prompt="123=") for s in samples(rows)]
    known = Known(eval_difficulty=3, template="{question:.3}=")
    d = fired(make_ev(rows, smp), "template_mismatch", known=known)
    assert d.evidence["mode"] == "question_lost" and d.evidence["mismatch_fraction"] == 1.0
    few = [dict(s, question="123+456", prompt="123=") if i < 4 else dict(s, question="123+456", prompt="123+456=")
           for i, s in enumerate(samples(rows))]                 # 4 of 16 cut: below the share that fires
    assert DETECTORS["template_mismatch"](make_ev(rows, few), THRESHOLDS, known) is None


def test_template_mismatch_from_malformed_after_harness_change():
    rows = sft_rows()
    for r in rows[50:]:
        r.update(harness_version="cccc", malformed_rate=0.7)
    d = fired(make_ev(rows, harness=None), "template_mismatch", known=Known(eval_difficulty=3))
    assert d.evidence["mode"] == "malformed_after_harness_change" and d.evidence["change_step"] == 51


def test_template_mismatch_ignores_samples_from_before_a_known_change():
    rows = sft_rows()
    for r in rows[-2:]:
        r["harness_version"] = "dddd"                          # the controller set a new template at step 59
    smp = [dict(s, prompt="Q:123+456\nA:") for s in samples(rows)]   # newest samples carry it
    for s in smp[:8]:
        s["prompt"] = "123+456="                                  # older ones the old template
    known = Known(eval_difficulty=3, template="Q:{question}\nA:")
    assert DETECTORS["template_mismatch"](make_ev(rows, smp), THRESHOLDS, known) is None


def test_too_hard_curriculum_above_eval_and_jumped():
    rows = sft_rows()
    for r in rows:
        r.update(difficulty=8, pass_rate=0.0, reward_mean=0.0)
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.0
    d = fired(make_ev(rows), "too_hard_curriculum")
    assert d.evidence["mode"] == "above_eval" and d.evidence["train_difficulty"] == 8
    assert d.evidence["eval_difficulty"] == 3
    rows = sft_rows()
    for r in rows[40:]:
        r.update(difficulty=7, pass_rate=0.0)
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.0
    d = fired(make_ev(rows, harness=None), "too_hard_curriculum", known=Known())
    assert d.evidence["mode"] == "jumped"
    # pass rate 0 at the eval difficulty itself (a fresh model): not the curriculum's fault
    fresh = sft_rows()
    for r in fresh:
        r["pass_rate"] = 0.0
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.0
    assert DETECTORS["too_hard_curriculum"](make_ev(fresh), THRESHOLDS, KNOWN) is None


def identical_groups() -> tuple[list[dict], list[dict]]:
    """A GRPO window whose failing groups all repeat one completion (near-greedy sampling)."""
    rows = grpo_rows()
    for r in rows[-5:]:
        r["pass_rate"] = 0.3
    smp = samples(rows, group=4)
    for s in smp:
        s.update(completion="57\n", verdict="wrong", reward=0.0)
    return rows, smp


def test_low_temperature_from_identical_groups():
    rows, smp = identical_groups()
    d = fired(make_ev(rows, smp), "low_temperature")
    assert d.evidence["identical_groups"] == d.evidence["groups"] == 4
    assert DETECTORS["low_temperature"](make_ev(sft_rows(), smp), THRESHOLDS, KNOWN) is None  # SFT samples greedily
    for s in smp:
        s.update(verdict="correct", reward=1.0)  # solved prompts may well agree: not a sampling problem
    assert DETECTORS["low_temperature"](make_ev(rows, smp), THRESHOLDS, KNOWN) is None


def real_run(tmp_path, perturbations: list[dict], steps: int = 30, harness: dict | None = None):
    """The built-in model (1 layer, width 32) on 3-digit addition, SFT, 30 steps, one thread
    (`harness`: the run's own starting harness, HARNESS by default)."""
    from trainer.config import RunConfig
    from trainer.loop import Trainer

    cfg = RunConfig.parse({
        "name": "run", "out_dir": str(tmp_path / "runs"), "seed": 0, "threads": 1, "samples_per_step": 4,
        "task": {"name": "addition"}, "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32},
        "harness": harness or HARNESS,
        "recipe": {"algorithm": "sft", "lr": 1e-2, "schedule": "constant", "warmup_steps": 0, "steps": steps,
                   "batch_size": 32, "eval_interval": 10, "eval_size": 64},
        "checkpoint": {"interval": 5, "keep_last": 10}, "perturbations": perturbations})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        Trainer(cfg).run()
    finally:
        torch.set_num_threads(threads)
    return collect(cfg.run_dir, job_status="SUCCEEDED", harness=harness or HARNESS)


@pytest.mark.parametrize("shortcut, expected", [
    (None, set()),
    ("truncation", {"truncation"}),
    ("broken_template", {"template_mismatch"}),
    ("too_hard", {"too_hard_curriculum"}),
])
def test_real_run(tmp_path, shortcut, expected):
    ev = real_run(tmp_path, [{"shortcut": shortcut}] if shortcut else [])
    # throughput depends on the wall clock of a shared machine: it may report, the rest may not
    assert names(ev) - {"throughput_drop"} == expected


def test_real_run_lr_spike(tmp_path):
    ev = real_run(tmp_path, [{"shortcut": "lr_spike", "at_step": 15}])
    found = {d.name: d for d in run_detectors(ev, known=KNOWN)}
    assert "loss_spike" in found
    spike = found["loss_spike"]
    assert 16 <= spike.evidence["onset_step"] <= 18
    assert spike.evidence["lr_before"] == pytest.approx(1e-2) and spike.evidence["lr_now"] == pytest.approx(0.5)


def stuck_rows(n: int = 120, seed: int = 2) -> list[dict]:
    """lr far too high from the start: the loss never leaves its starting level, held-out stays 0."""
    rows = sft_rows(n=n)
    rng = random.Random(seed)
    for r in rows:
        r.update(loss=1.9 + rng.uniform(-0.05, 0.05), pass_rate=0.0, lr=0.3)
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.0
    return rows


def test_not_learning():
    d = fired(make_ev(stuck_rows()), "not_learning")
    assert d.evidence["lr_now"] == 0.3 and d.evidence["relative_improvement"] < THRESHOLDS.not_learning_rel
    assert DETECTORS["not_learning"](make_ev(sft_rows(n=120)), THRESHOLDS, KNOWN) is None  # healthy: quiet


def test_not_learning_reads_the_newest_window_after_an_early_blow_up():
    """A loss that shot up in the first steps (an lr far too high), fell back from there and then
    sat still for a window has not learnt over that window: the fall from the blow-up is not
    learning. A healthy run's loss still falling over the newest window stays quiet, and so does
    one that fell from where it started without a blow-up."""
    rows = stuck_rows(n=150)
    for i, r in enumerate(rows[:30]):
        r["loss"] = 4.6 if i == 0 else 20.0 - 0.6 * i
    d = fired(make_ev(rows), "not_learning")
    assert d.evidence["loss_start_median"] < 2.0 and d.evidence["rows"] == THRESHOLDS.not_learning_rows
    assert DETECTORS["not_learning"](make_ev(sft_rows(n=150)), THRESHOLDS, KNOWN) is None
    # a loss that fell from where it started (no blow-up) and has flattened since, held-out still
    # at 0: judged over the whole stretch, which learnt (a task slow to score)
    slow = stuck_rows(n=150)
    for i, r in enumerate(slow[:50]):
        r["loss"] = 4.6 - 0.054 * i
    assert DETECTORS["not_learning"](make_ev(slow), THRESHOLDS, KNOWN) is None


def test_not_learning_compares_only_losses_that_compare():
    """The loss medians it compares must be of one segment (a rollback restarts the weights'
    history) and one training difficulty (a curriculum ramp changes what the loss is measured on);
    with fewer such rows than it needs, it says nothing yet."""
    stuck = stuck_rows(n=200)
    assert fired(make_ev(stuck), "not_learning")
    for i, r in enumerate(stuck):              # the last 60 rows: a new segment after a rollback
        r["segment"] = 0 if i < 140 else 1
    assert "not_learning" not in names(make_ev(stuck))
    ramp = stuck_rows(n=200)
    for i, r in enumerate(ramp):               # a curriculum ramping 1 → 2: 60 rows at the top so far
        r["difficulty"] = 1 if i < 140 else 2
    assert "not_learning" not in names(make_ev(ramp))
    for i, r in enumerate(ramp):               # at one difficulty for long enough: judged again
        r["difficulty"] = 1 if i < 40 else 2
    assert fired(make_ev(ramp), "not_learning")


def test_loss_spike_quiet_when_a_near_zero_loss_bumps_and_comes_back():
    """Measured on the healthy example (seed 0, step 655): loss 0.0066 → 0.067 for a step, then
    0.0104 — 1.6x the median, but 0.004 nats above it: recovered, not a divergence."""
    rows = sft_rows(n=120)
    for r in rows:
        r["loss"] = 0.0066
    rows[-8]["loss"] = 0.067
    for r in rows[-7:]:
        r["loss"] = 0.0104
    assert "loss_spike" not in names(make_ev(rows))
    for r in rows[-7:]:     # the same bump that stays 0.06 above the median is a divergence
        r["loss"] = 0.066
    assert "loss_spike" in names(make_ev(rows))


# ---- what is in force: the live harness and lr against what the controller set ------------------

SET = dataclasses.replace(KNOWN, harness_version="aaaa", recipe_version="rrrr", lr_bounds=(3e-3, 3e-3), warmup_steps=0,
                          settled_since=0.0)
DRIFTS = {"harness_drift", "lr_drift", "recipe_drift"}


def drifted(rows: list[dict], at: int, **fields) -> list[dict]:
    out = copy.deepcopy(rows)
    for r in out:
        if r["step"] >= at:
            r.update(fields)
    return out


@pytest.mark.parametrize("case, rows, known, fires", [
    ("healthy, in force", sft_rows(), SET, set()),
    ("harness changed mid-run, no command", drifted(sft_rows(), 40, harness_version="cccc"), SET, {"harness_drift"}),
    ("harness changed from the first step", drifted(sft_rows(), 1, harness_version="cccc"), SET, {"harness_drift"}),
    ("changed only in the last 3 rows (< recent)", drifted(sft_rows(), 58, harness_version="cccc"), SET, set()),
    ("the change predates the controller's latest one", drifted(sft_rows(), 20, harness_version="cccc"),
     dataclasses.replace(SET, harness_version="cccc", settled_since=1030.0), set()),
    ("lr cut 100x mid-run", drifted(sft_rows(), 30, lr=3e-5), SET, {"lr_drift"}),
    ("lr raised 50x mid-run", drifted(sft_rows(), 30, lr=0.15), SET, {"lr_drift"}),
    ("lr inside a cosine schedule's range", drifted(sft_rows(), 30, lr=1e-3),
     dataclasses.replace(SET, lr_bounds=(3e-4, 3e-3)), set()),
    ("lr below the set one during the warm-up", drifted(sft_rows(), 1, lr=1e-4),
     dataclasses.replace(SET, warmup_steps=60), set()),
    ("nothing known to be in force (settled_since None)", drifted(sft_rows(), 30, lr=3e-5, harness_version="cccc"),
     dataclasses.replace(SET, settled_since=None), set()),
    ("recipe changed mid-run, no command", drifted(drifted(sft_rows(), 1, recipe_version="rrrr"), 40, recipe_version="qqqq"),
     SET, {"recipe_drift"}),
    ("recipe as set", drifted(sft_rows(), 1, recipe_version="rrrr"), SET, set()),
    ("recipe changed only in the last 3 rows (< recent)",
     drifted(drifted(sft_rows(), 1, recipe_version="rrrr"), 58, recipe_version="qqqq"), SET, set()),
    ("rows that name no recipe version", sft_rows(), SET, set()),
])
def test_drift_detectors_compare_what_runs_with_what_the_controller_set(case, rows, known, fires):
    got = names(make_ev(rows), known) & DRIFTS
    assert got == fires, case


def test_a_rollback_starts_a_new_segment_whose_rows_alone_say_what_is_in_force():
    rows = drifted(sft_rows(), 30, harness_version="cccc")
    rows += [dict(r, segment=1, step=r["step"] - 30, time=r["time"] + 100, harness_version="aaaa") for r in sft_rows()[:10]]
    assert "harness_drift" not in names(make_ev(rows), SET)


@pytest.mark.parametrize("perturbation, drift", [
    (None, set()),
    ({"shortcut": "truncation", "at_step": 10}, {"harness_drift"}),
    ({"shortcut": "broken_template"}, {"harness_drift"}),
    ({"shortcut": "lr_spike", "at_step": 15}, {"lr_drift", "recipe_drift"}),
    ({"kind": "override", "at_step": 10, "set": {"recipe.lr": 1e-4}}, {"lr_drift", "recipe_drift"}),
    ({"kind": "override", "at_step": 10, "set": {"recipe.batch_size": 6}}, {"recipe_drift"}),
    ({"kind": "override", "at_step": 10, "set": {"recipe.weight_decay": 0.5}}, {"recipe_drift"}),
])
def test_real_run_what_is_in_force_against_what_the_controller_set(tmp_path, perturbation, drift):
    """What the controller knows (its context: the run's recipe and harness, nothing changed since the
    start) against what the run logs: a silent override of a harness field, of the lr or of any
    other recipe field shows; the recipe the controller knows leaves the run's length to it."""
    from agents.base import OperatorContext

    ev = real_run(tmp_path, [perturbation] if perturbation else [])
    known = OperatorContext(recipe={"algorithm": "sft", "lr": 1e-2, "schedule": "constant", "warmup_steps": 0, "steps": 30,
                                    "batch_size": 32, "eval_interval": 10, "eval_size": 64},
                            harness=HARNESS, eval_difficulty=3, settled_since=0.0).known()
    assert names(ev, known) & DRIFTS == drift
