"""The pilot (swarm/pilot.py): the successive-halving search on tables of rung results (promotion,
ties, the budget, the last survivor), the prediction on tables of curves, and a real tiny pilot on
the minimal addition goal: its winner becomes the plan's choice with source `pilot`, a field the goal
writes is untouched, its CPU stays within its share plus one run, and a second start resumes."""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import pytest
import torch
import yaml
from typer.testing import CliRunner

from swarm.cli import app
from swarm.goal import Goal
from swarm.pilot import Candidate, PilotError, candidates_for, pilot, piloted_plan, prior_order, start_refused
from swarm.pilot_search import (Promote, RungResult, Schedule, Stop, acc_level, next_rung, predict, rank,
                                tiers)
from swarm.plan import Source
from trainer.config import ConfigError, RunConfig, get_dotted
from trainer.loop import Trainer
from trainer.runlog import read_jsonl

MINIMAL = pathlib.Path(__file__).resolve().parents[1] / "examples" / "goals" / "minimal" / "addition.yaml"
runner = CliRunner()
ABCD = ("a", "b", "c", "d")


def R(c: str, rung: int, heldout: float, loss: float = 1.0, cpu: float = 1.0, base: int = 10) -> RungResult:
    return RungResult(c, rung, base * 2 ** rung, heldout, loss, cpu)


def sched(cands=ABCD, budget: float = 100.0, base: int = 10) -> Schedule:
    return Schedule(tuple(cands), base, budget)


# ---- next_rung on tables ----------------------------------------------------------------------


@pytest.mark.parametrize("results, want", [
    ([], Promote(0, 10, "a", "")),                                                   # nothing yet: rung 0, first
    ([R("a", 0, .1), R("b", 0, .2)], Promote(0, 10, "c", "")),                       # rung 0 goes on in order
    ([R("a", 0, .1), R("b", 0, .4), R("c", 0, .3), R("d", 0, .2)], Promote(1, 20, "b", "")),   # best half: b, c
    ([R("a", 0, .1), R("b", 0, .4), R("c", 0, .3), R("d", 0, .2), R("b", 1, .5)], Promote(1, 20, "c", "")),
    # held-out ties: the lower loss goes on; a non-finite loss is the worst
    ([R("a", 0, .2, 1.5), R("b", 0, .2, 0.9), R("c", 0, .2, math.nan), R("d", 0, .1, 0.1)], Promote(1, 20, "b", "")),
    # a full tie: the candidates' order
    ([R("a", 0, .2), R("b", 0, .2), R("c", 0, .2), R("d", 0, .2), R("a", 1, .3)], Promote(1, 20, "b", "")),
    # rung 1 done: c beat b, alone at rung 2 (4 -> 2 -> 1)
    ([R("a", 0, .1), R("b", 0, .4), R("c", 0, .3), R("d", 0, .2), R("b", 1, .5), R("c", 1, .6)], Promote(2, 40, "c", "")),
])
def test_next_rung_promotes_the_better_half(results, want):
    got = next_rung(results, sched())
    assert isinstance(got, Promote) and (got.rung, got.steps, got.candidate) == (want.rung, want.steps, want.candidate)


def test_the_single_survivor_stops_the_search():
    rows = [R("a", 0, .1), R("b", 0, .4), R("c", 0, .3), R("d", 0, .2), R("b", 1, .5), R("c", 1, .6), R("c", 2, .7)]
    got = next_rung(rows, sched())
    assert got == Stop("c", 2, "one_left", "one candidate remains after rung 2")
    # one candidate: one rung, then it is the winner; three: the better one (3 // 2) goes on
    assert next_rung([R("a", 0, 0.0)], sched(("a",))).winner == "a"
    three = next_rung([R("a", 0, .1), R("b", 0, .3), R("c", 0, .2)], sched(("a", "b", "c")))
    assert isinstance(three, Promote) and three.candidate == "b"
    assert next_rung([R("a", 0, .1), R("b", 0, .3), R("c", 0, .2), R("b", 1, .3)], sched(("a", "b", "c"))).winner == "b"


@pytest.mark.parametrize("results, budget, winner, rung", [
    # spent: the best of rung 0 so far
    ([R("a", 0, .1, cpu=5), R("b", 0, .3, cpu=5)], 10.0, "b", 0),
    # spent during rung 1: the best of rung 0 (the last complete rung), not the one run further
    ([R("a", 0, .1, cpu=3), R("b", 0, .4, cpu=3), R("c", 0, .3, cpu=3), R("d", 0, .2, cpu=3), R("c", 1, .9, cpu=3)],
     15.0, "b", 1),
    # the next run's estimate would pass it: b's 3 CPU-s per 10 steps, 10 more steps -> 3 > 13 - 12
    ([R("a", 0, .1, cpu=3), R("b", 0, .4, cpu=3), R("c", 0, .3, cpu=3), R("d", 0, .2, cpu=3)], 13.0, "b", 1),
    # at rung 0 the estimate is the mean of rung 0's runs so far: 4 > 10 - 8
    ([R("a", 0, .1, cpu=4), R("b", 0, .3, cpu=4)], 10.0, "b", 0),
])
def test_the_budget_stops_the_search(results, budget, winner, rung):
    got = next_rung(results, sched(budget=budget))
    assert isinstance(got, Stop) and got.reason == "budget" and (got.winner, got.rung) == (winner, rung), got


