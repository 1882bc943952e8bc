"""`target.stop`: a goal whose target marks success without ending the run (train on to the budget).
The controller records when the target was first met and ends the run only where the goal says so;
the built-in trainer gets its early stop only then."""
from __future__ import annotations

import json
import time

import pytest

from swarm.goal import Goal
from swarm.graph import SwarmState
from test_agent_run import TINY, controller


def observe(tmp_path, monkeypatch, stop: bool) -> dict:
    ctrl = controller(tmp_path, monkeypatch, dict(TINY))
    ctrl.goal.target.stop = stop
    try:
        ctrl.run_dir.mkdir(parents=True, exist_ok=True)
        row = {"step": 4, "time": time.time(), "algorithm": "grpo", "heldout_acc": 0.75, "harness_version": "x"}
        (ctrl.run_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        return ctrl.node_observe(SwarmState(job=None, job_status="RUNNING", started=time.time(), launched=time.time()))
    finally:
        ctrl.jobs.close()
        ctrl._conn.close()
        ctrl.knowledge.close()


@pytest.mark.parametrize("stop", [True, False])
def test_a_met_target_ends_an_agent_run_only_when_the_goal_stops_there(tmp_path, monkeypatch, stop):
    upd = observe(tmp_path, monkeypatch, stop)     # the goal's target: heldout_acc >= 0.5
    assert upd["to_target"]["worker_cpu_s"] >= 0.0                       # first met: recorded either way
    assert upd.get("done") == ("target_met" if stop else None)


def test_the_built_in_trainer_stops_early_only_when_the_goal_stops_at_its_target(tmp_path, monkeypatch):
    from swarm.controller import Controller

    monkeypatch.chdir(tmp_path)
    data = {"goal": "add two numbers", "target": {"metric": "heldout_acc", "op": ">=", "threshold": 0.9},
            "run": {"task": {"name": "addition"}},
            "memory": {"library": str(tmp_path / "lib"), "backend": "memory", "seed_skills": False}}
    for stop, early in ((True, 0.9), (False, None)):
        g = Goal.parse({**data, "target": {**data["target"], "stop": stop}})
        ctrl = Controller.create(tmp_path / f"ws-{stop}", g, jobs="process")
        try:
            assert ctrl.start_config()["recipe"].get("stop_at_heldout") == early
        finally:
            ctrl.jobs.close()
            ctrl._conn.close()
            ctrl.knowledge.close()
