"""Goals that run the user's own script (`run.entrypoint`, swarm/goal.py) and their launcher
(`swarm.jobs.ScriptJobs`: the steering relauncher running the script as a local process).

The refusals (missing script, a target metric the callback does not write, …) go through the
real CLI in tests/test_bad_input.py over tests/bad_goals/script_*.yaml. Here: the example goal
loads as a typed entrypoint, and a job of the launcher runs the real example script to its end,
with the target's metric in the run folder. A job that is stopped ends as STOPPED, and its script
ends with it.
"""
from __future__ import annotations

import os
import pathlib
import time

import psutil
import pytest
from typer.testing import CliRunner

from swarm.cli import app
from swarm.goal import Entrypoint, Goal
from swarm.jobs import ScriptJobs
from trainer.config import ConfigError
from trainer.runlog import read_heartbeat, read_jsonl

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "steer" / "goal_lr_too_high.yaml"
TINY = ["--d_model", "32", "--n_layers", "1", "--train_size", "512", "--eval_size", "64"]


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_the_example_goal_is_a_typed_entrypoint(monkeypatch):
    monkeypatch.chdir(ROOT)   # the script's path is relative to the working directory
    g = Goal.load(EXAMPLE)
    ep = g.entrypoint
    assert isinstance(ep, Entrypoint) and ep.metric == "eval_accuracy" and g.target.metric == "heldout_acc"
    assert ep.argv()[1] == str(ROOT / "examples" / "steer" / "sft_addition.py") and "--learning_rate" in ep.argv()
    with pytest.raises(ConfigError, match="this goal runs a script"):   # no trainer config of ours
        g.run_config("train", "/tmp")
    assert Goal.parse({"goal": "x", "run": {"task": {"name": "addition"}}}).entrypoint is None


@pytest.mark.parametrize("goal_file, script", [("goal_lr_too_high.yaml", "sft_addition.py"),
                                               ("goal_trl_sft_lr_too_high.yaml", "sft_trl.py")],
                         ids=["trainer", "trl_sft_trainer"])
def test_swarm_run_drives_the_example_script_goal_to_its_end(tmp_path, monkeypatch, goal_file, script):
    """`swarm run` on the example goal (a `transformers.Trainer` script, and TRL's `SFTTrainer` one),
    scaled down with the script's own flags (a later flag wins):
    the controller launches the script under the relauncher, reads its metrics, stops when the script
    has trained its steps, and writes the final report. At this scale (120 steps of a smaller model)
    the built-in detectors see a held-out plateau (info) only: `not_learning` needs 100 loss rows
    after the loss's early fall, which the goal at its own size has from about step 175
    (tests/test_script_diagnosis.py)."""
    import yaml

    monkeypatch.chdir(ROOT)
    g = yaml.safe_load((EXAMPLE.parent / goal_file).read_text())
    g["run"]["entrypoint"]["args"] += [*TINY, "--max_steps", "120", "--eval_steps", "20", "--save_steps", "40",
                                       "--output_dir", str(tmp_path / "out")]
    g["budget"] = {"wall_s": 600, "worker_cpu_s": 1200}
    g["memory"] = {"library": str(tmp_path / "lib"), "backend": "memory"}
    goal = tmp_path / "goal.yaml"
    goal.write_text(yaml.safe_dump(g))
    ws = tmp_path / "ws"
    r = CliRunner().invoke(app, ["run", str(goal), "--workspace", str(ws), "--jobs", "process", "--quiet",
                                 "--summary", str(tmp_path / "summary.json")])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output    # 1: the target was not reached
    import json

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reason"] == "steps_exhausted" and summary["steps"] == 120 and not summary["reached"]
    assert isinstance(summary["final_metric"], float) and summary["worker_cpu_s"] > 0
    assert (ws / "reports" / "final" / "REPORT.md").is_file()
    run = ws / ".swarm" / "runs" / "train"
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "heldout_acc" in r] == [20, 40, 60, 80, 100, 120]
    assert (tmp_path / "out" / "checkpoint-120").is_dir()
    # the saved goal holds the script's absolute path and the folder it ran in: a resume works from anywhere
    saved = yaml.safe_load((ws / ".swarm" / "private" / "goal.yaml").read_text())["run"]["entrypoint"]
    assert saved["script"] == str(ROOT / "examples" / "steer" / script) and saved["cwd"] == str(ROOT)
    # every change the swarm proposed names a setting the script declares
    from trainer.steer.settings import read_declared

    names = {s["name"] for s in read_declared(run)["settings"]}
    assert all(k.removeprefix("recipe.") in names for iv in summary["interventions"] for k in iv["changes"])


