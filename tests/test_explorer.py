"""The explorer (agents/explorer.py): a search over the fields the trainer declares tunable, for a
stuck run whose cause no detector names — the lr in both directions first, the next untried
candidate each time, from the untrained checkpoint when the run never learnt, quiet on healthy
runs and when another finding names the cause; and the lead lets the search move on after a loss."""
from __future__ import annotations

import sys
import pathlib

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from agents.base import rollback_target  # noqa: E402
from agents.detection import run_detectors  # noqa: E402
from agents.domain import Diagnosis, InterventionKind as K, Status  # noqa: E402
from agents.explorer import CAUSES, Explorer, candidates, moves  # noqa: E402
from agents.operators import Lead  # noqa: E402
from test_detectors import grpo_rows, make_ev, sft_rows, stuck_rows  # noqa: E402
from test_operators import ctx, iv_  # noqa: E402
from trainer.config import TUNABLE  # noqa: E402

STUCK_CTX = dict(recipe={"algorithm": "sft", "lr": 0.3, "batch_size": 64, "kl_coef": 0.0, "group_size": 8})


def explore(rows, **kw):
    return Explorer().builtin(make_ev(rows), ctx(**{**STUCK_CTX, **kw}))


def test_a_stuck_run_gets_the_lr_searched_down_then_up_then_the_next_field():
    (first,) = explore(stuck_rows())
    assert (first.kind, first.changes, first.diagnosis.name) == (K.RECIPE_EDIT, {"recipe.lr": 0.03}, "not_learning")
    assert "No detector names a cause" in first.rationale and "candidate 1 of" in first.rationale
    lost = first.model_copy(update={"status": Status.REJECTED})
    (second,) = explore(stuck_rows(), history=[lost])
    assert second.changes == {"recipe.lr": 0.1}                 # x3 is 0.9: clipped to the range's top
    (third,) = explore(stuck_rows(), history=[lost, second.model_copy(update={"status": Status.REJECTED})])
    assert list(third.changes) != ["recipe.lr"]                # both directions tried: the next field


def test_a_run_that_never_learnt_is_explored_from_its_untrained_checkpoint():
    cps = [{"name": "init", "step": 0}, {"name": "step_0000050", "step": 50}]
    (iv,) = explore(stuck_rows(), checkpoints=cps)
    assert (iv.kind, rollback_target(iv), iv.changes) == (K.ROLLBACK, "init", {"recipe.lr": 0.03})


def test_a_plateaued_grpo_run_is_explored_too():
    rows = grpo_rows(n=80)
    for r in rows:                       # stuck in training and on held-out alike: nothing names a cause
        r.update(pass_rate=0.2, reward_mean=0.2)
        if "heldout_acc" in r:
            r["heldout_acc"] = 0.2
    (iv,) = Explorer().builtin(make_ev(rows), ctx(recipe={"algorithm": "grpo", "lr": 5e-4, "batch_size": 16},
                                                  target={"threshold": 0.9}))
    assert iv.diagnosis.name == "plateau" and iv.changes == {"recipe.lr": 5e-5}
    fields = [next(iter(c)) for c in candidates(ctx(recipe={"algorithm": "grpo", "lr": 5e-4}), "grpo")]
    assert "harness.sampling.temperature" in fields            # a GRPO-only field is searched on GRPO
    assert "harness.sampling.temperature" not in [next(iter(c)) for c in candidates(ctx(), "sft")]


