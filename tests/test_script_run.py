"""The controller on a goal that runs the user's own script (swarm/script_run.py).

Pure parts on tables: the one mapping between the names SwarmCallback declares and the built-in
operators' fields, the adaptation of a proposal to a script run, which acknowledgements count as
accepted, the goal's own values from the script's arguments. Then the real controller on the real
example script: a proposal in operator terms is recorded under the declared name and pre-checked by
`trainer.steer.check_change`; a hot change is applied and read back; a restart-required change is
acknowledged `restart`, accepted, and relaunched by the relauncher; a change that would need a
backtest is backtested: the live script is paused while arms forked from its checkpoint run, and
the result is recorded.
"""
from __future__ import annotations

import pathlib
import time

import pytest

from agents.domain import Diagnosis, Intervention, InterventionKind, Risk, Status
from swarm.script_run import (OPERATOR_FIELDS, accepted, adapt, as_changes, operator_view, start_values,
                              to_declared, trainer_fields)
from trainer.runlog import read_jsonl
from trainer.steer.settings import Setting, read_declared

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--d_model", "32", "--n_layers", "1", "--train_size", "512", "--eval_size", "64"]
SETTINGS = {"settings": [Setting("learning_rate", "float", "hot", gt=0, le=1).to_json(),
                         Setting("max_steps", "int", "restart", ge=1).to_json(),
                         Setting("temperature", "float", "hot", gt=0, le=10).to_json()],
            "values": {"learning_rate": 0.05, "max_steps": 2000, "temperature": 0.7}, "overrides": {}}


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def proposal(kind: InterventionKind, changes: dict, **kw) -> Intervention:
    d = Diagnosis(name=kw.pop("diagnosis", "not_learning"), summary="loss flat", operator="diagnostics", policy="builtin")
    return Intervention(kind=kind, changes=changes, diagnosis=d, rationale="lower the lr.", operator="diagnostics",
                        policy="builtin", risk=Risk.MEDIUM, **kw)


def test_the_operators_see_the_declared_values_under_their_own_fields():
    recipe, harness = operator_view({"learning_rate": 0.05, "temperature": 0.7, "max_completion_length": 64,
                                     "seed": 3, "lr_scheduler_type": "cosine"})
    assert recipe == {"lr": 0.05}     # seed and the schedule have no operator field: not shown as one
    assert harness == {"sampling": {"temperature": 0.7, "max_new_tokens": 64}}
    assert len(set(OPERATOR_FIELDS.values())) == len(OPERATOR_FIELDS)   # one field per name, both ways


@pytest.mark.parametrize("changes, out, why", [
    ({"recipe.lr": 1e-3}, {"recipe.learning_rate": 1e-3}, None),
    ({"recipe.steps": 600}, {"recipe.max_steps": 600}, None),
    ({"harness.sampling.temperature": 1}, {"recipe.temperature": 1.0}, None),       # coerced to its declared type
    ({"recipe.learning_rate": 2e-3}, {"recipe.learning_rate": 2e-3}, None),         # a declared name is kept
    ({"recipe.lr": 5.0}, {"recipe.learning_rate": 5.0}, None),                      # translated; check_change refuses it
    ({"harness.curriculum.start": 2}, {}, "harness.curriculum.start: the script run declares no such setting"),
    ({"recipe.kl_coef": 0.1}, {}, "recipe.kl_coef: the script run declares no such setting"),   # beta not declared
])
def test_a_change_is_translated_to_the_declared_names(changes, out, why):
    got, reason = to_declared(changes, SETTINGS)
    assert got == out
    assert (reason is None) if why is None else reason.startswith(why) and "declared: learning_rate" in reason
    assert trainer_fields(as_changes({"learning_rate": 1e-3})) == {"learning_rate": 1e-3}


