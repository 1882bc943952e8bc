"""Running the trainer on Ray: a private head on 127.0.0.1, the Jobs API, and Ray Train.

    head = ensure_head()                      # or RayHead.connect("http://HOST:8265")
    job_id = submit_job(head, "run.yaml")     # the trainer runs as a Ray job
    wait_job(head, job_id)

When no cluster address is given the system starts its own head, bound to loopback, with its own
temp dir and Ray's token auth on: a random token per head in a 0600 file (`RAY_AUTH_MODE=token`,
`RAY_AUTH_TOKEN_PATH`), given to `ray start`, sent by every client of this module (HTTP header
`Authorization: Bearer <token>`) and inherited by the jobs it submits, so a local process without
the token (sandboxed code included) can neither submit jobs nor read them: the Jobs API answers
401. The token files live in `auth_dir()` (0700), named after the head's dashboard address, so a
controller that reconnects to its head after a restart finds the token again; `stop_head` stops the
head and removes its token; `head_alive` tells a head that still serves from one that died (a
reboot, an OOM kill), and `RayHead.record()` / `RayHead.from_record()` carry a head between
processes. For an existing cluster (`address`) the token comes from the caller's environment
(`RAY_AUTH_TOKEN_PATH` or `RAY_AUTH_TOKEN`, as for Ray's own clients) when it is set.
`num_workers > 1` in the run config makes the job's entrypoint run the loop data-parallel on Ray
Train workers (gloo on CPU).

A job carries what it runs: the project's packages as `py_modules` (Ray names each upload after a
hash of its contents, so a resubmission with unchanged code uploads nothing) and its run config as
the `working_dir`; the entrypoint names no path of the submitting machine. Which trainer the job
runs is its `JobTrainer`: the single-turn trainer (`RUN_TRAINER`: `python -m trainer.entry run.yaml`,
a `RunConfig`) unless the submitter names the agent trainer (`AGENT_TRAINER`:
`python -m trainer.agent_train --config run.yaml`, an `AgentTrainConfig`); the spec, its absolute
paths and its submission id are made the same way for both. Its submission id is
derived from the run spec and the restart count (`submission_id`), so submitting again after a
controller crash finds the job instead of starting a second one (`Submission.created` is False).
`wait_job` fails a job left PENDING beyond `JOB_PENDING_LIMIT_S` (stopped, `JobPendingError`).
The run's files travel through run storage when the submitter names one (`storage_uri`,
`trainer.run_storage`): the job works in its node's scratch folder and mirrors to the storage,
which is all the controller reads. Without it the trainer writes its run folder at the config's
`out_dir`, a path on the node that runs it: the default, right for one machine.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from typing import Any

from sandboxes.errors import SwarmlabError
from sandboxes.private import private_dir, write_private
from trainer.config import RunConfig

AUTH_DIR_ENV = "SWARMLAB_RAY_AUTH_DIR"  # where private heads' token files go (default: auth_dir())


SUBMIT_WAIT_S = 120.0  # how long submit_job waits for a fresh head's job agent
HEAD_ANSWER_S = 15.0   # how long head_alive waits for a head's Jobs API before calling it dead
# a job PENDING this long is a failure: its driver found no node (resources the cluster lacks) or its
# runtime env did not set up. Ray's own limit (RAY_JOB_START_TIMEOUT_SECONDS) is 15 min; a trainer
# job's env is the project's packages (well under 1 MiB), which set up in seconds
JOB_PENDING_LIMIT_S = 300.0

PROJECT_ROOT = pathlib.Path(__file__).resolve().parent.parent
CODE_PACKAGES = ("trainer", "harness", "sandboxes", "kernels")   # what `python -m trainer.entry` imports
CODE_EXCLUDES = ("__pycache__", "*.pyc", "*.so", "*.egg-info")   # matched against each path, folders without a slash
# Ray's client logs every runtime-env package it uploads or finds already uploaded at INFO
QUIET_LOGGERS = ("ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging")
JOB_PYTHON_ENV = "SWARMLAB_JOB_PYTHON"   # the interpreter a job runs on its node (default: this one)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_bin() -> str:
    cand = pathlib.Path(sys.executable).parent / "ray"
    return str(cand) if cand.exists() else (shutil.which("ray") or "ray")


def auth_dir() -> pathlib.Path:
    """The folder (0700) holding the token files of the private heads this user started."""
    d = os.environ.get(AUTH_DIR_ENV) or pathlib.Path.home() / ".cache" / "swarmlab" / "ray-auth"
    return private_dir(d)


def token_path_for(dashboard_url: str) -> pathlib.Path:
    """Where the token of the private head answering at `dashboard_url` is kept."""
    u = urllib.parse.urlsplit(dashboard_url if "//" in dashboard_url else f"http://{dashboard_url}")
    return auth_dir() / f"{u.hostname}_{u.port}.token"


def new_token(path: pathlib.Path) -> pathlib.Path:
    """A fresh random token (256 bits) in a 0600 file."""
    return write_private(path, secrets.token_hex(32))


def _read_token(path: str | os.PathLike) -> str:
    return pathlib.Path(path).read_text().strip()


@dataclasses.dataclass
class RayHead:
    gcs_address: str | None       # "127.0.0.1:PORT" (None for an external cluster reached by dashboard URL)
    dashboard_url: str
    temp_dir: str | None = None
    owned: bool = False
    token_path: str | None = None  # the head's auth token file (None: no token known; Ray's own env applies)

    def auth_env(self) -> dict[str, str]:
        """The variables that make Ray processes (`ray start`, jobs, ray.init) use this head's token."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)} if self.token_path else {}

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {_read_token(self.token_path)}"} if self.token_path else {}

    def client(self):
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.dashboard_url, headers=self.headers() or None)

    def record(self) -> dict[str, Any]:
        """What a later process needs to reach this head again and, if it is `owned`, to stop it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> "RayHead":
        """The head a `record` names. A record holding only `dashboard_url` (written before heads
        were recorded in full, for private heads only) is a private head whose token is found by
        its address; its processes, unknown, are judged by its Jobs API alone."""
        url = rec["dashboard_url"]
        if "owned" not in rec:
            tok = token_path_for(url)
            return cls(None, url, owned=True, token_path=str(tok) if tok.is_file() else None)
        return cls(rec.get("gcs_address"), url, rec.get("temp_dir"), bool(rec["owned"]), rec.get("token_path"))


# What a private head does for nobody, turned down (Ray 2.60; what each costs on an idle head and with
# a job running: benchmarks/results/ray_head_cpu.md, docs/operations.md). Environment defaults of
# `ray start`, so a caller's own setting wins. Prestarting workers when the first driver connects
# leaves one idle Python worker per CPU polling forever; the jobs' drivers are no Ray workers and Ray
# Train starts its own on demand. The dashboard agent's reporter samples every process with psutil
# every 5 s for the dashboard's node view and Prometheus, which nothing here reads.
HEAD_QUIET_ENV = {
    "RAY_prestart_worker_first_driver": "0",
    "REPORTER_UPDATE_INTERVAL_MS": "60000",
}


def _env(head: RayHead | None = None, quiet: bool = True) -> dict[str, str]:
    """The environment of `ray start` (and of Ray clients of `head`): this process's, with the head's
    token, usage stats off, loopback only and, if `quiet`, `HEAD_QUIET_ENV`; a variable already
    set here wins over each default."""
    env = dict(os.environ)
    if head is not None and head.token_path:
        env.pop("RAY_AUTH_TOKEN", None)  # an inline token in the caller's environment would win over the file
        env.update(head.auth_env())
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if quiet:
        for k, v in HEAD_QUIET_ENV.items():
            env.setdefault(k, v)
    # `ray start --node-ip-address=127.0.0.1` swaps loopback for the external address (and then
    # binds to it and 0.0.0.0); with "cluster mode" off the node address stays 127.0.0.1 and every
    # server binds to loopback (checked with `ss -ltn`, Ray 2.60).
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    return env


def _head_command(port: int, dashboard_port: int, agent_port: int, temp_dir: str,
                  num_cpus: int | None = None, quiet: bool = True) -> list[str]:
    """The `ray start --head` command line of a private head (see `start_head`)."""
    cmd = [_ray_bin(), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
           "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}", "--include-dashboard=true",
           f"--dashboard-agent-listen-port={agent_port}",
           f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    if quiet:
        # the log monitor polls every worker log ten times a second to stream it to drivers: job
        # logs do not need it (the job supervisor writes the driver's output to its own file, which
        # the Jobs API reads) and the job's ray.init has log_to_driver off
        cmd.append("--include-log-monitor=false")
    if num_cpus:
        cmd.append(f"--num-cpus={num_cpus}")
    return cmd


def start_head(num_cpus: int | None = None, temp_dir: str | None = None, timeout: float = 90.0,
               quiet: bool = True) -> RayHead:
    """Start a private Ray head bound to 127.0.0.1 (GCS, dashboard and Jobs API on loopback),
    with token auth on and a new token (see the module docstring). `quiet` (the default) turns off
    what nothing here uses: the log monitor and `HEAD_QUIET_ENV`; False keeps Ray's own defaults
    for them (benchmarks/ray_head_cpu.py compares the two)."""
    # the dashboard agent's HTTP port is a fixed default (52365): a second head on the machine (another
    # controller, a Tune baseline) would find it taken and its job agent never registers ("No
    # available agent to submit job"), so every port a client or job reaches is chosen free
    port, dash, agent = _free_port(), _free_port(), _free_port()
    # Ray makes its session folder 0777 and creates its sockets (the Jobs API's `dash_JobHead`
    # among them, which answers without the token) and logs under the umask: the whole temp dir
    # therefore lives inside a 0700 folder of ours, which no other uid (the sandbox's included)
    # can enter whatever the umask. Kept short: unix socket paths inside it are capped at 107 bytes.
    home = private_dir(temp_dir or f"/tmp/swarmlab-ray-{os.getpid()}-{port}")
    temp_dir = str(home / "r")
    url = f"http://127.0.0.1:{dash}"
    head = RayHead(f"127.0.0.1:{port}", url, temp_dir, owned=True, token_path=str(new_token(token_path_for(url))))
    cmd = _head_command(port, dash, agent, temp_dir, num_cpus=num_cpus, quiet=quiet)
    try:
        proc = subprocess.run(cmd, env=_env(head, quiet=quiet), capture_output=True, text=True, timeout=timeout)
    except BaseException:
        stop_head(head)
        raise
    if proc.returncode != 0:
        stop_head(head)
        raise RuntimeError(f"ray start failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    deadline = time.time() + timeout
    last: Exception | None = None
    while time.time() < deadline:
        try:
            head.client().list_jobs()
            return head
        except Exception as e:  # the Jobs API comes up a few seconds after the GCS
            last = e
            time.sleep(0.5)
    stop_head(head)
    raise RuntimeError(f"Ray Jobs API at {head.dashboard_url} did not answer within {timeout:.0f}s: {last}")


def _head_processes(head: RayHead) -> list:
    """This head's processes: those naming its temp dir or its GCS address, and their descendants.
    (`ray stop` would stop every Ray on the machine, other users' clusters included.)"""
    import psutil

    gcs = head.gcs_address
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["cmdline"]):
        args = p.info["cmdline"] or []
        if any((head.temp_dir and head.temp_dir in a) or (gcs and a.endswith(gcs)) for a in args):
            if p.pid == os.getpid():
                continue
            found[p.pid] = p
            try:
                found.update({c.pid: c for c in p.children(recursive=True)})
            except psutil.Error:
                pass
    return list(found.values())


