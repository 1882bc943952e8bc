"""Weight rollbacks on agent runs (trainer/agent_control.py's `rollback`, swarm/agent_run.py), on
real runs of the tiny built-in agent model (lookup, 4 warm-up steps, a checkpoint every 2 steps).

The trainer: a rollback sent with the fields it comes with, as the controller sends them, puts back
the named checkpoint's weights, optimiser, position and recipe, and the fields apply on top before
the next step. The controller: a rollback proposed on an agent run is kept (it used to be dropped as
not applicable), backtested with its candidate forked from the checkpoint it rolls back to and its
control from the live one, applied through the inbox, and undone by going back to the checkpoint
taken before it, so the weights trained since are discarded (it used to set the fields back only).
"""
from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Any

import pytest
import torch
import yaml

from agents.domain import Diagnosis, Intervention, InterventionKind, Risk, Status
from harness.agent import AgentHarness
from swarm.goal import Goal
from trainer.agent_train import AgentTrainConfig, AgentTrainer
from trainer.checkpoint import CheckpointManager
from trainer.control import send_command
from trainer.runlog import read_jsonl

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_agent_run import TINY as AGENT_TINY  # noqa: E402

TINY = {**AGENT_TINY, "checkpoint": {"interval": 2, "keep_last": 1000}}   # every checkpoint kept: rollbacks name old ones


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def moments(opt: dict[str, Any]) -> list[torch.Tensor]:
    return [t for st in opt["state"].values() for t in st.values() if isinstance(t, torch.Tensor)]


