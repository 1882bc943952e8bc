"""Running the trainer on Ray: a private head on 127.0.0.1, the Jobs API, and Ray Train.

    head = ensure_head()                      # or RayHead.connect("http://HOST:8265")
    job_id = submit_job(head, "run.yaml")     # the trainer runs as a Ray job
    wait_job(head, job_id)

When no cluster address is given the system starts its own head, bound to loopback, with token
auth disabled (Ray 2.60 enables it by default; a private loopback head is what makes disabling it
safe) and its own temp dir; `stop_head` stops it. `num_workers > 1` in the run config makes the
job's entrypoint run the loop data-parallel on Ray Train workers (gloo on CPU).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from trainer.config import RunConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_bin() -> str:
    cand = pathlib.Path(sys.executable).parent / "ray"
    return str(cand) if cand.exists() else (shutil.which("ray") or "ray")


@dataclasses.dataclass
class RayHead:
    gcs_address: str | None       # "127.0.0.1:PORT" (None for an external cluster reached by dashboard URL)
    dashboard_url: str
    temp_dir: str | None = None
    owned: bool = False

    def client(self):
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.dashboard_url)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # `ray start --node-ip-address=127.0.0.1` swaps loopback for the external address (and then
    # binds to it and 0.0.0.0); with "cluster mode" off the node address stays 127.0.0.1 and every
    # server binds to loopback (checked with `ss -ltn`, Ray 2.60).
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    return env


def start_head(num_cpus: int | None = None, temp_dir: str | None = None, timeout: float = 90.0) -> RayHead:
    """Start a private Ray head bound to 127.0.0.1 (GCS, dashboard and Jobs API on loopback)."""
    port, dash = _free_port(), _free_port()
    temp_dir = temp_dir or f"/tmp/swarmlab-ray-{os.getpid()}-{port}"
    cmd = [_ray_bin(), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
           "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--include-dashboard=true",
           f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    if num_cpus:
        cmd.append(f"--num-cpus={num_cpus}")
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"ray start failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    head = RayHead(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}", temp_dir, owned=True)
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


def stop_head(head: RayHead, timeout: float = 5.0) -> None:
    """Stop a head this process started (SIGTERM, then SIGKILL), and remove its temp dir."""
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
        shutil.rmtree(head.temp_dir, ignore_errors=True)


def ensure_head(address: str | None = None, num_cpus: int | None = None) -> RayHead:
    """An existing cluster (dashboard URL, e.g. http://HOST:8265) or a new private local head."""
    if address:
        url = address if address.startswith("http") else f"http://{address}"
        return RayHead(None, url, owned=False)
    return start_head(num_cpus=num_cpus)


def submit_job(head: RayHead, config_path: str | os.PathLike, job_id: str | None = None) -> str:
    """Submit the trainer as a Ray job; the entrypoint is this interpreter running trainer.entry."""
    cfg_path = pathlib.Path(config_path).resolve()
    RunConfig.from_yaml(cfg_path)  # validate before anything starts
    root = pathlib.Path(__file__).resolve().parent.parent
    entry = f"cd {root} && {sys.executable} -m trainer.entry {cfg_path}"
    env = {"RAY_AUTH_MODE": _env()["RAY_AUTH_MODE"], "PYTHONUNBUFFERED": "1"}
    if head.owned:  # the job's own ray.init must resolve this node as 127.0.0.1 too (see _env)
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = _env()["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
    if head.gcs_address:
        env["RAY_ADDRESS"] = head.gcs_address
    return head.client().submit_job(entrypoint=entry, submission_id=job_id, runtime_env={"env_vars": env})


def wait_job(head: RayHead, job_id: str, timeout: float = 3600.0, poll: float = 1.0) -> str:
    from ray.job_submission import JobStatus

    deadline = time.time() + timeout
    client = head.client()
    while time.time() < deadline:
        st = client.get_job_status(job_id)
        if st in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            return str(st.value)
        time.sleep(poll)
    raise TimeoutError(f"job {job_id} still running after {timeout:.0f}s")


def run_ray_train(cfg: RunConfig) -> dict[str, Any]:
    """Run the loop data-parallel on `cfg.num_workers` Ray Train workers (gloo on CPU).
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
