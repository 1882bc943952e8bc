"""A resumed run's jobs are of the kind it was started with unless `--jobs` says otherwise: a run
started with local processes and resumed without `--jobs` must not look for its jobs on Ray (and an
agent run started on Ray must not look for them among local processes)."""
from __future__ import annotations

from swarm.agent_run import AgentJobs
from swarm.goal import Goal
from swarm.jobs import ProcessJobs, RayJobs
from test_agent_run import goal_data


def close(ctrl) -> None:
    ctrl.jobs.close()
    ctrl._conn.close()
    ctrl.knowledge.close()
    ctrl.lock.release()


def test_a_resume_without_jobs_uses_the_kind_the_run_started_with(tmp_path, monkeypatch):
    from swarm.controller import Controller

    monkeypatch.chdir(tmp_path)
    mem = {"library": str(tmp_path / "lib"), "backend": "memory", "seed_skills": False}
    plain = Goal.parse({"goal": "add two numbers", "target": {"metric": "heldout_acc", "op": ">=", "threshold": 0.9},
                        "run": {"task": {"name": "addition"}}, "memory": mem})
    agent = Goal.parse({**goal_data(), "memory": mem})
    for goal, first, want in ((plain, "process", ProcessJobs), (agent, "ray", RayJobs)):
        ws = tmp_path / f"ws-{first}"
        ctrl = Controller.create(ws, goal, jobs=first)
        close(ctrl)
        again = Controller(ws, goal, jobs=None)       # `swarm resume` without --jobs
        try:
            assert type(again.jobs) is want
        finally:
            close(again)
    ws = tmp_path / "ws-process"                       # an explicit --jobs wins, and is what a later resume uses
    ctrl = Controller(ws, plain, jobs="ray")
    close(ctrl)
    ctrl = Controller(ws, plain, jobs=None)
    try:
        assert isinstance(ctrl.jobs, RayJobs) and not isinstance(ctrl.jobs, AgentJobs)
    finally:
        close(ctrl)


def test_a_recorded_kind_that_is_not_one_is_refused_naming_the_file(tmp_path, monkeypatch):
    import os

    import pytest

    from swarm.controller import Controller

    monkeypatch.chdir(tmp_path)
    g = Goal.parse({**goal_data(), "memory": {"library": str(tmp_path / "lib"), "backend": "memory", "seed_skills": False}})
    ctrl = Controller.create(tmp_path / "ws", g, jobs="process")
    kind = ctrl.private / "jobs_kind"
    assert kind.read_text() == "process" and os.stat(kind).st_mode & 0o777 == 0o600
    close(ctrl)
    kind.write_text("slurm")
    with pytest.raises(ValueError, match="jobs_kind: 'slurm' is not a jobs kind"):
        Controller(tmp_path / "ws", g, jobs=None)


def test_resume_refuses_a_jobs_kind_it_does_not_know(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "swarm.cli", "resume", "--workspace", str(tmp_path), "--jobs", "slurm"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--jobs='slurm': must be 'ray' or 'process'" in p.stderr + p.stdout
