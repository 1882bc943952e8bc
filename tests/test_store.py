"""The swarm's sqlite store and the controller lock, on real files in a temp dir.

Interventions round-trip whole (NaN evidence included), lifecycle moves persist across reopening
and an invalid move writes nothing; two processes write the timeline at once; a second controller
is refused with the holder's pid, and a SIGKILLed holder leaves no stale lock.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import pathlib
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from agents.domain import BacktestResult, Diagnosis, Intervention, InterventionKind, Status
from swarm.store import Store, WorkspaceLocked, acquire_lock, lock_holder

REPO = pathlib.Path(__file__).resolve().parents[1]


def make_iv(**over) -> Intervention:
    base = dict(
        kind=InterventionKind.RECIPE_EDIT, changes={"recipe.lr": 1e-3},
        diagnosis=Diagnosis(name="loss_spike", summary="loss jumped 40x", operator="diagnostics",
                            policy="builtin", evidence={"loss_last": float("nan"), "window": [0.5, 0.7, 20.0]}, step=120),
        rationale="lr too high", operator="diagnostics", policy="builtin",
    )
    return Intervention(**{**base, **over})


def test_put_get_round_trip_keeps_nan(tmp_path):
    s = Store(tmp_path)
    assert s.path == tmp_path / ".swarm" / "state.db"
    iv = make_iv(backtest=BacktestResult(metric="heldout_acc", candidate=[0.5, 0.6], control=[0.3, 0.2], effect=0.3,
                                         p_value=0.01, test="Welch t", horizon_steps=20, seeds=[0, 1], passed=True))
    s.put(iv)
    got = s.get(iv.id)
    assert math.isnan(got.diagnosis.evidence["loss_last"])
    assert got.model_dump(exclude={"diagnosis"}) == iv.model_dump(exclude={"diagnosis"})
    assert got.diagnosis.evidence["window"] == [0.5, 0.7, 20.0]
    assert iv.id in s and "nope" not in s
    with pytest.raises(KeyError, match="unknown intervention 'nope'"):
        s.get("nope")
    assert s.path.with_name("state.db-wal").exists(), "WAL mode"


def test_transitions_persist_across_reopen(tmp_path):
    db = tmp_path / "state.db"
    s = Store(db)
    iv = make_iv()
    s.put(iv)
    s.transition(iv.id, Status.BACKTESTING, "forked at step 120")
    s.transition(iv.id, "validated", "effect +0.3, p=0.01", applied_step=None)
    s.close()

    s2 = Store(db)
    got = s2.get(iv.id)
    assert got.status is Status.VALIDATED
    assert [(h["from"], h["to"], h["note"]) for h in got.history] == [
        ("proposed", "backtesting", "forked at step 120"), ("backtesting", "validated", "effect +0.3, p=0.01")]
    rows = s2.timeline(kind="transition")
    assert [(r["id"], r["from"], r["to"]) for r in rows] == [(iv.id, "proposed", "backtesting"),
                                                             (iv.id, "backtesting", "validated")]
    assert [x.id for x in s2.list(Status.VALIDATED)] == [iv.id] and s2.list("proposed") == []
    # updates ride along with a transition
    got = s2.transition(iv.id, Status.APPLIED, "auto: low risk", applied_step=130, branch="iv/x-recipe_edit")
    assert Store(db).get(iv.id).applied_step == 130 and got.branch == "iv/x-recipe_edit"


def test_invalid_transition_writes_nothing(tmp_path):
    s = Store(tmp_path)
    iv = make_iv()
    s.put(iv)
    before_row = s._db.execute("SELECT * FROM interventions").fetchall()
    before_tl = s.timeline()
    with pytest.raises(ValueError, match="cannot go from proposed to kept"):
        s.transition(iv.id, Status.KEPT, "skip ahead")
    with pytest.raises(KeyError):
        s.transition("missing", Status.VALIDATED)
    assert [tuple(r) for r in s._db.execute("SELECT * FROM interventions").fetchall()] == [tuple(r) for r in before_row]
    assert s.timeline() == before_tl
    assert Store(tmp_path).get(iv.id).status is Status.PROPOSED


def test_runs_and_timeline(tmp_path):
    s = Store(tmp_path)
    s.start_run("r1", goal="add 3 digits")
    s.start_run("r1", goal="add 3 digits")      # resume: same row
    assert len(s.runs()) == 1 and s.get_run("r1")["status"] == "running"
    s.end_run("r1", "reached")
    assert s.get_run("r1")["status"] == "reached" and s.get_run("r1")["ended"] is not None
    with pytest.raises(KeyError):
        s.end_run("r2", "x")
    a = s.log("diagnosis", name="loss_spike", step=120, loss=float("inf"))
    s.log("decision", id="abc", action="apply", policy="builtin")
    tl = s.timeline()
    assert [r["kind"] for r in tl] == ["diagnosis", "decision"] and tl[0]["loss"] == float("inf")
    assert [r["kind"] for r in s.timeline(since=a)] == ["decision"]


def _writer(db: str, tag: str, n: int) -> None:
    s = Store(db)
    for i in range(n):
        s.log("event", who=tag, i=i)


def test_two_processes_write_concurrently(tmp_path):
    db = str(tmp_path / "state.db")
    Store(db).close()
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=_writer, args=(db, t, 40)) for t in "ab"]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
        assert p.exitcode == 0
    tl = Store(db).timeline()
    assert len(tl) == 80 and {r["who"] for r in tl} == {"a", "b"}


def test_one_store_shared_by_threads(tmp_path):
    s = Store(tmp_path)
    ivs = [make_iv() for _ in range(8)]
    for iv in ivs:
        s.put(iv)

    def work(iv):
        s.transition(iv.id, Status.BACKTESTING)
        s.log("event", id=iv.id)
        return s.transition(iv.id, Status.VALIDATED).status

    with ThreadPoolExecutor(4) as ex:
        assert list(ex.map(work, ivs)) == [Status.VALIDATED] * 8
    assert len(s.timeline(kind="transition")) == 16 and len(s.list("validated")) == 8


_TRY_LOCK = ("import sys\nfrom swarm.store import acquire_lock, WorkspaceLocked\n"
             "try:\n    acquire_lock(sys.argv[1])\nexcept WorkspaceLocked as e:\n    print(e.pid, e); sys.exit(3)\n"
             "print('acquired')\n")
_HOLD_LOCK = ("import sys, time\nfrom swarm.store import acquire_lock\n"
              "lock = acquire_lock(sys.argv[1])\nprint('locked', flush=True)\ntime.sleep(60)\n")


def _py(code: str, *args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_second_controller_is_refused(tmp_path):
    lock = acquire_lock(tmp_path)
    assert lock_holder(tmp_path) == os.getpid()
    p = _py(_TRY_LOCK, str(tmp_path))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, (out, err)
    assert out.startswith(f"{os.getpid()} ") and f"pid {os.getpid()}" in out and "locked" in out
    with pytest.raises(WorkspaceLocked):       # another descriptor in this process is refused too
        acquire_lock(tmp_path)
    lock.release()
    p = _py(_TRY_LOCK, str(tmp_path))
    assert p.communicate(timeout=60)[0].strip() == "acquired" and p.returncode == 0


def test_sigkilled_holder_leaves_no_stale_lock(tmp_path):
    holder = _py(_HOLD_LOCK, str(tmp_path))
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(WorkspaceLocked, match=f"pid {holder.pid}") as e:
            acquire_lock(tmp_path)
        assert e.value.pid == holder.pid
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
    deadline = time.monotonic() + 10
    while True:
        try:
            lock = acquire_lock(tmp_path)
            break
        except WorkspaceLocked:
            assert time.monotonic() < deadline, "lock still held after its holder was killed"
            time.sleep(0.05)
    assert lock.held and lock_holder(tmp_path) == os.getpid()
    lock.release()
    assert not lock.held


def test_the_looks_that_gate_persistence_survive_a_restart(tmp_path):
    """How long a finding has held is read from the store (swarm.decisions.persistence gates fixes
    on it): a controller started again counts on from the looks before, keeps only the newest
    `keep`, and does not write the looks that saw nothing."""
    from swarm.decisions import Sighting, persistence

    s = Store(tmp_path / "state.db")
    for n in range(1, 8):
        s.record_look(n, 10 * n, ["truncation"] if n >= 5 else [], keep=4)
    s2 = Store(tmp_path / "state.db")            # another process opens the same ledger
    assert s2.last_look() == 7
    got = s2.sightings("truncation")
    assert [x[:2] for x in got] == [(5, 50), (6, 60), (7, 70)] and s2.sightings("divergence") == []
    s2.record_look(9, 90, ["truncation"], keep=4)  # looks 6..9 kept
    assert [x[0] for x in s2.sightings("truncation")] == [6, 7, 9]
    held = persistence([Sighting(*x) for x in s2.sightings("truncation")], Sighting(9, 90, got[-1][2] + 1), since=0.0)
    assert held == (3, 30)


def test_a_data_changes_onset_is_kept_while_its_finding_holds(tmp_path):
    """The step a finding named as the first whose data changed stays named on later looks whose
    evidence window has moved past it, while the finding holds; a look without it forgets it, and of
    two steps named the earlier is kept. It survives a reopen (it gates the pin)."""
    st = Store(tmp_path / "s.db")
    assert st.onsets({"label_noise": 250, "plateau": None}) == {"label_noise": 250}
    assert st.onsets({"label_noise": None}) == {"label_noise": 250}          # the window moved past it
    assert st.onsets({"label_noise": 300}) == {"label_noise": 250}           # the earlier is kept
    st.close()
    st = Store(tmp_path / "s.db")
    assert st.onsets({"label_noise": None, "harder_data": 40}) == {"label_noise": 250, "harder_data": 40}
    assert st.onsets({"harder_data": None}) == {"harder_data": 40}           # label_noise not seen: forgotten
    assert st.onsets({"label_noise": None}) == {}
    assert st.onsets({}) == {}
    st.close()
