"""The trainer as a real Ray job on a private head (127.0.0.1, token auth on: the job inherits the
token, a client reconnecting by address finds it): metrics stream while it runs, a control command
is acknowledged and obeyed; and data-parallel training on two
Ray Train workers (gloo on CPU; about 40 s here, most of it Ray Train's start-up). Every head is
stopped in a `finally`, by its own processes only (never `ray stop`, which stops every Ray)."""
from __future__ import annotations

import pathlib
import subprocess
import time

import pytest

from trainer.config import RunConfig
from trainer.control import send_command, wait_for_ack
from trainer.launch import RayHead, _head_processes, ensure_head, start_head, stop_head, submit_job, wait_job
from trainer.runlog import read_heartbeat, read_jsonl

pytestmark = pytest.mark.ray


def step_rows(run_dir):
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if not r.get("final")]


def _wait(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _listening_beyond_loopback(head) -> list[str]:
    pids = {str(p.pid) for p in _head_processes(head)}
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
    loopback = ("127.0.0.1", "[::ffff:127.0.0.1]", "[::1]")
    return [line for line in out if any(f"pid={pid}," in line for pid in pids)
            and line.split()[3].rsplit(":", 1)[0] not in loopback]


# a workspace path with a space, quotes and shell metacharacters: the job's shell must see one path
ODD_DIR = "my runs; touch swarmlab-pwned-marker; echo $(id) 'q\""
MARKER = pathlib.Path(__file__).resolve().parent.parent / "swarmlab-pwned-marker"


def test_ray_job_streams_metrics_and_obeys_commands(make_cfg, tmp_path):
    odd = tmp_path / ODD_DIR
    odd.mkdir()
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 100_000, "batch_size": 2, "schedule": "constant",
                                           "warmup_steps": 0, "eval_size": 4}, samples_per_step=1,
                                   out_dir=str(odd / "runs")))
    path = odd / "job.yaml"
    path.write_text(cfg.to_yaml())
    head = start_head(num_cpus=2)  # its temp dir: short (AF_UNIX paths), removed by stop_head
    try:
        assert head.dashboard_url.startswith("http://127.0.0.1:") and head.gcs_address.startswith("127.0.0.1:")
        assert not _listening_beyond_loopback(head)
        token = pathlib.Path(head.token_path)
        assert token.stat().st_mode & 0o777 == 0o600 and token.parent.stat().st_mode & 0o777 == 0o700
        again = ensure_head(head.dashboard_url)  # a controller reconnecting after a restart
        assert not again.owned and again.token_path == head.token_path and again.client().list_jobs() == []
        job = submit_job(head, path)
        _wait(lambda: len(step_rows(cfg.run_dir)) >= 3, 120, "the job's first metrics")
        n = len(step_rows(cfg.run_dir))
        _wait(lambda: len(step_rows(cfg.run_dir)) > n + 2, 60, "metrics to grow")
        assert (read_heartbeat(cfg.run_dir) or {}).get("state") == "running"
        ack = wait_for_ack(cfg.run_dir, send_command(cfg.run_dir, "set_recipe", fields={"lr": 1e-3}), timeout=60)
        assert ack["status"] == "applied"
        _wait(lambda: step_rows(cfg.run_dir)[-1]["lr"] == 1e-3, 60, "the new lr")
        before = [r["lr"] for r in step_rows(cfg.run_dir) if r["step"] <= ack["step"]]
        assert set(before) == {1e-2}
        stop = wait_for_ack(cfg.run_dir, send_command(cfg.run_dir, "stop"), timeout=60)
        assert stop["status"] == "applied"
        assert wait_job(head, job, timeout=120) == "SUCCEEDED"
        logs = head.client().get_job_logs(job)
        assert '"status": "stopped_by_command"' in logs
        assert read_heartbeat(cfg.run_dir)["state"] == "stopped_by_command"
        assert not MARKER.exists(), "a word of the workspace path ran as a command"
    finally:
        MARKER.unlink(missing_ok=True)
        stop_head(head)
    assert not _head_processes(head), "head processes left running"
    assert not pathlib.Path(head.token_path).exists()


