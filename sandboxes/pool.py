"""Run many sandbox executions concurrently and report throughput.

A GRPO step scores a whole group of completions at once; each run is a subprocess or a container,
so threads are enough to overlap them (the GIL is released while we wait on them). The pool keeps
the order of the requests and measures, per batch, executions per second and p50/p95 latency.

    from sandboxes import SandboxPool, make_sandbox
    with SandboxPool(make_sandbox("local"), workers=4) as pool:
        results = pool.map([pool.sandbox.python_request(code) for code in programs])
        pool.last_stats.throughput          # executions per second for that batch
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from typing import Iterable

from sandboxes.base import ExecRequest, ExecResult, Sandbox

log = logging.getLogger(__name__)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty list."""
    assert values, "percentile of an empty list"
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclasses.dataclass(frozen=True)
class PoolStats:
    executions: int
    workers: int
    seconds: float          # wall time of the batch
    throughput: float       # executions per second over the batch
    latency_p50: float      # seconds per execution, as seen by the caller
    latency_p95: float
    reasons: dict[str, int]  # StopReason value -> count
    latencies: tuple[float, ...] = dataclasses.field(default=(), repr=False)  # per run, in request order

    def line(self) -> str:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(self.reasons.items()))
        return (f"{self.executions} runs on {self.workers} workers in {self.seconds:.2f}s: "
                f"{self.throughput:.1f}/s, p50 {self.latency_p50 * 1e3:.0f} ms, "
                f"p95 {self.latency_p95 * 1e3:.0f} ms ({reasons})")


class SandboxPool:
    """A thread pool in front of one sandbox. `workers` defaults to the CPU count."""

    def __init__(self, sandbox: Sandbox, workers: int | None = None) -> None:
        if not isinstance(sandbox, Sandbox):
            raise ValueError(f"sandbox={sandbox!r} must be a sandboxes.Sandbox")
        workers = workers if workers is not None else (os.cpu_count() or 1)
        if workers < 1:
            raise ValueError(f"workers={workers} must be >= 1")
        self.sandbox = sandbox
        self.workers = workers
        self._executor = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="sandbox")
        self._lock = threading.Lock()
        self.last_stats: PoolStats | None = None
        self.total_executions = 0

    def _timed(self, request: ExecRequest) -> tuple[ExecResult, float]:
        t0 = time.monotonic()
        res = self.sandbox.execute(request)
        return res, time.monotonic() - t0

    def submit(self, request: ExecRequest) -> concurrent.futures.Future:
        """Schedule one run; the future's result is an `ExecResult` (not counted in `last_stats`)."""
        return self._executor.submit(self.sandbox.execute, request)

    def map(self, requests: Iterable[ExecRequest]) -> list[ExecResult]:
        """Run all `requests` concurrently; results in the same order. Sets `last_stats`."""
        requests = list(requests)
        t0 = time.monotonic()
        timed = list(self._executor.map(self._timed, requests))
        elapsed = time.monotonic() - t0
        results = [r for r, _ in timed]
        if requests:
            lat = [s for _, s in timed]
            stats = PoolStats(
                executions=len(results), workers=self.workers, seconds=elapsed,
                throughput=len(results) / elapsed if elapsed > 0 else float("inf"),
                latency_p50=percentile(lat, 50), latency_p95=percentile(lat, 95),
                reasons=dict(collections.Counter(r.reason.value for r in results)),
                latencies=tuple(lat),
            )
            with self._lock:
                self.last_stats = stats
                self.total_executions += len(results)
            log.info("sandbox pool: %s", stats.line())
        return results

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