def head_alive(head: RayHead, timeout: float = HEAD_ANSWER_S) -> bool:
    """Whether the head still serves: for a private head started here, some of its processes are
    alive (none after a reboot or when all were killed: no waiting), and its Jobs API answers a
    listing within `timeout` (retried meanwhile: a loaded head may be slow). A head whose GCS or
    dashboard died while other processes linger is not alive: the caller stops what is left."""
    if head.owned and (head.temp_dir or head.gcs_address) and not _head_processes(head):
        return False
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # loopback: never through a proxy
    deadline = time.time() + timeout
    while True:
        try:
            req = urllib.request.Request(head.dashboard_url.rstrip("/") + "/api/jobs/", headers=head.headers())
            with opener.open(req, timeout=max(1.0, deadline - time.time())) as r:
                if r.status == 200:
                    return True
        except (OSError, ValueError):   # refused, timed out, 401 (a token that is not its), no token file
            pass
        if time.time() >= deadline:
            return False
        time.sleep(1.0)


def stop_head(head: RayHead, timeout: float = 5.0) -> None:
    """Stop a head this process started (SIGTERM, then SIGKILL), and remove its temp dir and token."""
    if not head.owned:
        return
    import psutil

    procs = _head_processes(head)
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    if head.temp_dir:
        shutil.rmtree(pathlib.Path(head.temp_dir).parent, ignore_errors=True)  # the private folder around it
    if head.token_path:
        pathlib.Path(head.token_path).unlink(missing_ok=True)


