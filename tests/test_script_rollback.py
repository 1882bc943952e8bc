"""The controller rolls a script run back to its untrained start (swarm/script_run.py), on the real
example script: a run a too-high lr keeps from learning has nothing worth keeping in its weights, so
a fix is backtested from the start with both arms from `init` (the steps since gained nothing) over
the steps the rollback gives up, and applied as a relaunch from `init` with the change (the callback's `rollback`, then the change, in
one pause).
"""
from __future__ import annotations

import pathlib
import time

import pytest

from agents.domain import Diagnosis, Intervention, InterventionKind, Risk, Status
from trainer.runlog import read_jsonl
from trainer.steer.settings import read_declared

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--d_model", "32", "--n_layers", "1", "--train_size", "512", "--eval_size", "64"]


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def wait(cond, timeout: float = 300.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def test_a_run_that_never_learnt_is_backtested_and_restarted_from_its_untrained_start(tmp_path, monkeypatch):
    from swarm.controller import Controller
    from swarm.goal import Goal
    from swarm.graph import SwarmState

    monkeypatch.chdir(tmp_path)
    goal = Goal.parse({
        "goal": "a tiny Qwen2 learns 2-digit addition",
        "target": {"metric": "heldout_acc", "op": ">=", "threshold": 0.9},
        "run": {"entrypoint": {"script": str(ROOT / "examples" / "steer" / "sft_addition.py"), "metric": "eval_accuracy",
                               "args": [*TINY, "--output_dir", "out", "--max_steps", "100000", "--learning_rate", "0.05",
                                        "--eval_steps", "5", "--save_steps", "100000"]}},
        "memory": {"library": str(tmp_path / "lib"), "backend": "memory"},
        "swarm": {"backtest": {"horizon_steps": 8, "seeds": [0]}}})
    ctrl = Controller.create(tmp_path / "ws", goal, jobs="process")
    try:
        job = ctrl.start_job()
        ctrl.state_job = job

        def evals() -> list[dict]:
            ctrl.tick.evidence = None
            return ctrl.evidence("RUNNING").evals

        wait(lambda: len(evals()) >= 2 and any(c["name"] == "init" for c in ctrl.checkpoints()))
        s = SwarmState(job=job, job_status="RUNNING", step=1, started=time.time(), launched=time.time())
        d = Diagnosis(name="not_learning", summary="loss flat, held-out 0", operator="diagnostics", policy="builtin",
                      evidence={"rollback_to": "init"})
        iv = ctrl.prepare(Intervention(kind=InterventionKind.ROLLBACK, changes={"recipe.lr": 1e-3}, diagnosis=d,
                                       rationale="start over at a lower lr.", operator="diagnostics", policy="builtin",
                                       risk=Risk.MEDIUM), s)
        assert iv.kind == InterventionKind.ROLLBACK and iv.changes == {"recipe.learning_rate": 1e-3}
        assert "missing_evidence" not in iv.diagnosis.evidence or not any(
            "roll back" in m for m in iv.diagnosis.evidence["missing_evidence"])
        ctrl.store.put(iv)

        # the backtest: nothing gained since `init` (held-out 0 throughout), so both arms start there,
        # and train the steps the rollback gives up (the live run's step at the backtest's
        # checkpoint), at most 4x the goal's horizon of 8
        ctrl.backtest(ctrl.store.get(iv.id))
        got = ctrl.store.get(iv.id)
        assert got.status in (Status.VALIDATED, Status.REJECTED), got.history
        assert "both arms from checkpoint init (step 0)" in got.backtest.note, got.backtest.note
        live = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}[f"{iv.id}-bt"]["step"]
        horizon = min(max(live, 8), 32)
        assert live >= 10 and got.backtest.horizon_steps == horizon, (live, got.backtest.horizon_steps)
        assert f"horizon {horizon} steps: the {live} steps the rollback gives up" in got.backtest.note, got.backtest.note
        for arm in ("candidate", "control"):
            rows = read_jsonl(ctrl.sdir / "backtests" / f"bt-{iv.id}-{arm}-s0" / "metrics.jsonl")
            assert rows[0]["step"] == 1 and rows[-1]["step"] == horizon and "heldout_acc" in rows[-1]
        cand = [r for r in read_jsonl(ctrl.sdir / "backtests" / f"bt-{iv.id}-candidate-s0" / "metrics.jsonl") if "lr" in r]
        ctrl_rows = [r for r in read_jsonl(ctrl.sdir / "backtests" / f"bt-{iv.id}-control-s0" / "metrics.jsonl") if "lr" in r]
        assert cand[0]["loss"] == pytest.approx(ctrl_rows[0]["loss"], rel=1e-6)   # the same start, the same batch
        assert cand[0]["lr"] == pytest.approx(ctrl_rows[0]["lr"] * 1e-3 / 0.05, rel=1e-3)

        # applied: the rollback and its change land in one pause; the relauncher relaunches from `init`.
        # (8 steps tell too little either way, so the same fix is approved here as a user would.)
        iv = ctrl.prepare(Intervention(kind=InterventionKind.ROLLBACK, changes={"recipe.lr": 1e-3}, diagnosis=d,
                                       rationale="start over at a lower lr.", operator="diagnostics", policy="builtin",
                                       risk=Risk.MEDIUM), s)
        ctrl.store.put(iv)
        ctrl.store.transition(iv.id, Status.VALIDATED, "test: approved")
        ctrl.open_pr(ctrl.store.get(iv.id))
        left = ctrl.evidence("RUNNING").step
        ctrl.apply(ctrl.store.get(iv.id), s)
        assert ctrl.store.get(iv.id).status == Status.APPLIED, ctrl.store.get(iv.id).history
        acks = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}
        assert acks[f"{iv.id}-rb"]["status"] == "restart" and acks[f"{iv.id}-rb"]["result"]["rollback"] == "init"
        assert acks[f"{iv.id}-apply"]["status"] == "restart" and acks[f"{iv.id}-apply"]["result"]["hot"] == {"learning_rate": 1e-3}
        wait(lambda: any(r.get("reason") == "restart" for r in read_jsonl(ctrl.run_dir / "launches.jsonl")))
        launch = [r for r in read_jsonl(ctrl.run_dir / "launches.jsonl") if r.get("reason") == "restart"][0]
        assert launch["resume_from"] == str((tmp_path / "out" / "swarm-init").resolve())
        wait(lambda: (read_declared(ctrl.run_dir) or {}).get("overrides") == {"learning_rate": 1e-3})
        wait(lambda: any(r.get("segment") == 1 and "loss" in r for r in read_jsonl(ctrl.run_dir / "metrics.jsonl")))
        new = [r for r in read_jsonl(ctrl.run_dir / "metrics.jsonl") if r.get("segment") == 1 and "loss" in r]
        assert new[0]["step"] == 1 and left > 1 and new[0]["lr"] <= 1e-3
        assert read_declared(ctrl.run_dir)["values"]["learning_rate"] == pytest.approx(1e-3)
    finally:
        ctrl.jobs.close()
        ctrl._conn.close()
        ctrl.knowledge.close()