def test_the_first_run_always_starts_and_an_estimate_that_fits_runs():
    assert isinstance(next_rung([], sched(budget=0.001)), Promote)
    got = next_rung([R("a", 0, .1, cpu=4), R("b", 0, .3, cpu=4)], sched(budget=12.0))
    assert isinstance(got, Promote) and got.candidate == "c"


def test_the_schedule_counts_rungs_and_steps():
    assert [Schedule(tuple(str(i) for i in range(n)), 1, 1.0).rungs() for n in (1, 2, 3, 4, 9)] == [1, 2, 2, 3, 4]
    # 9 candidates: 9 x 1 + 4 x 1 + 2 x 2 + 1 x 4 base steps
    assert Schedule(tuple(str(i) for i in range(9)), 1, 1.0).step_units() == 21
    assert Schedule(ABCD, 7, 1.0).steps(3) == 56
    with pytest.raises(ValueError, match="each once"):
        Schedule(("a", "a"), 1, 1.0)
    with pytest.raises(ValueError, match="positive budget"):
        Schedule(ABCD, 1, 0.0)


# ---- the ranking by predicted cost to the target -----------------------------------------------


def tsched(cands=ABCD, budget: float = 100.0, threshold: float = 0.9, strict: bool = False) -> Schedule:
    return Schedule(tuple(cands), 10, budget, threshold=threshold, strict=strict)


RUNG0 = [R("a", 0, .1), R("b", 0, .4, cpu=4), R("c", 0, .3, cpu=1), R("d", 0, .2)]   # b and c go on


@pytest.mark.parametrize("rung1, threshold, want", [
    # b: +0.2 a doubling at 0.4 CPU-s a step -> 57 steps, (57 - 20) x 0.4 = 14.8 CPU-s still to spend;
    # c: +0.2 a doubling at 0.1 CPU-s a step -> 80 steps, (80 - 20) x 0.1 = 6 CPU-s: c goes on, though behind
    ([R("b", 1, .6, cpu=4), R("c", 1, .5, cpu=1)], .9, "c"),
    # the same curves at the same CPU a step: the nearer one (b) goes on
    ([R("b", 1, .6, cpu=4), R("c", 1, .5, cpu=4)], .9, "b"),
    # b's curve is flat (no prediction): c, with one (2.3 doublings to 0.5), goes on though b is ahead
    ([R("b", 1, .4, cpu=4), R("c", 1, .36, cpu=1)], .5, "c"),
    # neither has a usable prediction (flat; too far: 3 doublings at most): held-out accuracy ranks
    ([R("b", 1, .4, cpu=4), R("c", 1, .35, cpu=1)], .9, "b"),
    ([R("b", 1, .3, cpu=4), R("c", 1, .35, cpu=1)], .9, "c"),
])
def test_a_rung_keeps_the_candidates_nearest_the_target_by_cpu(rung1, threshold, want):
    got = next_rung(RUNG0 + rung1, tsched(threshold=threshold))
    assert isinstance(got, Promote) and (got.rung, got.candidate) == (2, want), got


def test_without_a_target_the_ranking_is_by_held_out_accuracy():
    got = next_rung(RUNG0 + [R("b", 1, .6, cpu=4), R("c", 1, .5, cpu=1)], sched())
    assert isinstance(got, Promote) and got.candidate == "b"


@pytest.mark.parametrize("results, schedule, want", [
    # at rung 0 one point is no curve: held-out accuracy ranks, as without a target
    ([R("a", 0, .1), R("b", 0, .4), R("c", 0, .3), R("d", 0, .2)], tsched(), Promote(1, 20, "b", "")),
    # a result at the target ends the search at once, whatever is left of the rung
    ([R("a", 0, .1), R("b", 0, .95)], tsched(), Stop("b", 0, "target", "")),
    (RUNG0 + [R("c", 1, .91, cpu=1)], tsched(), Stop("c", 1, "target", "")),
    # two at the target: the one that spent less CPU to get there
    ([R("a", 0, .92, cpu=3), R("b", 0, .95, cpu=2)], tsched(), Stop("b", 0, "target", "")),
    # `> 0.9`: 0.9 is not at the target
    ([R("a", 0, .9), R("b", 0, .2)], tsched(("a", "b"), strict=True), Promote(1, 20, "a", "")),
    ([R("a", 0, .9), R("b", 0, .2)], tsched(("a", "b")), Stop("a", 0, "target", "")),
])
def test_a_result_at_the_target_wins(results, schedule, want):
    got = next_rung(results, schedule)
    assert type(got) is type(want), got
    if isinstance(want, Stop):
        assert (got.winner, got.rung, got.reason) == (want.winner, want.rung, want.reason) and "at the target" in got.why
    else:
        assert (got.rung, got.candidate) == (want.rung, want.candidate)


# ---- the plan's own values first ---------------------------------------------------------------


