"""Detectors and operator rules on GRPO-after-SFT-warm-up windows, the shape of the
low_temperature and reward_hack evaluation goals (examples/goals/): SFT rows first (algorithm
"sft", greedy samples one per prompt), then GRPO rows (groups of 4 samples per prompt).

The windows are hand-built, shaped like rows measured on those goals' run sections: with the
reward_hack perturbation (sort, exact reward, max_new_tokens 4) GRPO drifted to answers that
never close (digits then a stray character instead of the newline): training scored 21 of 30
recent samples correct although cut off, train pass rate 0.90, while greedy held-out answers
still closed (held-out 0.855, 0.5 % truncated); 50 steps later held-out fell to 0.015.
"""
from __future__ import annotations

import copy

from agents.detection import DETECTORS, THRESHOLDS, Known
from agents.domain import InterventionKind as K, Risk
from agents.operators import Diagnostics, HarnessCritic
from test_detectors import grpo_rows, make_ev, sft_rows
from test_operators import ctx

KNOWN = Known(eval_difficulty=3, target_threshold=0.9)


def warmup_then_grpo(n_sft: int = 90, n_grpo: int = 60) -> list[dict]:
    """SFT warm-up rows, then GRPO rows continuing the step counter (one segment)."""
    rows = sft_rows(n=n_sft)
    for r in grpo_rows(n=n_grpo):
        r = copy.deepcopy(r)
        r["step"] += n_sft
        r["time"] += n_sft
        rows.append(r)
    return rows


def group_samples(rows: list[dict], *, truncated: bool, verdict: str, distinct: bool = True) -> list[dict]:
    """4 completions of one prompt per step for the last 8 steps (GRPO sampling)."""
    out = []
    for r in rows[-8:]:
        for k in range(4):
            comp = f"123{'pqrs'[k] if distinct else 'p'}" if truncated else "123\n"
            out.append({"step": r["step"] - 1, "segment": 0, "uid": f"u{r['step']}", "prompt": "sort:312=",
                        "completion": comp, "reward": 1.0 if verdict == "correct" else 0.0, "verdict": verdict,
                        "truncated": truncated})
    return out


def hacked_window(heldout_truncated: float = 0.005) -> list[dict]:
    rows = warmup_then_grpo()
    for r in rows[-12:]:
        r.update(pass_rate=0.9, reward_mean=0.9, truncation_rate=0.75, response_len=4.0)
    rows[-1].update(heldout_acc=0.855, heldout_truncated=heldout_truncated, heldout_malformed=0.0)
    return rows


def run(name: str, ev, known: Known = KNOWN):
    return DETECTORS[name](ev, THRESHOLDS, known)


def test_reward_hacking_fires_on_correct_answers_that_never_closed_before_heldout_falls():
    rows = hacked_window()
    d = run("reward_hacking", make_ev(rows, group_samples(rows, truncated=True, verdict="correct")))
    assert d is not None and d.evidence["mode"] == "unclosed_correct" and d.severity == "critical"
    assert d.evidence["correct_unclosed_samples"] == 32 and d.evidence["heldout_acc"] == 0.855
    # nothing of the completions' text is in the diagnosis
    assert "123p" not in d.model_dump_json()


def test_reward_hacking_quiet_when_answers_close_or_the_limit_cuts_heldout_too():
    rows = hacked_window()
    assert run("reward_hacking", make_ev(rows, group_samples(rows, truncated=False, verdict="correct"))) is None
    # greedy held-out answers are cut off as well: the limit is tight for every answer, not an exploit
    rows = hacked_window(heldout_truncated=0.9)
    assert run("reward_hacking", make_ev(rows, group_samples(rows, truncated=True, verdict="correct"))) is None
    # too few such samples
    rows = hacked_window()
    smp = group_samples(rows, truncated=False, verdict="correct")
    for s in smp[:3]:
        s["truncated"] = True
    assert run("reward_hacking", make_ev(rows, smp)) is None


def test_truncation_quiet_when_cut_off_answers_are_scored_correct():
    rows = hacked_window()
    for r in rows[-8:]:
        r["truncation_rate"] = 1.0
    assert run("truncation", make_ev(rows, group_samples(rows, truncated=True, verdict="correct"))) is None
    rows[-1]["heldout_truncated"] = 1.0   # scored truncated, and greedy held-out answers cut off too
    d = run("truncation", make_ev(rows, group_samples(rows, truncated=True, verdict="truncated")))
    assert d is not None and d.evidence["samples_truncated"] == 32


