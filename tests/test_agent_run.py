"""The controller on a goal that drives the agent trainer (`run.agent`, swarm/agent_run.py).

Fast: the goal's validation (a good goal, bad fields as one line naming them); the agent detector and
the HarnessCritic operator on hand-made evidence; the backtest arms' configs (fork_from and
fork_overrides) and real arms forked from a tiny run's checkpoint; apply and undo through the inbox of
a tiny live run, on a hand-built intervention. Slow: a real controller run on the default built-in
agent model whose starting harness has one turn (`max_turns: 1`): the controller diagnoses it,
backtests the critic's edit with forked arms, applies it and the run reaches its target.
"""
from __future__ import annotations

import pathlib
import time

import pytest
import yaml

from agents.domain import Diagnosis, Intervention, InterventionKind, Risk, Status
from swarm.agent_backtest import arm_config, fork_position, run_agent_arms
from swarm.goal import Goal
from trainer.agent_train import AgentTrainConfig
from trainer.config import ConfigError, ModelConfig
from trainer.runlog import read_jsonl

TINY = {"env": "lookup", "threads": 1, "eval_size": 4, "system_prompt": "Tools: get(key).", "max_new_tokens": 32,
        "max_turns": 4, "log_every": 1, "samples_per_step": 2,
        "model": ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=256, learned_positions=True).model_dump(),
        "sft": {"steps": 4, "batch_size": 4}, "grpo": {"steps": 4, "prompts": 2, "group_size": 2},
        "checkpoint": {"interval": 2, "keep_last": 8}}


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def goal_data(**agent) -> dict:
    return {"goal": "a tool-using policy answers lookup questions",
            "target": {"metric": "heldout_acc", "op": ">=", "threshold": 0.5},
            "run": {"agent": {**TINY, **agent}}}


def wait(pred, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


# ---- the goal -------------------------------------------------------------------------------------
def test_a_goal_with_an_agent_run_validates_as_the_agent_trainer_would():
    g = Goal.parse(goal_data(harness_fault={"max_turns": 1}))
    assert g.agent["env"] == "lookup" and g.entrypoint is None
    assert "harness_fault" not in g.public()["run"]["agent"]      # the fault is hidden, as perturbations are
    with pytest.raises(ConfigError, match="run.agent: this goal runs the agent trainer"):
        g.run_config("train", "/tmp")


@pytest.mark.parametrize("change, line", [
    ({"run": {"agent": {"env": "lookup", "grpo": {"stepz": 3}}}}, "invalid goal: run.agent.grpo.stepz: unknown field"),
    ({"run": {"agent": {"env": "lookup", "difficulty": 0}}}, "invalid goal: run.agent.difficulty=0: "),
    ({"run": {"agent": {**TINY, "harness_fault": {"max_turns": 0}}}},
     "invalid goal: run.agent: harness_fault: max_turns=0"),
    ({"run": {"agent": {**TINY, "name": "x"}}}, "invalid goal: run.agent.name: set by the controller"),
    ({"run": {"agent": {**TINY, "critic": {"enabled": True}}}}, "invalid goal: run.agent.critic.enabled=True"),
    ({"run": {"agent": TINY, "task": "add"}}, "invalid goal: run.task: a goal that drives the agent trainer"),
    ({"target": {"metric": "heldout_turns", "threshold": 0.5}}, "invalid goal: target.metric='heldout_turns'"),
    ({"perturbations": [{"shortcut": "lr_spike", "at_step": 3}]}, "invalid goal: perturbations: an agent run"),
    # a rule across fields: its own message, not the whole config with the controller's placeholders
    ({"run": {"agent": {**TINY, "harness_fault_step": 2}}},
     "invalid goal: run.agent: harness_fault_step=2 needs a harness_fault to apply"),
    ({"budget": {"steps": 3}}, "invalid goal: budget.steps=3 is below run.agent.sft.steps=4"),
    ({"budget": {"steps": 6}, "run": {"agent": {**TINY, "harness_fault": {"max_turns": 1}, "harness_fault_step": 6}}},
     "invalid goal: run.agent.harness_fault_step=6 is not before budget.steps=6"),
])
def test_a_bad_agent_goal_is_one_line_naming_the_field(change, line):
    with pytest.raises(ConfigError) as e:
        Goal.parse({**goal_data(), **change})
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)
    assert "/tmp" not in str(e.value) and len(str(e.value)) < 300, str(e.value)


