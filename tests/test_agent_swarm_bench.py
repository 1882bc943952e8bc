"""The swarm arm of the agentic fault benchmark (swarmbench/agent_swarm.py): the goal it hands
`swarm run`, the first step whose eval counts, and the worker-CPU curve less the live job's evals."""
from __future__ import annotations

from swarm.goal import Goal
from swarmbench import agent_swarm
from swarmbench.agentic import scenario


def test_the_goal_is_the_faulted_run_with_its_fault_hidden_and_a_valid_goal():
    sc = scenario(3, "lookup", "parser", "config")
    g = agent_swarm.goal(sc, target=0.9, budget=40.0, wall_cap=400.0, eval_size=16, eval_every=2)
    assert g["run"]["agent"]["harness_fault"] == sc["fault"] and g["run"]["agent"]["seed"] == 3
    assert g["target"]["threshold"] == 0.9 and g["target"]["stop"]
    assert g["budget"]["worker_cpu_s"] == 40.0 * agent_swarm.CONTROLLER_BUDGET_X
    goal = Goal.parse(g)
    assert "harness_fault" not in goal.public()["run"]["agent"]
    drift = scenario(3, "lookup", "parser", "drift", 5)
    # a drift's run must not end at the warm-up's eval, before the drift: the target does not stop it
    dg = agent_swarm.goal(drift, 0.9, 40.0, 400.0, eval_size=16, eval_every=2)
    assert dg["target"] == {"metric": "heldout_acc", "op": ">=", "threshold": 0.9, "stop": False}
    assert Goal.parse(dg).target.stop is False
    assert agent_swarm.fault_step(drift) == drift["config"]["harness_fault_step"] + 1
    assert agent_swarm.fault_step(sc) == sc["config"]["sft"]["steps"]


def test_the_curve_leaves_out_the_live_jobs_evals_and_the_hit_counts_from_the_fault():
    timeline = [(0.0, 0.0), (10.0, 10.0), (20.0, 30.0)]
    rows = [{"step": 0, "time": 1.0, "heldout_acc": 0.95, "eval_cpu_s": 1.0},     # before the fault: never a hit
            {"step": 300, "time": 10.0, "heldout_acc": 0.0, "eval_cpu_s": 2.0},
            {"step": 301, "time": 15.0},                                         # a row without an eval
            {"step": 302, "time": 20.0, "heldout_acc": 0.95, "eval_cpu_s": 3.0},
            {"step": 302, "time": 20.0, "heldout_acc": 0.95, "final": True}]
    pts = agent_swarm.curve(rows, timeline)
    assert [(p["step"], p["cpu_s"]) for p in pts] == [(0, 0.0), (300, 7.0), (302, 24.0)]
    assert agent_swarm.hit(pts, 0.9, budget=30.0, first_step=300)["step"] == 302
    assert agent_swarm.hit(pts, 0.9, budget=20.0, first_step=300) is None       # past the budget
    assert agent_swarm.is_agent_trainer(["python", "-m", "trainer.agent_train", "x.yaml"])
    assert not agent_swarm.is_agent_trainer(["python", "-m", "trainer.entry", "x.yaml"])