def ensure_head(address: str | None = None, num_cpus: int | None = None) -> RayHead:
    """An existing cluster (dashboard URL, e.g. http://HOST:8265) or a new private local head.
    The token for an address: the caller's `RAY_AUTH_TOKEN_PATH`, else the one this user's private
    head at that address was started with (a controller reconnecting after a restart), else none
    (Ray's own `RAY_AUTH_MODE`/`RAY_AUTH_TOKEN` environment then decides)."""
    if address:
        url = address if address.startswith("http") else f"http://{address}"
        token = os.environ.get("RAY_AUTH_TOKEN_PATH")
        if not token and token_path_for(url).is_file():
            token = str(token_path_for(url))
        return RayHead(None, url, owned=False, token_path=token)
    return start_head(num_cpus=num_cpus)


class JobPendingError(SwarmlabError, RuntimeError):
    """A job that stayed PENDING (no node could start its driver: resources the cluster lacks, a
    runtime env that does not set up) beyond the stated limit; its stop has been requested."""

    def __init__(self, job_id: str, waited_s: float, limit_s: float, message: str = "") -> None:
        super().__init__(f"job {job_id} still PENDING after {waited_s:.0f}s (limit {limit_s:.0f}s); stop requested"
                         + (f": {message}" if message else ""))
        self.job_id, self.waited_s, self.limit_s = job_id, waited_s, limit_s


