"""Days unattended on Ray: `swarm resume` after the controller and its private Ray head died, and
the head a run started is stopped by whichever controller process ends the run.

- the controller is SIGKILLed and so is every process of its head (a reboot, an OOM kill); `swarm
  resume` finds the recorded head dead, cleans what is left of it (temp folder, token), starts a new
  private head and relaunches the job, which resumes from its newest good checkpoint: one restart,
  a `ray_head_replaced` row in the timeline, the target reached;
- the controller alone is SIGKILLed (the head and the job go on); the resumed controller reconnects
  to the recorded head and, when the run ends, stops it: no process of either head, no
  `/tmp/swarmlab-ray-*` folder of either controller and no token file is left behind;
- (slow) the head alone dies under a live controller: replaced and relaunched the same way;
- without Ray: a head's record round-trips, a dead head is told at once, and a cluster given by
  address is never replaced or stopped.

A healthy tiny goal (2-digit addition, held-out accuracy 0.6) on real `swarm run` / `swarm resume`
processes and real Ray heads on 127.0.0.1; token files go under tmp_path (SWARMLAB_RAY_AUTH_DIR).

    .venv/bin/python -m pytest tests/test_ray_resume.py -q
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any, Callable

import psutil
import pytest
import yaml

from swarm.jobs import RayJobs
from trainer.control import send_command, wait_for_ack
from trainer.launch import AUTH_DIR_ENV, RayHead, _free_port, _head_processes, head_alive, stop_head, token_path_for
from trainer.runlog import read_heartbeat, read_jsonl

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_swarm import timeline  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "goals" / "truncation.yaml"


def goal_file(tmp_path: pathlib.Path) -> pathlib.Path:
    """The truncation example without its perturbation, scaled down: healthy, the target in a few
    hundred steps, a checkpoint every 10."""
    g = yaml.safe_load(EXAMPLE.read_text())
    g["perturbations"] = []
    g["target"]["threshold"] = 0.6
    g["run"]["model"].update({"d_model": 64, "n_layers": 2})
    g["run"]["recipe"].update({"lr": 0.005, "eval_interval": 25, "eval_size": 100})
    g["run"]["checkpoint"] = {"interval": 10, "keep_last": 4}
    g["budget"] = {"wall_s": 400, "steps": 1500, "worker_cpu_s": 900, "llm_usd": 0.0}
    g["swarm"].update({"observe_every_s": 0.5, "observe_quiet_s": 0.5})
    path = tmp_path / "goal.yaml"
    path.write_text(yaml.safe_dump(g, sort_keys=False))
    return path


@pytest.fixture
def env(tmp_path, clean_git_home, monkeypatch):
    monkeypatch.setenv(AUTH_DIR_ENV, str(tmp_path / "ray-auth"))
    return dict(os.environ, PYTHONUNBUFFERED="1")


@pytest.fixture
def reap(tmp_path):
    """Controllers the test started (killed at the end if still running) and the heads they recorded
    or left (stopped by their own processes), so a failing test leaves nothing running."""
    procs: list[subprocess.Popen] = []
    heads: list[RayHead] = []
    yield procs, heads
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for h in heads:
        stop_head(h)
    for p in procs:
        for d in pathlib.Path("/tmp").glob(f"swarmlab-ray-{p.pid}-*"):
            stop_head(RayHead(None, "", str(d / "r"), owned=True))


def spawn(tmp_path: pathlib.Path, env: dict[str, str], log: pathlib.Path, *args: str) -> subprocess.Popen:
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "swarm.cli", *args], cwd=tmp_path, stdout=f,
                                stderr=subprocess.STDOUT, env=env)


def wait_for(what: str, pred: Callable[[], Any], timeout: float, proc: subprocess.Popen, log: pathlib.Path) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        if proc.poll() is not None:
            pytest.fail(f"controller exited ({proc.returncode}) while waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}:\n{log.read_text()[-3000:]}")


def recorded_head(ws: pathlib.Path) -> RayHead | None:
    p = ws / ".swarm" / "ray_head.json"
    try:
        return RayHead.from_record(json.loads(p.read_text()))
    except (OSError, ValueError):
        return None


def sigkill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def start_run(tmp_path, env, log, reap) -> tuple[pathlib.Path, subprocess.Popen, RayHead]:
    """`swarm run` on Ray until its trainer is past its first periodic checkpoint; returns the
    workspace, the controller and the head it recorded."""
    ws = tmp_path / "ws"
    proc = spawn(tmp_path, env, log, "run", str(goal_file(tmp_path)), "--workspace", str(ws), "--quiet")
    reap[0].append(proc)
    head = wait_for("the recorded head", lambda: recorded_head(ws), 180, proc, log)
    reap[1].append(head)
    assert head.owned and head.temp_dir and head.token_path and head.gcs_address, head
    run_dir = ws / ".swarm" / "runs" / "train"
    wait_for("a checkpoint past step 0", lambda: (read_heartbeat(run_dir) or {}).get("step", 0) >= 12, 240, proc, log)
    return ws, proc, head


def resume_to_the_end(tmp_path, env, log, reap, ws) -> tuple[dict[str, Any], subprocess.Popen]:
    summary_path = tmp_path / "summary.json"
    proc = spawn(tmp_path, env, log, "resume", "--workspace", str(ws), "--quiet", "--summary", str(summary_path))
    reap[0].append(proc)
    try:
        rc = proc.wait(400)
    except subprocess.TimeoutExpired:
        pytest.fail(f"resumed controller did not finish:\n{log.read_text()[-3000:]}")
    assert rc == 0, log.read_text()[-3000:]
    return json.loads(summary_path.read_text()), proc


def assert_nothing_left(tmp_path: pathlib.Path, ws: pathlib.Path, heads: list[RayHead], pids: list[int]) -> None:
    """No process of any head, no private temp folder, no token file, no head record."""
    for h in heads:
        assert not _head_processes(h), f"processes of {h.dashboard_url} left running"
        assert not pathlib.Path(h.temp_dir).parent.exists(), f"{h.temp_dir} left behind"
        assert not pathlib.Path(h.token_path).exists(), f"token {h.token_path} left behind"
    for pid in pids:   # every head a controller started: /tmp/swarmlab-ray-<its pid>-<port>
        tag = f"/tmp/swarmlab-ray-{pid}-"
        assert not list(pathlib.Path("/tmp").glob(f"swarmlab-ray-{pid}-*")), f"a temp folder of controller {pid}"
        assert not [p for p in psutil.process_iter(["cmdline"]) if any(tag in a for a in p.info["cmdline"] or [])]
    assert not list((tmp_path / "ray-auth").glob("*.token")), "a token file left behind"
    assert not (ws / ".swarm" / "ray_head.json").exists()


def test_a_head_record_round_trips_and_a_dead_head_is_told_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv(AUTH_DIR_ENV, str(tmp_path / "ray-auth"))
    port = _free_port()   # nothing listens there
    url = f"http://127.0.0.1:{port}"
    head = RayHead(f"127.0.0.1:{_free_port()}", url, str(tmp_path / "gone" / "r"), True, str(token_path_for(url)))
    assert RayHead.from_record(json.loads(json.dumps(head.record()))) == head
    # a record from before heads were recorded in full named a private head only
    legacy = RayHead.from_record({"dashboard_url": url})
    assert legacy.owned and legacy.token_path is None and legacy.temp_dir is None
    t0 = time.monotonic()
    assert not head_alive(head)          # no process of it is alive: dead without waiting for its API
    assert time.monotonic() - t0 < 5
    assert not head_alive(legacy, timeout=1.0)   # nothing answers at its address


def test_a_cluster_given_by_address_is_never_replaced_or_stopped(tmp_path, monkeypatch):
    monkeypatch.setenv(AUTH_DIR_ENV, str(tmp_path / "ray-auth"))
    url = f"http://127.0.0.1:{_free_port()}"   # the user's cluster, not answering
    for jobs in (RayJobs(url), RayJobs(saved=RayHead(None, url, owned=False))):
        assert jobs.status("train-1") == "UNKNOWN"
        assert jobs.take_replaced() == [] and jobs.head is not None and not jobs.head.owned
        assert jobs.head.dashboard_url == url
        jobs.close()


@pytest.mark.slow   # about a minute of a real Ray head (the default run stays under ~20 min)
@pytest.mark.ray
def test_resume_after_the_head_died_relaunches_from_the_checkpoint(tmp_path, env, reap):
    log = tmp_path / "controller.log"
    ws, proc, head = start_run(tmp_path, env, log, reap)
    run_dir = ws / ".swarm" / "runs" / "train"
    # hold the trainer still, so the kill lands before the target whatever the machine's speed
    ack = wait_for_ack(run_dir, send_command(run_dir, "pause"), timeout=60)
    assert ack["status"] == "applied", ack
    paused_at = ack["step"]
    sigkill(proc)
    procs = _head_processes(head)
    assert procs, "the head has no process"
    for p in procs:   # a reboot, an OOM kill: every process of the head, the trainer's included
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=30)
    assert not _head_processes(head)
    assert pathlib.Path(head.temp_dir).exists() and pathlib.Path(head.token_path).exists()   # what a crash leaves

    summary, resumed = resume_to_the_end(tmp_path, env, log, reap, ws)
    assert summary["reached"] is True and summary["reason"] == "target_met", summary
    assert summary["restarts"] == 1, summary
    rows = timeline(ws)
    replaced = [r for r in rows if r["kind"] == "ray_head_replaced"]
    assert len(replaced) == 1 and replaced[0]["old"] == head.dashboard_url, replaced
    assert [r for r in rows if r["kind"] == "job_relaunched"], [r["kind"] for r in rows]
    # the relaunched trainer went on from its newest good checkpoint, not from scratch
    events = read_jsonl(run_dir / "events.jsonl")
    resumes = [e for e in events if e["event"] == "resume"]
    assert resumes and 10 <= resumes[-1]["step"] <= paused_at, (paused_at, events)
    assert "ray_head_replaced" in (ws / "reports" / "final" / "REPORT.md").read_text()
    assert_nothing_left(tmp_path, ws, [head], [proc.pid, resumed.pid])


@pytest.mark.slow   # about a minute of a real Ray head (the default run stays under ~20 min)
@pytest.mark.ray
def test_a_resumed_run_stops_the_head_its_run_started(tmp_path, env, reap):
    log = tmp_path / "controller.log"
    ws, proc, head = start_run(tmp_path, env, log, reap)
    sigkill(proc)   # the head and its job go on without a controller
    assert _head_processes(head)

    summary, resumed = resume_to_the_end(tmp_path, env, log, reap, ws)
    assert summary["reached"] is True and summary["restarts"] == 0, summary
    assert not [r for r in timeline(ws) if r["kind"] == "ray_head_replaced"]
    assert_nothing_left(tmp_path, ws, [head], [proc.pid, resumed.pid])


@pytest.mark.ray
@pytest.mark.slow
def test_a_live_controller_replaces_a_head_that_died_under_it(tmp_path, env, reap):
    log = tmp_path / "controller.log"
    ws, proc, head = start_run(tmp_path, env, log, reap)
    run_dir = ws / ".swarm" / "runs" / "train"
    assert wait_for_ack(run_dir, send_command(run_dir, "pause"), timeout=60)["status"] == "applied"
    procs = _head_processes(head)
    for p in procs:   # the head alone: the controller finds it dead when a status request fails
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=30)
    try:
        rc = proc.wait(400)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the controller did not finish:\n{log.read_text()[-3000:]}")
    assert rc == 0, log.read_text()[-3000:]
    rows = timeline(ws)
    assert [r["old"] for r in rows if r["kind"] == "ray_head_replaced"] == [head.dashboard_url]
    assert [r["restarts"] for r in rows if r["kind"] == "job_relaunched"] == [1]
    assert_nothing_left(tmp_path, ws, [head], [proc.pid])
