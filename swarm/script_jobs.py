"""Ray jobs for a goal that runs the user's own script (`run.entrypoint`).

    jobs = ScriptRayJobs(entrypoint, address=None)   # a private loopback head unless `address`
    h = jobs.start("train", run_dir)                 # the relauncher running the script, as a Ray job

Each job's entrypoint is the steering relauncher (`python -m trainer.steer.relaunch --run-dir RUN
-- SCRIPT ARGS…`) started in the entrypoint's folder (`Entrypoint.cwd`), with the run folder as the
script's `$SWARMLAB_RUN_DIR`. The relauncher relaunches the script from its checkpoint after a
restart-required change and resumes it after a crash, as it does under `swarm.jobs.ScriptJobs`.
Everything else (the head, its token, status, stop, a replaced head) is `swarm.jobs.RayJobs`'.

The job carries the project's code (`trainer.launch.code_runtime_env`: the relauncher and the
steering SDK the script imports), not the script: the script, its folder and the run folder are
paths of the node that runs the job. On a private head that is this machine; on a cluster they
must be on storage every node and the controller reach (docs/cluster.md), and the interpreter is
`$SWARMLAB_JOB_PYTHON` or the entrypoint's `python`. A backtest's arms run as local processes of
the controller (`swarm.script_backtest`).
"""
from __future__ import annotations

import os
import pathlib
import shlex
import sys
import time
import uuid
from typing import Any, Callable

from swarm.jobs import RayJobs


class ScriptRayJobs(RayJobs):
    """`RayJobs` whose `start(name, run_dir)` submits the relauncher running the script; see the
    module docstring. `max_crashes`: the relauncher's."""

    def __init__(self, entrypoint: Any, address: str | None = None, num_cpus: int | None = None, saved: Any = None,
                 on_head: Callable[[Any], None] | None = None, max_crashes: int = 3, job_cpus: float | None = None,
                 job_resources: dict[str, float] | None = None, run_key: str = "") -> None:
        if not entrypoint.cwd or not pathlib.Path(entrypoint.cwd).is_absolute():
            raise ValueError(f"entrypoint.cwd={entrypoint.cwd!r}: a Ray job needs the script's folder as an absolute "
                             "path (swarm run records it)")
        super().__init__(address, num_cpus=num_cpus, saved=saved, on_head=on_head, job_cpus=job_cpus,
                         job_resources=job_resources, run_key=run_key)
        self.entrypoint = entrypoint
        self.max_crashes = max_crashes

    def command(self, run_dir: pathlib.Path) -> str:
        """The job's shell entrypoint: every word quoted."""
        from trainer.launch import JOB_PYTHON_ENV

        python = os.environ.get(JOB_PYTHON_ENV) or sys.executable
        argv = [python, "-m", "trainer.steer.relaunch", "--run-dir", str(run_dir), "--max-crashes",
                str(self.max_crashes), "--", *self.entrypoint.argv()]
        return f"cd {shlex.quote(str(self.entrypoint.cwd))} && exec {shlex.join(argv)}"

    def start(self, name: str, config_path: str | os.PathLike, restart: int | None = None) -> str:
        import hashlib
        import logging

        from sandboxes.base import PLAIN_OPT_IN_ENV
        from trainer.launch import QUIET_LOGGERS, SUBMIT_WAIT_S, code_runtime_env

        run_dir = pathlib.Path(config_path).resolve()   # for a script job: its run folder
        run_dir.mkdir(parents=True, exist_ok=True)
        head = self._head()
        env = {**head.auth_env(), "PYTHONUNBUFFERED": "1"}
        if os.environ.get(PLAIN_OPT_IN_ENV):
            env[PLAIN_OPT_IN_ENV] = os.environ[PLAIN_OPT_IN_ENV]
        for logger in QUIET_LOGGERS:
            logging.getLogger(logger).setLevel(logging.WARNING)
        client = self._client()
        # the live job's id names the run (its key and folder) and its restart: a controller resumed
        # after a crash that starts it again finds it (as swarm.jobs.RayJobs names its jobs)
        if restart is None:
            job_id = f"{name}-{uuid.uuid4().hex[:6]}"
        else:
            digest = hashlib.sha256(f"{self.run_key}\0{run_dir}".encode()).hexdigest()[:16]
            job_id = f"swarmlab-{name}-{digest}-r{restart}"
        deadline = time.time() + SUBMIT_WAIT_S
        while True:
            try:
                client.submit_job(entrypoint=self.command(run_dir), submission_id=job_id,
                                  runtime_env={**code_runtime_env(), "env_vars": env},
                                  entrypoint_num_cpus=self.job_cpus, entrypoint_resources=self.job_resources,
                                  metadata={"swarmlab_script": pathlib.Path(self.entrypoint.script).name})
                break
            except RuntimeError as e:
                if "already exists" in str(e) and restart is not None:
                    break       # submitted before (by this run before a crash): that job is the run's
                # a fresh head answers before its job agent has registered (transient)
                if "No available agent" not in str(e) or time.time() > deadline:
                    raise
                time.sleep(1.0)
        self.handles.add(job_id)
        return job_id