@pytest.mark.parametrize("results, schedule, want", [
    # with a held-out target the plan's values (the prior's first) train rung 0, then rung 1, first
    ([], tsched(), Promote(0, 10, "a", "")),
    ([], dataclasses.replace(tsched(), prior=("c", "a", "b", "d")), Promote(0, 10, "c", "")),
    ([R("a", 0, .3)], tsched(), Promote(1, 20, "a", "")),
    # on course: +0.2 a doubling, one more doubling to 0.9 (40 steps at 0.1 CPU-s a step: 2 CPU-s still),
    # less than the other candidates' runs of a complete search (4 base runs' steps at 0.1: 4 CPU-s)
    ([R("a", 0, .5), R("a", 1, .7)], tsched(), Stop("a", 1, "on_course", "")),
    # two doublings to go (6 CPU-s still): the search could pay for itself, it goes on at rung 0
    ([R("a", 0, .3), R("a", 1, .5)], tsched(), Promote(0, 10, "b", "")),
    # a flat curve predicts nothing: the search
    ([R("a", 0, .3), R("a", 1, .3)], tsched(), Promote(0, 10, "b", "")),
    # without a held-out target (no prediction) the candidates run in their order
    ([R("a", 0, .3)], sched(), Promote(0, 10, "b", "")),
    # once another candidate ran (a record written before), the search as it was
    ([R("b", 0, .3), R("a", 0, .3)], tsched(), Promote(0, 10, "c", "")),
    # the plan's values' rung 1 would pass the budget: the search decides (here: the budget stop)
    ([R("a", 0, .3, cpu=60)], tsched(), Stop("a", 0, "budget", "")),
])
def test_the_plans_values_train_first_and_win_when_no_search_can_pay(results, schedule, want):
    got = next_rung(results, schedule)
    assert type(got) is type(want), got
    if isinstance(want, Stop):
        assert (got.winner, got.rung, got.reason) == (want.winner, want.rung, want.reason), got
    else:
        assert (got.rung, got.steps, got.candidate) == (want.rung, want.steps, want.candidate), got


def test_the_plans_values_are_on_course_only_beyond_the_spread_between_seeds():
    nine = tuple(f"c{i}" for i in range(9))
    sch = Schedule(nine, 10, 100.0, threshold=0.9, eval_size=100, prior=("c4", *nine[:4], *nine[5:]))
    # 0.5 -> 0.7 over 100 examples: beyond one run's binomial error, within the spread between seeds
    got = next_rung([R("c4", 0, .5), R("c4", 1, .7)], sch)
    assert isinstance(got, Promote) and (got.rung, got.candidate) == (0, "c0"), got
    # 0.3 -> 0.8: beyond it, and one doubling from the target at 0.1 CPU-s a step: on course
    got = next_rung([R("c4", 0, .3), R("c4", 1, .8)], sch)
    assert isinstance(got, Stop) and (got.winner, got.reason) == ("c4", "on_course"), got


def test_the_plans_values_rung_1_counts_in_the_search_that_follows():
    # a's curve is too flat to predict (+0.05 a doubling): the others' rung 0, then rung 1 for the
    # better half (a and c), where a's result is there already
    rows = [R("a", 0, .4), R("a", 1, .45), R("b", 0, .3), R("c", 0, .35), R("d", 0, .1)]
    got = next_rung(rows, tsched())
    assert isinstance(got, Promote) and (got.rung, got.candidate) == (1, "c"), got
    got = next_rung(rows + [R("c", 1, .5)], tsched())
    assert isinstance(got, Promote) and (got.rung, got.candidate) == (2, "c"), got


def test_a_curve_ranks_candidates_only_beyond_the_spread_between_seeds():
    # one run's rise from 0.44 to 0.64 over 100 examples is beyond its binomial error but within what
    # differs between seeds: the search keeps the plan's values (level with it) rather than extrapolate
    sch = Schedule(("small", "plan", "big"), 21, 270.0, threshold=0.9, eval_size=100, prior=("plan", "small", "big"))
    rows = [RungResult("plan", 0, 21, .33, .78, 2.9), RungResult("plan", 1, 42, .46, .27, 1.3),
            RungResult("small", 0, 21, .03, 1.6, .4), RungResult("big", 0, 21, .34, .49, 3.4),
            RungResult("big", 1, 42, .44, .25, 3.1), RungResult("plan", 2, 84, .48, .19, 2.6),
            RungResult("big", 2, 84, .64, .19, 6.5)]
    ranked = rank([r for r in rows if r.rung == 2], sch.candidates, rows, sch)
    assert [r.candidate for r in ranked] == ["plan", "big"]
    # the winner's own prediction for the report still reads its rise against the binomial error
    assert predict(rows, "big", 0.9, eval_size=100).steps is not None
    assert predict(rows, "big", 0.9, eval_size=100, between_seeds=True).steps is None


def test_rank_orders_reached_then_predicted_then_the_rest():
    rows = RUNG0 + [R("b", 1, .6, cpu=4), R("c", 1, .5, cpu=1), R("a", 1, .95, cpu=9), R("d", 1, .2)]
    ranked = rank([r for r in rows if r.rung == 1], ABCD, rows, tsched())
    assert [r.candidate for r in ranked] == ["a", "c", "b", "d"]
    assert [r.candidate for r in rank([r for r in rows if r.rung == 1], ABCD)] == ["a", "b", "c", "d"]


# ---- differences within the noise: the plan's prior stands -------------------------------------


def N(c: str, heldout: float, loss: float, se: float, rung: int = 0) -> RungResult:
    return RungResult(c, rung, 10 * 2 ** rung, heldout, loss, 1.0, "completed", se)


