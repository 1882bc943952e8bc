"""The swarm arm of the agentic fault benchmark (swarmbench/agent_swarm.py): the goal it hands
`swarm run`, the first step whose eval counts, and the worker-CPU curve less the live job's evals."""
from __future__ import annotations

import pytest

from swarm.goal import Goal
from swarmbench import agent_swarm
from swarmbench.agentic import scenario


def test_the_goal_is_the_faulted_run_with_its_fault_hidden_and_a_valid_goal():
    sc = scenario(3, "lookup", "parser", "config")
    g = agent_swarm.goal(sc, target=0.9, budget=40.0, wall_cap=400.0, eval_size=16, eval_every=2)
    assert g["run"]["agent"]["harness_fault"] == sc["fault"] and g["run"]["agent"]["seed"] == 3
    assert g["target"]["threshold"] == 0.9 and g["target"]["stop"] is False   # the same for every origin
    assert g["budget"]["worker_cpu_s"] == 40.0 * agent_swarm.CONTROLLER_BUDGET_X
    goal = Goal.parse(g)
    assert "harness_fault" not in goal.public()["run"]["agent"]
    drift = scenario(3, "lookup", "parser", "drift", 5)
    # a drift's run must not end at the warm-up's eval, before the drift: the target does not stop it
    dg = agent_swarm.goal(drift, 0.9, 40.0, 400.0, eval_size=16, eval_every=2)
    assert dg["target"] == g["target"] and Goal.parse(dg).target.stop is False
    assert agent_swarm.fault_step(drift) == drift["config"]["harness_fault_step"] + 1
    assert agent_swarm.fault_step(sc) == sc["config"]["sft"]["steps"]


def test_the_curve_leaves_out_the_live_jobs_evals_and_the_hit_counts_from_the_fault():
    timeline = [(0.0, 0.0), (10.0, 10.0), (20.0, 30.0), (30.0, 40.0)]
    # the run's first eval row is stamped after its eval; a training row before its own eval runs
    rows = [{"step": 0, "time": 1.0, "algorithm": "eval", "heldout_acc": 0.95, "eval_cpu_s": 1.0},
            {"step": 300, "time": 10.0, "algorithm": "sft", "heldout_acc": 0.0, "eval_cpu_s": 2.0},
            {"step": 301, "time": 15.0, "algorithm": "grpo"},                   # a row without an eval
            {"step": 302, "time": 20.0, "algorithm": "grpo", "heldout_acc": 0.95, "eval_cpu_s": 3.0},
            {"step": 303, "time": 30.0, "algorithm": "grpo", "heldout_acc": 0.95, "eval_cpu_s": 3.0},
            {"step": 303, "time": 30.0, "algorithm": "eval", "heldout_acc": 0.95, "final": True}]
    pts = agent_swarm.curve(rows, timeline)
    assert [(p["step"], p["cpu_s"]) for p in pts] == [(0, 0.0), (300, 9.0), (302, 27.0), (303, 34.0)]
    assert agent_swarm.hit(pts, 0.9, budget=30.0, first_step=300)["step"] == 302
    assert agent_swarm.hit(pts, 0.9, budget=20.0, first_step=300) is None       # past the budget
    # only where the in-process arms evaluate: GRPO steps after a 300-step warm-up on their schedule
    assert agent_swarm.hit(pts, 0.9, budget=40.0, first_step=300, counts=lambda s: s - 300 in (0, 3))["step"] == 303
    assert agent_swarm.is_agent_trainer(["python", "-m", "trainer.agent_train", "x.yaml"])
    assert not agent_swarm.is_agent_trainer(["python", "-m", "trainer.entry", "x.yaml"])