def test_a_proposal_is_adapted_to_what_a_script_run_can_take():
    ev = type("Ev", (), {"samples": []})()
    iv, why = adapt(proposal(InterventionKind.RECIPE_EDIT, {"recipe.lr": 1e-3}), SETTINGS, ev)
    assert why is None and iv.changes == {"recipe.learning_rate": 1e-3} and iv.kind == InterventionKind.RECIPE_EDIT
    assert "recipe.lr → recipe.learning_rate" in iv.rationale
    assert any("per-sample" in m for m in iv.diagnosis.evidence["missing_evidence"])   # named, not guessed
    rb, why = adapt(proposal(InterventionKind.ROLLBACK, {"recipe.lr": 1e-3}, backtest_skipped="divergence"), SETTINGS, ev)
    assert why is None and rb.kind == InterventionKind.RECIPE_EDIT and rb.backtest_skipped is None
    assert "not rolled back" in rb.rationale and any("roll back" in m for m in rb.diagnosis.evidence["missing_evidence"])
    assert adapt(proposal(InterventionKind.ROLLBACK, {}), SETTINGS, ev)[0] is None
    # with a checkpoint of the script's to go back to (its untrained `init`), a rollback stays one
    rb, why = adapt(proposal(InterventionKind.ROLLBACK, {"recipe.lr": 1e-3}), SETTINGS, ev, "init")
    assert why is None and rb.kind == InterventionKind.ROLLBACK and rb.changes == {"recipe.learning_rate": 1e-3}
    assert "not rolled back" not in rb.rationale and not any("roll back" in m for m in rb.diagnosis.evidence["missing_evidence"])
    none, why = adapt(proposal(InterventionKind.DATA_CHANGE, {"harness.filters.dedupe": True}), SETTINGS, ev)
    assert none is None and "data_change has no command" in why
    with_samples = type("Ev", (), {"samples": [{"completion": "x"}]})()
    iv, _ = adapt(proposal(InterventionKind.RECIPE_EDIT, {"recipe.lr": 1e-3}), SETTINGS, with_samples)
    assert "missing_evidence" not in iv.diagnosis.evidence


@pytest.mark.parametrize("ack, ok", [
    ({"status": "applied", "step": 3}, True),
    ({"status": "restart", "step": 3, "result": {"restart": {"max_steps": 9}}}, True),   # the relauncher relaunches
    ({"status": "rejected", "reason": "learning_rate=5: must be <= 1"}, False),
    (None, False), ({}, False),
])
def test_which_acknowledgements_count_as_accepted(ack, ok):
    assert accepted(ack) is ok


def test_the_goals_own_values_come_from_the_scripts_arguments():
    ep = type("Ep", (), {"args": ["--learning_rate", "0.5", "--learning_rate", "0.05", "--max_steps=300"]})()
    assert start_values(ep, SETTINGS, ["recipe.learning_rate", "recipe.max_steps", "recipe.temperature"]) == \
        {"recipe.learning_rate": 0.05, "recipe.max_steps": 300, "recipe.temperature": 0.7}
    s = {**SETTINGS, "overrides": {"temperature": 1.0}}
    assert start_values(ep, s, ["recipe.temperature"]) == {"recipe.temperature": None}   # changed since: unknown