def test_swarm_validate_prints_ok_or_one_line_and_exits_2(tmp_path):
    from typer.testing import CliRunner

    from swarm.cli import app

    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump(goal_data()))
    bad.write_text(yaml.safe_dump(goal_data(grpo_steps=3)))
    r = CliRunner().invoke(app, ["validate", str(good)])
    assert r.exit_code == 0 and r.output.startswith("ok: agent run on lookup, target heldout_acc >= 0.5"), r.output
    r = CliRunner().invoke(app, ["validate", str(bad)])
    assert r.exit_code == 2 and r.output.strip().splitlines() == ["error: invalid goal: run.agent.grpo_steps: unknown field"]


# ---- diagnosis -------------------------------------------------------------------------------------
def rows(share: float, version: str = "h1", n: int = 4, start: int = 10) -> list[dict]:
    return [{"step": start + i, "algorithm": "grpo", "harness_version": version, "end_max_turns": share, "success": 0.0,
             "end_max_tool_calls": 0.0, "end_context_full": 0.0} for i in range(n)]


@pytest.mark.parametrize("metrics, fires", [
    (rows(1.0), True),
    (rows(0.3), False),                                    # most trajectories end otherwise
    (rows(1.0, n=1), False),                               # one row under this harness says nothing yet
    (rows(1.0, "h0") + rows(0.0, "h1", start=20), False),  # the harness changed since: its rows are healthy
])
def test_the_turn_limit_detector_reads_the_current_harness_rows(metrics, fires):
    from agents.agent_critic import run_agent_detectors
    from agents.evidence import Evidence

    ev = Evidence(run_dir="/x", step=metrics[-1]["step"], metrics=metrics,
                  samples=[{"step": 12, "reward": 0.0, "end": "max_turns"}] * 3)
    found = [d.name for d in run_agent_detectors(ev)]
    assert found == (["agent_turn_limit"] if fires else [])


def test_the_agent_critic_proposes_the_critics_typed_edit_of_the_live_harness():
    from agents.agent_critic import AgentHarnessCritic, run_agent_detectors
    from agents.base import OperatorContext
    from agents.evidence import Evidence
    from trainer.envs import make_env

    harness = make_env("lookup").default_harness(max_turns=1)
    ev = Evidence(run_dir="/x", step=13, metrics=rows(1.0), samples=[{"step": 12, "reward": 0.0, "end": "max_turns"}])
    ctx = OperatorContext(goal="g", harness=harness.model_dump(mode="json")).with_findings(run_agent_detectors(ev))
    (iv,) = AgentHarnessCritic().propose(ev, ctx)
    assert iv.kind == InterventionKind.HARNESS_EDIT and iv.changes == {"harness.max_turns": 2}
    assert iv.diagnosis.name == "agent_turn_limit" and iv.diagnosis.severity == "critical"
    assert AgentHarnessCritic().propose(ev, OperatorContext(goal="g").with_findings([])) == []