@pytest.mark.parametrize("a, b, n, level", [
    (0.0, 0.0, 100, True),        # nothing solved by either: no evidence
    (0.01, 0.0, 100, True),       # one example of 100
    (0.2, 0.1, 100, True),        # 2 standard errors are 0.20 here (binomial 0.10, 4x the variance between seeds)
    (0.4, 0.1, 100, False),
    (0.2, 0.1, 1000, False),      # the same gap over ten times the examples
    (0.65, 0.48, 100, True),      # seeds of one sort candidate at 84 steps ranged 0.48-0.76 (pilot_noise.md)
    (0.2, 0.1, None, False),      # the evaluation's size unknown: every difference counts
    (0.2, 0.2, None, True),
])
def test_accuracies_are_level_within_two_standard_errors(a, b, n, level):
    assert acc_level(a, b, n) is level and acc_level(b, a, n) is level


def by_measurement(results, order, n):
    return [r for t in tiers(results, order, n) for r in t]


def test_results_the_measurements_cannot_tell_apart_keep_the_prior_order():
    prior = ("plan", "hi_lr", "small")
    # held-out 0 everywhere; the higher lr's loss is lower, but within 2 standard errors: the plan's first
    flat = [N("hi_lr", 0.0, 1.52, 0.01), N("small", 0.0, 2.00, 0.01), N("plan", 0.0, 1.53, 0.01)]
    assert [r.candidate for r in by_measurement(flat, prior, 100)] == ["plan", "hi_lr", "small"]
    # however precisely one run measured them: seeds move a loss by more (LOSS_SPREAD)
    sharp = [dataclasses.replace(r, loss_se=0.0001) for r in flat]
    assert [r.candidate for r in by_measurement(sharp, prior, 100)] == ["plan", "hi_lr", "small"]
    # a lower loss beyond that leads
    apart = [N("hi_lr", 0.0, 1.20, 0.01), N("small", 0.0, 2.00, 0.01), N("plan", 0.0, 1.53, 0.01)]
    assert [r.candidate for r in by_measurement(apart, prior, 100)] == ["hi_lr", "plan", "small"]
    # accuracy beyond its noise leads whatever the loss
    acc = [N("hi_lr", 0.05, 1.2, 0.001), N("small", 0.65, 1.9, 0.001), N("plan", 0.3, 1.5, 0.001)]
    assert [r.candidate for r in by_measurement(acc, prior, 100)][0] == "small"
    # unknown noise (no eval size, no loss error): the old strict order, accuracy then loss then order
    strict = [N("hi_lr", 0.2, 1.52, math.nan), N("small", 0.1, 1.0, math.nan), N("plan", 0.2, 1.53, math.nan)]
    assert [r.candidate for r in by_measurement(strict, prior, None)] == ["hi_lr", "plan", "small"]


def test_the_tiers_below_the_first_keep_the_prior_too():
    """a leads beyond the noise; x and plan are 0.01 apart where 2 standard errors are 0.028: the
    plan's values come before x, so a rung keeping two keeps a and plan."""
    prior = ("plan", "x", "a", "z")
    rows = [N("a", 0.0, 1.00, 0.01), N("plan", 0.0, 1.20, 0.01), N("x", 0.0, 1.19, 0.01), N("z", 0.0, 2.0, 0.01)]
    assert [[r.candidate for r in t] for t in tiers(rows, prior, 100)] == [["a"], ["plan", "x"], ["z"]]
    # a held-out accuracy that is not a number is the worst, never an error
    nan = rows + [N("w", math.nan, 0.5, 0.01)]
    assert [r.candidate for r in by_measurement(nan, prior + ("w",), 100)][-1] == "w"


def test_a_rise_within_the_noise_is_no_curve():
    """0.78 -> 0.84 over 100 examples is within two binomial standard errors (~0.11): no
    prediction, so it does not jump ahead of a candidate level with it; over 1000 it is a curve."""
    rows = [R("x", 0, .78, cpu=2), R("x", 1, .84, cpu=2)]
    assert predict(rows, "x", 0.9, eval_size=100).steps is None
    assert "beyond its noise" in predict(rows, "x", 0.9, eval_size=100).why
    # one run's rise is tested against the binomial error alone (same run, same examples): over
    # 1000 examples 0.06 is beyond its 2 standard errors (0.035)
    assert predict(rows, "x", 0.9, eval_size=1000).steps is not None
    s = Schedule(("x", "plan"), 10, 100.0, threshold=0.9, eval_size=100, prior=("plan", "x"))
    table = [N("x", .78, 1.0, .01), N("plan", .86, 1.0, .01), N("x", .84, 1.0, .01, rung=1),
             N("plan", .84, 1.0, .01, rung=1)]
    stop = next_rung(table, s)
    assert stop.winner == "plan" and "holds the plan's own values" in stop.why


def test_a_budget_stop_says_so_too_when_the_prior_chose():
    s = Schedule(("x", "plan", "y", "z"), 10, 4.5, eval_size=100, prior=("plan", "x", "y", "z"))
    table = [N("x", .3, 1.0, .01), N("plan", .3, 1.0, .01), N("y", .0, 3.0, .01), N("z", .0, 3.0, .01)]
    stop = next_rung(table + [N("plan", .4, .9, .01, rung=1)], s)
    assert stop.reason == "budget" and stop.winner == "plan" and "level with x" in stop.why, stop


