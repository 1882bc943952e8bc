"""An answer limit read against the task's own facts: where the controller knows the fewest tokens a
right held-out answer takes (`swarm.backtest.answer_chars`), a limit that keeps the target out of
reach is a finding from the first look (`truncation` with `task_fact`), not a statistic to wait a
second look or an eval for; the fix is sized from the task's longest answer."""
from __future__ import annotations

import dataclasses

from agents.detection import DETECTORS, THRESHOLDS
from agents.domain import Diagnosis, Intervention, InterventionKind as K, Risk
from agents.operators import HarnessCritic
from swarm.backtest import answer_chars
from swarm.decisions import TASK_FACT, corroborated_by, outlook, worth_verifying
from test_detectors import HARNESS, KNOWN, make_ev, sft_rows

# 3-digit sums written lowest digit first: 3 or 4 characters, nearly all 4
SUMS = {3: {3: 2, 4: 22}}
KNOWS = dataclasses.replace(KNOWN, answer_chars=SUMS, target_threshold=0.9)


def limited(n: int, **answer) -> dict:
    return {**HARNESS, "sampling": {**HARNESS["sampling"], "max_new_tokens": n}, "answer": {**HARNESS["answer"], **answer}}


def test_a_limit_below_the_tasks_answers_is_found_at_the_first_look():
    # no row, no eval yet: the config and the task's facts are enough
    ev = make_ev(sft_rows(1), harness=limited(3))
    d = DETECTORS["truncation"](ev, THRESHOLDS, KNOWS)
    assert d is not None and d.evidence["task_fact"] == "harness.sampling.max_new_tokens"
    assert abs(d.evidence["share_cut"] - 22 / 24) < 1e-3 and d.evidence["needed_max"] == 4 and d.evidence["limit"] == 3
    assert d.evidence["written_max"] == 5                                   # with its stop
    # the answer's prefix is written within the limit too, and the stop where the pattern needs it
    d = DETECTORS["truncation"](make_ev(sft_rows(1), harness=limited(5, prefix="A:", regex=r"A:(\d+)")), THRESHOLDS, KNOWS)
    assert d is not None and d.evidence["needed_max"] == 6
    d = DETECTORS["truncation"](make_ev(sft_rows(1), harness=limited(
        6, prefix="<a>", stop="</a>", regex=r"<a>(\d+)</a>")), THRESHOLDS, KNOWS)
    assert d is not None and d.evidence["needed_max"] == d.evidence["written_max"] == 11
    assert DETECTORS["truncation"](make_ev(sft_rows(1), harness=limited(
        11, prefix="<a>", stop="</a>", regex=r"<a>(\d+)</a>")), THRESHOLDS, KNOWS) is None
    # a limit that fits them, a target within what fits, lengths not known, another target metric: no fact
    quiet = [(limited(4), KNOWS), (limited(3), dataclasses.replace(KNOWS, target_threshold=0.05)),
             (limited(3), dataclasses.replace(KNOWS, answer_chars=None)),
             (limited(3), dataclasses.replace(KNOWS, target_metric="heldout_loss", target_op="<="))]
    for harness, known in quiet:
        assert DETECTORS["truncation"](make_ev(sft_rows(1), harness=harness), THRESHOLDS, known) is None


def test_the_tasks_answer_lengths_are_known_only_where_they_are_the_fewest_tokens_of_a_right_answer():
    lens = answer_chars({"task": {"name": "addition"}, "seed": 0})
    # the held-out set the trainer evaluates: its first recipe.eval_size held-out examples
    assert lens and all(sum(x.values()) == 200 for x in lens.values())
    assert set(lens[3]) == {3, 4} and lens[3][4] > lens[3][3]        # 3-digit sums: most carry into a 4th digit
    assert answer_chars({"task": {"name": "sort"}, "recipe": {"eval_size": 64}, "seed": 0})[4] == {4: 64}
    # a right countdown answer can be written many ways; an HF model's tokens are not characters
    assert answer_chars({"task": {"name": "countdown"}, "seed": 0}) == {}
    assert answer_chars({"task": {"name": "sort"}, "model": {"kind": "hf", "path": "/x"}, "seed": 0}) == {}


def test_a_finding_of_the_tasks_facts_waits_neither_a_second_look_nor_an_eval():
    d = DETECTORS["truncation"](make_ev(sft_rows(1), harness=limited(3)), THRESHOLDS, KNOWS)
    fix = Intervention(kind=K.HARNESS_EDIT, operator="harness_critic", policy="builtin", diagnosis=d, risk=Risk.MEDIUM,
                       changes={"harness.sampling.max_new_tokens": 6}, rationale="r", expected_effect="e")
    assert corroborated_by(fix.diagnosis, [d], fix.changes) == TASK_FACT
    # a change of another field named after the same finding is not what the fact says
    assert corroborated_by(fix.diagnosis, [d], {"recipe.lr": 0.1}) is None
    none = outlook([], 0.9, True)
    assert worth_verifying(fix, frozenset({"truncation"}), none, 160, next_eval_in=90, held_for=(1, 0),
                           corroborated=TASK_FACT) is None
    # the same finding read from statistics waits for both
    stat = d.model_copy(update={"evidence": {"truncation_rate_recent": [1.0]}})
    assert corroborated_by(stat, [stat], fix.changes) is None
    assert "look" in worth_verifying(fix, frozenset({"truncation"}), none, 160, next_eval_in=90, held_for=(1, 0))
    assert "next eval" in worth_verifying(fix, frozenset({"truncation"}), none, 160, next_eval_in=90, held_for=(2, 40))
    # what a proposal claims is not the controller's finding: only a current finding corroborates
    claimed = Diagnosis(name="truncation", summary="s", operator="x", policy="llm", evidence={"task_fact": "f"})
    assert corroborated_by(claimed, [stat], fix.changes) is None


def test_the_fix_is_sized_from_the_tasks_longest_answer():
    ev = make_ev(sft_rows(1), harness=limited(1))
    d = DETECTORS["truncation"](ev, THRESHOLDS, KNOWS)
    from test_operators import ctx
    c = ctx(harness=limited(1), answer_chars=SUMS).with_findings([d])
    [iv] = HarnessCritic().builtin(ev, c)
    assert iv.changes == {"harness.sampling.max_new_tokens": 7}              # the longest answer and its stop, 5, + 2
    assert "the task's longest answer" in iv.rationale and "do not fit the limit" in iv.rationale
