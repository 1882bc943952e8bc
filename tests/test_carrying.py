"""A fix whose backtest measured nothing (every arm at the floor) is carried by the next cause's
fix (`Deciding.carrying`, run on every proposal the controller prepares): two faults that each hold
the run at the floor are each measured at nothing alone, and fixed only together. A real controller
and its sqlite store."""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from agents.base import rollback_target  # noqa: E402
from agents.domain import BacktestResult, Diagnosis, Intervention, InterventionKind as K, Status  # noqa: E402
from test_claims import close, controller  # noqa: E402

FLOOR = BacktestResult(metric="heldout_acc", candidate=[0.0, 0.0], control=[0.0, 0.0], effect=0.0, p_value=1.0,
                       test="t", horizon_steps=40, seeds=[0, 1], passed=False, harmed=False, eval_size=200)


def iv(kind: K, changes: dict, name: str, **evidence) -> Intervention:
    d = Diagnosis(name=name, summary=f"{name} found", severity="warning", operator="o", policy="builtin",
                  evidence=evidence)
    return Intervention(kind=kind, changes=changes, diagnosis=d, rationale="r", operator="o", policy="builtin")


def named(ctrl, *names: str) -> None:
    ctrl.tick.findings = [Diagnosis(name=n, summary="s", severity="warning", operator="detectors", policy="builtin")
                          for n in names]


def test_the_next_causes_fix_carries_one_that_measured_nothing(tmp_path):
    ctrl = controller(tmp_path)
    try:
        limit = iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 6}, "truncation")
        ctrl.store.put(limit.model_copy(update={"status": Status.REJECTED, "backtest": FLOOR}))
        named(ctrl, "truncation", "too_hard_curriculum")
        ease = iv(K.DATA_CHANGE, {"harness.curriculum.start": 2}, "too_hard_curriculum")
        out = ctrl.carrying(ease)
        assert out.kind == K.DATA_CHANGE
        assert out.changes == {"harness.sampling.max_new_tokens": 6, "harness.curriculum.start": 2}
        assert out.diagnosis.evidence["answers"] == ["truncation"] and "measured nothing" in out.rationale
        # the cause no longer named, or a change of the same field: as proposed
        named(ctrl, "too_hard_curriculum")
        assert ctrl.carrying(ease) == ease
        named(ctrl, "truncation", "too_hard_curriculum")
        other = iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 12}, "too_hard_curriculum")
        assert ctrl.carrying(other) == other
        # a fix whose arms left the floor measured itself: nothing carried
        moved = FLOOR.model_copy(update={"candidate": [0.3, 0.35], "control": [0.3, 0.4], "effect": -0.025})
        ctrl.store.put(limit.model_copy(update={"id": "moved", "status": Status.REJECTED, "backtest": moved}))
        assert ctrl.carrying(ease) == ease
    finally:
        close(ctrl)


def test_a_carried_rollback_makes_the_change_one_to_its_checkpoint(tmp_path):
    ctrl = controller(tmp_path)
    try:
        start_over = iv(K.ROLLBACK, {"harness.sampling.max_new_tokens": 6}, "truncation", rollback_to="init")
        ctrl.store.put(start_over.model_copy(update={"status": Status.REJECTED, "backtest": FLOOR}))
        named(ctrl, "truncation", "too_hard_curriculum")
        out = ctrl.carrying(iv(K.DATA_CHANGE, {"harness.curriculum.start": 2}, "too_hard_curriculum"))
        assert out.kind == K.ROLLBACK and rollback_target(out) == "init"
        assert out.changes == {"harness.sampling.max_new_tokens": 6, "harness.curriculum.start": 2}
        # a rollback to another checkpoint cannot carry it
        mine = iv(K.ROLLBACK, {"harness.curriculum.start": 2}, "too_hard_curriculum", rollback_to="step_0000040")
        assert ctrl.carrying(mine) == mine
        # a restart carries nothing
        restart = iv(K.RESTART, {}, "crashed_job")
        assert ctrl.carrying(restart) == restart
    finally:
        close(ctrl)