def test_quiet_on_a_healthy_run_and_when_a_finding_names_the_cause():
    assert Explorer().builtin(make_ev(sft_rows(n=120)), ctx(target={"threshold": 0.9})) == []   # there
    assert Explorer().builtin(make_ev(sft_rows(n=50)), ctx()) == []                            # still rising
    # stopped at 0.92 for four evals below a target of 0.95: a plateau, and a search is what it gets
    assert Explorer().builtin(make_ev(sft_rows(n=120)), ctx())
    c = ctx(**STUCK_CTX)
    found = run_detectors(make_ev(stuck_rows()), known=c.known())
    assert any(d.name == "not_learning" for d in found)
    cause = Diagnosis(name="truncation", summary="answers cut", severity="warning", operator="t", policy="builtin")
    assert "truncation" in CAUSES
    assert Explorer().builtin(make_ev(stuck_rows()), c.with_findings(found + [cause])) == []
    info = cause.model_copy(update={"name": "throughput_drop", "severity": "info"})
    assert Explorer().builtin(make_ev(stuck_rows()), ctx(**STUCK_CTX).with_findings(found + [info]))
    # a cause whose every fix failed holds the search back no longer; one still pending does
    fix = iv_(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation")
    for status, searched in ((Status.REJECTED, True), (Status.ROLLED_BACK, True), (Status.BACKTESTING, False)):
        c = ctx(**STUCK_CTX, history=[fix.model_copy(update={"status": status})])
        assert bool(Explorer().builtin(make_ev(stuck_rows()), c.with_findings(found + [cause]))) is searched, status
    # rejected without evidence against it: its retry over a longer horizon comes first
    from agents.domain import BacktestResult
    unsure = BacktestResult(metric="heldout_acc", candidate=[0.1], control=[0.1], effect=-0.01, p_value=0.5, test="t",
                            horizon_steps=40, seeds=[0], passed=False, harmed=False)
    c = ctx(**STUCK_CTX, history=[fix.model_copy(update={"status": Status.REJECTED, "backtest": unsure})])
    assert Explorer().builtin(make_ev(stuck_rows()), c.with_findings(found + [cause])) == []


def test_every_candidate_stays_in_its_fields_range_and_moves():
    for t in TUNABLE:
        for cur in (t.lo, t.hi, (t.lo + t.hi) / 2):
            cur = int(cur) if t.integer else cur
            for v in moves(t, cur):
                assert t.lo <= v <= t.hi and v != cur, (t.field, cur, v)


def test_every_tried_candidate_ends_the_search():
    c = ctx(**STUCK_CTX)
    tried = [iv_(K.RECIPE_EDIT, ch, "not_learning", status=Status.REJECTED) for ch in candidates(c, "sft")]
    assert explore(stuck_rows(), history=tried) == []


def test_the_lead_lets_the_next_candidate_through_after_a_loss():
    (first,) = explore(stuck_rows())
    lost = first.model_copy(update={"status": Status.REJECTED})
    (second,) = explore(stuck_rows(), history=[lost])
    assert Lead().arbitrate([second], ctx(history=[lost])) == [second]


@pytest.mark.parametrize("name", ["not_learning", "plateau"])
def test_the_explorer_reads_only_the_stuck_findings(name):
    assert name in Explorer.detectors and name not in CAUSES


def test_a_move_that_left_the_run_stuck_bounds_the_next_ones():
    lr = next(t for t in TUNABLE if t.field == "recipe.lr")
    assert moves(lr, 0.001) == [0.0001, 0.003]                 # no history: down first
    assert moves(lr, 0.001, came_from=0.3) == [0.003, 0.0001]  # came down from 0.3: back up first, short of it
    assert moves(lr, 0.03, came_from=0.06)[0] == pytest.approx((0.03 * 0.06) ** 0.5, rel=1e-5)   # x3 passes it
    assert moves(lr, 0.03, came_from=0.06)[1] == 0.003
    # the bracket has narrowed below what a backtest tells apart (a quarter of the x3 step): no
    # move inside it, the move away is still offered
    assert moves(lr, 0.000683852, came_from=0.000519615) == [0.00205156]
    assert moves(lr, 0.000624038, came_from=0.000623996) == [0.00187211]


def test_stuck_again_after_a_lower_lr_was_kept_the_search_goes_back_up_from_the_start():
    """A learning rate of 0.3 lowered to 0.001 from the untrained checkpoint for not_learning, kept,
    and the run still does not learn: Diagnostics does not lower it again; the explorer's first
    candidate is 0.003 (up, below the 0.3 it came from), again from the untrained checkpoint."""
    from agents.operators import Diagnostics

    rows = stuck_rows()
    for r in rows:
        r["lr"] = 0.001
    kept = iv_(K.ROLLBACK, {"recipe.lr": 0.001}, "not_learning", status=Status.KEPT, rollback_to="init")
    kept.outcome.before = {"recipe.lr": 0.3}
    cps = [{"name": "init", "step": 0}, {"name": "step_0000050", "step": 50}]
    c = ctx(recipe={**STUCK_CTX["recipe"], "lr": 0.001}, history=[kept], checkpoints=cps)
    assert not [iv for iv in Diagnostics().builtin(make_ev(rows), c) if iv.diagnosis.name == "not_learning"]
    (iv,) = Explorer().builtin(make_ev(rows), c)
    assert (iv.kind, iv.changes, rollback_target(iv)) == (K.ROLLBACK, {"recipe.lr": 0.003}, "init")


def test_a_fix_that_measured_nothing_is_carried_by_each_candidate_of_the_search():
    """The fix for a named cause was backtested with every arm at 0: something else holds the run at
    the floor too (an answer limit too short and an lr far too high, say). The search goes on, each
    candidate with that fix in it, skipping the fix's own fields; a fix that measured something
    against it, or goes on, still holds the search back."""
    from agents.domain import BacktestResult

    c = ctx(**STUCK_CTX)
    found = run_detectors(make_ev(stuck_rows()), known=c.known())
    cause = Diagnosis(name="truncation", summary="answers cut", severity="warning", operator="t", policy="builtin")
    floor = BacktestResult(metric="heldout_acc", candidate=[0.0, 0.0], control=[0.0, 0.0], effect=0.0, p_value=1.0,
                           test="t", horizon_steps=40, seeds=[0, 1], passed=False, harmed=False, eval_size=200)
    fix = iv_(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation")
    lost = fix.model_copy(update={"status": Status.REJECTED, "backtest": floor})
    (first,) = Explorer().builtin(make_ev(stuck_rows()), ctx(**STUCK_CTX, history=[lost]).with_findings(found + [cause]))
    assert first.changes == {"recipe.lr": 0.03, "harness.sampling.max_new_tokens": 8}, first.changes
    assert first.kind == K.RECIPE_EDIT and "measured nothing" in first.rationale and "truncation" in first.rationale
    # that candidate tried: the next one, with the fix still carried
    (second,) = Explorer().builtin(make_ev(stuck_rows()), ctx(**STUCK_CTX, history=[
        lost, first.model_copy(update={"status": Status.REJECTED})]).with_findings(found + [cause]))
    assert second.changes == {"recipe.lr": 0.1, "harness.sampling.max_new_tokens": 8}
    # arms that left the floor measured the fix: no gain there is its own answer (its retry first)
    moved = floor.model_copy(update={"candidate": [0.2, 0.3], "control": [0.25, 0.3], "effect": -0.025})
    c = ctx(**STUCK_CTX, history=[fix.model_copy(update={"status": Status.REJECTED, "backtest": moved})])
    assert Explorer().builtin(make_ev(stuck_rows()), c.with_findings(found + [cause])) == []
    # the fix proposed again and waiting for its backtest: it goes first
    again = fix.model_copy(update={"id": "again", "status": Status.BACKTESTING})
    c = ctx(**STUCK_CTX, history=[lost, again])
    assert Explorer().builtin(make_ev(stuck_rows()), c.with_findings(found + [cause])) == []


def test_the_carried_fix_is_answered_by_the_candidate_and_keeps_its_checkpoint():
    """The candidate answers the causes whose fix it carries (the judge does not count them as faults
    it leaves in force); a rollback fix's checkpoint stays with it; a joint fix answers its parts."""
    from agents.domain import BacktestResult

    found = run_detectors(make_ev(stuck_rows()), known=ctx(**STUCK_CTX).known())
    floor = BacktestResult(metric="heldout_acc", candidate=[0.0], control=[0.0], effect=0.0, p_value=1.0,
                           test="t", horizon_steps=40, seeds=[0], passed=False, harmed=False, eval_size=200)

    def cause(name):
        return Diagnosis(name=name, summary="s", severity="warning", operator="t", policy="builtin")

    pin = iv_(K.ROLLBACK, {"harness.filters.as_of_step": 40}, "label_noise")
    pin.diagnosis = pin.diagnosis.model_copy(update={"evidence": {"rollback_to": "step_0000040",
                                                                  "answers": ["label_noise", "repeated_examples"]}})
    lost = pin.model_copy(update={"status": Status.REJECTED, "backtest": floor})
    c = ctx(**STUCK_CTX, history=[lost]).with_findings(found + [cause("label_noise"), cause("repeated_examples")])
    (iv,) = Explorer().builtin(make_ev(stuck_rows()), c)
    assert iv.kind == K.ROLLBACK and rollback_target(iv) == "step_0000040"
    assert iv.changes == {"recipe.lr": 0.03, "harness.filters.as_of_step": 40}
    assert iv.diagnosis.evidence["answers"] == ["label_noise", "repeated_examples"]


def test_a_named_cause_no_operator_answers_holds_no_search_back():
    """A finding whose operator proposes nothing for it in this state (a symptom like malformed
    answers on a run that learns nothing) would hold the search back for good: where the tick's
    proposals are known, only a cause with a fix proposed on this tick, or one pending or in
    effect, holds it back."""
    c = ctx(**STUCK_CTX)
    found = run_detectors(make_ev(stuck_rows()), known=c.known())
    cause = Diagnosis(name="malformed_rate", summary="answers malformed", severity="warning", operator="t", policy="builtin")
    assert "malformed_rate" in CAUSES

    def search(history=(), proposed=None):
        c = ctx(**STUCK_CTX, history=list(history)).with_findings(found + [cause])
        if proposed is not None:
            c = c.with_proposed(proposed)
        return Explorer().builtin(make_ev(stuck_rows()), c)

    assert search() == []                                      # the tick's proposals not known: held back
    assert search(proposed=[])                                  # nobody answers it: searched
    fix = iv_(K.HARNESS_EDIT, {"harness.template": "{question}="}, "malformed_rate")
    assert search(proposed=[fix]) == []                         # answered on this tick
    joint = iv_(K.DATA_CHANGE, {"harness.curriculum.start": 2}, "too_hard_curriculum")
    joint = joint.model_copy(update={"diagnosis": joint.diagnosis.model_copy(update={"evidence": {"answers": ["malformed_rate"]}})})
    assert search(proposed=[joint]) == []                       # a joint change's part
    assert search(history=[fix.model_copy(update={"status": Status.EVALUATING})], proposed=[]) == []   # in effect


def test_an_lr_lowered_from_the_live_state_is_judged_on_the_target_not_on_the_losses():
    """Within a backtest's horizon a lower lr lowers the loss whatever it does to the run (the noise
    of the larger steps settles: the short-horizon bias of lr decay). A search move down from the
    live state whose arms differ only in their losses measured nothing: rejected. The same change
    from a rollback's earlier checkpoint, and an lr raise, keep the losses; a gain on the target
    still validates a lower lr."""
    from swarm.backtest import anneals, rule_for
    from swarm.decisions import TARGET_SIGNAL, ArmScore, Pair, Rejected, Validated, decide

    base, recipe = {"recipe": {"algorithm": "sft", "lr": 3e-3}}, {"algorithm": "sft", "lr": 4.65e-3}

    def rule(kind, lr):
        return rule_for(iv_(kind, {"recipe.lr": lr}), base, alpha=0.2, higher_is_better=True, metric="heldout_acc",
                        eval_size=200, looks=1, look=1, recipe=recipe)

    down = rule(K.RECIPE_EDIT, 4.65e-4)
    assert anneals(iv_(K.RECIPE_EDIT, {"recipe.lr": 4.65e-4}), recipe)
    assert (down.losses_compare, down.heldout_compares) == (False, False)
    for kept in (rule(K.ROLLBACK, 4.65e-4), rule(K.RECIPE_EDIT, 1.4e-2)):
        assert (kept.losses_compare, kept.heldout_compares) == (True, True)
    # a rollback whose arms both start from its trained checkpoint settles the same noise; from the
    # untrained one there is none to settle
    for shared, losses in ((True, False), (False, True)):
        r = rule_for(iv_(K.ROLLBACK, {"recipe.lr": 4.65e-4}), base, alpha=0.2, higher_is_better=True,
                     metric="heldout_acc", eval_size=200, looks=1, look=1, recipe=recipe, shared=shared)
        assert (r.losses_compare, r.heldout_compares) == (losses, losses), shared
    assert anneals(iv_(K.RECIPE_EDIT, {"recipe.lr": "4.65e-4"}), {"lr": "4.65e-3"})   # read as numbers
    assert not anneals(iv_(K.RECIPE_EDIT, {"recipe.lr": 4.65e-4}), {})                # no lr in force: not told
    # the recipe in force decides, not the start config's: 3e-3 is below 4.65e-3, above the start's 3e-3 it is not
    assert rule(K.RECIPE_EDIT, 3e-3).losses_compare is False
    assert rule_for(iv_(K.RECIPE_EDIT, {"recipe.lr": 3e-3}), base, alpha=0.2, higher_is_better=True,
                    metric="heldout_acc", eval_size=200, looks=1, look=1).losses_compare is True

    def pairs(target_gain: float):
        return [Pair(s, ArmScore(target=0.21 + target_gain, format_fail=0.0, loss=0.50, loss_se=0.005,
                                 heldout_loss=0.78, heldout_loss_se=0.02),
                     ArmScore(target=0.21, format_fail=0.0, loss=0.55, loss_se=0.005, heldout_loss=0.86,
                              heldout_loss_se=0.02)) for s in (0, 1)]

    assert isinstance(decide(pairs(0.0), rule(K.ROLLBACK, 4.65e-4)), Validated)     # the losses read
    flat = decide(pairs(0.0), down)
    assert isinstance(flat, Rejected) and not flat.harmed, flat
    won = decide(pairs(0.2), down)
    assert isinstance(won, Validated) and won.signal.name == TARGET_SIGNAL, won
