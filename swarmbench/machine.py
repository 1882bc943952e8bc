"""The machine a bench runs on: which sitting measured a row, how fast its machine was, and its cores.

Worker CPU-s measure compute only on one machine. The same trainer run (a healthy 3-digit sort
GRPO run of the suite, 300 steps) cost 16.5 CPU-s on one sitting's machine and 51 CPU-s on another
sitting's, alone on both; on one machine it cost 1.1-1.4x more with 6-12 runnable processes on
its 2 cores than alone. So a bench

- labels every ledger row and calibration with its **sitting** (`sitting_id`: the machine's boot,
  so two bench processes on one machine share one), and states every row's CPU in one sitting's
  machine's CPU-s (`fit_speeds`). The factors between sittings are fitted to the bench's own
  repeated runs: a plain or oracle run (one trainer process at a fixed seed) of the same scenario,
  seed and code measured in two sittings is the same work twice, so the ratio of its CPU-s is the
  ratio of the machines' speeds. The **reference workload** (`measure`: a fixed short trainer run,
  `REFERENCE`, the least CPU-s of `REFERENCE_RUNS` runs after a discarded warm-up, with every core
  slot held, once per sitting: `shared_reference`) links only sittings that no repeated run links:
  it is mostly the trainer's start-up, and on one machine two measurements of it differed 1.6x
  while repeated suite runs agreed within 10%. Ratios within a sitting (C2T / oracle, CPU / plain
  measured side by side) do not depend on any of it.
- **holds core slots** (`CoreSlots`) around every run: a method declares how many cores it keeps
  busy (`METHOD_CORES`; a population of four trials, or a swarm's backtest arms, both), and runs
  start only while their sum stays within the machine's cores, across every bench process on the
  machine (file locks in one folder), so that runs are not measured on an oversubscribed machine.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import math
import os
import pathlib
import platform
import statistics
import tempfile
import time
import threading
from typing import Any, Iterable, Iterator

REFERENCE_STEPS = 60
REFERENCE_RUNS = 2
# names what `measure` runs: references are compared only between sittings that ran the same one
# (it is part of every ledger key and calibration key)
REFERENCE_ID = f"addition2-sft-{REFERENCE_STEPS}-v1"

METHOD_CORES = {"plain": 1, "oracle": 1, "pbt": 2, "pb2": 2, "asha": 2, "swarm": 2}
# one trainer process at a fixed seed: the same work wherever it runs (the anchors of `fit_speeds`)
DETERMINISTIC = ("plain", "oracle")
REF_WEIGHT = 0.05   # a reference ratio's weight in the fit, against 1 for each repeated run


def reference_goal() -> dict[str, Any]:
    """The reference workload: the 2-digit addition family's healthy config (SFT), REFERENCE_STEPS
    steps, one held-out eval at the end, with the target 1.0 (a held-out level it does not reach in that many steps)."""
    from swarmbench.scenarios import FAMILIES, generate

    fam = FAMILIES["addition2"]
    g = {k: v for k, v in generate(0).items() if k not in ("scenario", "perturbations")}
    g["goal"], g["run"] = "the bench's reference workload", dict(fam.run)
    g["run"]["recipe"] = dict(g["run"]["recipe"], eval_interval=REFERENCE_STEPS)
    g["budget"] = dict(g["budget"], steps=REFERENCE_STEPS)
    return g


def measure(work: pathlib.Path, runs: int = REFERENCE_RUNS, steps: int | None = None) -> float:
    """The reference's worker CPU-s on this machine (the least of `runs` runs)."""
    from swarmbench.methods import run_trainer, trainer_config

    g = reference_goal()
    if steps is not None:
        g["budget"]["steps"] = steps
        g["run"]["recipe"]["eval_interval"] = steps
    best = None
    for i in range(runs + 1):      # run 0 warms the caches (imports, the page cache) and does not count
        r = run_trainer(trainer_config(g, str(work / f"ref{i}" / "runs"), 0, 1.0), work / f"ref{i}", budget=600.0,
                        wall_cap=600.0)
        if r["rc"] != 0 or r["steps"] < g["budget"]["steps"]:
            raise RuntimeError(f"the bench's reference workload failed (rc {r['rc']}, {r['steps']} steps): {r['log_tail']}")
        if i > 0:
            best = r["cpu_total"] if best is None else min(best, r["cpu_total"])
    assert best is not None and best > 0
    return float(best)


