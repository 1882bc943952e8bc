"""Sandbox benchmark: executions per second and p50/p95 latency, per backend, with the overhead
over a bare subprocess measured in the same run.

Two workloads:
- `trivial`: the snippet `print(1)`;
- `unittest`: a code-task unit-test run — the `code` task's test runner with a difficulty-5
  reference solution and its 8 hidden tests, exactly the request a GRPO reward makes.

Backends: `bare` (the same files written to a temp dir and `python3 main.py` run by
`subprocess.run`: no isolation, the baseline), `plain` (LocalSandbox fallback), `bwrap`
(LocalSandbox with bubblewrap), `docker` (skipped when no engine answers or the image is missing).
For each: `--runs` sequential executions (latency p50/p95), then `--runs` through a `SandboxPool`
of `--workers` threads (executions per second). Overhead = backend p50 / bare p50 and
bare throughput / backend throughput.

    .venv/bin/python benchmarks/sandboxes/bench_sandboxes.py            # writes results/<tag>.json
    .venv/bin/python benchmarks/sandboxes/bench_sandboxes.py --runs 10 --backends bare,bwrap

Results are committed in benchmarks/sandboxes/results/ with a summary in results.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sandboxes import ExecRequest, ExecResult, Isolation, Limits, Sandbox, SandboxPool, StopReason  # noqa: E402
from sandboxes.base import ResourceUsage  # noqa: E402
from sandboxes.local import LocalSandbox, default_python  # noqa: E402
from sandboxes.pool import percentile  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
LIMITS = Limits(wall_seconds=10, cpu_seconds=10)


class BareSubprocess(Sandbox):
    """The baseline: write the files to a temp dir and run the command there, nothing else."""

    isolation = Isolation.PLAIN

    def __init__(self) -> None:
        super().__init__(LIMITS)
        self.python = default_python()

    def _execute(self, request: ExecRequest, limits: Limits) -> ExecResult:
        t0 = time.monotonic()
        work = tempfile.mkdtemp(prefix="bench-bare-")
        try:
            for rel, data in request.files.items():
                path = os.path.join(work, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            p = subprocess.run(list(request.argv), cwd=work, capture_output=True, timeout=limits.wall_seconds)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return ExecResult(StopReason.EXIT, p.returncode, p.stdout, p.stderr,
                          usage=ResourceUsage(time.monotonic() - t0), isolation=self.isolation)


def workloads(sb: Sandbox) -> dict[str, ExecRequest]:
    from trainer.tasks.code import CodeTask

    task = CodeTask(seed=0, sandbox=sb)
    ex = task.example("train", 0, 5)
    return {
        "trivial": sb.python_request("print(1)", limits=LIMITS),
        "unittest": task.sandbox_request(ex.solution, ex, "benchtag"),
    }


def check(name: str, res: ExecResult) -> None:
    if not res.ok:
        raise SystemExit(f"{name}: benchmark run failed: {res.summary()} {res.stderr_text[-300:]}")


def measure(sb: Sandbox, runs: int, workers: int) -> dict[str, dict]:
    out = {}
    for wname, req in workloads(sb).items():
        for _ in range(3):  # warm-up: page cache, first container, bwrap probe
            check(wname, sb.execute(req))
        lat = []
        for _ in range(runs):
            t0 = time.monotonic()
            res = sb.execute(req)
            lat.append(time.monotonic() - t0)
            check(wname, res)
        with SandboxPool(sb, workers=workers) as pool:
            results = pool.map([req] * runs)
            stats = pool.last_stats
        for r in results:
            check(wname, r)
        out[wname] = {
            "sequential_p50_ms": round(percentile(lat, 50) * 1e3, 1),
            "sequential_p95_ms": round(percentile(lat, 95) * 1e3, 1),
            "sequential_per_s": round(runs / sum(lat), 2),
            "pool_per_s": round(stats.throughput, 2),
            "pool_p50_ms": round(stats.latency_p50 * 1e3, 1),
            "pool_p95_ms": round(stats.latency_p95 * 1e3, 1),
        }
        print(f"  {wname:9s} {out[wname]}", flush=True)
    return out


def make(name: str) -> Sandbox | None:
    if name == "bare":
        return BareSubprocess()
    if name == "plain":
        return LocalSandbox(LIMITS, isolation="plain")
    if name == "bwrap":
        try:
            return LocalSandbox(LIMITS, isolation="bwrap")
        except Exception as e:
            print(f"bwrap: skipped ({e})")
            return None
    if name == "docker":
        from sandboxes.docker_backend import DockerSandbox, docker_status

        ok, why = docker_status()
        if not ok:
            print(f"docker: skipped ({why})")
            return None
        return DockerSandbox(LIMITS)
    raise SystemExit(f"unknown backend {name!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40, help="executions per backend and workload (each mode)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="pool threads")
    ap.add_argument("--backends", default="bare,plain,bwrap,docker")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    import logging

    logging.basicConfig(level=logging.ERROR)  # the plain fallback's warning is expected here
    results: dict[str, dict] = {}
    load_before = os.getloadavg()[0]
    for name in args.backends.split(","):
        sb = make(name)
        if sb is None:
            continue
        print(f"{name}:", flush=True)
        results[name] = measure(sb, args.runs, args.workers)
        sb.close()
    if "bare" in results:
        base = results["bare"]
        for per in results.values():
            for wname, m in per.items():
                m["latency_overhead_x"] = round(m["sequential_p50_ms"] / base[wname]["sequential_p50_ms"], 2)
                m["throughput_overhead_x"] = round(base[wname]["pool_per_s"] / m["pool_per_s"], 2)
    now = datetime.datetime.now(datetime.timezone.utc)
    record = {
        "date": now.isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python_in_sandbox": default_python(),
                    # other jobs on a shared machine inflate every row alike; the ratios are the point
                    "loadavg_1m_before": round(load_before, 2), "loadavg_1m_after": round(os.getloadavg()[0], 2)},
        "runs": args.runs,
        "workers": args.workers,
        "limits": LIMITS.to_dict(),
        "results": results,
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{now:%Y-%m-%d}-{os.cpu_count()}cpu.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