def test_a_script_goal_on_ray_jobs_gets_the_ray_launcher_of_scripts(tmp_path, monkeypatch):
    """`--jobs ray` on a script goal: the relauncher as a Ray job (swarm.script_jobs, run on a real
    head in tests/test_script_jobs.py); nothing starts before the first job."""
    from swarm.controller import Controller
    from swarm.script_jobs import ScriptRayJobs

    monkeypatch.chdir(ROOT)
    g = Goal.load(EXAMPLE).model_copy(update={"memory": Goal.load(EXAMPLE).memory.model_copy(
        update={"library": str(tmp_path / "lib"), "backend": "memory"})})
    ctrl = Controller.create(tmp_path / "ws", g, jobs="ray")
    try:
        assert isinstance(ctrl.jobs, ScriptRayJobs) and ctrl.jobs.head is None
        assert ctrl.jobs.entrypoint.cwd == str(ROOT)     # the saved goal's folder: the job runs the script there
        assert "cd " + str(ROOT) + " && exec " in ctrl.jobs.command(ctrl.run_dir)
    finally:
        ctrl.jobs.close()
        ctrl._conn.close()
        ctrl.knowledge.close()


@pytest.mark.parametrize("goal, script", [(EXAMPLE, "sft_addition.py"),
                                          (EXAMPLE.with_name("goal_trl_sft_lr_too_high.yaml"), "sft_trl.py")])
def test_swarm_validate_names_the_script_and_the_target(monkeypatch, goal, script):
    monkeypatch.chdir(ROOT)
    r = CliRunner().invoke(app, ["validate", str(goal)])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert r.output.strip() == f"ok: script examples/steer/{script}, target heldout_acc >= 0.2"


def wait(pred, timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


def test_a_script_job_runs_the_example_to_its_end_and_writes_the_targets_metric(tmp_path):
    ep = Entrypoint(script=str(ROOT / "examples" / "steer" / "sft_addition.py"), metric="eval_accuracy",
                    args=[*TINY, "--output_dir", "out", "--max_steps", "20", "--eval_steps", "10", "--save_steps", "10"])
    jobs = ScriptJobs(ep, tmp_path / "logs", cwd=tmp_path)
    run = tmp_path / "runs" / "train"
    h = jobs.start("train", run)
    try:
        assert jobs.status(h) == "RUNNING"
        wait(lambda: jobs.status(h) != "RUNNING")
        assert jobs.status(h) == "SUCCEEDED", (tmp_path / "logs" / "train.log").read_text()[-3000:]
    finally:
        jobs.close()
    evals = [r for r in read_jsonl(run / "metrics.jsonl") if "heldout_acc" in r]
    assert [r["step"] for r in evals] == [10, 20] and all(0.0 <= r["heldout_acc"] <= 1.0 for r in evals)
    assert (tmp_path / "out" / "checkpoint-20").is_dir()   # the script's own paths are relative to cwd
    assert [r["reason"] for r in read_jsonl(run / "launches.jsonl") if r["event"] == "launch"] == ["start"]
    assert read_heartbeat(run)["state"] == "completed"


def test_stopping_a_script_job_stops_its_script(tmp_path):
    ep = Entrypoint(script=str(ROOT / "examples" / "steer" / "sft_addition.py"),
                    args=[*TINY, "--output_dir", "out", "--max_steps", "100000", "--eval_strategy", "no"])
    jobs = ScriptJobs(ep, tmp_path / "logs", cwd=tmp_path)
    run = tmp_path / "run"
    h = jobs.start("train", run)
    try:
        wait(lambda: (read_heartbeat(run) or {}).get("state") == "running")
        pid = read_heartbeat(run)["pid"]
        assert pid != jobs.procs[h].pid and psutil.pid_exists(pid)
        jobs.stop(h)
        assert jobs.status(h) == "STOPPED"
        wait(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 30)
    finally:
        jobs.close()
    rows = read_jsonl(run / "launches.jsonl")
    assert [r["event"] for r in rows] == ["launch", "exit"] and rows[1]["rc"] == -15
    assert not any(r["event"] == "launch" and r["reason"] == "crash" for r in rows)   # a stop is not a crash
    assert os.path.exists(run / "metrics.jsonl")