def test_the_stop_names_the_plan_only_when_the_winner_holds_its_values():
    s = Schedule(("x", "y", "plan", "z"), 10, 100.0, eval_size=100, prior=("plan", "x", "y", "z"))
    table = [N("x", .5, 1.0, .01), N("y", .5, 1.0, .01), N("plan", .1, 1.0, .01), N("z", .1, 1.0, .01),
             N("x", .6, 1.0, .01, rung=1), N("y", .6, 1.0, .01, rung=1), N("x", .7, 1.0, .01, rung=2)]
    stop = next_rung(table, s)
    assert stop.winner == "x" and "level with y" in stop.why and "nearest the plan's" in stop.why


def test_a_rung_with_no_measured_difference_promotes_the_candidates_nearest_the_plan():
    cands = ("d64-lr0.009", "d128-lr0.003", "d128-lr0.009", "d64-lr0.003")
    prior = ("d128-lr0.003", "d128-lr0.009", "d64-lr0.003", "d64-lr0.009")
    s = Schedule(cands, 10, 100.0, threshold=0.9, eval_size=100, prior=prior)
    rung0 = [N("d64-lr0.009", 0.0, 1.60, 0.02), N("d128-lr0.003", 0.0, 1.62, 0.02),
             N("d128-lr0.009", 0.0, 1.61, 0.02), N("d64-lr0.003", 0.0, 1.70, 0.02)]
    got = next_rung(rung0, s)
    assert isinstance(got, Promote) and (got.rung, got.candidate) == (1, "d128-lr0.003")
    assert [r.candidate for r in rank(rung0, cands, rung0, s)][:2] == ["d128-lr0.003", "d128-lr0.009"]
    # the same table with exact comparisons (the loss errors unknown) promotes the lowest loss
    exact = [dataclasses.replace(r, loss_se=math.nan) for r in rung0]
    assert next_rung(exact, s).candidate == "d64-lr0.009"
    # rung 1 level again: the plan's own values are the last one left, and the stop says why
    rung1 = [N("d128-lr0.003", 0.02, 1.40, 0.02, rung=1), N("d128-lr0.009", 0.03, 1.38, 0.02, rung=1)]
    rung2 = [N("d128-lr0.003", 0.1, 1.2, 0.02, rung=2)]
    stop = next_rung(rung0 + rung1 + rung2, s)
    assert isinstance(stop, Stop) and stop.winner == "d128-lr0.003" and "measured level with d128-lr0.009" in stop.why
    # a rung the measurements decide says nothing of the sort
    rung1_apart = [N("d128-lr0.003", 0.30, 1.40, 0.02, rung=1), N("d128-lr0.009", 0.03, 1.38, 0.02, rung=1)]
    stop = next_rung(rung0 + rung1_apart + rung2, s)
    assert stop.winner == "d128-lr0.003" and "level" not in stop.why
    with pytest.raises(ValueError, match="every candidate once"):
        Schedule(cands, 10, 100.0, prior=prior[:3])


def test_the_prior_puts_the_plans_own_values_first():
    run = RunConfig().model_dump(mode="json")
    cands = candidates_for(run, lambda f: False)
    order = prior_order(cands, run)
    by = {c.name: c for c in cands}
    size = {n: (by[n].fields["model.d_model"], by[n].fields["model.n_layers"]) for n in order}
    plan_size = (run["model"]["d_model"], run["model"]["n_layers"])
    away = [(size[n] != plan_size) + (by[n].fields["recipe.lr"] != run["recipe"]["lr"]) for n in order]
    assert away == [0, 1, 1, 1, 1, 2, 2, 2, 2]
    # an lr the candidates round (to 3 significant digits) is still the plan's own
    odd = {**run, "recipe": {**run["recipe"], "lr": 0.0012345}}
    first = {c.name: c for c in candidates_for(odd, lambda f: False)}[prior_order(candidates_for(odd, lambda f: False), odd)[0]]
    assert first.fields["recipe.lr"] == 0.00123 and first.fields["model.d_model"] == run["model"]["d_model"]
    assert sorted(order) == sorted(by)


def test_rung_results_keep_their_loss_error_across_the_record():
    r = N("a", 0.1, 1.5, 0.02)
    assert RungResult.from_json(r.to_json()) == r
    nan = RungResult.from_json(N("a", 0.1, math.nan, math.nan).to_json())
    assert math.isnan(nan.loss) and math.isnan(nan.loss_se)
    old = {"candidate": "a", "rung": 0, "steps": 10, "heldout": 0.1, "loss": 1.5, "cpu_s": 1.0}   # written before the field
    assert math.isnan(RungResult.from_json(old).loss_se)


# ---- the prediction on tables -----------------------------------------------------------------


