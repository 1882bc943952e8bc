"""Measured inputs of the cluster simulation (benchmarks/cluster_sim.py) that no other benchmark
measures: how many file-system operations a controller tick makes on the run's storage, and what
the Ray Jobs API costs per request on a private local head.

    python benchmarks/cluster_costs.py            # both parts, about a minute; writes benchmarks/results/cluster_costs.{json,md}
    python benchmarks/cluster_costs.py --no-ray   # the storage count only (a second)

Storage: the functions a quiet tick's `observe` calls on the run folder (`agents.evidence.collect`,
`trainer.runlog.read_heartbeat`, `swarm.jobs.CpuMeter.observe` for the live run and each backtest
arm, the checkpoint folder's stat), and one iteration of a command's acknowledgement wait
(`Controller.command`: the command log and the heartbeat), run against a synthetic run folder with
`open`, `stat` and directory listings counted. Each is one round trip to storage that is not the
controller's disk, which is what the simulation charges its latency for. The count is per call, so
it holds on any machine.

Ray: a private head (`trainer.launch.start_head`, loopback, token auth), `get_job_status` timed
many times, then a few trainer jobs submitted the way the controller submits them
(`trainer.launch.submit`, the project's code as `py_modules`): the submit round trip, the time to
RUNNING, to the trainer's first heartbeat and first metrics row; the head's own processes' CPU per
request. The head is stopped at the end (its processes only). On a shared, loaded machine the
latencies are upper bounds; the CPU per request is the better number.
"""
from __future__ import annotations

import argparse
import builtins
import contextlib
import io
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"


@contextlib.contextmanager
def counted_fs() -> Iterator[dict[str, int]]:
    """Count open / stat / listing calls made through os, io and builtins while the block runs."""
    counts = {"open": 0, "stat": 0, "list": 0}
    saved = {"open": builtins.open, "io_open": io.open, "stat": os.stat, "scandir": os.scandir, "listdir": os.listdir}

    def wrap(fn, key):
        def inner(*a, **k):
            counts[key] += 1
            return fn(*a, **k)
        return inner

    builtins.open = io.open = wrap(saved["open"], "open")
    os.stat = wrap(saved["stat"], "stat")
    os.scandir, os.listdir = wrap(saved["scandir"], "list"), wrap(saved["listdir"], "list")
    try:
        yield counts
    finally:
        builtins.open, io.open, os.stat = saved["open"], saved["io_open"], saved["stat"]
        os.scandir, os.listdir = saved["scandir"], saved["listdir"]


