"""The gate of a real controller (real sqlite store, real git workspace) on validated fixes of a
wrong starting config: the risk is assessed again with what the backtest measured, and while a fix
that moves a field too far waits for a human, the largest step not rated high is proposed as its
alternative, so the run does not idle.

The goal's own temperature is the fault (0.05 on GRPO): there is nothing to go back to, so
"back to the goal's value" gives no way out and the fix is a 20× raise.
"""
from __future__ import annotations

import pathlib

import pytest
import yaml

from agents.domain import BacktestResult, Diagnosis, Intervention, InterventionKind as K, Risk, Status
from swarm.controller import Controller
from swarm.goal import Goal

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def ctrl(tmp_path, clean_git_home):
    goal = yaml.safe_load((ROOT / "examples" / "goals" / "truncation.yaml").read_text())
    goal.pop("perturbations", None)
    goal["run"].setdefault("harness", {}).setdefault("sampling", {})["temperature"] = 0.05
    goal["run"].setdefault("recipe", {})["algorithm"] = "grpo"      # its updates read what it samples
    c = Controller.create(tmp_path / "w", Goal.parse(goal), jobs="process")
    yield c
    c._conn.close()
    c.knowledge.close()


def _validated(c: Controller, signal: str) -> Intervention:
    d = Diagnosis(name="low_temperature", summary="groups sample one answer", operator="diagnostics", policy="builtin")
    iv = c.assess(Intervention(kind=K.HARNESS_EDIT, changes={"harness.sampling.temperature": 1.0}, diagnosis=d,
                               rationale="sample again", operator="diagnostics", policy="builtin"))
    assert (iv.risk, iv.outcome.risk_cause) == (Risk.HIGH, "size")        # before any backtest
    c.store.put(iv)
    c.store.transition(iv.id, Status.BACKTESTING, "forked")
    iv = c.store.get(iv.id)
    iv.backtest = BacktestResult(metric="heldout_acc", candidate=[0.6], control=[0.3], effect=0.3, p_value=0.001,
                                 test="t", horizon_steps=40, seeds=[0], passed=True, signal=signal)
    c.store.put(iv)
    c.store.transition(iv.id, Status.VALIDATED, "validated")
    return c.store.get(iv.id)


def test_a_large_fix_validated_on_held_out_answers_goes_ahead_as_medium(ctrl):
    iv = _validated(ctrl, "target")
    ctrl.node_gate(None)
    got = ctrl.store.get(iv.id)
    assert got.status == Status.VALIDATED and got.risk == Risk.MEDIUM, got.outcome
    assert got.outcome.risk_before_backtest == "high" and "validated on the held-out target" in got.outcome.risk_reason
    assert [r for r in ctrl.store.timeline() if r.get("kind") == "risk_reassessed" and r.get("id") == iv.id]


def test_a_high_risk_fix_waits_while_its_smaller_step_goes_on(ctrl):
    iv = _validated(ctrl, "training pass rate")          # a training statistic: still high for its size
    ctrl.node_gate(None)
    got = ctrl.store.get(iv.id)
    assert got.status == Status.AWAITING_APPROVAL and got.risk == Risk.HIGH
    alt = ctrl.store.get(got.outcome.alternative)
    assert alt.status == Status.PROPOSED and alt.operator == "lead"
    assert alt.changes == {"harness.sampling.temperature": 0.15}                 # 3× the value in force
    assert alt.risk == Risk.MEDIUM and alt.outcome.smaller_step_of == iv.id
    assert iv.id in alt.rationale
    ctrl.node_gate(None)                                                       # a second pass adds nothing
    assert len([x for x in ctrl.store.list() if x.outcome.smaller_step_of == iv.id]) == 1