@pytest.mark.slow   # about a minute of real Ray workers (the default run stays under ~20 min)
def test_ray_train_data_parallel_two_workers(make_cfg, tmp_path):
    cfg = RunConfig.parse(make_cfg(num_workers=2, recipe={"steps": 4, "batch_size": 8, "eval_interval": 4,
                                                          "eval_size": 8}, checkpoint={"interval": 2}))
    path = tmp_path / "dp.yaml"
    path.write_text(cfg.to_yaml())
    head = start_head(num_cpus=3)
    try:
        job = submit_job(head, path)
        status = wait_job(head, job, timeout=400)
        logs = head.client().get_job_logs(job)
        assert status == "SUCCEEDED", logs[-4000:]
    finally:
        stop_head(head)
    events = read_jsonl(cfg.run_dir / "events.jsonl")
    assert events[0]["event"] == "start" and events[0]["world"] == 2
    rows = step_rows(cfg.run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and "heldout_acc" in rows[-1]
    # each rank took half of the batch of 8: tokens are averaged over ranks, so they match 4 examples
    assert all(r["tokens"] > 0 for r in rows)
    assert [m for m in events if m["event"] == "end"][0]["status"] == "completed"
    assert (cfg.run_dir / "checkpoints" / "step_0000004.pt").exists()


def test_swarm_train_ray_json(make_cfg, tmp_path):
    """`swarm train --ray --json`: its own private head, the run as a job, rows streamed, head gone."""
    import json
    import pathlib
    import sys

    cfg = RunConfig.parse(make_cfg(recipe={"steps": 3}))
    path = tmp_path / "cli.yaml"
    path.write_text(cfg.to_yaml())
    swarm = pathlib.Path(sys.executable).parent / "swarm"
    proc = subprocess.Popen([str(swarm), "train", str(path), "--ray", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # timed out: kill the CLI, then the head it could not stop
            proc.kill()
            proc.wait()
            for d in pathlib.Path("/tmp").glob(f"swarmlab-ray-{proc.pid}-*"):
                stop_head(RayHead(None, "", str(d), owned=True))
    assert proc.returncode == 0, stderr[-3000:]
    rows = [json.loads(line) for line in stdout.strip().splitlines()]
    assert [r["step"] for r in rows if not r.get("final")] == [1, 2, 3]
    assert "private Ray head on 127.0.0.1" in stderr
    # the CLI's head (temp dir /tmp/swarmlab-ray-<cli pid>-<port>) is stopped and its temp dir removed
    import psutil

    tag = f"/tmp/swarmlab-ray-{proc.pid}-"
    assert not [p for p in psutil.process_iter(["cmdline"]) if any(tag in a for a in p.info["cmdline"] or [])]
    assert not list(pathlib.Path("/tmp").glob(f"swarmlab-ray-{proc.pid}-*"))


def test_job_carries_its_code_is_submitted_once_and_fails_when_pending(make_cfg, tmp_path):
    """The job's code is the project's packages shipped by Ray (uploaded once: a second run reuses
    the same content-named packages), its config travels in its working dir; submitting the same
    spec again (a controller resumed after a crash) finds the job instead of starting another; a
    job that no node can start is stopped at the pending limit and reported."""
    import sys

    from trainer.launch import PROJECT_ROOT, JobPendingError, code_runtime_env, submission_id, submit, run_spec

    paths = []
    for name in ("a", "b", "c"):
        cfg = RunConfig.parse(make_cfg(name=name, recipe={"steps": 2, "eval_size": 4}, samples_per_step=0))
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(cfg.to_yaml())
    head = start_head(num_cpus=2)
    try:
        client = head.client()
        first = submit(head, paths[0])
        assert first.created and first.job_id == submission_id(run_spec(paths[0]))
        again = submit(head, paths[0])   # the same spec again: the same job, nothing new started
        assert again == type(first)(first.job_id, False)
        assert [j.submission_id for j in client.list_jobs()] == [first.job_id]
        restarted = submit(head, paths[0], restart=1)   # a deliberate restart is a new job
        assert restarted.created and restarted.job_id != first.job_id
        other = submit(head, paths[1])
        for job in (first.job_id, restarted.job_id, other.job_id):
            assert wait_job(head, job, timeout=300) == "SUCCEEDED", client.get_job_logs(job)[-3000:]
        assert (tmp_path / "runs" / "a" / "metrics.jsonl").is_file() and (tmp_path / "runs" / "b" / "metrics.jsonl").is_file()
        envs = [client.get_job_info(j).runtime_env for j in (first.job_id, other.job_id)]
        mods = [e["py_modules"] for e in envs]
        assert all(m.startswith("gcs://_ray_pkg_") for m in mods[0]) and len(mods[0]) == 4
        assert mods[0] == mods[1], "unchanged code was uploaded again"
        assert envs[0]["working_dir"] != envs[1]["working_dir"]   # each run's own config
        # no path of this checkout in the entrypoint but the interpreter (SWARMLAB_JOB_PYTHON names another)
        assert client.get_job_info(first.job_id).entrypoint == f"{sys.executable} -m trainer.entry run.yaml"

        # the job imports the shipped copy, not this checkout (the venv's editable install points here)
        probe = client.submit_job(
            entrypoint=f"{sys.executable} -c 'import trainer.loop, harness.spec, sandboxes, kernels; print(\"AT\", trainer.__file__)'",
            runtime_env={**code_runtime_env(), "env_vars": head.auth_env()})
        assert wait_job(head, probe, timeout=120) == "SUCCEEDED"
        at = [ln.split(" ", 1)[1] for ln in client.get_job_logs(probe).splitlines() if ln.startswith("AT ")][0]
        assert not at.startswith(str(PROJECT_ROOT)) and "runtime_resources" in at, at

        # a driver that needs a resource no node has stays PENDING: a failure at the limit, reported
        # (Ray keeps listing it PENDING until its own start timeout: a stop reaches a job only once
        # its supervisor runs; the run never started)
        stuck = submit(head, paths[2], resources={"no_such_node": 1})
        t0 = time.time()
        with pytest.raises(JobPendingError) as info:
            wait_job(head, stuck.job_id, timeout=60, poll=0.5, pending_limit_s=3)
        assert info.value.job_id == stuck.job_id and 3 <= time.time() - t0 < 30
        assert str(client.get_job_status(stuck.job_id).value) in ("PENDING", "STOPPED", "FAILED")
        assert not (tmp_path / "runs" / "c").exists()
    finally:
        stop_head(head)