# ---- backtest arms ------------------------------------------------------------------------------
def test_arm_configs_fork_the_checkpoint_with_the_change_as_overrides_and_train_the_horizon():
    live = AgentTrainConfig.parse({**TINY, "name": "train", "out_dir": "/w/runs",
                                   "harness_fault": {"max_turns": 1}}).model_dump(mode="json")
    kw = dict(out_dir="/w/bt", checkpoint="/w/runs/train/checkpoints/bt-x.pt", horizon=3, seed=7, eval_size=16)
    cand = arm_config(live, name="c", stage="grpo", stage_step=2, changes={"harness.max_turns": 2}, **kw)
    ctrl = arm_config(live, name="k", stage="grpo", stage_step=2, changes={}, **kw)
    for cfg in (cand, ctrl):
        c = AgentTrainConfig.parse(cfg)    # what the arm's trainer will read
        assert c.fork_from == "/w/runs/train/checkpoints/bt-x.pt" and c.grpo.steps == 5 and c.sft.steps == 4
        assert c.seed == 7 and c.eval_size == 16 and c.eval_every == 0 and c.checkpoint.interval == 0
        assert c.run_dir == pathlib.Path("/w/bt") / cfg["name"] and c.harness_fault == {"max_turns": 1}
    assert cand["fork_overrides"] == {"harness.max_turns": 2} and ctrl["fork_overrides"] == {}
    warm = AgentTrainConfig.parse(arm_config(live, name="w", stage="warmup", stage_step=1, changes={}, **kw))
    assert warm.sft.steps == 4 and warm.grpo.steps == 0
    with pytest.raises(ValueError, match="stage 'done'"):
        arm_config(live, name="d", stage="done", stage_step=0, changes={}, **kw)


def test_arms_fork_a_real_checkpoint_and_only_the_candidate_has_the_change(tmp_path):
    from swarm.agent_run import AgentJobs
    from trainer.agent_train import AgentTrainer

    src = AgentTrainConfig.parse({**TINY, "name": "src", "out_dir": str(tmp_path)})
    AgentTrainer(src, printer=None).run()
    stage, at = fork_position(src.run_dir, "step_0000006")
    assert (stage, at) == ("grpo", 2)
    iv = Intervention(kind=InterventionKind.HARNESS_EDIT, changes={"harness.max_turns": 6}, rationale="r", operator="t",
                      policy="builtin", diagnosis=Diagnosis(name="agent_turn_limit", summary="s", operator="t",
                                                            policy="builtin"))
    pairs, cpu = run_agent_arms(iv, live=src.model_dump(mode="json"), checkpoint=str(src.run_dir / "checkpoints" /
                                "step_0000006.pt"), stage=stage, stage_step=at, horizon=2, seeds=[0], eval_size=4,
                                jobs=AgentJobs(tmp_path / "logs"), workdir=tmp_path / "bt", config_dir=tmp_path / "cfg")
    assert cpu > 0 and pairs[0].candidate.target is not None and pairs[0].control.target is not None
    versions = {}
    for arm in ("candidate", "control"):
        d = tmp_path / "bt" / f"bt-{iv.id}-{arm}-s0"
        m = read_jsonl(d / "metrics.jsonl")
        assert [r["step"] for r in m if r["algorithm"] == "grpo"] == [7, 8] and "heldout_acc" in m[-1]
        versions[arm] = m[-1]["harness_version"]
        assert yaml.safe_load((d / "harnesses" / f"{versions[arm]}.yaml").read_text())["max_turns"] == \
            (6 if arm == "candidate" else 4)
    assert versions["candidate"] != versions["control"]


# ---- apply and undo through the inbox -------------------------------------------------------------
def controller(tmp_path, monkeypatch, agent: dict, **swarm):
    from swarm.controller import Controller

    monkeypatch.chdir(tmp_path)
    g = Goal.parse({**goal_data(), "run": {"agent": agent},
                    "memory": {"library": str(tmp_path / "lib"), "backend": "memory", "seed_skills": False, "mine": False},
                    "swarm": swarm})
    return Controller.create(tmp_path / "ws", g, jobs="process")


def test_an_agent_goal_runs_its_jobs_as_local_processes_unless_told_otherwise(tmp_path, monkeypatch):
    from swarm.agent_run import AgentJobs
    from swarm.controller import Controller
    from swarm.jobs import RayJobs
    from trainer.launch import AGENT_TRAINER

    monkeypatch.chdir(tmp_path)
    g = Goal.parse({**goal_data(), "memory": {"library": str(tmp_path / "lib"), "backend": "memory", "seed_skills": False}})
    for ws, jobs, kind in (("ws", None, AgentJobs), ("ws2", "ray", RayJobs)):   # `swarm run` without --jobs; --jobs ray
        ctrl = Controller.create(tmp_path / ws, g, jobs=jobs)
        try:   # (a Ray launcher starts its head on its first job: none here)
            assert isinstance(ctrl.jobs, kind) and ctrl.jobs.trainer is AGENT_TRAINER
        finally:
            ctrl.jobs.close()
            ctrl._conn.close()
            ctrl.knowledge.close()