def wait(pred, timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def script_controller(tmp_path, monkeypatch, threshold: float, eval_args: list[str]):
    """The real controller on the example SFT script (a tiny Qwen2, lr 0.05: too high to learn)."""
    from swarm.controller import Controller
    from swarm.goal import Goal

    monkeypatch.chdir(tmp_path)
    goal = Goal.parse({
        "goal": "a tiny Qwen2 learns 2-digit addition",
        "target": {"metric": "heldout_acc", "op": ">=", "threshold": threshold},
        "run": {"entrypoint": {"script": str(ROOT / "examples" / "steer" / "sft_addition.py"), "metric": "eval_accuracy",
                               "args": [*TINY, "--output_dir", "out", "--max_steps", "100000", "--learning_rate", "0.05",
                                        *eval_args, "--save_steps", "100000"]}},
        "memory": {"library": str(tmp_path / "lib"), "backend": "memory"},
        "swarm": {"backtest": {"horizon_steps": 8, "seeds": [0]}}})
    return Controller.create(tmp_path / "ws", goal, jobs="process")


def test_the_controller_checks_applies_and_relaunches_a_script_runs_changes(tmp_path, monkeypatch):
    from swarm.graph import SwarmState

    ctrl = script_controller(tmp_path, monkeypatch, 0.2, ["--eval_strategy", "no"])
    try:
        job = ctrl.start_job()
        ctrl.state_job = job

        def stepping() -> bool:
            ctrl.tick.evidence = None    # read the run's files afresh
            return bool((read_declared(ctrl.run_dir) or {}).get("values")) and ctrl.evidence("RUNNING").step > 0

        wait(stepping)
        s = SwarmState(job=job, job_status="RUNNING", step=1, started=time.time(), launched=time.time())

        # operator terms in, the declared name recorded, checked as the live trainer would
        iv = ctrl.prepare(proposal(InterventionKind.RECIPE_EDIT, {"recipe.lr": 0.02}), s)
        assert iv.changes == {"recipe.learning_rate": 0.02} and ctrl.validity(iv) is None
        bad = ctrl.prepare(proposal(InterventionKind.RECIPE_EDIT, {"recipe.lr": 5.0}), s)
        assert ctrl.validity(bad) == "learning_rate=5.0: must be <= 1"
        assert ctrl.prepare(proposal(InterventionKind.DATA_CHANGE, {"harness.curriculum.start": 2}), s) is None
        assert [r["reason"] for r in ctrl.store.timeline("not_applicable")] == ["a data_change has no command on a script run"]

        # hot: applied and read back
        ctrl.store.put(iv)
        ctrl.store.transition(iv.id, Status.VALIDATED, "test: validated")
        ctrl.open_pr(ctrl.store.get(iv.id))    # as the gate does: a PR that changes no workspace file
        ctrl.apply(ctrl.store.get(iv.id), s)
        assert ctrl.ws.pr_state(iv.id) == "merged" and ctrl.ws.current_recipe() == {}
        assert ctrl.store.get(iv.id).status == Status.APPLIED
        assert read_declared(ctrl.run_dir)["values"]["learning_rate"] == pytest.approx(0.02)

        # restart-required: acknowledged `restart`, accepted; the relauncher relaunches with the flag
        rs = ctrl.prepare(proposal(InterventionKind.RECIPE_EDIT, {"recipe.steps": 50000}, diagnosis="plateau"), s)
        assert rs.changes == {"recipe.max_steps": 50000}
        ctrl.store.put(rs)
        ctrl.store.transition(rs.id, Status.VALIDATED, "test: validated")
        ctrl.open_pr(ctrl.store.get(rs.id))
        ctrl.apply(ctrl.store.get(rs.id), s)
        assert ctrl.store.get(rs.id).status == Status.APPLIED, ctrl.store.get(rs.id).history
        acks = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}
        assert acks[f"{rs.id}-apply"]["status"] == "restart"
        wait(lambda: any(r.get("reason") == "restart" for r in read_jsonl(ctrl.run_dir / "launches.jsonl")))
        launch = [r for r in read_jsonl(ctrl.run_dir / "launches.jsonl") if r.get("reason") == "restart"][0]
        assert launch["argv"][-4:-2] == ["--max_steps", "50000"] and launch["argv"][-2] == "--resume_from_checkpoint"

        # a change that needs a backtest: the relaunched script is checkpointed and paused, a candidate
        # and a control arm fork from that checkpoint, and the decision is recorded
        def live_step() -> int:
            ctrl.tick.evidence = None
            return ctrl.evidence("RUNNING").step

        wait(lambda: (read_declared(ctrl.run_dir) or {}).get("values", {}).get("max_steps") == 50000
             and live_step() > int(acks[f"{rs.id}-apply"]["step"]))
        bt = ctrl.prepare(proposal(InterventionKind.RECIPE_EDIT, {"recipe.lr": 0.01}), s)
        ctrl.store.put(bt)
        ctrl.backtest(ctrl.store.get(bt.id))
        got = ctrl.store.get(bt.id)
        assert got.status in (Status.VALIDATED, Status.REJECTED), got.history
        assert got.backtest is not None and got.backtest.horizon_steps == 8 and got.backtest.seeds == [0]
        assert got.backtest_skipped is None and got.outcome.backtest_cpu_s > 0
        assert "held-out size 64 (the script's)" in got.backtest.note
        acks = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}
        if got.status == Status.VALIDATED:   # held at the fork until it is applied or sent to a human
            assert got.outcome.paused_for_backtest and f"{bt.id}-bt-resume" not in acks
            ctrl.resume_paused(bt.id)
            acks = {r["id"]: r for r in read_jsonl(ctrl.run_dir / "command_log.jsonl")}
        fork = acks[f"{bt.id}-bt"]
        assert fork["status"] == "applied" and pathlib.Path(fork["result"]["checkpoint"]).is_dir()
        paused, resumed = acks[f"{bt.id}-bt-pause"], acks[f"{bt.id}-bt-resume"]
        assert paused["status"] == resumed["status"] == "applied" and paused["step"] == resumed["step"]
        # the live run trained nothing while the arms ran
        assert not [r for r in read_jsonl(ctrl.run_dir / "metrics.jsonl") if paused["time"] < r["time"] < resumed["time"]]
        assert not (ctrl.sdir / "backtests" / f"fork-{bt.id}").exists()   # the arms' copy of the checkpoint: removed
        for arm in ("candidate", "control"):
            rows = read_jsonl(ctrl.sdir / "backtests" / f"bt-{bt.id}-{arm}-s0" / "metrics.jsonl")
            assert rows[0]["step"] == fork["step"] + 1 and rows[-1]["step"] == fork["step"] + 8 and "heldout_acc" in rows[-1]
        wait(lambda: live_step() > resumed["step"])   # and goes on after them
    finally:
        ctrl.jobs.close()
        ctrl._conn.close()
        ctrl.knowledge.close()