def sitting_id() -> str:
    """This machine's sitting: its boot (the bench processes of one boot run on one machine)."""
    try:
        return "boot:" + pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip().split("-")[0]
    except OSError:
        return f"host:{platform.node()}:{os.getpid()}"   # no boot id: each process is its own sitting


def label_of(row: dict[str, Any]) -> str:
    """The sitting a ledger row or a calibration names: its own label, or for one written before rows
    had one, the reference its bench process measured (`ref:2.7035`)."""
    if row.get("sitting"):
        return str(row["sitting"])
    ref = row.get("machine_ref_cpu_s")
    return f"ref:{float(ref):.6g}" if ref else "unlabelled"


def _legacy(label: str) -> bool:
    return label.startswith("ref:") or label == "unlabelled"


def _reference_path(folder: pathlib.Path, sitting: str) -> pathlib.Path:
    return folder / f"reference-{sitting.replace(':', '_').replace('/', '_')}-{REFERENCE_ID}.json"


def cached_reference(folder: str | pathlib.Path, sitting: str) -> float | None:
    """The sitting's reference workload CPU-s if a bench process of it measured it already."""
    try:
        return float(json.loads(_reference_path(pathlib.Path(folder), sitting).read_text())["cpu_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def shared_reference(folder: str | pathlib.Path, sitting: str, measure_fn: Any) -> float:
    """The sitting's reference workload CPU-s: measured once (`measure_fn()`) and read by every later
    bench process of the sitting that uses the same core-slot folder."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = _reference_path(folder, sitting)
    with open(folder / "reference.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        known = cached_reference(folder, sitting)
        if known is not None:
            return known
        value = float(measure_fn())
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"cpu_s": value, "sitting": sitting, "reference": REFERENCE_ID}))
        os.replace(tmp, path)
        return value


@dataclasses.dataclass
class Sitting:
    name: str
    labels: list[str]
    rows: int = 0
    first: str | None = None            # when its first and last runs finished
    last: str | None = None
    ref_cpu_s: float | None = None      # the median reference its bench processes measured
    factor: float = 1.0                 # its CPU-s x factor = the base sitting's CPU-s
    how: str = "as measured"            # base | repeated runs | reference workload | as measured
    anchors: int = 0                    # runs repeated between it and another sitting
    spread: float | None = None         # the median misfit of its repeated runs (0.05: 5%)


@dataclasses.dataclass
class Speeds:
    """Every sitting's speed relative to `base` (`fit_speeds`)."""
    base: str
    sittings: list[Sitting]
    segments: dict[str, list[tuple[float, float, str]]]   # label -> its stretches (start, end, sitting)

    def sitting_of(self, label: str, when: float | None = None) -> str | None:
        """The sitting of a label's row finished at `when` (a legacy label can span sittings: the
        stretch nearest in time)."""
        segs = self.segments.get(label) or []
        return _nearest(segs, when)[2] if segs else None

    def sitting_of_row(self, row: dict[str, Any]) -> str | None:
        return self.sitting_of(label_of(row), _row_time(row))

    def _factor(self, name: str | None) -> float:
        return next((s.factor for s in self.sittings if s.name == name), 1.0)

    def ratio(self, from_label: str, to_label: str | None = None, when: float | None = None) -> float:
        """What CPU-s measured in `from_label`'s sitting cost in `to_label`'s (default: the base's)."""
        f = self._factor(self.sitting_of(from_label, when))
        return f / self._factor(self.sitting_of(to_label)) if to_label is not None else f

    def of_row(self, row: dict[str, Any], to_label: str | None = None) -> float:
        return self.ratio(label_of(row), to_label, _row_time(row))

    def table(self) -> list[dict[str, Any]]:
        return [dataclasses.asdict(s) for s in self.sittings]


GAP_S = 300.0   # a legacy label's runs more than this apart (nothing of it running between) may be two sittings


def _nearest(segs: list, when: float | None):
    """Of a label's stretches (start, end, ...), the one a row finished at `when` belongs to: the
    one it falls in (GAP_S either side), else the nearest in time; the last without a time."""
    if when is None or len(segs) == 1:
        return segs[-1]
    return min(segs, key=lambda g: 0.0 if g[0] - GAP_S <= when <= g[1] + GAP_S else min(abs(when - g[0]), abs(when - g[1])))


def _when(t: str) -> float:
    return dt.datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()


def _row_time(r: dict[str, Any]) -> float | None:
    try:
        return _when(r["finished"]) if r.get("finished") else None
    except (ValueError, TypeError):
        return None


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def fit_speeds(rows: Iterable[dict[str, Any]], here: str, here_ref: float | None = None,
               extra: dict[str, float | None] | None = None, base: str | None = None) -> Speeds:
    """Group the rows into sittings and fit each sitting's speed.

    Sittings: the rows of one label (`label_of`) ran in one sitting. A label written before rows
    had a sitting (the reference each bench process measured, or none) is cut where none of its
    runs was going for more than GAP_S, and its stretches join the sitting of any run they overlap
    in time: a ledger file is appended on one machine at a time. `here` (with its reference
    `here_ref`) and the labels of `extra` (label -> reference) are sittings too, rows or not.

    Speeds: with x_s the log of sitting s's factor, every (scenario, method, seed, code state) of
    a DETERMINISTIC method measured uncapped, with equal steps, in two sittings a and b gives
    x_a - x_b = log(cpu_b / cpu_a) (each sitting's median); every two sittings with a reference
    give x_a - x_b = log(ref_b / ref_a) at weight REF_WEIGHT; x_base = 0. The weighted least-squares
    solution is the factors: repeated runs decide wherever they link sittings, the reference only
    where none does. `base` (a label; default: the sitting of `here` if it has rows, else the one
    with most rows) is the sitting whose CPU-s the factors give."""
    import numpy as np

    rows = [r for r in rows if isinstance(r, dict)]
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        end = _row_time(r)
        if end is not None and not r.get("from_calibration"):
            spans.setdefault(label_of(r), []).append((end - float(r.get("wall_s") or 0.0), end))
    segments: dict[str, list[list]] = {}         # label -> [start, end, name, refs, rows]
    for label in {*(label_of(r) for r in rows), here, *(extra or {})}:
        cuts: list[list] = []
        for st, en in sorted(spans.get(label, [])):
            if cuts and (not _legacy(label) or st - cuts[-1][1] <= GAP_S):
                cuts[-1][1] = max(cuts[-1][1], en)
            else:
                cuts.append([st, en])
        segments[label] = [[st, en, label if len(cuts) == 1 else f"{label}@{_stamp(st)[11:]}", [], 0]
                           for st, en in cuts] or [[None, None, label, [], 0]]

    def seg(label: str, when: float | None) -> list:
        return _nearest(segments[label], when)

    for label, ref in [(here, here_ref), *((extra or {}).items())]:
        if ref:
            segments[label][-1][3].append(float(ref))
    row_seg = []
    for r in rows:
        g = seg(label_of(r), _row_time(r))
        g[4] += 1
        if r.get("machine_ref_cpu_s"):
            g[3].append(float(r["machine_ref_cpu_s"]))
        row_seg.append(g[2])
    parent = {g[2]: g[2] for segs in segments.values() for g in segs}

    def find(a: str) -> str:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    timed = sorted((g for segs in segments.values() for g in segs if g[0] is not None), key=lambda g: g[0])
    for i, ga in enumerate(timed):
        for gb in timed[i + 1:]:
            if gb[0] >= ga[1]:
                break
            ra, rb = find(ga[2]), find(gb[2])
            if ra != rb and (_legacy(ra) or _legacy(rb)):     # two boots never overlap
                if _legacy(ra):
                    ra, rb = rb, ra
                parent[rb] = ra
    groups: dict[str, list[list]] = {}
    for segs in segments.values():
        for g in segs:
            groups.setdefault(find(g[2]), []).append(g)
    sittings = []
    for root, gs in groups.items():
        timed_gs = [g for g in gs if g[0] is not None]
        all_refs = [v for g in gs for v in g[3]]
        sittings.append(Sitting(name=root, labels=sorted(g[2] for g in gs), rows=sum(g[4] for g in gs),
                                first=_stamp(min(g[0] for g in timed_gs)) if timed_gs else None,
                                last=_stamp(max(g[1] for g in timed_gs)) if timed_gs else None,
                                ref_cpu_s=statistics.median(all_refs) if all_refs else None))
    sittings.sort(key=lambda s: (s.first is None, s.first or "", s.name))
    idx = {s.name: i for i, s in enumerate(sittings)}
    if base is None:
        here_s = sittings[idx[find(seg(here, None)[2])]]
        base = here_s.name if here_s.rows else max(sittings, key=lambda s: s.rows).name
    else:
        base = find(seg(base, None)[2]) if base in segments else base

    per_key: dict[str, dict[str, list[float]]] = {}
    steps: dict[str, set] = {}
    for r, g in zip(rows, row_seg):
        if r.get("method") not in DETERMINISTIC or r.get("capped") or not isinstance(r.get("cpu_total"), (int, float)) \
                or r["cpu_total"] <= 0:
            continue
        key = "|".join(str(r.get(k)) for k in ("scenario_hash", "method", "seed", "code_state"))
        per_key.setdefault(key, {}).setdefault(find(g), []).append(float(r["cpu_total"]))
        steps.setdefault(key, set()).add(r.get("steps"))
    anchors: list[tuple[int, int, float]] = []
    for key, by in per_key.items():
        if len(by) < 2 or len(steps[key]) != 1:
            continue
        names = sorted(by)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                anchors.append((idx[a], idx[b], math.log(statistics.median(by[b]) / statistics.median(by[a]))))
    n = len(sittings)
    eqs: list[tuple[dict[int, float], float, float]] = [({a: 1.0, b: -1.0}, y, 1.0) for a, b, y in anchors]
    with_ref = [i for i, s in enumerate(sittings) if s.ref_cpu_s]
    for i, a in enumerate(with_ref):
        for b in with_ref[i + 1:]:
            eqs.append(({a: 1.0, b: -1.0}, math.log(sittings[b].ref_cpu_s / sittings[a].ref_cpu_s), REF_WEIGHT))
    eqs += [({i: 1.0}, 0.0, 1e-8) for i in range(n)] + [({idx[base]: 1.0}, 0.0, 1e4)]
    A = np.zeros((len(eqs), n))
    y = np.zeros(len(eqs))
    for k, (coef, val, w) in enumerate(eqs):
        for i, c in coef.items():
            A[k, i] = c * math.sqrt(w)
        y[k] = val * math.sqrt(w)
    x = np.linalg.lstsq(A, y, rcond=None)[0]
    linked, frontier = {idx[base]}, [idx[base]]
    while frontier:
        i = frontier.pop()
        for a, b, _ in anchors:
            for u, v in ((a, b), (b, a)):
                if u == i and v not in linked:
                    linked.add(v)
                    frontier.append(v)
    for i, s in enumerate(sittings):
        s.factor = round(math.exp(x[i]), 4)
        mis = [abs(yv - (x[a] - x[b])) for a, b, yv in anchors if i in (a, b)]
        s.anchors = len(mis)
        s.spread = round(math.exp(statistics.median(mis)) - 1, 3) if mis else None
        s.how = ("base" if s.name == base else "repeated runs" if i in linked
                 else "reference workload" if s.ref_cpu_s and any(sittings[j].ref_cpu_s for j in linked) else "as measured")
    out_segments = {label: [(g[0] or 0.0, g[1] or 0.0, find(g[2])) for g in segs] for label, segs in segments.items()}
    return Speeds(base=base, sittings=sittings, segments=out_segments)


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