def test_a_harness_edit_is_applied_through_the_inbox_and_undone_by_rolling_back_to_before_it(tmp_path, monkeypatch):
    from swarm.graph import SwarmState

    ctrl = controller(tmp_path, monkeypatch, {**TINY, "grpo": {"steps": 100000, "prompts": 2, "group_size": 2}})
    try:
        job = ctrl.start_job()
        ctrl.state_job = job

        def grpo_rows() -> list[dict]:
            ctrl.tick.evidence = None
            return [r for r in ctrl.evidence("RUNNING").metrics if r.get("algorithm") == "grpo"]

        wait(lambda: len(grpo_rows()) >= 2)
        s = SwarmState(job=job, job_status="RUNNING", step=grpo_rows()[-1]["step"], started=time.time(), launched=time.time())
        d = Diagnosis(name="agent_turn_limit", summary="turns run out", operator="agent_harness_critic", policy="builtin")
        iv = ctrl.prepare(Intervention(kind=InterventionKind.HARNESS_EDIT, changes={"harness.max_turns": 6}, diagnosis=d,
                                       rationale="more turns", operator="agent_harness_critic", policy="builtin",
                                       risk=Risk.MEDIUM), s)
        assert iv is not None and ctrl.validity(iv) is None and iv.risk == Risk.MEDIUM
        assert ctrl.values_in_force(["harness.max_turns"]) == {"harness.max_turns": 4}
        bad = iv.model_copy(update={"changes": {"harness.max_turns": 0}})
        assert "max_turns=0" in ctrl.validity(bad)
        long = iv.model_copy(update={"changes": {"harness.sampling.max_new_tokens": 300}})   # the policy: 256
        assert "below the policy's" in ctrl.validity(long)   # what the live trainer's inbox refuses
        other = Intervention(kind=InterventionKind.RECIPE_EDIT, changes={"recipe.lr": 0.1}, diagnosis=d, rationale="r",
                             operator="diagnostics", policy="builtin")
        assert ctrl.prepare(other, s) is None         # a field the agent trainer has not: dropped, logged once
        assert "recipe.lr" in ctrl.store.timeline("not_applicable")[0]["reason"]

        ctrl.store.put(iv)
        ctrl.store.transition(iv.id, Status.VALIDATED, "test: validated")
        ctrl.open_pr(ctrl.store.get(iv.id))
        ctrl.apply(ctrl.store.get(iv.id), s)
        got = ctrl.store.get(iv.id)
        assert got.status == Status.APPLIED and got.outcome.before == {"harness.max_turns": 4}, got.history
        acks = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}
        assert acks[f"{iv.id}-apply"]["status"] == "applied" and acks[f"{iv.id}-apply"]["result"]["harness_changed"]
        wait(lambda: ctrl.values_in_force(["harness.max_turns"]) == {"harness.max_turns": 6} or
             bool(ctrl.__setattr__("tick", type(ctrl.tick)())))
        assert ctrl.ws.current_harness() == {} and ctrl.ws.pr_state(iv.id) == "merged"

        ctrl.roll_back(ctrl.store.get(iv.id), "test: undo")
        got = ctrl.store.get(iv.id)
        assert got.status == Status.ROLLED_BACK and got.outcome.undone, got.history
        acks = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}
        undo = acks[f"{iv.id}-undo"]   # back to the checkpoint taken before the edit (tests/test_agent_rollback.py)
        assert undo["cmd"] == "rollback" and undo["status"] == "applied" and undo["result"]["rolled_back_to"] == \
            f"pre-{iv.id}" and undo["result"]["step"] == acks[f"{iv.id}-pre"]["step"]
        wait(lambda: ctrl.values_in_force(["harness.max_turns"]) == {"harness.max_turns": 4} or
             bool(ctrl.__setattr__("tick", type(ctrl.tick)())))
    finally:
        ctrl.jobs.close()
        ctrl._conn.close()
        ctrl.knowledge.close()