def _fake_run(d: pathlib.Path, step: int) -> None:
    """A run folder as the trainer leaves it: the streams, a heartbeat, a checkpoint."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "checkpoints").mkdir(exist_ok=True)
    (d / "checkpoints" / "step_100.json").write_text(json.dumps({"name": "step_100", "step": 100}))
    with open(d / "metrics.jsonl", "a") as f:
        for s in range(step - 10, step):
            f.write(json.dumps({"step": s, "loss": 1.0, "pass_rate": 0.5, "time": time.time()}) + "\n")
    with open(d / "samples.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "question": "1+1", "answer": "2"}) + "\n")
    (d / "events.jsonl").touch()
    (d / "command_log.jsonl").touch()
    (d / "heartbeat.json").write_text(json.dumps({"time": time.time(), "step": step, "pid": os.getpid(),
                                                  "state": "running", "cpu_s": 1.0}))


def storage_ops() -> dict[str, Any]:
    """File-system operations per quiet observe (with 0, 2 and 4 backtest arm folders) and per
    iteration of a command's acknowledgement wait, on the second and later ticks (the first reads
    the whole stream once)."""
    from agents.evidence import collect
    from swarm.jobs import CpuMeter
    from trainer.runlog import iter_jsonl, read_heartbeat

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as t:
        root = pathlib.Path(t)
        run = root / "runs" / "train"
        arms = root / "backtests"
        arms.mkdir()
        _fake_run(run, 20)

        def observe() -> None:   # the storage side of Controller.node_observe + Controller.checkpoints
            meter = CpuMeter()
            meter.observe(run)
            for arm in arms.glob("bt-*"):
                if arm.is_dir():
                    meter.observe(arm)
            collect(run, "RUNNING")
            (run / "checkpoints").stat()

        observe()   # the first tick reads the streams from the start
        for n_arms in (0, 2, 4):
            for i in range(n_arms):
                _fake_run(arms / f"bt-x-{i}", 5)
            _fake_run(run, 30 + n_arms)   # new rows since the last tick
            with counted_fs() as c:
                observe()
            out[f"observe_{n_arms}_arms"] = dict(c, total=sum(c.values()))
            for i in range(n_arms):
                for p in sorted((arms / f"bt-x-{i}").rglob("*"), reverse=True):
                    p.rmdir() if p.is_dir() else p.unlink()
                (arms / f"bt-x-{i}").rmdir()
        with counted_fs() as c:   # one pass of Controller.command's wait loop (and heartbeat_stale)
            list(iter_jsonl(run / "command_log.jsonl"))
            read_heartbeat(run)
        out["command_wait_poll"] = dict(c, total=sum(c.values()))
    return out


def _tiny_config(out_dir: pathlib.Path, name: str, steps: int) -> dict[str, Any]:
    return {"name": name, "seed": 0, "threads": 1, "samples_per_step": 1, "out_dir": str(out_dir),
            "task": {"name": "reverse"}, "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32},
            "harness": {"curriculum": {"start": 3}, "answer": {"reverse_digits": True}, "sampling": {"max_new_tokens": 6}},
            "recipe": {"algorithm": "sft", "lr": 1e-2, "steps": steps, "batch_size": 8, "warmup_steps": 2,
                       "eval_interval": 0, "eval_size": 16},
            "checkpoint": {"interval": 0, "keep_last": 1}}


def _head_cpu(head: Any) -> float:
    import psutil

    from trainer.launch import _head_processes

    total = 0.0
    for p in _head_processes(head):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def ray_costs(status_calls: int, jobs: int) -> dict[str, Any]:
    import yaml

    from trainer.launch import start_head, stop_head, submit
    from trainer.runlog import read_heartbeat, read_jsonl

    t0 = time.time()
    head = start_head(num_cpus=2)
    out: dict[str, Any] = {"head_start_s": round(time.time() - t0, 2)}
    try:
        client = head.client()
        with tempfile.TemporaryDirectory() as t:
            root = pathlib.Path(t)
            rows = []
            for i in range(jobs):
                cfg = _tiny_config(root / "runs", f"job{i}", steps=30)
                path = root / f"job{i}.yaml"
                path.write_text(yaml.safe_dump(cfg))
                cpu0, w0 = _head_cpu(head), time.time()
                jid = submit(head, path, job_id=f"cost-{i}-{os.getpid()}").job_id
                w1, cpu1 = time.time(), _head_cpu(head)
                run_dir = root / "runs" / f"job{i}"
                marks: dict[str, float] = {}
                deadline = w0 + 120
                while time.time() < deadline:
                    st = str(client.get_job_status(jid).value)
                    now = time.time()
                    if st == "RUNNING" and "running" not in marks:
                        marks["running"] = now
                        cpu_running = _head_cpu(head)
                    if read_heartbeat(run_dir):
                        marks.setdefault("heartbeat", now)
                    if (run_dir / "metrics.jsonl").exists() and read_jsonl(run_dir / "metrics.jsonl"):
                        marks.setdefault("first_row", now)
                    if st in ("SUCCEEDED", "FAILED", "STOPPED"):
                        marks.setdefault("ended", now)
                        break
                    time.sleep(0.05)
                rows.append({"job": i, "submit_s": round(w1 - w0, 3), "head_cpu_submit_s": round(cpu1 - cpu0, 3),
                             "head_cpu_to_running_s": round(cpu_running - cpu0, 3) if "running" in marks else None,
                             **{f"to_{k}_s": round(v - w0, 3) for k, v in marks.items()},
                             "status": st})
            out["jobs"] = rows
            jid = f"cost-0-{os.getpid()}"
            lat = []
            cpu0 = _head_cpu(head)
            w0 = time.time()
            for _ in range(status_calls):
                a = time.perf_counter()
                client.get_job_status(jid)
                lat.append(time.perf_counter() - a)
            wall = time.time() - w0
            cpu1 = _head_cpu(head)
            # the head's idle CPU over the same wall time is subtracted (ray_head_cpu.md: 3.7% of a core idle)
            idle = wall * 0.0372
            out["status"] = {"calls": status_calls, "median_ms": round(1000 * statistics.median(lat), 2),
                             "p90_ms": round(1000 * sorted(lat)[int(0.9 * len(lat))], 2),
                             "head_cpu_ms_per_call": round(1000 * max(cpu1 - cpu0 - idle, 0.0) / status_calls, 3),
                             "head_cpu_ms_per_call_raw": round(1000 * (cpu1 - cpu0) / status_calls, 3),
                             "wall_s": round(wall, 2)}
    finally:
        stop_head(head)
    return out


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def markdown(res: dict[str, Any]) -> str:
    lines = ["# Measured inputs of the cluster simulation", "",
             f"Command: `{res['command']}`.  ",
             f"Code: {res['commit']} (working tree). Machine: {res['machine']}; load average at start {res['load']}.", "",
             "## File-system operations per controller action (counted, any machine)", "",
             "| action | open | stat | listing | total |", "|---|---|---|---|---|"]
    for k, v in res["storage"].items():
        lines.append(f"| {k.replace('_', ' ')} | {v['open']} | {v['stat']} | {v['list']} | {v['total']} |")
    lines += ["", "Each is one round trip when the run folder is on storage other than the controller's disk "
              "(NFS, an object store through a filesystem layer): the simulation charges the storage latency per operation."]
    if "ray" in res:
        r = res["ray"]
        lines += ["", "## Ray Jobs API on a private local head (timed)", "",
                  f"Head start: {r['head_start_s']} s. `get_job_status`, {r['status']['calls']} calls: median "
                  f"{r['status']['median_ms']} ms, p90 {r['status']['p90_ms']} ms, head CPU {r['status']['head_cpu_ms_per_call']} ms "
                  f"per call with the head's idle CPU (3.72% of a core, ray_head_cpu.md) over the same {r['status']['wall_s']} s "
                  f"subtracted ({r['status']['head_cpu_ms_per_call_raw']} ms without).", "",
                  "| job | submit round trip s | head CPU during submit s | head CPU submit → RUNNING s | to RUNNING s | to first heartbeat s | to first metrics row s | to end s | status |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for j in r["jobs"]:
            lines.append(f"| {j['job']} | {j['submit_s']} | {j['head_cpu_submit_s']} | {j.get('head_cpu_to_running_s', '—')} | {j.get('to_running_s', '—')} | "
                         f"{j.get('to_heartbeat_s', '—')} | {j.get('to_first_row_s', '—')} | {j.get('to_ended_s', '—')} | {j['status']} |")
        lines += ["", "Job 0 uploads the project's packages; later jobs find them on the head (same hash). "
                  "The machine is shared with other jobs (2 cores): latencies are upper bounds. The head's CPU is summed "
                  "over the processes alive at each reading, and processes come and go while a job starts, so the "
                  "per-job CPU columns are rough (the second can come out below the first); the simulation takes the "
                  "median head CPU during submit of jobs 1-3."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-ray", action="store_true", help="count storage operations only")
    ap.add_argument("--status-calls", type=int, default=2000, help="get_job_status calls timed")
    ap.add_argument("--jobs", type=int, default=4, help="trainer jobs submitted")
    ap.add_argument("--out", default=str(RESULTS / "cluster_costs"), help="results path without extension")
    a = ap.parse_args()
    res: dict[str, Any] = {"command": "python benchmarks/cluster_costs.py" + (" --no-ray" if a.no_ray else ""),
                           "commit": commit(), "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, "
                           f"Python {platform.python_version()}", "load": os.getloadavg()[0],
                           "storage": storage_ops()}
    if not a.no_ray:
        import ray

        res["machine"] += f", Ray {ray.__version__}"
        res["ray"] = ray_costs(a.status_calls, a.jobs)
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
