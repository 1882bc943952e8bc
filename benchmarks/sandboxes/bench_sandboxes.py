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
of `--workers` threads (executions per second). Backends are interleaved (round-robin for the
sequential runs, alternating pool batches), so load from other jobs on a shared machine falls on
all of them alike. Overhead = backend p50 / bare p50 and bare throughput / backend throughput.

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


def measure(sandboxes: dict[str, Sandbox], runs: int, workers: int, rounds: int) -> dict[str, dict]:
    """Interleaved, so that load from anything else on the machine falls on every backend alike:
    sequential runs go round-robin over the backends one execution at a time, and the pool batches
    alternate between backends in `rounds` rounds of runs/rounds executions each."""
    reqs = {name: workloads(sb) for name, sb in sandboxes.items()}
    out: dict[str, dict] = {name: {} for name in sandboxes}
    for wname in ("trivial", "unittest"):
        for name, sb in sandboxes.items():
            for _ in range(3):  # warm-up: page cache, first container
                check(f"{name}/{wname}", sb.execute(reqs[name][wname]))
        lat: dict[str, list[float]] = {name: [] for name in sandboxes}
        for _ in range(runs):
            for name, sb in sandboxes.items():
                t0 = time.monotonic()
                res = sb.execute(reqs[name][wname])
                lat[name].append(time.monotonic() - t0)
                check(f"{name}/{wname}", res)
        pool_time = {name: 0.0 for name in sandboxes}
        pool_lat: dict[str, list[float]] = {name: [] for name in sandboxes}
        per_round = max(1, runs // rounds)
        for _ in range(rounds):
            for name, sb in sandboxes.items():
                with SandboxPool(sb, workers=workers) as pool:
                    for res in pool.map([reqs[name][wname]] * per_round):
                        check(f"{name}/{wname}", res)
                    pool_time[name] += pool.last_stats.seconds
                    pool_lat[name] += pool.last_stats.latencies
        for name in sandboxes:
            out[name][wname] = {
                "sequential_p50_ms": round(percentile(lat[name], 50) * 1e3, 1),
                "sequential_p95_ms": round(percentile(lat[name], 95) * 1e3, 1),
                "sequential_per_s": round(runs / sum(lat[name]), 2),
                "pool_per_s": round(len(pool_lat[name]) / pool_time[name], 2),
                "pool_p50_ms": round(percentile(pool_lat[name], 50) * 1e3, 1),
                "pool_p95_ms": round(percentile(pool_lat[name], 95) * 1e3, 1),
            }
            print(f"  {name:7s} {wname:9s} {out[name][wname]}", flush=True)
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
    ap.add_argument("--rounds", type=int, default=4, help="pool batches per backend, alternating backends")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    import logging

    logging.basicConfig(level=logging.ERROR)  # the plain fallback's warning is expected here
    load_before = os.getloadavg()[0]
    sandboxes = {name: sb for name in args.backends.split(",") if (sb := make(name)) is not None}
    results = measure(sandboxes, args.runs, args.workers, args.rounds)
    for sb in sandboxes.values():
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
    md = out.parent / "results.md"
    md.write_text(render(record, path.name))
    print(f"wrote {path} and {md}")


def render(record: dict, json_name: str) -> str:
    m = record["machine"]
    lines = [
        "# Sandbox benchmark results",
        "",
        f"`bench_sandboxes.py`, {record['date']}, {m['cpus']} CPUs, {record['runs']} runs per row and mode, "
        f"pool of {record['workers']} workers; load average {m['loadavg_1m_before']} before, "
        f"{m['loadavg_1m_after']} after (the machine is shared). Raw numbers: `results/{json_name}`.",
        "",
        "`trivial` = `print(1)`; `unittest` = the code task's test run (difficulty-5 reference solution, "
        "8 hidden tests). Overhead = backend / bare subprocess, measured in the same run "
        "(latency: sequential p50; throughput: pool executions/s).",
        "",
        "| backend | workload | p50 ms | p95 ms | sequential exec/s | pool exec/s | pool p50 ms | pool p95 ms "
        "| latency overhead | throughput overhead |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, per in record["results"].items():
        for wname, r in per.items():
            lines.append(
                f"| {name} | {wname} | {r['sequential_p50_ms']} | {r['sequential_p95_ms']} | {r['sequential_per_s']} "
                f"| {r['pool_per_s']} | {r['pool_p50_ms']} | {r['pool_p95_ms']} "
                f"| {r.get('latency_overhead_x', '')}x | {r.get('throughput_overhead_x', '')}x |")
    group = ", ".join(f"{name} {8 / per['unittest']['pool_per_s']:.2f} s" for name, per in record["results"].items()
                      if "unittest" in per)
    lines += ["", f"Scoring a GRPO group of 8 code completions (8 unittest runs through the pool): {group}.",
              "", NOTES]
    return "\n".join(lines) + "\n"


NOTES = """Where the time goes:
- `bare`: one interpreter start plus writing the files.
- `plain`: the supervisor interpreter (read the request, write files, fork/exec with rlimits, collect,
  report) in front of the code's own interpreter: roughly one more Python start-up.
- `bwrap`: `plain` plus bubblewrap's namespaces and mounts, run as an unprivileged uid (a few ms).
- `docker`: a fresh container per run. Measured separately on this machine: create ~15-40 ms,
  start (runc) ~110 ms, the run itself ~60 ms, wait/inspect ~10 ms, remove ~15-60 ms."""


if __name__ == "__main__":
    main()