def wait(pred, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


# ---- the trainer ----------------------------------------------------------------------------------
def test_a_rollback_restores_the_checkpoint_whole_and_the_fields_sent_with_it_apply_on_top(tmp_path):
    """In the warm-up, where every step moves the weights (a GRPO step of this tiny policy, whose
    rewards are all alike, may not)."""
    cfg = AgentTrainConfig.parse({**TINY, "out_dir": str(tmp_path), "name": "r",
                                  "sft": {"steps": 4, "batch_size": 4, "warmup_steps": 0}})
    plan = {1: [{"cmd": "set_recipe", "id": "lr1", "fields": {"sft.lr": 1e-3}},
                {"cmd": "checkpoint", "id": "c", "name": "mark"}],
            2: [{"cmd": "set_recipe", "id": "lr2", "fields": {"sft.lr": 2e-3}}],
            3: [{"cmd": "pause", "id": "p"}, {"cmd": "rollback", "id": "rb", "name": "mark"},
                {"cmd": "set_fields", "id": "f", "fields": {"recipe.sft.lr": 3e-3, "harness.max_turns": 6}},
                {"cmd": "resume", "id": "go"}]}
    trained: dict[str, Any] = {}

    def printer(line: str) -> None:   # called with each metrics row: the commands reach the inbox before the step end
        if tr.step == 3 and not trained:
            trained.update({k: v.detach().clone() for k, v in tr.policy.model.state_dict().items()})
        for c in plan.pop(tr.step, []):
            send_command(cfg.run_dir, **c)

    tr = AgentTrainer(cfg, printer=printer)
    summary = tr.run()
    acks = {a["id"]: a for a in read_jsonl(cfg.run_dir / "command_log.jsonl")}
    assert all(a["status"] == "applied" for a in acks.values()), acks
    ck = CheckpointManager(cfg.run_dir / "checkpoints")
    mark, rb = ck.load("mark"), acks["rb"]["result"]
    # the checkpoint's position and the recipe in force when it was saved (1e-3), not the live one (2e-3)
    assert (rb["step"], rb["stage"], rb["stage_step"]) == (1, "warmup", 1) and rb["recipe"]["sft.lr"] == 1e-3
    assert rb["harness_version"] == AgentHarness.model_validate(mark["harness"]).version != \
        acks["f"]["result"]["harness_version"]
    restored = ck.load(rb["checkpoint"])          # saved at the safe point, after the fields were set
    assert restored["step"] == 1 and same(restored["model"], mark["model"])
    assert all(torch.equal(a, b) for a, b in zip(moments(restored["opt"]), moments(mark["opt"])))
    assert restored["recipe"]["sft.lr"] == 3e-3 and restored["harness"]["max_turns"] == 6
    assert trained and not same(trained, mark["model"])   # the steps after the mark moved the weights
    rows = [r for r in read_jsonl(cfg.run_dir / "metrics.jsonl") if r["algorithm"] == "sft"]
    assert [(r["step"], r["segment"], r["lr"]) for r in rows] == [
        (1, 0, AgentTrainConfig().sft.lr), (2, 0, 1e-3), (3, 0, 2e-3), (2, 1, 3e-3), (3, 1, 3e-3), (4, 1, 3e-3)]
    assert summary["steps"] == 8 and tr.harness.max_turns == 6


# ---- the controller -------------------------------------------------------------------------------
def test_what_is_in_force_after_a_rollback_is_the_recipe_its_acknowledgement_names(tmp_path):
    from swarm.agent_run import acknowledged_fields

    rows = [{"id": "a", "cmd": "set_fields", "status": "applied",
             "result": {"set": {"recipe.grpo.lr": 1e-4, "harness.max_turns": 6}}},
            {"id": "b", "cmd": "rollback", "status": "applied",
             "result": {"rolled_back_to": "mark", "recipe": {"grpo.lr": 3e-4, "grad_clip": 1.0}}},
            {"id": "c", "cmd": "rollback", "status": "rejected", "reason": "no checkpoint named 'x'"},
            {"id": "d", "cmd": "set_recipe", "status": "applied", "result": {"set": {"grad_clip": 0.5}}}]
    (tmp_path / "command_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert acknowledged_fields(tmp_path) == {"recipe.grpo.lr": 3e-4, "recipe.grad_clip": 0.5}
    # what the newest change replaced: the checkpoint's value, not the one set before the rollback
    assert acknowledged_fields(tmp_path, but_last=True) == {"recipe.grpo.lr": 3e-4, "recipe.grad_clip": 1.0}


def controller(tmp_path, monkeypatch, agent: dict, **swarm):
    from swarm.controller import Controller

    monkeypatch.chdir(tmp_path)
    g = Goal.parse({"goal": "a tool-using policy answers lookup questions",
                    "target": {"metric": "heldout_acc", "op": ">=", "threshold": 0.5}, "run": {"agent": agent},
                    "memory": {"library": str(tmp_path / "lib"), "backend": "memory", "seed_skills": False, "mine": False},
                    "swarm": swarm})
    return Controller.create(tmp_path / "ws", g, jobs="process")


def rollback_to(name: str) -> Intervention:
    d = Diagnosis(name="agent_turn_limit", summary="turns run out", operator="lead", policy="llm",
                  evidence={"rollback_to": name})
    return Intervention(kind=InterventionKind.ROLLBACK, changes={"harness.max_turns": 6}, diagnosis=d,
                        rationale="more turns, from before the run learnt to stop short", operator="lead", policy="llm",
                        risk=Risk.MEDIUM)


def test_a_rollback_on_an_agent_run_is_backtested_from_its_checkpoint_applied_and_undone_to_the_weights_before(
        tmp_path, monkeypatch):
    from swarm.graph import SwarmState

    # a long warm-up (every step moves the weights), held-out evals only at its end: the steps since
    # the mark are never found to have gained nothing, so the control carries on from the live state
    live = {**TINY, "eval_every": 0, "sft": {"steps": 50000, "batch_size": 4}}
    ctrl = controller(tmp_path, monkeypatch, live, backtest={"horizon_steps": 2, "seeds": [0], "eval_size": 10})
    ck = CheckpointManager(ctrl.run_dir / "checkpoints")
    try:
        job = ctrl.start_job()
        ctrl.state_job = job

        def rows() -> list[dict]:
            ctrl.tick.evidence = None
            return [r for r in ctrl.evidence("RUNNING").metrics if r.get("algorithm") == "sft"]

        wait(lambda: len(rows()) >= 2)
        mark = ctrl.command("checkpoint", "mark", name="mark")
        assert mark["status"] == "applied"
        wait(lambda: rows()[-1]["step"] >= mark["step"] + 4)    # weights trained since the mark
        s = SwarmState(job=job, job_status="RUNNING", step=rows()[-1]["step"], started=time.time(),
                       launched=time.time())

        # proposed: kept, with the controller's risk (the old code dropped it as not applicable)
        iv = ctrl.prepare(rollback_to("mark"), s)
        assert iv is not None and iv.kind == InterventionKind.ROLLBACK, ctrl.store.timeline("not_applicable")
        assert ctrl.rollback_target(iv) == "mark"

        # backtested: the candidate forks the mark with the change, the control the live checkpoint
        ctrl.store.put(iv)
        ctrl.backtest(ctrl.store.get(iv.id))
        got = ctrl.store.get(iv.id)
        assert got.status in (Status.VALIDATED, Status.REJECTED) and got.backtest is not None, got.history
        assert "candidate forked from checkpoint mark" in got.backtest.note
        arms = {arm: yaml.safe_load((ctrl.private / "backtests" / f"bt-{iv.id}-{arm}-s0.yaml").read_text())
                for arm in ("candidate", "control")}
        assert arms["candidate"]["fork_from"].endswith("/mark.pt")
        assert arms["control"]["fork_from"].endswith(f"/bt-{iv.id}.pt")
        assert arms["candidate"]["fork_overrides"] == {"harness.max_turns": 6} and arms["control"]["fork_overrides"] == {}
        first = {arm: min(r["step"] for r in read_jsonl(ctrl.sdir / "backtests" / f"bt-{iv.id}-{arm}-s0" /
                                                         "metrics.jsonl") if r["algorithm"] == "sft")
                 for arm in arms}
        bt_step = ck.load(f"bt-{iv.id}")["step"]
        assert first == {"candidate": mark["step"] + 1, "control": bt_step + 1} and bt_step > mark["step"]

        # applied: the run goes back to the mark's weights and takes the change at the same safe point
        iv = ctrl.prepare(rollback_to("mark"), s)
        ctrl.store.put(iv)
        ctrl.store.transition(iv.id, Status.VALIDATED, "test: validated")
        ctrl.open_pr(ctrl.store.get(iv.id))
        ctrl.apply(ctrl.store.get(iv.id), s)
        got = ctrl.store.get(iv.id)
        assert got.status == Status.APPLIED and got.checkpoint_before == f"pre-{iv.id}", got.history
        acks = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}
        rb, pre = acks[f"{iv.id}-rb"], acks[f"{iv.id}-pre"]
        assert rb["cmd"] == "rollback" and rb["status"] == "applied" and rb["result"]["step"] == mark["step"]
        assert acks[f"{iv.id}-apply"]["status"] == "applied" and acks[f"{iv.id}-apply"]["result"]["harness_changed"]
        assert same(ck.load(rb["result"]["checkpoint"])["model"], ck.load("mark")["model"])
        assert got.outcome.before == {"harness.max_turns": 4} and got.outcome.step_left == pre["step"]

        # undone: back to the checkpoint taken before it, the weights trained since discarded
        ctrl.roll_back(got, "test: undo")
        got = ctrl.store.get(iv.id)
        assert got.status == Status.ROLLED_BACK and got.outcome.undone, got.history
        assert "weights trained since are discarded" in got.history[-1]["note"]
        undo = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}[f"{iv.id}-undo"]
        assert undo["cmd"] == "rollback" and undo["status"] == "applied", undo
        assert undo["result"]["step"] == pre["step"] and undo["result"]["recipe"] == rb["result"]["recipe"]
        before = ck.load(f"pre-{iv.id}")
        assert same(ck.load(undo["result"]["checkpoint"])["model"], before["model"])
        assert not same(before["model"], ck.load("mark")["model"])
        wait(lambda: ctrl.values_in_force(["harness.max_turns"]) == {"harness.max_turns": 4} or
             bool(ctrl.__setattr__("tick", type(ctrl.tick)())))

        # a checkpoint the trainer no longer has: the values the change replaced are set back instead
        assert ctrl.command("set_fields", "lost-apply", fields={"harness.max_turns": 5})["status"] == "applied"
        lost = Intervention(kind=InterventionKind.HARNESS_EDIT, changes={"harness.max_turns": 5}, diagnosis=iv.diagnosis,
                            rationale="r", operator="lead", policy="llm", status=Status.APPLIED, checkpoint_before="gone",
                            outcome={"before": {"harness.max_turns": 4}})
        ctrl.store.put(lost)
        ctrl.open_pr(lost)
        ctrl.roll_back(lost, "test: undo")
        got = ctrl.store.get(lost.id)
        acks = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}
        assert acks[f"{lost.id}-undo"]["status"] == "rejected" and acks[f"{lost.id}-undo-set"]["status"] == "applied"
        assert got.status == Status.ROLLED_BACK and got.outcome.undone and "the rollback to gone was refused" in \
            got.history[-1]["note"] and "the weights trained since are kept" in got.history[-1]["note"]
    finally:
        ctrl.jobs.close()
        ctrl._conn.close()
        ctrl.knowledge.close()
