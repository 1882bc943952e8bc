"""A goal that drives the agent trainer (`run.agent`) with `--jobs ray`: its jobs are Ray jobs on a
real private head (127.0.0.1, token auth on), submitted as every other goal's are
(`trainer.launch.submit` with `AGENT_TRAINER`): the config travels in the job's working dir with its
paths made absolute, the entrypoint is `python -m trainer.agent_train --config run.yaml`, the id is
derived from the spec and the restart count.

One head for the module (started once: ~6 s of Ray start-up), one tiny live run on it (a few
seconds of training, checkpoints every 2 steps) that the tests share: the live job writes its
metrics and ends; submitting it again with the same restart count, from the same launcher or from a
new one (a resumed controller), is the same job; a backtest arm forked from its checkpoint, whose
config names its paths relative to the submitting folder, runs as a Ray job of its own. Every head
is stopped by its own processes only (never `ray stop`).
"""
from __future__ import annotations

import pathlib
import sys
import time

import pytest
import yaml

from swarm.agent_backtest import arm_config, fork_position
from swarm.agent_run import agent_jobs, job_config
from swarm.goal import Goal
from swarm.jobs import RayJobs
from test_agent_run import goal_data
from trainer.launch import AGENT_TRAINER, run_spec, start_head, stop_head, submission_id
from trainer.runlog import read_heartbeat, read_jsonl

pytestmark = pytest.mark.ray

JOB_S = 180.0   # a tiny agent run as a Ray job: ~10 s here (runtime env set-up, imports, training)


def wait_end(jobs, handle: str, timeout: float = JOB_S) -> str:
    deadline = time.time() + timeout
    while (st := jobs.status(handle)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.time() < deadline, f"job {handle} still {st} after {timeout:.0f}s"
        time.sleep(0.5)
    return st


@pytest.fixture(scope="module")
def head():
    h = start_head(num_cpus=2)
    try:
        yield h
    finally:
        stop_head(h)


@pytest.fixture(scope="module")
def live(head, tmp_path_factory):
    """The controller's live job of a tiny agent goal, run to its end as a Ray job: (launcher, its
    handle, the config path, the run folder, the workspace)."""
    ws = tmp_path_factory.mktemp("ws")
    cfg = job_config(Goal.parse(goal_data()), ws / "runs")     # what the controller writes for its live job
    path = ws / "train.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    jobs = agent_jobs(ws / "logs", "ray", saved_head=lambda: head, run_key="k1")   # as a controller would make it
    handle = jobs.start("train", path, restart=0)
    st = wait_end(jobs, handle)
    assert st == "SUCCEEDED", head.client().get_job_logs(handle)[-3000:]
    return jobs, handle, path, ws / "runs" / "train", ws


def test_the_live_job_of_an_agent_goal_runs_as_a_ray_job_and_writes_its_metrics(head, live):
    jobs, handle, _, run_dir, _ = live
    assert isinstance(jobs, RayJobs) and jobs.trainer is AGENT_TRAINER and jobs.head is head
    info = head.client().get_job_info(handle)
    assert info.entrypoint == f"{sys.executable} -m trainer.agent_train --config run.yaml"
    assert handle.startswith("swarmlab-train-") and handle.endswith("-r0")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows if r.get("algorithm") == "grpo"] == [5, 6, 7, 8]
    assert rows[-1].get("final") and "heldout_acc" in rows[-1]
    assert read_heartbeat(run_dir)["state"] == "completed"
    assert (run_dir / "checkpoints" / "step_0000008.pt").is_file()
    ran = yaml.safe_load((run_dir / "config.yaml").read_text())   # the config the job read: absolute paths
    assert ran["out_dir"] == str(run_dir.parent) and ran["name"] == "train"


def test_the_same_spec_and_restart_count_is_one_job(head, live):
    """A resumed controller submits its live job again: the same id, nothing started; a restart is new."""
    jobs, handle, path, run_dir, ws = live
    before = (run_dir / "metrics.jsonl").read_text()
    assert jobs.start("train", path, restart=0) == handle
    resumed = agent_jobs(ws / "logs", "ray", saved_head=lambda: head, run_key="k1")   # a new controller process
    assert resumed.start("train", path, restart=0) == handle
    ids = [j.submission_id for j in head.client().list_jobs()]
    assert ids.count(handle) == 1
    assert wait_end(resumed, handle) == "SUCCEEDED" and (run_dir / "metrics.jsonl").read_text() == before
    # the id is the spec's, the run key's and the restart count's: another run or a restart is a new job
    spec = run_spec(path, AGENT_TRAINER)
    assert submission_id(spec, 0, "k1") == handle
    assert len({submission_id(spec, 0, "k2"), submission_id(spec, 1, "k1"), handle}) == 3


def test_a_backtest_arm_forked_from_the_live_checkpoint_runs_as_a_ray_job(head, live, monkeypatch):
    jobs, _, live_path, run_dir, ws = live
    monkeypatch.chdir(ws)   # the arm's paths are relative to the submitting folder; the job runs in its own
    stage, at = fork_position(run_dir, "step_0000006")
    assert (stage, at) == ("grpo", 2)
    cfg = arm_config(yaml.safe_load(live_path.read_text()), name="bt-x-candidate-s0", out_dir="backtests",
                     checkpoint="runs/train/checkpoints/step_0000006.pt", stage=stage, stage_step=at, horizon=2,
                     seed=0, eval_size=4, changes={"harness.max_turns": 6})
    path = ws / "arm.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    handle = jobs.start(cfg["name"], path)   # restart=None: an arm, a new id each time
    assert handle.startswith("swarmlab-bt-x-candidate-s0-")
    assert wait_end(jobs, handle) == "SUCCEEDED", head.client().get_job_logs(handle)[-3000:]
    arm = ws / "backtests" / cfg["name"]
    rows = read_jsonl(arm / "metrics.jsonl")
    assert [r["step"] for r in rows if r.get("algorithm") == "grpo"] == [7, 8] and "heldout_acc" in rows[-1]
    (start,) = [e for e in read_jsonl(arm / "events.jsonl") if e.get("event") == "start"]
    assert start["fork_from"] == str((run_dir / "checkpoints" / "step_0000006.pt").resolve())
    version = rows[-1]["harness_version"]
    assert yaml.safe_load((arm / "harnesses" / f"{version}.yaml").read_text())["max_turns"] == 6


def test_run_storage_is_refused_for_the_agent_trainer(tmp_path):
    with pytest.raises(ValueError, match="keeps its run folder at out_dir"):
        RayJobs(trainer=AGENT_TRAINER, storage=str(tmp_path / "store"))
