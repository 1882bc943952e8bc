"""A script goal's job as a real Ray job (swarm/script_jobs.py): the relauncher running the example
script on a private loopback head with token auth, in the entrypoint's folder, writing the run
folder the controller reads; a stopped job stops its script. The head is stopped in a `finally`
(`jobs.close()`: its own processes only)."""
from __future__ import annotations

import pathlib
import time

import psutil
import pytest

from swarm.goal import Entrypoint
from swarm.script_jobs import ScriptRayJobs
from trainer.runlog import read_heartbeat, read_jsonl

pytestmark = pytest.mark.ray

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "steer" / "sft_addition.py"
TINY = ["--d_model", "32", "--n_layers", "1", "--train_size", "512", "--eval_size", "64"]


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def wait(pred, timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def test_a_relative_script_folder_is_refused_in_one_line():
    ep = Entrypoint(script=str(SCRIPT), cwd="runs")
    with pytest.raises(ValueError, match=r"^entrypoint.cwd='runs': a Ray job needs the script's folder as an absolute path"):
        ScriptRayJobs(ep)


def test_a_script_goals_job_runs_on_ray_and_stops_with_its_script(tmp_path):
    ep = Entrypoint(script=str(SCRIPT), cwd=str(tmp_path), metric="eval_accuracy",
                    args=[*TINY, "--output_dir", "out", "--max_steps", "20", "--eval_steps", "10", "--save_steps", "10"])
    jobs = ScriptRayJobs(ep, num_cpus=2)
    run = tmp_path / "runs" / "train"
    try:
        h = jobs.start("train", run)
        assert jobs.head is not None and jobs.head.owned and jobs.head.dashboard_url.startswith("http://127.0.0.1:")
        wait(lambda: jobs.status(h) in ("SUCCEEDED", "FAILED", "STOPPED"))
        assert jobs.status(h) == "SUCCEEDED", jobs._client().get_job_logs(h)[-3000:]
        evals = [r for r in read_jsonl(run / "metrics.jsonl") if "heldout_acc" in r]
        assert [r["step"] for r in evals] == [10, 20]
        assert (tmp_path / "out" / "checkpoint-20").is_dir()      # the script ran in the entrypoint's folder
        assert [r["reason"] for r in read_jsonl(run / "launches.jsonl") if r["event"] == "launch"] == ["start"]
        assert read_heartbeat(run)["state"] == "completed"

        # a long run, stopped: the relauncher passes the stop on, and the script ends with the job
        long = tmp_path / "runs" / "long"
        ep2 = ep.model_copy(update={"args": [*TINY, "--output_dir", "out2", "--max_steps", "100000", "--eval_strategy", "no"]})
        jobs.entrypoint = ep2
        h2 = jobs.start("long", long)
        wait(lambda: (read_heartbeat(long) or {}).get("state") == "running")
        pid = read_heartbeat(long)["pid"]
        jobs.stop(h2)
        wait(lambda: jobs.status(h2) in ("SUCCEEDED", "FAILED", "STOPPED"), 60)
        assert jobs.status(h2) == "STOPPED"
        wait(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 60)
    finally:
        jobs.close()