def test_a_cause_whose_fix_measured_nothing_waits_for_another_named_cause_untried(tmp_path):
    """The lead's order: a retry of a fix that measured nothing goes after the first try of another
    named cause's fix (which carries it), whatever the severities; with no such history, the most
    severe first."""
    from agents.base import OperatorContext
    from agents.operators import Lead
    from swarm.goal import Target

    def ctx(history):
        return OperatorContext(goal="g", target=Target(threshold=0.9), recipe={"algorithm": "sft", "lr": 1e-5},
                               harness={}, start_harness={}, eval_difficulty=2, history=history)

    def critical(x: Intervention) -> Intervention:
        return x.model_copy(update={"diagnosis": x.diagnosis.model_copy(update={"severity": "critical"})})

    ease = critical(iv(K.DATA_CHANGE, {"harness.curriculum.start": 2}, "too_hard_curriculum"))
    retry = critical(iv(K.ROLLBACK, {"harness.curriculum.start": 2}, "too_hard_curriculum", rollback_to="init"))
    raise_lr = iv(K.RECIPE_EDIT, {"recipe.lr": 3e-3, "harness.curriculum.start": 2}, "small_updates",
                  answers=["too_hard_curriculum"])
    assert Lead().arbitrate([retry, raise_lr], ctx([]))[0] is retry        # the most severe first
    measured_nothing = ease.model_copy(update={"status": Status.REJECTED, "backtest": FLOOR})
    assert Lead().arbitrate([retry, raise_lr], ctx([measured_nothing]))[0] is raise_lr
    # a fix whose arms left the floor measured itself: severity decides again
    moved = FLOOR.model_copy(update={"candidate": [0.3, 0.35], "control": [0.3, 0.4], "effect": -0.025})
    lost = ease.model_copy(update={"status": Status.REJECTED, "backtest": moved})
    assert Lead().arbitrate([retry, raise_lr], ctx([lost]))[0] is retry
    # a critical rollback that retries nothing keeps its place ahead of a departure's edit, which
    # waits for the rolled-back run
    template = critical(iv(K.ROLLBACK, {"harness.template": "{question}="}, "template_mismatch", rollback_to="step_40"))
    drift = iv(K.HARNESS_EDIT, {"harness.sampling.temperature": 1.0}, "harness_drift")
    assert Lead().arbitrate([drift, template], ctx([measured_nothing])) == [template]
    # a rollback out of a divergence cannot wait, retry or not: the edit waits for the rolled-back run
    spike_fix = iv(K.RECIPE_EDIT, {"recipe.lr": 1e-6}, "loss_spike").model_copy(
        update={"status": Status.REJECTED, "backtest": FLOOR})
    out_of_spike = critical(iv(K.ROLLBACK, {"recipe.lr": 1e-6}, "loss_spike", rollback_to="step_40"))
    limit = iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 8}, "truncation")
    assert Lead().arbitrate([limit, out_of_spike], ctx([spike_fix])) == [out_of_spike]
    # the search's next candidate for a finding is another change, not a retry of the one that measured nothing
    search = iv(K.RECIPE_EDIT, {"recipe.lr": 1e-4}, "too_hard_curriculum")
    assert Lead().arbitrate([raise_lr, critical(search)], ctx([measured_nothing]))[0].diagnosis.name == "too_hard_curriculum"


def test_a_retry_of_a_fix_that_measured_nothing_waits_a_look_for_a_cause_named_too_recently(tmp_path):
    """The truncation fix measured nothing; the curriculum is named on one look only, so its fix
    waits for a second (a one-look false alarm). The retry waits with it instead of taking the turn:
    once the curriculum is seen again, both go to the lead, whose order puts the curriculum's fix,
    carrying the limit's, first."""
    from swarm.graph import SwarmState

    ctrl = controller(tmp_path)
    try:
        limit = iv(K.HARNESS_EDIT, {"harness.sampling.max_new_tokens": 6}, "truncation")
        ctrl.store.put(limit.model_copy(update={"status": Status.REJECTED, "backtest": FLOOR}))
        for n, step in ((1, 10), (2, 30)):
            ctrl.store.record_look(n, step, ["truncation"], keep=10)
        ctrl.store.record_look(3, 50, ["truncation", "too_hard_curriculum"], keep=10)
        ctrl.memo.looks = 3
        named(ctrl, "truncation", "too_hard_curriculum")
        retry = iv(K.ROLLBACK, {"harness.sampling.max_new_tokens": 6}, "truncation", rollback_to="init")
        ease = iv(K.DATA_CHANGE, {"harness.curriculum.start": 2}, "too_hard_curriculum")
        state = SwarmState(job_status="RUNNING", tick=3, step=60)
        assert ctrl.worth_it([retry, ease], state) == []
        waits = [r for r in ctrl.store.timeline("deferred") if r.get("diagnosis") == "truncation"]
        assert waits and "too_hard_curriculum" in waits[-1]["reason"]
        # without the newly named cause the retry goes on its own
        named(ctrl, "truncation")
        assert ctrl.worth_it([retry], state) == [retry]
        # seen again on a later look: both go, the lead's order decides
        named(ctrl, "truncation", "too_hard_curriculum")
        ctrl.store.record_look(4, 60, ["truncation", "too_hard_curriculum"], keep=10)
        ctrl.memo.looks = 4
        assert ctrl.worth_it([retry, ease], state) == [retry, ease]
    finally:
        close(ctrl)