# ---- end to end -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_controller_fixes_a_one_turn_harness_with_a_backtested_edit_and_reaches_the_target(tmp_path, monkeypatch):
    """lookup at difficulty 1 on the default built-in agent model, seed 502 (its warm-up learns the
    task: benchmarks/results/agentic_faults.md, s502), 300 warm-up steps under the healthy harness,
    then GRPO under `max_turns: 1`: the policy calls the tool and has no turn left to answer."""
    ctrl = controller(tmp_path, monkeypatch, {
        "env": "lookup", "difficulty": 1, "seed": 502, "threads": 1, "eval_size": 32, "eval_every": 2,
        "samples_per_step": 4, "sft": {"steps": 300}, "grpo": {"steps": 400}, "harness_fault": {"max_turns": 1},
        "checkpoint": {"interval": 10}},
        observe_every_s=1, evaluate_window_steps=10, min_steps_between_interventions=0,
        backtest={"horizon_steps": 4, "seeds": [0], "eval_size": 32})
    summary = ctrl.run()
    assert summary["reached"] and summary["reason"] == "target_met", summary
    ivs = [iv for iv in ctrl.store.list() if iv.changes == {"harness.max_turns": 2}]
    assert ivs, [(iv.changes, iv.status) for iv in ctrl.store.list()]
    iv = ivs[0]
    assert iv.operator == "agent_harness_critic" and iv.diagnosis.name == "agent_turn_limit"
    assert iv.backtest is not None and iv.backtest.passed and iv.backtest.candidate[0] > iv.backtest.control[0]
    assert iv.status in (Status.APPLIED, Status.EVALUATING, Status.KEPT) and iv.outcome.before == {"harness.max_turns": 1}
    arm = yaml.safe_load((ctrl.private / "backtests" / f"bt-{iv.id}-candidate-s0.yaml").read_text())
    assert arm["fork_from"].endswith(f"bt-{iv.id}.pt") and arm["fork_overrides"] == {"harness.max_turns": 2}
    acks = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}
    assert acks[f"{iv.id}-apply"]["status"] == "applied"
    after = [r for r in read_jsonl(ctrl.run_dir / "metrics.jsonl") if r["step"] > iv.applied_step and "heldout_acc" in r]
    assert after and after[-1]["heldout_acc"] >= 0.5


def test_an_agent_runs_steps_left_end_with_its_stages_or_the_budget(tmp_path, monkeypatch):
    ctrl = controller(tmp_path, monkeypatch, dict(TINY))       # sft 4 + grpo 4 steps
    try:
        assert ctrl.goal.budget.steps > 8 and ctrl.last_step() == 8
    finally:
        ctrl.jobs.close()
        ctrl._conn.close()
        ctrl.knowledge.close()
    from swarm.agent_run import job_config

    g = Goal.parse({**goal_data(), "budget": {"steps": 6}})
    cut = job_config(g, tmp_path / "runs")                     # the budget's steps end the run
    assert (cut["sft"]["steps"], cut["grpo"]["steps"]) == (4, 2)
    from swarm.controller import Controller

    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    ctrl = Controller.create(tmp_path / "b" / "ws", Goal.parse({**goal_data(), "budget": {"steps": 6}, "memory": {
        "library": str(tmp_path / "lib"), "backend": "memory", "seed_skills": False}}), jobs="process")
    try:
        assert ctrl.base_cfg["job"]["grpo"]["steps"] == 2 and ctrl.last_step() == 6
    finally:
        ctrl.jobs.close()
        ctrl._conn.close()
        ctrl.knowledge.close()