def code_runtime_env(root: str | os.PathLike | None = None) -> dict[str, Any]:
    """The project's code as Ray `py_modules`: each package the trainer imports, uploaded by Ray
    under a URI named after the hash of its files' paths and contents, so an unchanged package is
    uploaded once per cluster and reused by every later job; compiled files are left out (they
    change at every import and would make every upload new)."""
    root = pathlib.Path(root) if root else PROJECT_ROOT
    return {"py_modules": [str(root / p) for p in CODE_PACKAGES], "excludes": list(CODE_EXCLUDES)}


@dataclasses.dataclass(frozen=True)
class JobTrainer:
    """What a job runs: the trainer module (`python -m MODULE *ARGS run.yaml`) and the config type it
    reads (`module:Class`, with `parse`, `name`, `out_dir`, `fork_from`; imported when first needed).
    `storage`: whether the trainer can keep its run on run storage (`trainer.run_storage`)."""
    module: str
    args: tuple[str, ...]
    config: str
    storage: bool

    def config_type(self) -> Any:
        import importlib

        mod, _, name = self.config.partition(":")
        return getattr(importlib.import_module(mod), name)

    def argv(self, config: str) -> list[str]:
        """The words after the interpreter."""
        return ["-m", self.module, *self.args, config]


RUN_TRAINER = JobTrainer("trainer.entry", (), "trainer.config:RunConfig", storage=True)
AGENT_TRAINER = JobTrainer("trainer.agent_train", ("--config",), "trainer.agent_train:AgentTrainConfig", storage=False)


def spec_yaml(cfg: Any) -> str:
    """A config as the job reads it (`run.yaml`) and as its submission id hashes it."""
    import yaml

    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def run_spec(config_path: str | os.PathLike, trainer: JobTrainer = RUN_TRAINER) -> Any:
    """The config a job carries (`trainer`'s type; a RunConfig by default): validated, with its
    paths (`out_dir`, `fork_from`) made absolute against the caller's working directory, as a local
    run would read them (the job runs in a folder of its own)."""
    from trainer.config import load_yaml

    cfg_path = pathlib.Path(config_path).resolve()
    cfg = trainer.config_type().parse(load_yaml(cfg_path, "config file") or {})   # validate before anything starts
    upd: dict[str, Any] = {"out_dir": str(pathlib.Path(cfg.out_dir).resolve())}
    if cfg.fork_from:
        upd["fork_from"] = str(pathlib.Path(cfg.fork_from).resolve())
    return cfg.model_copy(update=upd)


