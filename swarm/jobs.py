"""Job launchers for the controller: Ray jobs (default) or plain local processes, one interface.

    jobs = RayJobs(address=None)          # starts a private head on 127.0.0.1 on first use
    h = jobs.start("train-0", cfg_path)   # the trainer's entrypoint: python -m trainer.entry CFG
    jobs.status(h) -> "RUNNING" | "SUCCEEDED" | "FAILED" | "STOPPED" | "PENDING"

Both launchers run the trainer their `trainer` names (`trainer.launch.JobTrainer`): the single-turn
trainer by default, the agent trainer (`AGENT_TRAINER`: `python -m trainer.agent_train --config CFG`)
for a goal that drives it (`swarm.agent_run.agent_jobs`).

A goal that runs the user's own script (`run.entrypoint`) has its own launcher, `ScriptJobs`: each
job is the steering relauncher (`python -m trainer.steer.relaunch`) running the script as a local
process, with the job's run folder as the script's `$SWARMLAB_RUN_DIR`.

Worker CPU seconds are metered from the trainer processes' pids (the heartbeat names its pid),
so the same accounting works for both launchers.

Every request to a private head carries its auth token (`trainer.launch`: token auth on, the jobs
inherit it); a controller restarted on a workspace reconnects to the head its run recorded
(`.swarm/ray_head.json`: address, token file, temp dir, whether the run started it), replaces a
private head that died, and stops the run's private head when the run ends. Both launchers pass
on the goal's sandbox opt-in (`sandboxes.base.PLAIN_OPT_IN_ENV`): local processes inherit the
environment, Ray jobs get it in their runtime env.
"""
from __future__ import annotations

import abc
import math
import os
import pathlib
import subprocess
import sys
from typing import Any, Callable


ROOT = pathlib.Path(__file__).resolve().parent.parent


class Jobs(abc.ABC):
    @abc.abstractmethod
    def start(self, name: str, config_path: str | os.PathLike, restart: int | None = None) -> str:
        """Start job `name` on `config_path`. `restart`: for the run's live job, how many times it
        was started before (a launcher that names jobs by their spec names a restart apart, and a
        resumed controller that starts the same one again finds it); None for any other job (a
        backtest arm, whose rerun after a controller restart must start afresh)."""

    @abc.abstractmethod
    def status(self, handle: str) -> str: ...

    @abc.abstractmethod
    def stop(self, handle: str) -> None: ...

    def close(self) -> None:
        pass


class ProcessJobs(Jobs):
    """Each job is a child process of the controller (tests, or machines without Ray)."""

    def __init__(self, log_dir: str | os.PathLike, trainer: Any = None) -> None:
        from trainer.launch import RUN_TRAINER

        self.log_dir = pathlib.Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.trainer = trainer or RUN_TRAINER   # what each job runs (trainer.launch.JobTrainer)

    def start(self, name: str, config_path: str | os.PathLike, restart: int | None = None) -> str:
        return self._spawn(name, [sys.executable, *self.trainer.argv(str(config_path))], ROOT)

    def _spawn(self, name: str, argv: list[str], cwd: str | os.PathLike) -> str:
        with open(self.log_dir / f"{name}.log", "ab") as log:
            p = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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


class ScriptJobs(ProcessJobs):
    """Jobs of a goal that runs the user's own script (`swarm.goal.Entrypoint`): each job is the
    steering relauncher running the script as a child process. `start(name, run_dir)` takes the run
    folder that the script's SwarmCallback writes. The relauncher relaunches the script from its
    checkpoint after a restart-required change, and resumes it after a crash. Stopping a job sends
    SIGTERM to the relauncher, which passes it on to the script and then ends by it (STOPPED).
    `cwd`: the folder the script runs in (its relative paths, e.g. its `--output_dir`). The default
    is the current one."""

    def __init__(self, entrypoint: Any, log_dir: str | os.PathLike, cwd: str | os.PathLike | None = None,
                 max_crashes: int = 3) -> None:
        super().__init__(log_dir)
        self.entrypoint = entrypoint
        self.cwd = pathlib.Path(cwd or os.getcwd()).resolve()
        self.max_crashes = max_crashes

    def start(self, name: str, config_path: str | os.PathLike, restart: int | None = None) -> str:
        run_dir = pathlib.Path(config_path).resolve()   # for a script job: its run folder
        run_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "trainer.steer.relaunch", "--run-dir", str(run_dir),
                "--max-crashes", str(self.max_crashes), "--", *self.entrypoint.argv()]
        return self._spawn(name, argv, self.cwd)