@pytest.mark.parametrize("rows, steps, why", [
    ([R("w", 0, .2, cpu=2), R("w", 1, .6, cpu=2)], 37, ""),        # +0.4 per doubling: 20 * 2**(0.35 / 0.4) = 36.7
    ([R("w", 0, .2, cpu=2), R("w", 1, .96, cpu=2)], 20, ""),       # reached in the pilot: its first rung end there
    ([R("w", 0, .3, cpu=2), R("w", 1, .3, cpu=2)], None, "did not rise"),
    ([R("w", 0, .3, cpu=2)], None, "one point"),
    ([R("w", 0, 0.0, cpu=2), R("w", 1, .01, cpu=2)], None, "too far"),   # measured: 0 -> 0.01 said 10^31 steps
    ([R("w", 0, .5, cpu=2), R("w", 1, .625, cpu=2)], 122, ""),           # 2.6 doublings more: within the 3 allowed
])
def test_the_prediction_extrapolates_the_winners_curve(rows, steps, why):
    p = predict(rows + [R("x", 0, .9)], "w", 0.95)
    assert p.steps == steps and why in p.why
    if steps is not None:
        assert p.worker_cpu_s == pytest.approx(steps * 4 / 20) and p.cpu_per_step == pytest.approx(0.2)


# ---- candidates ---------------------------------------------------------------------------------


def test_candidates_vary_only_fields_the_goal_leaves_out():
    run = RunConfig().model_dump(mode="json")
    all9 = candidates_for(run, lambda f: False)
    assert len(all9) == 9 and {c.fields["recipe.lr"] for c in all9} == {0.001, 0.003, 0.009}
    for c in all9:   # each one a config the trainer accepts
        RunConfig.parse({**run, "model": {**run["model"], "d_model": c.fields["model.d_model"],
                                          "n_layers": c.fields["model.n_layers"]}})
    lr_written = candidates_for(run, lambda f: f == "recipe.lr")
    assert len(lr_written) == 3 and all("recipe.lr" not in c.fields for c in lr_written)
    assert candidates_for(run, lambda f: True) == (Candidate("as-written", {}),)


# ---- a real tiny pilot --------------------------------------------------------------------------


def tiny_goal(worker_cpu_s: float) -> Goal:
    data = yaml.safe_load(MINIMAL.read_text())
    data["budget"] = {**data["budget"], "worker_cpu_s": worker_cpu_s}
    data["run"] = {"model": {"n_layers": 1}}   # written: the pilot never varies or chooses it
    return Goal.parse(data)


def test_a_tiny_pilot_on_the_minimal_addition_goal(tmp_path):
    goal = tiny_goal(worker_cpu_s=8.0)
    seen: list[tuple[RungResult, float]] = []
    res = pilot(goal, share=0.5, base_steps=3, sizes=[(16, 2), (32, 2)], lrs=[3e-3, 1e-2], eval_size=16,
                work_dir=tmp_path / "p", on_result=lambda r, spent: seen.append((r, spent)))
    assert [c.name for c in res.candidates] == ["d16-lr0.003", "d16-lr0.01", "d32-lr0.003", "d32-lr0.01"]
    assert len(seen) == len(res.results) >= 1 and [r for r, _ in seen] == list(res.results)
    # the CPU stays within the share, but for the one run that may pass it
    assert res.budget_cpu_s == 4.0
    assert res.cpu_s <= res.budget_cpu_s + max(r.cpu_s for r in res.results) + 0.5, res.lines()
    assert res.cpu_s >= math.fsum(r.cpu_s for r in res.results) - 1e-6
    assert res.spent_share == pytest.approx(res.cpu_s / 8.0)
    assert res.stop.reason in ("one_left", "budget")
    # rungs go on from their checkpoints: every step of a candidate is trained once
    for c in res.candidates:
        mine = [r for r in res.results if r.candidate == c.name]
        if len(mine) > 1:
            rows = [r["step"] for r in read_jsonl(tmp_path / "p" / c.name / "metrics.jsonl") if not r.get("final")]
            assert rows == list(range(1, max(r.steps for r in mine) + 1)), c.name
    # the winner's fields are the plan's, source pilot; the written field is the goal's
    plan = piloted_plan(goal.plan(), res)
    for field, value in res.winner.fields.items():
        ch = plan.get(field)
        assert ch.source is Source.PILOT and ch.value == value and ch.evidence["winner"] == res.winner.name
    assert set(res.winner.fields) == {"model.d_model", "recipe.lr"}
    assert plan.get("model.n_layers").source is Source.USER and plan.get("model.n_layers").value == 1
    run = plan.run(goal.run)
    assert get_dotted(run, "model.d_model")[1] == res.winner.fields["model.d_model"] and run["model"]["n_layers"] == 1
    assert goal.run == {"model": {"n_layers": 1}}, "the goal's own run is never rewritten"
    # the pilot measured at one torch thread, and the run trains at what it measured
    assert plan.get("threads").source is Source.PILOT and run["threads"] == 1
    lines = "\n".join(res.lines())
    assert res.winner.name in lines and "prediction:" in lines and "held-out / loss / CPU-s" in lines
    # the record's head holds the schedule as older pilots wrote it (the prior follows from the
    # candidates and the base config): a pilot killed under older code resumes
    head = json.loads((tmp_path / "p" / "pilot.jsonl").read_text().splitlines()[0])
    assert set(head["schedule"]) == {"candidates", "base_steps", "budget_cpu_s", "eta", "threshold", "strict"}
    # a second start in the same folder resumes from the record: nothing runs again
    again: list = []
    res2 = pilot(goal, share=0.5, base_steps=3, sizes=[(16, 2), (32, 2)], lrs=[3e-3, 1e-2], eval_size=16,
                 work_dir=tmp_path / "p", on_result=lambda r, s: again.append(r))
    assert again == [] and res2.results == res.results and res2.winner == res.winner
    with pytest.raises(PilotError, match="another pilot"):
        pilot(goal, share=0.5, base_steps=4, sizes=[(16, 2)], lrs=[3e-3], eval_size=16, work_dir=tmp_path / "p")