def test_harness_critic_restores_the_task_verifier_at_medium_risk_and_not_max_new_tokens():
    rows = hacked_window()
    for r in rows[-8:]:
        r["truncation_rate"] = 1.0
    # no checkpoint to roll back to: the edit alone
    ivs = HarnessCritic().builtin(make_ev(rows, group_samples(rows, truncated=True, verdict="correct")), ctx(checkpoints=[]))
    assert [(iv.kind, iv.changes, iv.risk) for iv in ivs] == [
        (K.HARNESS_EDIT, {"harness.reward.verifier": "task"}, Risk.MEDIUM)]


def test_not_learning_judges_the_warmup_as_sft_and_never_the_grpo_surrogate():
    # GRPO after the warm-up: surrogate loss flat around 0 and held-out still low early on
    rows = warmup_then_grpo(n_sft=90, n_grpo=120)
    for r in rows[90:]:
        r.update(loss=0.001, pass_rate=0.02)
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.02
    assert run("not_learning", make_ev(rows)) is None
    assert not [iv for iv in Diagnostics().builtin(make_ev(rows), ctx()) if iv.diagnosis.name == "not_learning"]
    # a warm-up whose SFT loss falls is learning, also while held-out is still 0
    rows = sft_rows(n=120)
    for r in rows:
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.0
    assert run("not_learning", make_ev(rows)) is None


def test_low_temperature_only_on_grpo_rows_after_the_warmup():
    rows = warmup_then_grpo()
    for r in rows[-8:]:
        r.update(pass_rate=0.4, reward_std=0.0)
    identical = group_samples(rows, truncated=False, verdict="wrong")
    d = run("low_temperature", make_ev(rows, identical))
    assert d is not None and d.evidence["identical_groups"] == 8
    # the same samples while the run is still in its SFT warm-up: SFT rows say nothing about sampling
    assert run("low_temperature", make_ev(rows[:90], identical)) is None
    [iv] = [iv for iv in Diagnostics().builtin(make_ev(rows, identical), ctx()) if iv.diagnosis.name == "low_temperature"]
    assert iv.changes == {"harness.sampling.temperature": 1.0} and iv.risk == Risk.MEDIUM


def test_harness_critic_rolls_back_to_before_the_onset_when_a_checkpoint_predates_it():
    rows = hacked_window()
    smp = group_samples(rows, truncated=True, verdict="correct")
    onset = min(s["step"] for s in smp)
    cps = [{"name": "init", "step": 0}, {"name": "step_0000100", "step": 100}, {"name": "step_0000150", "step": 150}]
    [iv] = HarnessCritic().builtin(make_ev(rows, smp), ctx(checkpoints=cps))
    assert onset == 142 and iv.kind == K.ROLLBACK and iv.diagnosis.evidence["rollback_to"] == "step_0000100"
    assert iv.changes == {"harness.reward.verifier": "task"} and iv.risk == Risk.MEDIUM
    # held-out already collapsed: back to before the last eval that still agreed with training
    rows[-1]["heldout_acc"] = 0.0
    d = run("reward_hacking", make_ev(rows, smp))
    assert d.evidence["mode"] == "gap" and d.evidence["onset_step"] == 140


def test_truncation_quiet_while_greedy_heldout_answers_fit_the_limit():
    # GRPO at temperature 1.5 right after the warm-up (reward_hack goal, no exploit yet): 78 % of
    # sampled completions ran past max_new_tokens, scored malformed, while greedy held-out answers
    # closed (held-out truncated 0.05)
    rows = warmup_then_grpo()
    for r in rows[-20:]:
        r.update(truncation_rate=0.78, response_len=3.8)
    rows[-1].update(heldout_truncated=0.05)
    smp = group_samples(rows, truncated=True, verdict="malformed")
    assert run("truncation", make_ev(rows, smp)) is None
    # the last eval was taken before the cut-offs began: it says nothing about them, so it fires
    rows = warmup_then_grpo()
    for r in rows[-8:]:
        r.update(truncation_rate=0.78, response_len=3.8)
        r.pop("heldout_truncated", None), r.pop("heldout_acc", None)
    assert rows[-11]["heldout_truncated"] == 0.0 and run("truncation", make_ev(rows, smp)) is not None
