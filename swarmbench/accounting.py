"""Worker-CPU accounting: CPU seconds of every trainer process a method starts.

`ProcessMeter` polls a process tree (psutil) and keeps, per process (pid + start time, so a reused
pid is a new process), the largest CPU time seen (user + system, its reaped children included); the
total is their sum, sampled as a timeline so that the CPU at the moment a held-out eval met the
target can be read off (`cpu_at`). A process that ends between two polls loses at most one poll
interval of CPU; the runner takes the exact `getrusage` figure where one exists (a plain run's single
trainer child) and the Ray Tune methods count in-process (see `tune_methods`). `WorkClock` is the
in-process form, for benchmarks whose arms train in the benchmark's own process.
"""
from __future__ import annotations

import bisect
import dataclasses
import time
from typing import Any, Callable

import psutil


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


@dataclasses.dataclass
class ProcessMeter:
    root: int
    match: Callable[[list[str]], bool] = lambda cmd: True   # which descendants count (default: all)
    include_root: bool = False

    def __post_init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.cmd: dict[str, str] = {}
        self.timeline: list[tuple[float, float]] = []   # (time, total worker CPU-s)

    def poll(self, now: float) -> float:
        try:
            root = psutil.Process(self.root)
            procs = ([root] if self.include_root else []) + root.children(recursive=True)
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                cmd = p.cmdline()
                if p.pid != self.root and not self.match(cmd):
                    continue
                key = f"{p.pid}:{p.create_time():.2f}"
                self.cpu[key] = max(self.cpu.get(key, 0.0), _cpu(p))
                self.cmd.setdefault(key, " ".join(cmd)[-160:])
            except psutil.Error:
                continue
        total = self.total
        self.timeline.append((now, total))
        return total

    @property
    def total(self) -> float:
        return sum(self.cpu.values())

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return []


def cpu_at(timeline: list[tuple[float, float]], t: float, times: list[float] | None = None) -> float | None:
    """Worker CPU-s at time `t`, linear between samples (None before the first sample). `times`:
    the timeline's times, for a caller that reads many points of one timeline."""
    if not timeline:
        return None
    times = times if times is not None else [x[0] for x in timeline]
    i = bisect.bisect_left(times, t)
    if i == 0:
        return timeline[0][1]
    if i >= len(timeline):
        return timeline[-1][1]
    (t0, c0), (t1, c1) = timeline[i - 1], timeline[i]
    return c0 + (c1 - c0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)


def is_trainer(cmd: list[str]) -> bool:
    """A trainer process: `python -m trainer.entry CFG` (the plain run, the swarm's live job, its
    restarts and its backtest arms)."""
    return "trainer.entry" in cmd


class WorkClock:
    """An arm's worker-CPU in the benchmark's own process: its CPU time since the clock started
    (plus `charged`, CPU spent for the arm before, e.g. a shared warm-up), less what `measure`
    spent on the benchmark's own evaluations."""

    def __init__(self, charged: float = 0.0) -> None:
        self.c0 = time.process_time() - charged
        self.w0 = time.perf_counter()
        self.eval_cpu = 0.0

    def work(self) -> float:
        return time.process_time() - self.c0 - self.eval_cpu

    def wall(self) -> float:
        return time.perf_counter() - self.w0

    def measure(self, fn: Callable[[], Any]) -> Any:
        c = time.process_time()
        try:
            return fn()
        finally:
            self.eval_cpu += time.process_time() - c
