"""A validated change is applied by adopting its candidate arm's state (population-based training's
exploit): the arm already trained the change's first `horizon` steps from the live run's fork, so
the live run takes that state on instead of training the same steps again, with its own eval
settings back; where the arm is not ahead of where the change would start, or its state cannot be
read, the change is applied to the live state as before, and why is recorded.

    .venv/bin/python -m pytest tests/test_adopt_arm.py -q
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import pytest
import torch

from agents.domain import BacktestResult, Diagnosis, Intervention, InterventionKind, Risk, Status
from swarm.backtest import adoptable, run_arms
from test_swarm import tiny_goal
from trainer.checkpoint import CheckpointManager
from trainer.runlog import read_jsonl


@pytest.fixture(autouse=True)
def _home(clean_git_home):
    """Every test here runs with a clean git HOME (conftest.clean_git_home)."""


def arm(root: pathlib.Path, name: str, step: int | None, state: str = "completed") -> pathlib.Path:
    d = root / name
    (d / "checkpoints").mkdir(parents=True)
    (d / "heartbeat.json").write_text(json.dumps({"state": state, "step": step or 0}))
    if step is not None:
        CheckpointManager(d / "checkpoints").save({"step": step, "w": torch.ones(2) * step, "recipe": {"eval_interval": 0}}, step)
    return d


def result(candidate: list[float], arms: list[str]) -> BacktestResult:
    return BacktestResult(metric="heldout_acc", candidate=candidate, control=[0.1] * len(candidate), effect=0.3,
                          p_value=0.01, test="t", horizon_steps=20, seeds=list(range(len(candidate))), passed=True,
                          fork_step=100, candidate_arms=arms)


def test_the_best_completed_candidate_arm_ahead_of_the_change_start_is_adopted(tmp_path):
    arm(tmp_path, "bt-a-candidate-s0", 120)
    arm(tmp_path, "bt-a-candidate-s1", 120)
    names = ["bt-a-candidate-s0", "bt-a-candidate-s1"]
    path, step = adoptable(result([0.4, 0.6], names), tmp_path, resume_step=105, higher_is_better=True)
    assert path.parent.parent.name == "bt-a-candidate-s1" and step == 120
    # a lower-is-better target picks the other one; a tie the lower seed
    assert adoptable(result([0.4, 0.6], names), tmp_path, 105, False)[0].parent.parent.name == "bt-a-candidate-s0"
    assert adoptable(result([0.5, 0.5], names), tmp_path, 105, True)[0].parent.parent.name == "bt-a-candidate-s0"
    # the live run went past the arm's end meanwhile (it waited for a human): adopting would lose steps
    why = adoptable(result([0.4, 0.6], names), tmp_path, resume_step=120, higher_is_better=True)
    assert isinstance(why, str) and "not past step 120" in why


def test_an_arm_that_did_not_complete_or_kept_no_checkpoint_is_not_adopted(tmp_path):
    arm(tmp_path, "bt-b-candidate-s0", 120, state="failed")
    arm(tmp_path, "bt-b-candidate-s1", None)
    why = adoptable(result([0.9, 0.6], ["bt-b-candidate-s0", "bt-b-candidate-s1"]), tmp_path, 100, True)
    assert why == "bt-b-candidate-s0 did not complete; bt-b-candidate-s1 kept no checkpoint here"
    assert adoptable(None, tmp_path, 100, True) == "not validated by a backtest"
    assert "no candidate arm" in adoptable(result([0.9], []), tmp_path, 100, True)
    rejected = result([0.9], ["bt-b-candidate-s0"]).model_copy(update={"passed": False})
    assert adoptable(rejected, tmp_path, 100, True) == "not validated by a backtest"


def wait(pred, timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def test_a_validated_change_takes_on_its_arms_state_with_the_live_eval_settings(tmp_path):
    """A real live trainer and real arms (process jobs): the arms' decision is scripted (the
    candidate reported better), everything else is the controller's."""
    from swarm.controller import Controller
    from swarm.goal import Goal
    from swarm.graph import SwarmState

    def validating(iv, **kw):
        pairs, cpu = run_arms(iv, **kw)
        return [dataclasses.replace(p, candidate=dataclasses.replace(p.candidate, target=0.9),
                                    control=dataclasses.replace(p.control, target=0.1)) for p in pairs], cpu

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False},
                                swarm={"backtest": {"seeds": [0], "horizon_steps": 20}}))
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    ctrl.backtest_runner = validating
    try:
        job = ctrl.start_job()
        ctrl.state_job = job

        def live_step() -> int:
            ctrl.tick.evidence = None
            return ctrl.evidence("RUNNING").step

        wait(lambda: live_step() >= 10)
        s = SwarmState(job=job, job_status="RUNNING", step=live_step(), started=time.time(), launched=time.time())
        d = Diagnosis(name="plateau", summary="flat", operator="diagnostics", policy="builtin")
        iv = Intervention(kind=InterventionKind.RECIPE_EDIT, changes={"recipe.lr": 0.002}, diagnosis=d,
                          rationale="lower the lr.", operator="diagnostics", policy="builtin", risk=Risk.LOW)
        ctrl.store.put(iv)
        ctrl.backtest(ctrl.store.get(iv.id))
        iv = ctrl.store.get(iv.id)
        assert iv.status == Status.VALIDATED, iv.history
        fork = iv.backtest.fork_step
        # validated: the live run waits where its backtest paused it (the step it read the pause at,
        # a few past the fork) until the apply: the tiny run would train ~20 steps a second meanwhile
        assert iv.outcome.paused_for_backtest
        held = live_step()
        time.sleep(1.0)
        assert live_step() == held < fork + 20
        assert iv.backtest.candidate_arms == [f"bt-{iv.id}-candidate-s0"]
        arm_dir = ctrl.sdir / "backtests" / f"bt-{iv.id}-candidate-s0"
        (arm_ckpt,) = [m for m in (arm_dir / "checkpoints").glob("*.json")]
        arm_state = CheckpointManager(arm_dir / "checkpoints").load(arm_ckpt.stem)
        assert arm_state["step"] == fork + 20 and arm_state["recipe"]["eval_interval"] == 0

        ctrl.open_pr(iv)
        ctrl.apply(iv, s)
        iv = ctrl.store.get(iv.id)
        assert iv.status == Status.APPLIED, iv.history
        assert iv.outcome.adopted == f"bt-{iv.id}-candidate-s0 at step {fork + 20}", iv.outcome
        assert iv.outcome.not_adopted is None and iv.applied_step == fork + 20
        assert iv.checkpoint_before == f"pre-{iv.id}"     # the judge's undo goes back to the live state
        assert iv.outcome.paused_for_backtest is False    # and the run goes on
        # the state taken on is the arm's, with the live run's own eval settings and early stop
        mine = CheckpointManager(ctrl.run_dir / "checkpoints").load(f"adopt-{iv.id}")
        assert all(torch.equal(mine["model"][k], v) for k, v in arm_state["model"].items())
        live = ctrl.base_cfg["recipe"]
        assert {k: mine["recipe"][k] for k in ("eval_interval", "eval_size", "stop_at_heldout")} == \
            {k: live.get(k) for k in ("eval_interval", "eval_size", "stop_at_heldout")}
        assert mine["recipe"]["lr"] == pytest.approx(0.002)
        # the live run goes on from the arm's step, in a new segment, at the new lr, and evaluates again
        wait(lambda: live_step() >= (fork + 20) // 25 * 25 + 26)
        rows = [r for r in read_jsonl(ctrl.run_dir / "metrics.jsonl") if r.get("time", 0) > iv.outcome.since_time]
        train = [r for r in rows if "loss" in r]
        assert train[0]["step"] == fork + 21, train[:3]
        # a timeline of its own: numbered past every one the live run wrote (the arm's state says 0)
        earlier = [r["segment"] for r in read_jsonl(ctrl.run_dir / "metrics.jsonl") if r.get("time", 0) <= iv.outcome.since_time]
        assert train[0]["segment"] == max(earlier) + 1, (train[0], set(earlier))
        assert all(r["step"] > fork + 20 for r in rows)
        assert any("heldout_acc" in r for r in rows)
    finally:
        ctrl.jobs.close()
        ctrl._conn.close()
        ctrl.knowledge.close()


def test_an_arm_is_not_adopted_when_the_live_run_changed_since_it_forked_and_the_judge_starts_from_it(tmp_path):
    """Its state would bring back a fix undone since, or drop one applied since; and without a
    checkpoint of the live state there is nothing to undo it to. An adopted change is judged
    against its candidate arms' mean score, where a run with the change stood just before applying."""
    from swarm.controller import Controller
    from swarm.goal import Goal

    goal = Goal.parse(tiny_goal(memory={"backend": "memory", "seed_skills": False}))
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    try:
        arm(ctrl.sdir / "backtests", "bt-aaaaaaaa-candidate-s0", 140)
        d = Diagnosis(name="plateau", summary="flat", operator="diagnostics", policy="builtin")
        iv = Intervention(id="aaaaaaaa", kind=InterventionKind.RECIPE_EDIT, changes={"recipe.lr": 0.002}, diagnosis=d,
                          rationale="r", operator="diagnostics", policy="builtin",
                          backtest=result([0.42, 0.3], ["bt-aaaaaaaa-candidate-s0", "bt-aaaaaaaa-candidate-s1"]))
        iv.move(Status.BACKTESTING)
        iv.move(Status.VALIDATED)
        ctrl.store.put(iv)
        other = Intervention(kind=InterventionKind.HARNESS_EDIT, changes={"harness.sampling.temperature": 0.9},
                             diagnosis=d, rationale="r", operator="harness_critic", policy="builtin")
        other.outcome.since_time = time.time() + 5       # applied after the fork
        ctrl.store.put(other)
        pre = {"status": "applied", "step": 120}
        assert ctrl.adoption(ctrl.store.get(iv.id), None, pre) is None
        assert "changed since its arms forked it" in ctrl.store.get(iv.id).outcome.not_adopted

        other.outcome.since_time = time.time() - 3600   # before the fork: nothing changed since
        ctrl.store.put(other)
        assert ctrl.adoption(ctrl.store.get(iv.id), None, {"status": "rejected", "step": 120}) is None
        assert ctrl.store.get(iv.id).outcome.not_adopted == "no checkpoint of the live state to undo it to"
        assert ctrl.adoption(ctrl.store.get(iv.id), None, pre) == "adopt-aaaaaaaa"
        got = ctrl.store.get(iv.id)
        assert got.outcome.adopted == "bt-aaaaaaaa-candidate-s0 at step 140"
        assert CheckpointManager(ctrl.run_dir / "checkpoints").load("adopt-aaaaaaaa")["step"] == 140

        control = ctrl.control_for(got)
        # the candidates' mean, not the adopted (best) one's score: choosing the best biases it up
        assert control.value == pytest.approx(0.36) and control.se > 0
        assert control.source == "the candidate arms after 20 steps, one of them adopted"
        ctrl.drop_adopted(iv.id)     # not taken on after all: a restart must not resume from it
        assert not list((ctrl.run_dir / "checkpoints").glob("adopt-*"))
    finally:
        ctrl.jobs.close()
        ctrl._conn.close()
        ctrl.knowledge.close()


@pytest.mark.parametrize("common", [True, False])
def test_the_arms_that_fork_a_rollbacks_checkpoint_carry_the_fixes_in_force(tmp_path, common):
    """`run_arms` writes the carried fields into every arm that forks the rollback's checkpoint (the
    candidate always; the control when both start there), the change itself winning."""
    import yaml

    from agents.domain import JobStatus

    class Jobs:
        def start(self, name, path):
            return name

        def status(self, handle):
            return JobStatus.SUCCEEDED

    d = Diagnosis(name="not_learning", summary="flat", operator="x", policy="builtin")
    iv = Intervention(id="bbbbbbbb", kind=InterventionKind.ROLLBACK, changes={"recipe.lr": 0.003}, diagnosis=d,
                      rationale="r", operator="x", policy="builtin")
    old, live = str(tmp_path / "init.pt"), str(tmp_path / "bt-bbbbbbbb.pt")
    run_arms(iv, base_config={"recipe": {}, "harness": {}}, ckpt=old if common else live, step=0 if common else 120,
             metric="heldout_acc", horizon=10, seeds=[0], eval_size=50, jobs=Jobs(), workdir=tmp_path / "bt",
             candidate_ckpt=old, candidate_step=0, carried={"harness.sampling.max_new_tokens": 6, "recipe.lr": 0.5})
    cand = yaml.safe_load((tmp_path / "bt" / "bt-bbbbbbbb-candidate-s0.yaml").read_text())
    ctl = yaml.safe_load((tmp_path / "bt" / "bt-bbbbbbbb-control-s0.yaml").read_text())
    assert cand["fork_from"] == old and cand["fork_overrides"]["harness.sampling.max_new_tokens"] == 6
    assert cand["fork_overrides"]["recipe.lr"] == 0.003
    assert ("harness.sampling.max_new_tokens" in ctl["fork_overrides"]) is common
    assert ctl["fork_overrides"].get("recipe.lr") == (0.5 if common else None)
