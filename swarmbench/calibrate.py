"""Calibration: the target and the budget of a scenario, from a healthy run of the same config.

For a scenario (at its calibration seed, run seed 0 unless set):
  1. healthy run: the scenario's config with its faults removed, stopped at the goal's threshold
     (at most `CALIB_CPU_CAP` worker CPU-s). The target is the goal's threshold when the healthy run
     reaches it; otherwise 0.9 x the best held-out level it reached (rounded down to 0.01), and a
     scenario whose healthy run never passes `MIN_LEARNABLE` is labelled `unlearnable` (left out);
  2. budget = `BUDGET_MULTIPLE` x the healthy run's worker CPU-s to the target (5: a population of
     four trials gets 1.25 healthy runs' worth each; PBT on a healthy scenario needed ~3x);
  3. plain run: the faulted config under that budget. The scenario's class: `healthy` (no fault),
     `mild` (plain training reaches the target within the budget anyway: there a method must cost no
     more than plain), `failing` (it does not).
The healthy and plain runs double as the oracle's and plain's rows at the calibration seed.

The result is cached as JSON by a content hash of what determines it: the scenario's goal (faults
included), the calibration seed and constants, and the code state of the trainer (`code_state`). A
changed scenario or trainer is recalibrated; an unchanged one is read back.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
from typing import Any, Callable

from swarmbench import machine

CALIB_VERSION = 2           # 2: calibrations record the machine's reference (swarmbench.machine)
BUDGET_MULTIPLE = 5.0
CALIB_CPU_CAP = 600.0
CALIB_WALL_CAP = 900.0
MIN_LEARNABLE = 0.3
WALL_CAP_MULTIPLE = 10.0    # a run's wall-clock cap: this x the healthy run's wall to target ...
MIN_WALL_CAP = 240.0        # ... and at least this (a hung run ends here)

# what a measurement depends on (the runner, the report and the CLI do not change a measurement)
BASELINE_DIRS = ("trainer", "harness", "kernels", "swarmbench/methods.py", "swarmbench/tune_methods.py",
                 "swarmbench/accounting.py", "swarmbench/worker.py")
SWARM_DIRS = BASELINE_DIRS + ("swarm", "agents", "skills", "memory", "sandboxes")


def code_state(root: pathlib.Path, dirs: tuple[str, ...]) -> str:
    """A hash of the source files (*.py, *.yaml, *.c, *.md) under `dirs` (folders or files) of
    `root`: what a result was measured with."""
    h = hashlib.sha256()
    files: set[pathlib.Path] = set()
    for d in dirs:
        base = root / d
        if base.is_file():
            files.add(base)
        elif base.is_dir():
            files |= {p for p in base.rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".c", ".md")
                      and "__pycache__" not in p.parts}
    for p in sorted(files):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


@dataclasses.dataclass
class Calibration:
    key: str
    scenario: str
    target: float
    healthy_cpu_to_target: float | None
    budget: float
    wall_cap: float
    cls: str                      # healthy | mild | failing | unlearnable
    seed: int
    healthy: dict[str, Any]
    plain: dict[str, Any] | None
    machine_ref_cpu_s: float | None = None   # the reference workload's CPU-s where this was measured
    sitting: str | None = None               # the sitting that measured it (machine.sitting_id)

    @property
    def label(self) -> str:
        """The sitting it names (machine.label_of)."""
        return machine.label_of({"sitting": self.sitting, "machine_ref_cpu_s": self.machine_ref_cpu_s})

    def scaled(self, f: float) -> tuple[float, float]:
        """(budget, wall cap) on a machine where the calibration's CPU-s cost `f` times as much
        (`Bench.cal_factor`): the budget is a multiple of a healthy run's CPU and the cap of its
        wall, both larger on a slower machine."""
        return round(self.budget * f, 2), round(self.wall_cap * f, 1)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def calibration_key(goal: dict[str, Any], seed: int, trainer_state: str) -> str:
    blob = json.dumps({"goal": goal, "seed": seed, "version": CALIB_VERSION, "multiple": BUDGET_MULTIPLE,
                       "cap": CALIB_CPU_CAP, "min": MIN_LEARNABLE, "trainer": trainer_state,
                       "reference": machine.REFERENCE_ID},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


RunFn = Callable[[str, dict[str, Any], int, float, float, float], dict[str, Any]]
# run(method, goal, seed, target, budget, wall_cap) -> a RunResult dict


def calibrate(name: str, goal: dict[str, Any], seed: int, trainer_state: str, cache: pathlib.Path, run: RunFn,
              has_faults: bool, machine_ref: float | None = None, sitting: str | None = None) -> tuple[Calibration, bool]:
    """The scenario's calibration and whether it came from the cache (a cached one may come from
    another machine: `Calibration.scaled` gives its budget and cap on this one)."""
    key = calibration_key(goal, seed, trainer_state)
    path = cache / f"{key}.json"
    if path.exists():
        try:
            return Calibration(**json.loads(path.read_text())), True
        except (json.JSONDecodeError, TypeError):
            pass   # a damaged cache entry is recomputed
    threshold = float(goal["target"]["threshold"])
    healthy = run("oracle", goal, seed, threshold, CALIB_CPU_CAP, CALIB_WALL_CAP)
    target, c2t = threshold, healthy.get("cpu_to_target")
    cls = None
    if not healthy.get("reached"):
        best = healthy.get("best_heldout") or 0.0
        if best < MIN_LEARNABLE:
            cls, c2t = "unlearnable", None
        else:
            target = math.floor(0.9 * best * 100) / 100
            c2t = next((c for c, v in healthy.get("curve", []) if v >= target), None)
    wall = healthy.get("wall_to_target") or healthy.get("wall_s") or 60.0
    wall_cap = max(MIN_WALL_CAP, WALL_CAP_MULTIPLE * wall)
    budget = BUDGET_MULTIPLE * c2t if c2t else 0.0
    plain = None
    if cls is None:
        if has_faults:
            plain = run("plain", goal, seed, target, budget, wall_cap)
            cls = "mild" if plain.get("reached") else "failing"
        else:
            cls = "healthy"
    cal = Calibration(key=key, scenario=name, target=target, healthy_cpu_to_target=c2t, budget=round(budget, 2),
                      wall_cap=round(wall_cap, 1), cls=cls, seed=seed, healthy=healthy, plain=plain,
                      machine_ref_cpu_s=machine_ref, sitting=sitting)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(cal.to_json(), indent=1))
    os.replace(tmp, path)
    return cal, False