class RayJobs(Jobs):
    """Jobs on a Ray cluster through the Jobs API; a private loopback head unless `address`.

    `saved`: the head a previous controller of the workspace used. A cluster given by address is
    reached as it is and never stopped here. A private head (`owned`) is checked on first use
    (`trainer.launch.head_alive`); one that died (a reboot, an OOM kill) is cleaned up (its
    leftover processes, temp folder and token) and replaced by a new private head, and so is the
    current head when a status request fails and the head no longer serves. The replaced heads
    wait in `replaced` for the caller (`take_replaced`): the jobs they ran are gone (their status is
    FAILED here) and the caller decides what to launch again. `on_head` is called with every head
    this launcher starts or connects to anew, before any job is submitted to it (the controller
    records it, so whichever process ends the run stops the head the run started). `close` stops
    the current head if it is a private one.

    The live job's id is derived from its spec, its restart count and `run_key` (a key the swarm
    run keeps for its life: `trainer.launch.submission_id`), so a controller resumed after a crash
    that submits the same live job again finds it instead of starting a second one; any other job
    (`restart=None`: a backtest arm) gets a new id each time. `job_cpus` and
    `job_resources` reserve each job's place on the cluster (Ray's `entrypoint_num_cpus` and
    `entrypoint_resources`): without them Ray runs every job's trainer on the head node.

    `trainer` (`trainer.launch.JobTrainer`, default the single-turn trainer) is what every job runs
    and which config type its spec is read as; `storage` needs a trainer that keeps its run there
    (the agent trainer does not: a ValueError).

    `storage` (the goal's `swarm.storage`): each job's run is kept at `<storage>/<run_key>/<name>`
    (`trainer.run_storage`): the job works on its node's scratch and mirrors there, and the job's
    local run folder (the config's `out_dir/name`) becomes the controller's replica of it, kept
    current by `trainer.run_storage.sync_run`. A backtest arm's stored folder is cleared when it
    starts (a rerun starts afresh); the live job's is kept (a restart resumes from it). A fork
    from a replica's checkpoint is fetched from the storage; from any other file, the file is
    put on the storage first."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None, saved: Any = None,
                 on_head: Callable[[Any], None] | None = None, job_cpus: float | None = None,
                 job_resources: dict[str, float] | None = None, run_key: str = "", storage: str | None = None,
                 trainer: Any = None) -> None:
        from trainer.launch import RUN_TRAINER

        self.trainer = trainer or RUN_TRAINER
        if storage and not self.trainer.storage:
            raise ValueError(f"storage={storage!r}: {self.trainer.module} keeps its run folder at out_dir, "
                             "not on run storage")
        self.address, self.num_cpus, self.storage = address, num_cpus, storage
        self.job_cpus, self.job_resources, self.run_key = job_cpus, dict(job_resources or {}) or None, run_key
        if saved is not None and not saved.owned:   # the user's cluster: reached by address, never replaced
            self.address, saved = self.address or saved.dashboard_url, None
        self.saved, self.on_head = saved, on_head
        self.head = None
        self._jobs_client: tuple[Any, Any] | None = None   # (head, its client): made once per head
        self.replaced: list[Any] = []
        self.handles: set[str] = set()     # jobs submitted to the current head by this launcher
        self.lost: set[str] = set()        # jobs of heads it replaced

    def _use(self, head: Any) -> Any:
        self.head = head
        if self.on_head is not None:
            self.on_head(head)
        return head

    def _replace(self, dead: Any) -> Any:
        """Clean up a private head that died and start a new one in its place."""
        from trainer.launch import start_head, stop_head

        stop_head(dead)   # what is left of it: processes, the private temp folder, the token
        self.replaced.append(dead)
        self.lost |= self.handles
        self.handles = set()
        self.head = None
        return self._use(start_head(num_cpus=self.num_cpus))

    def _head(self) -> Any:
        if self.head is None:
            from trainer.launch import ensure_head, head_alive

            saved, self.saved = self.saved, None
            if saved is None:
                self._use(ensure_head(self.address, num_cpus=self.num_cpus))
            elif head_alive(saved):
                self.head = saved
            else:
                self._replace(saved)
        return self.head

    def _client(self):
        head = self._head()
        if self._jobs_client is None or self._jobs_client[0] is not head:
            # a client checks the head's version over HTTP when made: once per head, not per status
            self._jobs_client = (head, head.client())
        return self._jobs_client[1]

    def take_replaced(self) -> list[Any]:
        """The heads replaced since the last call (oldest first)."""
        out, self.replaced = self.replaced, []
        return out

    def start(self, name: str, config_path: str | os.PathLike, restart: int | None = None) -> str:
        import uuid

        from trainer.launch import RUN_TRAINER, submit_job

        self._head()
        salt = self.run_key if restart is not None else f"{self.run_key}-{uuid.uuid4().hex[:8]}"
        where = self._storage(config_path, fresh=restart is None) if self.storage else {}
        if self.trainer is not RUN_TRAINER:   # submit's own default is the single-turn trainer
            where["trainer"] = self.trainer
        handle = submit_job(self.head, config_path, restart=restart or 0, entrypoint_num_cpus=self.job_cpus,
                            resources=self.job_resources, salt=salt, **where)
        self.handles.add(handle)
        return handle

    def _storage(self, config_path: str | os.PathLike, fresh: bool) -> dict[str, str | None]:
        """Bind the job's local run folder to its place on the storage; where its fork comes from."""
        from trainer.launch import run_spec
        from trainer.run_storage import bind, put_checkpoint_file, run_uri, storage_ref
        from trainer.storage import join_uri

        cfg = run_spec(config_path)
        uri = run_uri(self.storage, self.run_key, cfg.name)
        bind(cfg.run_dir, uri, fresh=fresh)
        fork = None
        if cfg.fork_from:
            ref = storage_ref(cfg.fork_from)
            fork = ref[0] if ref else put_checkpoint_file(cfg.fork_from, join_uri(uri, "fork-source"))
        return {"storage_uri": uri, "fork_storage": fork}

    def status(self, handle: str) -> str:
        if handle in self.lost:
            return "FAILED"
        try:
            return str(self._client().get_job_status(handle).value)
        except Exception:  # an unknown job or an unreachable head is a status, not a crash
            pass
        try:
            from trainer.launch import head_alive

            if self.head is not None and self.head.owned and not head_alive(self.head):
                self._replace(self.head)
                return "FAILED" if handle in self.lost else "UNKNOWN"
        except Exception:
            pass
        return "UNKNOWN"

    def stop(self, handle: str) -> None:
        if handle in self.lost:
            return
        try:
            self._client().stop_job(handle)
        except Exception:
            pass

    def close(self) -> None:
        from trainer.launch import stop_head

        head = self.head or self.saved   # a saved head never used by this process is still the run's
        if head is not None:
            stop_head(head)   # a private head only (owned); a cluster given by address is left running
        self.head = self.saved = None
        self._jobs_client = None


def run_key(private: str | os.PathLike) -> str:
    """The key a swarm run keeps for its life (`private/run_key`, drawn on first use, 0600): its
    Ray jobs' ids include it, so a workspace made again at the same path names its jobs anew."""
    import secrets

    from sandboxes.private import private_dir, write_private

    path = pathlib.Path(private) / "run_key"
    private_dir(path.parent)
    if path.is_file():
        key = path.read_text().strip()
        if key:
            return key
    key = secrets.token_hex(8)
    write_private(path, key)
    return key


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