def test_a_tiny_pilot_stops_when_its_share_is_spent(tmp_path):
    """0.3 CPU-s for a schedule of 8 x 40 steps (more than a second of CPU here): the budget ends it."""
    goal = tiny_goal(worker_cpu_s=8.0)
    res = pilot(goal, share=0.0375, base_steps=40, sizes=[(16, 2), (32, 2)], lrs=[3e-3, 1e-2], eval_size=16,
                work_dir=tmp_path)
    assert res.stop.reason == "budget", res.lines()
    assert res.cpu_s <= res.budget_cpu_s + max(r.cpu_s for r in res.results) + 0.5, res.lines()
    assert res.winner.name in {r.candidate for r in res.results}
    assert piloted_plan(goal.plan(), res).get("recipe.lr").source is Source.PILOT
    # threads the goal writes stay the goal's
    data = yaml.safe_load(MINIMAL.read_text())
    written = Goal.parse({**data, "run": {"model": {"n_layers": 1}, "threads": 2}})
    assert piloted_plan(written.plan(), res).get("threads").source is Source.USER


def test_the_winners_checkpoint_starts_the_run(tmp_path):
    """The plan starts the run from the winner's last checkpoint: at its start the live run holds the
    checkpoint's weights, optimiser state and step, and its steps go on from there; a checkpoint of
    another model size is one clear error."""
    goal = tiny_goal(worker_cpu_s=8.0)
    res = pilot(goal, share=0.5, base_steps=3, sizes=[(16, 2), (32, 2)], lrs=[3e-3], eval_size=16,
                work_dir=tmp_path / "p")
    last = max(r.steps for r in res.results if r.candidate == res.winner.name)
    assert res.checkpoint == str((tmp_path / "p" / res.winner.name / "checkpoints" / f"step_{last:07d}.pt").resolve())
    assert res.trained == {"model.d_model": res.winner.fields["model.d_model"], "model.n_layers": 1, "recipe.lr": 3e-3}
    plan = piloted_plan(goal.plan(), res, goal.run)
    assert start_refused(plan, res, goal.run) is None
    assert (plan.get("fork_from").value, plan.get("fork_mode").value) == (res.checkpoint, "full")
    assert plan.get("fork_from").source is Source.PILOT and plan.get("fork_from").evidence["steps"] == last
    goal.adopt(plan)
    cfg = goal.run_config("train", str(tmp_path / "runs"))
    assert cfg.fork_from == res.checkpoint and cfg.fork_mode == "full"

    t = Trainer(cfg)
    t._start()   # what run() does before its first step
    saved = torch.load(res.checkpoint, map_location="cpu", weights_only=False)
    assert t.step == last == saved["step"]
    # the pilot trained on the live run's lr schedule (recipe.steps = budget.steps): the run goes on with it
    assert saved["recipe"]["steps"] == goal.budget.steps and saved["recipe"]["lr"] == cfg.recipe.lr
    model = t.policy.model.state_dict()
    assert model.keys() == saved["model"].keys() and all(torch.equal(model[k], saved["model"][k]) for k in model)
    assert t.opt.state_dict()["state"], "the optimiser's moments go on from the pilot"
    assert t.recipe.steps == cfg.recipe.steps, "the recipe is the run's, not the pilot's"
    # the untrained start of the winner's run is this run's `init` (a fix that starts over starts
    # there), with this run's recipe; the newest checkpoint is the fork point, where a restart resumes
    winner_init = torch.load(pathlib.Path(res.checkpoint).parent / "init.pt", map_location="cpu", weights_only=False)
    own = t.ckpt.load("init")
    assert own["step"] == 0 and all(torch.equal(own["model"][k], winner_init["model"][k]) for k in own["model"])
    assert own["recipe"] == cfg.recipe.model_dump(mode="json")
    assert t.ckpt.load_latest_good()["step"] == last
    t.close()
    # restarted before a checkpoint of its own: it goes on from the fork again, not from the
    # untrained start it keeps for fixes that start over
    again = Trainer(cfg)
    again._start()
    assert again.step == last and all(torch.equal(again.policy.model.state_dict()[k], saved["model"][k]) for k in model)
    again.close()
    # and when none of its own checkpoints verifies, it goes on from the fork, not from random weights
    for pt in (tmp_path / "runs" / "train" / "checkpoints").glob("*.pt"):
        pt.write_bytes(pt.read_bytes()[:-10])
    torn = Trainer(cfg)
    torn._start()
    assert torn.step == last and all(torch.equal(torn.policy.model.state_dict()[k], saved["model"][k]) for k in model)
    torn.close()
    # the run trains on from the winner's step: its first metrics row is the step after it
    summary = Trainer(cfg.model_copy(update={"name": "train2"})).run(until=last + 2)
    rows = [r["step"] for r in read_jsonl(tmp_path / "runs" / "train2" / "metrics.jsonl") if not r.get("final")]
    assert rows == [last + 1, last + 2] and summary["step"] == last + 2
    # a source whose `init` does not verify: the run goes on without one, and says so
    init_pt = pathlib.Path(res.checkpoint).parent / "init.pt"
    init_pt.write_bytes(init_pt.read_bytes()[:-10])
    t3 = Trainer(cfg.model_copy(update={"name": "train3"}))
    t3._start()
    assert "init" not in {m["name"] for m in t3.ckpt.manifests()}
    events = read_jsonl(tmp_path / "runs" / "train3" / "events.jsonl")
    assert any(e["event"] == "checkpoint_corrupt" and e.get("name") == "init" for e in events), events
    t3.close()

    other = cfg.model_copy(update={"name": "other", "model": cfg.model.model_copy(update={"d_model": 48})})
    with pytest.raises(ConfigError, match="does not fit this run's model"):
        Trainer(other).run(until=last + 1)
    with pytest.raises(ConfigError, match="checkpoint file not found"):
        Trainer(cfg.model_copy(update={"name": "gone", "fork_from": str(tmp_path / "none.pt")})).run(until=last + 1)


