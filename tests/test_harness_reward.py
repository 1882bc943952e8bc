"""harness/reward.py: the verifier choice and reward shaping, against a reference (the trainer's
scoring before it moved into the harness, kept here verbatim) on a table of tasks, completions and
reward configs; the exploitable verifier; the registry.

    .venv/bin/python -m pytest tests/test_harness_reward.py -q
"""
from __future__ import annotations

import itertools
import re
import typing

import pytest

from harness import reward
from harness.spec import HarnessSpec, RewardConfig
from trainer.tasks.base import Verdict, VerifyResult, make_task


# ---- the reference: trainer/rollout.py's scoring as it was before the move ---------------------
def _ref_digits_any_order(parsed, ex):
    if parsed is None:
        return None
    if sorted(re.sub(r"\D", "", parsed)) == sorted(re.sub(r"\D", "", ex.answer)) and parsed:
        return VerifyResult(1.0, Verdict.CORRECT, parsed, "digits match (any order)")
    return None


def _ref_score(task, harness, ex, completion, truncated, for_training):
    res = task.verify(completion, ex, harness.answer.extract, truncated=truncated)
    if not for_training:
        return res, res.reward
    if harness.reward.verifier == "digits_any_order" and res.verdict != Verdict.CORRECT:
        res = _ref_digits_any_order(harness.answer.extract(completion), ex) or res
    if harness.reward.kind == "partial" and res.parsed is not None and res.verdict == Verdict.WRONG:
        r = float(task.partial_credit(res.parsed, ex))
    else:
        r = res.reward
    if res.verdict == Verdict.WRONG:
        r = max(r, harness.reward.format_bonus)
    return res, min(1.0, max(0.0, r))


def _completions(ex):
    a = ex.answer
    return [a + "\n", a[::-1] + "\n", a[1:] + a[0] + "\n", "9" * len(a) + "\n", a + "x\n", a[:-1] + "\n",
            "\n", "", " " + a + " \n", a + " " + a + "\n", "-" + a + "\n", a]


REWARDS = [dict(kind=k, format_bonus=b, verifier=v)
           for k, b, v in itertools.product(("exact", "partial"), (0.0, 0.2), ("task", "digits_any_order"))]


@pytest.mark.parametrize("task_name", ["addition", "sort", "countdown"])
@pytest.mark.parametrize("rcfg", REWARDS, ids=lambda r: "-".join(str(v) for v in r.values()))
def test_score_equals_the_pre_move_reference(task_name, rcfg):
    task = make_task(task_name)
    spec = HarnessSpec(reward=rcfg)
    n = 0
    for i in range(4):
        ex = task.example("train", i, 3)
        for c, trunc, train in itertools.product(_completions(ex), (False, True), (True, False)):
            assert reward.score(task, spec, ex, c, trunc, train) == _ref_score(task, spec, ex, c, trunc, train), (c, trunc, train)
            n += 1
    assert n == 4 * 12 * 4


def test_verify_all_then_shape_is_score_for_a_batch():
    task, spec = make_task("sort"), HarnessSpec(reward={"kind": "partial", "format_bonus": 0.1})
    exs = [task.example("train", i, 3) for i in range(6)]
    comps = [ex.answer[::-1] + "\n" for ex in exs]
    res = reward.verify_all(task, spec, exs, comps, [False] * 6)
    shaped = [reward.shape_reward(task, spec, ex, r, c, True) for ex, r, c in zip(exs, res, comps)]
    assert shaped == [reward.score(task, spec, ex, c, False, True) for ex, c in zip(exs, comps)]


def test_the_exploitable_verifier_accepts_any_order_in_training_only():
    task, spec = make_task("addition"), HarnessSpec(reward={"verifier": "digits_any_order"})
    ex = next(e for e in (task.example("train", i, 3) for i in range(50)) if e.answer[::-1] != e.answer)
    res, r = reward.score(task, spec, ex, ex.answer[::-1] + "\n", False, for_training=True)
    assert (res.verdict, r, res.parsed, res.detail) == (Verdict.CORRECT, 1.0, ex.answer[::-1], "digits match (any order)")
    res, r = reward.score(task, spec, ex, ex.answer[::-1] + "\n", False, for_training=False)
    assert (res.verdict, r) == (Verdict.WRONG, 0.0)
    assert reward.digits_any_order("", ex) is None and reward.digits_any_order(None, ex) is None


def test_the_registry_matches_the_spec_and_refuses_duplicates():
    choices = set(typing.get_args(RewardConfig.model_fields["verifier"].annotation))
    assert set(reward.VERIFIERS) == choices - {"task"}
    with pytest.raises(ValueError, match="registered twice"):
        reward.register_verifier("digits_any_order")(lambda parsed, ex: None)
    with pytest.raises(ValueError, match="registered twice"):
        reward.register_verifier("task")(lambda parsed, ex: None)