def submission_id(cfg: Any, restart: int = 0, salt: str = "") -> str:
    """The job id of the run `cfg` at its `restart`-th start: the same spec gives the same id, so a
    controller that crashed after submitting and submits again finds its job instead of starting
    a second one; a deliberate restart counts up. `salt` (e.g. a key the swarm run drew once and
    keeps) tells apart two runs of the same spec on one cluster, such as a workspace made again
    at the same path."""
    if restart < 0:
        raise ValueError(f"restart={restart}: must be >= 0")
    digest = hashlib.sha256(salt.encode() + b"\0" + spec_yaml(cfg).encode()).hexdigest()[:16]
    return f"swarmlab-{cfg.name}-{digest}-r{restart}"


@dataclasses.dataclass(frozen=True)
class Submission:
    job_id: str
    created: bool   # False: a job with this id existed already (a resubmission): nothing was started


def submit(head: RayHead, config_path: str | os.PathLike, job_id: str | None = None, restart: int = 0,
           entrypoint_num_cpus: float | None = None, resources: dict[str, float] | None = None,
           python: str | None = None, salt: str = "", storage_uri: str | None = None,
           fork_storage: str | None = None, trainer: JobTrainer = RUN_TRAINER) -> Submission:
    """Submit a trainer as a Ray job that carries its code and its config: the project's
    packages as `py_modules` (`code_runtime_env`), the config (`trainer`'s type, paths made absolute)
    as the job's `working_dir`, the entrypoint run there `PYTHON -m trainer.entry run.yaml` (or, for
    `AGENT_TRAINER`, `PYTHON -m trainer.agent_train --config run.yaml`). `job_id`
    defaults to `submission_id(config, restart, salt)`; a job that exists under that id is not started
    again (`created=False`). `entrypoint_num_cpus` / `resources` reserve the driver's place
    (a custom resource pins it to the nodes that have it). `python`: the interpreter on the node
    (default: `$SWARMLAB_JOB_PYTHON`, else this one, which a node that shares this machine's
    layout has). `storage_uri`: the run's folder on run storage (`trainer.run_storage`): the job
    then works in its node's scratch folder, mirrors to it and resumes from it; `fork_storage`: the
    stored run whose checkpoint `fork_from` names (the job fetches it from there); only for a
    trainer that keeps its run there (`JobTrainer.storage`)."""
    if storage_uri and not trainer.storage:
        raise ValueError(f"storage_uri={storage_uri!r}: {trainer.module} keeps its run folder at out_dir, "
                         "not on run storage")
    cfg = run_spec(config_path, trainer)
    job_id = job_id or submission_id(cfg, restart, salt)
    python = python or os.environ.get(JOB_PYTHON_ENV) or sys.executable
    env = {**head.auth_env(), "PYTHONUNBUFFERED": "1"}  # the job's own ray.init (Ray Train) needs the token too
    from sandboxes.base import PLAIN_OPT_IN_ENV

    if os.environ.get(PLAIN_OPT_IN_ENV):  # the goal's sandbox opt-in reaches code-task rewards in the job
        env[PLAIN_OPT_IN_ENV] = os.environ[PLAIN_OPT_IN_ENV]
    if head.owned:  # the job's own ray.init must resolve this node as 127.0.0.1 too (see _env)
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = _env()["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
    if head.gcs_address:
        env["RAY_ADDRESS"] = head.gcs_address
    # the Jobs API runs the entrypoint through a shell: every word is quoted; no path of this
    # machine is in it (the config travels in the working dir, the code in py_modules)
    argv = trainer.argv("run.yaml")
    if storage_uri:   # the run's folder is on storage, not at out_dir (trainer/run_storage.py)
        from trainer.run_storage import FORK_ENV, STORAGE_ENV

        env[STORAGE_ENV] = storage_uri
        if fork_storage:
            env[FORK_ENV] = fork_storage
        argv = ["-m", "trainer.run_storage", "run.yaml"]
    entry = shlex.join([python, *argv])
    client = head.client()
    for name in QUIET_LOGGERS:   # a line per package uploaded or reused would land in the user's live view
        logging.getLogger(name).setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="swarmlab-job-") as wd:
        (pathlib.Path(wd) / "run.yaml").write_text(spec_yaml(cfg))
        runtime_env = {**code_runtime_env(), "working_dir": wd, "env_vars": env}
        deadline = time.time() + SUBMIT_WAIT_S
        while True:
            try:
                # the packages are uploaded (if the cluster lacks them) before this returns
                got = client.submit_job(entrypoint=entry, submission_id=job_id, runtime_env=runtime_env,
                                        entrypoint_num_cpus=entrypoint_num_cpus, entrypoint_resources=resources,
                                        metadata={"swarmlab_run": cfg.name, "swarmlab_restart": str(restart)})
                return Submission(got, True)
            except RuntimeError as e:
                if "already exists" in str(e):
                    # this id was submitted before (by us before a crash, or a retry of a request
                    # whose answer was lost): that job is the run's, whatever its state
                    return Submission(job_id, False)
                # a fresh head answers list_jobs before its job agent has registered; Ray then says
                # "No available agent to submit job" (HTTP 500) — transient, seconds on a loaded machine
                if "No available agent" not in str(e) or time.time() > deadline:
                    raise
                time.sleep(1.0)