def test_a_written_size_or_lr_keeps_the_checkpoint_out(tmp_path):
    """A field the user writes wins over the winner's: the run trains it, from scratch (the winner's
    weights were trained at another value), and the plan says why."""
    goal = tiny_goal(worker_cpu_s=8.0)
    res = pilot(goal, share=0.5, base_steps=2, sizes=[(16, 2)], lrs=[3e-3], eval_size=8, work_dir=tmp_path / "p")
    assert res.checkpoint is not None
    data = yaml.safe_load(MINIMAL.read_text())
    for run, field in (({"model": {"n_layers": 1}, "recipe": {"lr": 0.05}}, "recipe.lr"),
                       ({"model": {"n_layers": 1, "d_model": 32}}, "model.d_model"),
                       ({"model": {"n_layers": 2}}, "model.n_layers")):
        written = Goal.parse({**data, "run": run})
        plan = piloted_plan(written.plan(), res, written.run)
        assert plan.get(field).source is Source.USER
        with pytest.raises(KeyError):
            plan.get("fork_from")
        assert "fork_from" not in plan.run(written.run)
        assert any(f"{field}=" in n and "(user) differs" in n and "from scratch" in n for n in plan.notes), plan.notes
    # the same value written as the winner's: the checkpoint fits and starts the run
    same = Goal.parse({**data, "run": {"model": {"n_layers": 1}, "recipe": {"lr": 3e-3}}})
    assert piloted_plan(same.plan(), res, same.run).get("fork_from").value == res.checkpoint
    # a fork_from the goal writes is the goal's; a pilot in a temporary folder kept no checkpoint
    own = Goal.parse({**data, "run": {"model": {"n_layers": 1}, "fork_from": res.checkpoint, "fork_mode": "weights"}})
    assert start_refused(own.plan(), res, own.run) == "the goal writes fork_from"
    assert "temporary folder" in start_refused(goal.plan(), dataclasses.replace(res, checkpoint=None), goal.run)


def test_bad_pilot_input_is_refused_before_any_run(tmp_path):
    goal = tiny_goal(worker_cpu_s=8.0)
    for share in (0, -0.1, 1.5):
        with pytest.raises(PilotError, match="share"):
            pilot(goal, share=share, work_dir=tmp_path)
    with pytest.raises(PilotError, match="candidate d10"):   # head dim 10/4: not a model the trainer builds
        pilot(goal, share=0.5, sizes=[(10, 1)], lrs=[1e-3], work_dir=tmp_path / "x")
    assert not (tmp_path / "x" / "d10-lr0.001").exists()


# ---- the command --------------------------------------------------------------------------------


def test_swarm_plan_prints_the_plan_and_refuses_bad_input_in_one_line(tmp_path):
    res = runner.invoke(app, ["plan", str(MINIMAL)])
    assert res.exit_code == 0, res.output
    assert "from the task:" in res.stdout and "pilot:" not in res.stdout
    bad = runner.invoke(app, ["plan", str(MINIMAL), "--pilot", "--pilot-share", "0"])
    assert bad.exit_code == 2 and "--pilot-share=0" in bad.output and len(bad.output.strip().splitlines()) == 1
    missing = runner.invoke(app, ["plan", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2 and len(missing.output.strip().splitlines()) == 1


def test_swarm_plan_pilot_shows_its_table_progress_and_prediction(tmp_path):
    data = yaml.safe_load(MINIMAL.read_text())
    data["budget"] = {"worker_cpu_s": 2.0, "steps": 100}   # the budget stops it after a few 10-step runs
    g = tmp_path / "goal.yaml"
    g.write_text(yaml.safe_dump(data))
    res = runner.invoke(app, ["plan", str(g), "--pilot", "--pilot-share", "1", "--pilot-dir", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    assert "from the pilot: model.d_model=" in res.stdout and "recipe.lr=" in res.stdout
    assert "winner:" in res.stdout and "prediction:" in res.stdout
    progress = [ln for ln in res.stderr.splitlines() if ln.startswith("pilot: ")]
    assert progress and all("rung 0 (10 steps)" in ln for ln in progress[:1])
    assert len(progress) == len(read_jsonl(tmp_path / "p" / "pilot.jsonl")) - 1   # one line per finished run
