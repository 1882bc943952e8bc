"""Job launchers for the controller: Ray jobs (default) or plain local processes, one interface.

    jobs = RayJobs(address=None)          # starts a private head on 127.0.0.1 on first use
    h = jobs.start("train-0", cfg_path)   # the trainer's entrypoint: python -m trainer.entry CFG
    jobs.status(h) -> "RUNNING" | "SUCCEEDED" | "FAILED" | "STOPPED" | "PENDING"

Worker CPU seconds are metered from the trainer processes' pids (the heartbeat names its pid),
so the same accounting works for both launchers.

Every request to a private head carries its auth token (`trainer.launch`: token auth on, the jobs
inherit it); a controller restarted on a workspace reconnects to its head by address and finds
the token there. Both launchers pass on the goal's sandbox opt-in (`sandboxes.base.PLAIN_OPT_IN_ENV`):
local processes inherit the environment, Ray jobs get it in their runtime env.
"""
from __future__ import annotations

import abc
import math
import os
import pathlib
import subprocess
import sys
from typing import Any


ROOT = pathlib.Path(__file__).resolve().parent.parent


class Jobs(abc.ABC):
    @abc.abstractmethod
    def start(self, name: str, config_path: str | os.PathLike) -> str: ...

    @abc.abstractmethod
    def status(self, handle: str) -> str: ...

    @abc.abstractmethod
    def stop(self, handle: str) -> None: ...

    def close(self) -> None:
        pass


class ProcessJobs(Jobs):
    """Each job is a child process of the controller (tests, or machines without Ray)."""

    def __init__(self, log_dir: str | os.PathLike) -> None:
        self.log_dir = pathlib.Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, config_path: str | os.PathLike) -> str:
        log = open(self.log_dir / f"{name}.log", "ab")
        p = subprocess.Popen([sys.executable, "-m", "trainer.entry", str(config_path)], cwd=ROOT,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = p
        return name

    def status(self, handle: str) -> str:
        p = self.procs.get(handle)
        if p is None:
            return "UNKNOWN"
        rc = p.poll()
        if rc is None:
            return "RUNNING"
        return "SUCCEEDED" if rc == 0 else ("STOPPED" if rc in (-15,) else "FAILED")

    def stop(self, handle: str) -> None:
        p = self.procs.get(handle)
        if p and p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()

    def close(self) -> None:
        for h in list(self.procs):
            self.stop(h)


class RayJobs(Jobs):
    """Jobs on a Ray cluster through the Jobs API; a private loopback head unless `address`."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        self.address, self.num_cpus = address, num_cpus
        self.head = None

    def _client(self):
        if self.head is None:
            from trainer.launch import ensure_head

            self.head = ensure_head(self.address, num_cpus=self.num_cpus)
        return self.head.client()

    def start(self, name: str, config_path: str | os.PathLike) -> str:
        from trainer.launch import submit_job

        self._client()
        import uuid

        return submit_job(self.head, config_path, job_id=f"{name}-{uuid.uuid4().hex[:6]}")

    def status(self, handle: str) -> str:
        try:
            return str(self._client().get_job_status(handle).value)
        except Exception:  # an unknown job or an unreachable head is a status, not a crash
            return "UNKNOWN"

    def stop(self, handle: str) -> None:
        try:
            self._client().stop_job(handle)
        except Exception:
            pass

    def close(self) -> None:
        if self.head is not None:
            from trainer.launch import stop_head

            stop_head(self.head)
            self.head = None


class CpuMeter:
    """Worker CPU seconds of every trainer process the swarm ran (the live job's segments and
    backtest arms). Each trainer reports its own CPU time in its heartbeat (`cpu_s`); the meter
    keeps the newest reading per process, so the total survives restarts and works the same for
    Ray jobs and local processes."""

    def __init__(self, state: dict[str, float] | None = None) -> None:
        self.by_proc: dict[str, float] = dict(state or {})

    def observe(self, run_dir: str | os.PathLike) -> None:
        from trainer.runlog import read_heartbeat

        hb = read_heartbeat(run_dir)
        if not hb or "cpu_s" not in hb:
            return
        key = f"{run_dir}:{hb.get('pid')}"
        self.by_proc[key] = max(self.by_proc.get(key, 0.0), float(hb["cpu_s"]))

    @property
    def total(self) -> float:
        # fsum: exactly rounded whatever the order, so a total read back from saved state never
        # differs from the same readings summed live (a plain sum can by one ulp)
        return math.fsum(self.by_proc.values())

    def state(self) -> dict[str, float]:
        return dict(self.by_proc)