def test_a_swarm_arm_recorded_with_the_first_accounting_is_scored_again_from_its_run_folder(tmp_path):
    import importlib.util
    import json
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "agentic_faults.py"
    spec = importlib.util.spec_from_file_location("agentic_faults_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sc = scenario(3, "lookup", "parser", "config")          # a 300-step warm-up
    rows = [{"step": 0, "time": 1.0, "algorithm": "eval", "heldout_acc": 0.0, "eval_cpu_s": 1.0},
            {"step": 300, "time": 9.0, "algorithm": "sft", "heldout_acc": 0.0, "eval_cpu_s": 2.0},
            {"step": 303, "time": 12.0, "algorithm": "grpo", "heldout_acc": 0.95, "eval_cpu_s": 2.0},
            {"step": 304, "time": 13.0, "algorithm": "grpo", "heldout_acc": 0.95, "eval_cpu_s": 2.0}]
    run = tmp_path / sc["id"] / "swarm" / "ws" / ".swarm" / "runs" / "train"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    old = [{"step": 0, "cpu_s": 0.0, "heldout_acc": 0.0}, {"step": 300, "cpu_s": 20.0, "heldout_acc": 0.0},
           {"step": 303, "cpu_s": 25.0, "heldout_acc": 0.95}, {"step": 304, "cpu_s": 26.0, "heldout_acc": 0.95}]
    r = {"scenario": sc, "target": 0.9, "budget_cpu_s": 50.0, "status": "failing",
         "arms": {"swarm": {"curve": old, "reached": True, "cpu_to_target": 25.0}}}
    got = bench.rescore_swarm(r, str(tmp_path))["arms"]["swarm"]
    # each training row's point gains its own eval; 303 is off the in-process schedule (3 GRPO steps in)
    assert [p["cpu_s"] for p in got["curve"]] == [0.0, 22.0, 27.0, 28.0]
    assert got["reached"] and got["cpu_to_target"] == 28.0 and got["accounting"] == 2
    assert bench.rescore_swarm({**r, "arms": {"swarm": got}}, str(tmp_path))["arms"]["swarm"] == got   # once
    # a run stopped at an off-schedule hit: charged to the next scheduled eval at its CPU per step
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    short = bench.rescore_swarm({**r, "arms": {"swarm": {"curve": old[:3], "reached": True, "cpu_to_target": 25.0}}},
                                str(tmp_path))["arms"]["swarm"]
    assert short["reached"] and short["cpu_to_target"] == pytest.approx(27.0 + (27.0 - 22.0) / 3, abs=0.01)
    assert "off the in-process schedule" in short["rescored"] and short["estimated"]
    # the run went on to the next scheduled eval and missed there: that eval decides, nothing is estimated
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows[:3] + [{**rows[3], "heldout_acc": 0.1}]))
    miss = bench.rescore_swarm({**r, "arms": {"swarm": {"curve": old[:3] + [{**old[3], "heldout_acc": 0.1}],
                                                        "reached": True, "cpu_to_target": 25.0}}}, str(tmp_path))
    assert not miss["arms"]["swarm"]["reached"] and "missed" in miss["arms"]["swarm"]["rescored"]
    # no earlier point to take a CPU per step from: missed, never charged at zero
    (run / "metrics.jsonl").write_text(json.dumps({**rows[2], "step": 303}) + "\n")
    lone = bench.rescore_swarm({**r, "arms": {"swarm": {"curve": [old[2]], "reached": True, "cpu_to_target": 25.0}}},
                               str(tmp_path))["arms"]["swarm"]
    assert not lone["reached"] and "no CPU per step" in lone["rescored"]
    summary = bench.summarize([{**r, "status": "failing", "arms": {"swarm": {**got, "unscored": True}, "plain": {"reached": False},
                                                                  "oracle": {"reached": True, "cpu_to_target": 20.0}}}])
    assert summary["all"]["swarm"]["unscored"] == 1 and summary["all"]["swarm"]["failing"] == 0
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    left = bench.rescore_swarm(r, str(tmp_path))["arms"]["swarm"]
    assert left["unscored"] and "left out" in left["rescored"]