def test_a_run_that_never_learnt_is_backtested_and_restarted_from_its_untrained_start(tmp_path, monkeypatch):
    """A run a too-high lr keeps from learning has nothing worth keeping in its weights, so a fix is
    backtested from the untrained start with both arms from `init` (the steps since gained nothing),
    training the steps the rollback gives up, and applied as a relaunch from `init` with the change
    (the callback's `rollback`, then the change, in one pause)."""
    from swarm.graph import SwarmState

    ctrl = script_controller(tmp_path, monkeypatch, 0.9, ["--eval_steps", "5"])
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


def test_a_script_run_ends_when_its_target_is_met(tmp_path, monkeypatch):
    """This project's trainer stops itself at the target; a user's script does not know it, so the
    controller ends the run on the first evaluation that meets it (and not on one that does not)."""
    import json

    from swarm.graph import SwarmState

    ctrl = script_controller(tmp_path, monkeypatch, 0.2, ["--eval_steps", "5"])
    try:
        s = SwarmState(job="train", job_status="RUNNING", started=time.time(), launched=time.time())
        ctrl.job_status = lambda job: "RUNNING"   # a live script: only its rows matter here

        ctrl.run_dir.mkdir(parents=True, exist_ok=True)

        def observe_after(acc: float, step: int) -> dict:
            with open(ctrl.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "segment": 0, "time": time.time(), "heldout_acc": acc}) + "\n")
            return ctrl.node_observe(s)

        assert "done" not in observe_after(0.1, 5)
        got = observe_after(0.25, 10)
        assert got["done"] == "target_met" and got["to_target"]["worker_cpu_s"] >= 0
    finally:
        ctrl.jobs.close()
        ctrl._conn.close()
        ctrl.knowledge.close()
