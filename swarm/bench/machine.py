"""The machine a bench runs on: its speed (a reference workload's worker CPU-s) and its cores.

Worker CPU-s measure compute only on one machine. The same trainer run (a healthy 3-digit sort
GRPO run of the suite, 300 steps) cost 16.5 CPU-s on one sitting's machine and 51 CPU-s on another
sitting's, alone on both; on one machine it cost 1.1-1.4x more with 6-12 runnable processes on
its 2 cores than alone. So a bench

- measures **the reference** at the start of every sitting (`measure`): a fixed short trainer run
  (`REFERENCE`), the least CPU-s of `REFERENCE_RUNS` runs, with every core slot held so that no
  other bench run shares the machine meanwhile. Each ledger row and each calibration records the
  reference of the sitting that measured it; a budget and a wall cap calibrated on another machine
  are scaled by the ratio of the references before a run, and the results state every row's CPU
  in this sitting's machine's CPU-s (`scale`). Ratios (C2T / oracle, CPU / plain) do not depend on
  it.
- **holds core slots** (`CoreSlots`) around every run: a method declares how many cores it keeps
  busy (`METHOD_CORES`; a population of four trials, or a swarm's backtest arms, both), and runs
  start only while their sum stays within the machine's cores, across every bench process on the
  machine (file locks in one folder), so that runs are not measured on an oversubscribed machine.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import tempfile
import time
import threading
from typing import Any, Iterator

REFERENCE_STEPS = 60
REFERENCE_RUNS = 2
# names what `measure` runs: references are compared only between sittings that ran the same one
# (it is part of every ledger key and calibration key)
REFERENCE_ID = f"addition2-sft-{REFERENCE_STEPS}-v1"

METHOD_CORES = {"plain": 1, "oracle": 1, "pbt": 2, "pb2": 2, "asha": 2, "swarm": 2}


def reference_goal() -> dict[str, Any]:
    """The reference workload: the 2-digit addition family's healthy config (SFT), REFERENCE_STEPS
    steps, one held-out eval at the end, with the target 1.0 (a held-out level it does not reach in that many steps)."""
    from swarm.bench.scenarios import FAMILIES, generate

    fam = FAMILIES["addition2"]
    g = {k: v for k, v in generate(0).items() if k not in ("scenario", "perturbations")}
    g["goal"], g["run"] = "the bench's reference workload", dict(fam.run)
    g["run"]["recipe"] = dict(g["run"]["recipe"], eval_interval=REFERENCE_STEPS)
    g["budget"] = dict(g["budget"], steps=REFERENCE_STEPS)
    return g


def measure(work: pathlib.Path, runs: int = REFERENCE_RUNS, steps: int | None = None) -> float:
    """The reference's worker CPU-s on this machine (the least of `runs` runs)."""
    from swarm.bench.methods import run_trainer, trainer_config

    g = reference_goal()
    if steps is not None:
        g["budget"]["steps"] = steps
        g["run"]["recipe"]["eval_interval"] = steps
    best = None
    for i in range(runs):
        r = run_trainer(trainer_config(g, str(work / f"ref{i}" / "runs"), 0, 1.0), work / f"ref{i}", budget=600.0,
                        wall_cap=600.0)
        if r["rc"] != 0 or r["steps"] < g["budget"]["steps"]:
            raise RuntimeError(f"the bench's reference workload failed (rc {r['rc']}, {r['steps']} steps): {r['log_tail']}")
        best = r["cpu_total"] if best is None else min(best, r["cpu_total"])
    assert best is not None and best > 0
    return float(best)


def scale(from_ref: float | None, to_ref: float | None) -> float | None:
    """The factor that turns CPU-s (or wall-s) measured where the reference cost `from_ref` into
    CPU-s where it costs `to_ref` (None where either is unknown)."""
    if not from_ref or not to_ref:
        return None
    return to_ref / from_ref


class CoreSlots:
    """`cores` slots shared by every process that opens the same folder: `hold(k)` waits until it
    holds k of them (fcntl locks on slot files, released by the OS if the holder dies)."""

    def __init__(self, cores: int | None = None, folder: str | pathlib.Path | None = None, poll_s: float = 0.5) -> None:
        self.cores = max(1, int(cores or os.cpu_count() or 1))
        self.folder = pathlib.Path(folder or pathlib.Path(tempfile.gettempdir()) / "swarm-bench-cores")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.poll_s = poll_s

    def _lock(self, name: str, stop: Any) -> int:
        fd = os.open(self.folder / name, os.O_CREAT | os.O_RDWR, 0o600)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if stop is not None and stop():
                    os.close(fd)
                    raise KeyboardInterrupt from None
                time.sleep(self.poll_s)

    @contextlib.contextmanager
    def hold(self, k: int, stop: Any = None) -> Iterator["Lease"]:
        """Hold min(k, cores) slots for the block; `stop()` true while waiting raises KeyboardInterrupt.
        One waiter at a time takes slots (it holds the `turn` lock until it has all k), so a run that
        needs every core is not starved by runs that need one. The block gets a `Lease`: its
        `release()` lets the slots go before the block ends (a run that can no longer use a core)."""
        k = max(1, min(int(k), self.cores))
        held: list[int] = []
        lease: Lease | None = None
        turn = self._lock("turn", stop)
        try:
            while True:
                for i in range(self.cores):
                    if len(held) == k:
                        break
                    fd = os.open(self.folder / f"slot-{i}", os.O_CREAT | os.O_RDWR, 0o600)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        held.append(fd)
                    except BlockingIOError:
                        os.close(fd)
                if len(held) == k:
                    break
                for fd in held:          # not enough free: let go (no one waits holding slots) and retry
                    os.close(fd)
                held = []
                if stop is not None and stop():
                    raise KeyboardInterrupt
                time.sleep(self.poll_s)
            os.close(turn)
            turn = -1
            lease = Lease(held)
            yield lease
        finally:
            if turn >= 0:
                os.close(turn)
            if lease is not None:
                lease.release()
            else:
                for fd in held:
                    os.close(fd)


class Lease:
    """The slots `CoreSlots.hold` took; `release()` lets them go (once; the block's end does too)."""

    def __init__(self, fds: list[int]) -> None:
        self._fds = list(fds)
        self._lock = threading.Lock()
        self.released_at: float | None = None

    def release(self) -> None:
        with self._lock:
            fds, self._fds = self._fds, []
            if fds and self.released_at is None:
                self.released_at = time.time()
        for fd in fds:
            os.close(fd)