def submit_job(head: RayHead, config_path: str | os.PathLike, job_id: str | None = None, **kw: Any) -> str:
    """`submit`, returning the job id only (the job this spec names, new or already there)."""
    return submit(head, config_path, job_id=job_id, **kw).job_id


def pending_overdue(status: str, pending_since: float | None, now: float, limit_s: float) -> bool:
    """Whether a job has been PENDING for longer than `limit_s` (`pending_since`: when it was first
    seen PENDING, None if never)."""
    return status == "PENDING" and pending_since is not None and now - pending_since > limit_s


def wait_job(head: RayHead, job_id: str, timeout: float = 3600.0, poll: float = 1.0,
             pending_limit_s: float = JOB_PENDING_LIMIT_S) -> str:
    """Wait for a job to end; returns its final status. A job PENDING beyond `pending_limit_s` is
    a failure: its stop is requested, then `JobPendingError`. (Ray 2.60 carries a stop out through
    the job's supervisor actor: a job whose driver never gets a node stays listed as PENDING until
    Ray's own start timeout, `RAY_JOB_START_TIMEOUT_SECONDS` in the head's environment, marks it
    FAILED; if it gets a node first, the queued stop ends it.)"""
    from ray.job_submission import JobStatus

    deadline = time.time() + timeout
    client = head.client()
    pending_since: float | None = None
    while time.time() < deadline:
        st = client.get_job_status(job_id)
        if st in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            return str(st.value)
        now = time.time()
        if st == JobStatus.PENDING and pending_since is None:
            pending_since = now
        if pending_overdue(str(st.value), pending_since, now, pending_limit_s):
            try:
                message = client.get_job_info(job_id).message or ""
            except Exception:   # the stop below matters more than the message
                message = ""
            client.stop_job(job_id)
            raise JobPendingError(job_id, now - pending_since, pending_limit_s, message)
        time.sleep(poll)
    raise TimeoutError(f"job {job_id} still running after {timeout:.0f}s")


def run_ray_train(cfg: RunConfig) -> dict[str, Any]:
    """Run the loop data-parallel on `cfg.num_workers` Ray Train workers (gloo on CPU), every
    rank on the run folder at `cfg.run_dir` (one machine, or a shared mount); every rank resumes
    from the checkpoint rank 0 chooses there (`Trainer._start`: `trainer.distributed.agree_resume`).
    Must be called inside a Ray driver (e.g. the job entrypoint, or after ray.init)."""
    from ray.train import RunConfig as RayRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    def loop(config: dict[str, Any]) -> None:
        import ray.train

        from trainer.loop import Trainer

        c = RunConfig.model_validate(config)
        summary = Trainer(c).run()
        ray.train.report({k: v for k, v in summary.items() if isinstance(v, (int, float))})

    storage = (cfg.run_dir / "ray_train").resolve()
    trainer = TorchTrainer(
        loop, train_loop_config=cfg.model_dump(mode="json"),
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=False,
                                     resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RayRunConfig(name=cfg.name, storage_path=str(storage.parent)),
    )
    result = trainer.fit()
    return dict(result.metrics or {})
