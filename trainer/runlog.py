"""The run's observable record: append-only JSONL streams and a heartbeat, readable while live.

    RUN_DIR/metrics.jsonl      one row per step (eval fields on eval steps)
    RUN_DIR/samples.jsonl      sampled rollouts: question, prompt, completion, reward, verdict
    RUN_DIR/events.jsonl       notable events: start, resume, checkpoint, non-finite loss, …
    RUN_DIR/heartbeat.json     rewritten atomically every step and while paused
    RUN_DIR/config.yaml        the resolved config (perturbations removed)

Each line is flushed on write so a reader (`read_jsonl`) sees whole rows; a torn last line from a
crash is skipped by the reader, never fatal.

Bounded on disk over days: a stream past `Rotation.max_bytes` is rolled to `metrics.000001.jsonl`
(the newest rolled part stays plain, so a reader that was part-way through it can finish it),
older parts are gzipped (`metrics.000001.jsonl.gz`) and only the newest `Rotation.keep` parts are
kept. Every reader here follows the parts: `iter_jsonl`/`read_jsonl` read the retained parts oldest
first and then the live file, `tail_jsonl` reads backwards from the end. The long-run curve is
`RUN_DIR/metrics_summary.json`, a downsampled history (`History`: at most `cap` training rows and
`cap` eval rows, every final row and each held-out record) that the writer keeps current, so a
report on a run of days reads a bounded file instead of every row (`metrics_history`).
Settings: `SWARMLAB_LOG_ROTATE_BYTES` (default 16 MiB) and `SWARMLAB_LOG_KEEP_ROTATED` (default 8)
in the trainer's environment.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import pathlib
import re
import shutil
import time
from typing import Any, Callable, Iterator

INIT_CHECKPOINT = "init"      # the checkpoint a fresh run saves before its first update (checkpoints/init.pt)

# The held-out metrics a run writes, on eval steps and in its final row: each one the rate of a
# `trainer.rollout.summarize` field over greedy rollouts on the held-out split, the same for every
# task and algorithm (`heldout_row` names them; `Trainer.evaluate` returns exactly these,
# tests/test_goal_checks.py holds the two together). A goal's target must be one of them
# (swarm/goal.py), and a backtest treats each as a rate in [0, 1] (swarm/backtest.py).
HELDOUT_METRICS: dict[str, str] = {"heldout_acc": "pass_rate", "heldout_malformed": "malformed_rate",
                                   "heldout_truncated": "truncation_rate"}


def heldout_row(summary: dict[str, float]) -> dict[str, float]:
    """The held-out metrics of a `summarize` over held-out rollouts, named as the run writes them."""
    return {name: float(summary[key]) for name, key in HELDOUT_METRICS.items()}


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # "nan"/"inf": JSON has no literal for them
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


@dataclasses.dataclass(frozen=True)
class Rotation:
    """When a stream is rolled and how many rolled parts stay (see the module docstring)."""

    max_bytes: int = 16 << 20     # roll the live file once it holds this many bytes
    keep: int = 8                 # rolled parts kept (the newest plain, older ones gzipped)

    def __post_init__(self) -> None:
        if self.max_bytes < 1024:
            raise ValueError(f"Rotation.max_bytes={self.max_bytes} must be >= 1024")
        if self.keep < 1:
            raise ValueError(f"Rotation.keep={self.keep} must be >= 1")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Rotation":
        env = os.environ if env is None else env
        vals: dict[str, int] = {}
        for field, var in (("max_bytes", "SWARMLAB_LOG_ROTATE_BYTES"), ("keep", "SWARMLAB_LOG_KEEP_ROTATED")):
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            try:
                vals[field] = int(raw)
            except ValueError:
                raise ValueError(f"{var}={raw!r} is not an integer") from None
        try:
            return cls(**vals)
        except ValueError as e:
            raise ValueError(f"log rotation from the environment: {e}") from None


def _stem(path: pathlib.Path) -> str | None:
    return path.name[: -len(".jsonl")] if path.name.endswith(".jsonl") else None


def rotated_parts(path: str | os.PathLike) -> list[pathlib.Path]:
    """The rolled parts of the stream at `path`, oldest first (a part both plain and gzipped — a
    kill while compressing it — is read plain)."""
    p = pathlib.Path(path)
    stem = _stem(p)
    if stem is None or not p.parent.is_dir():
        return []
    rx = re.compile(rf"^{re.escape(stem)}\.(\d{{6}})\.jsonl(\.gz)?$")
    by_seq: dict[int, pathlib.Path] = {}
    for q in p.parent.glob(f"{stem}.*.jsonl*"):
        m = rx.match(q.name)
        if m and (int(m[1]) not in by_seq or not m[2]):
            by_seq[int(m[1])] = q
    return [by_seq[k] for k in sorted(by_seq)]


def _seq(part: pathlib.Path) -> int:
    return int(re.search(r"\.(\d{6})\.jsonl", part.name)[1])


def _part_name(path: pathlib.Path, seq: int) -> pathlib.Path:
    return path.with_name(f"{_stem(path)}.{seq:06d}.jsonl")


def _gzip(part: pathlib.Path) -> None:
    dest = part.with_name(part.name + ".gz")
    tmp = part.with_name(f".{dest.name}.tmp{os.getpid()}")
    with open(part, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(tmp, dest)
    part.unlink()


class JsonlWriter:
    """Appends rows to a JSONL stream; with a `Rotation`, rolls it past `max_bytes` (see the module
    docstring). `on_row` sees each row as written (after it is in the file, before a roll);
    `on_rotate` runs after each roll (the run log re-writes its summary then)."""

    def __init__(self, path: pathlib.Path, rotation: Rotation | None = None,
                 on_rotate: Callable[[], None] | None = None,
                 on_row: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = path
        self.rotation = rotation
        self.on_rotate = on_rotate
        self.on_row = on_row
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", encoding="utf-8")
        self._size = self._f.tell()

    @property
    def position(self) -> tuple[int, int]:
        """(inode, byte offset) of the end of what was written: what a reader has read when it is there."""
        return os.fstat(self._f.fileno()).st_ino, self._size

    def write(self, row: dict[str, Any]) -> None:
        clean = _clean(row)
        line = json.dumps(clean, separators=(",", ":")) + "\n"
        self._f.write(line)
        self._f.flush()
        self._size += len(line.encode("utf-8"))
        if self.on_row:
            self.on_row(clean)
        if self.rotation is not None and self._size >= self.rotation.max_bytes:
            self.rotate()

    def write_lines(self, data: bytes) -> None:
        """Append whole JSONL lines as they are (rows copied from another copy of the stream: no
        `on_row`), then roll if past `max_bytes`."""
        assert not data or data.endswith(b"\n"), "write_lines takes complete lines"
        self._f.write(data.decode("utf-8"))
        self._f.flush()
        self._size += len(data)
        if self.rotation is not None and self._size >= self.rotation.max_bytes:
            self.rotate()

    def rotate(self) -> None:
        """Roll the live file to the next part; gzip the older plain parts; drop parts past `keep`."""
        assert self.rotation is not None
        self._f.close()
        before = rotated_parts(self.path)
        seq = _seq(before[-1]) + 1 if before else 1
        os.replace(self.path, _part_name(self.path, seq))
        self._f = open(self.path, "a", encoding="utf-8")
        self._size = 0
        for q in before:
            if q.suffix != ".gz":
                _gzip(q)
        for q in rotated_parts(self.path)[: -self.rotation.keep]:
            q.unlink(missing_ok=True)
        if self.on_rotate:
            self.on_rotate()

    def close(self) -> None:
        self._f.close()


def _open_part(q: pathlib.Path):
    if q.suffix == ".gz":
        return gzip.open(q, "rt", encoding="utf-8")
    try:
        return open(q, encoding="utf-8")
    except FileNotFoundError:   # compressed since it was listed
        return gzip.open(q.with_name(q.name + ".gz"), "rt", encoding="utf-8")


def read_jsonl(path: str | os.PathLike, start: int = 0) -> list[dict[str, Any]]:
    """All complete rows from line `start` on (the retained rolled parts, then the live file); a
    torn or corrupt line is skipped. Reads everything retained: for the newest rows use
    `tail_jsonl`, for a long-run curve `metrics_history`."""
    return list(iter_jsonl(path, start))


def iter_jsonl(path: str | os.PathLike, start: int = 0) -> Iterator[dict[str, Any]]:
    p = pathlib.Path(path)
    i = 0
    for q in [*rotated_parts(p), p]:
        try:
            f = _open_part(q)
        except FileNotFoundError:
            continue
        with f:
            for line in f:
                if i < start or not line.endswith("\n"):
                    i += 1
                    continue
                i += 1
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue


def _tail_lines(f: Any, n: int, block: int = 1 << 16) -> list[bytes]:
    """The last `n` complete lines of a seekable binary file, read backwards in blocks."""
    f.seek(0, os.SEEK_END)
    pos = f.tell()
    buf = b""
    while pos > 0 and buf.count(b"\n") <= n:
        step = min(block, pos)
        pos -= step
        f.seek(pos)
        buf = f.read(step) + buf
    lines = buf.split(b"\n")[:-1]      # what follows the last newline is a torn line (or nothing)
    if pos > 0:
        lines = lines[1:]               # the first may have started before the block
    return lines[-n:] if n else []


def tail_jsonl(path: str | os.PathLike, n: int) -> list[dict[str, Any]]:
    """The newest `n` complete rows of a stream (oldest first), reading backwards from its end and
    into the newest rolled part when the live file holds fewer: cost O(n), not O(history)."""
    p = pathlib.Path(path)
    out: list[dict[str, Any]] = []
    for q in [p, *reversed(rotated_parts(p))]:
        if len(out) >= n:
            break
        try:
            if q.suffix == ".gz":
                with gzip.open(q, "rb") as g:
                    lines = g.read().split(b"\n")[:-1][-(n - len(out)):]
            else:
                with open(q, "rb") as f:
                    lines = _tail_lines(f, n - len(out))
        except FileNotFoundError:
            continue
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
        out = rows + out
    return out[-n:] if n else []


def _is_eval(r: dict[str, Any]) -> bool:
    return any(k.startswith("heldout") for k in r)


class History:
    """A downsampled history of a metrics stream, bounded whatever the run's length: every
    `stride`-th training row (the stride doubles whenever more than `cap` are held, so the points
    stay spread over the whole run), likewise for eval rows, each row that set a new high or low
    of a held-out metric (the first time a target was met is one of them; at most `cap`), and the
    newest final rows. `rows()` gives them in the order they were written."""

    def __init__(self, cap: int = 1000) -> None:
        if cap < 2:
            raise ValueError(f"History cap={cap} must be >= 2")
        self.cap = cap
        self.n = 0
        self.kinds: dict[str, dict[str, Any]] = {k: {"count": 0, "stride": 1, "rows": []} for k in ("train", "eval")}
        self.records: list[list[Any]] = []
        self.best: dict[str, list[float]] = {}
        self.finals: list[list[Any]] = []
        self.last: list[Any] | None = None          # the newest row, so a curve ends where the run is
        self.position: list[int] = [0, 0]          # (inode, offset) of the live file up to which rows were added

    def add(self, row: dict[str, Any]) -> None:
        self.n += 1
        n = self.n
        self.last = [n, row]
        if row.get("final"):
            self.finals = (self.finals + [[n, row]])[-20:]
            return
        kind = "eval" if _is_eval(row) else "train"
        if kind == "eval":
            record = False
            for k, v in row.items():
                if k.startswith("heldout") and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    lo, hi = self.best.get(k, (math.inf, -math.inf))
                    if v < lo or v > hi:
                        record = True
                        self.best[k] = [min(lo, v), max(hi, v)]
            if record and len(self.records) < self.cap:
                self.records.append([n, row])
        k = self.kinds[kind]
        k["count"] += 1
        if (k["count"] - 1) % k["stride"] == 0:
            k["rows"].append([k["count"], n, row])
            if len(k["rows"]) > self.cap:
                k["stride"] *= 2
                k["rows"] = [x for x in k["rows"] if (x[0] - 1) % k["stride"] == 0]

    def rows(self) -> list[dict[str, Any]]:
        by_n: dict[int, dict[str, Any]] = {}
        for k in self.kinds.values():
            by_n.update({n: r for _, n, r in k["rows"]})
        by_n.update({n: r for n, r in self.records})
        by_n.update({n: r for n, r in self.finals})
        if self.last:
            by_n[self.last[0]] = self.last[1]
        return [by_n[n] for n in sorted(by_n)]

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "cap": self.cap, "n": self.n, "kinds": self.kinds, "records": self.records,
                "best": self.best, "finals": self.finals, "last": self.last, "position": self.position}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "History":
        h = cls(int(d.get("cap", 1000)))
        h.n, h.kinds, h.records = int(d["n"]), d["kinds"], d["records"]
        h.best, h.finals, h.position = d.get("best", {}), d.get("finals", []), list(d.get("position", [0, 0]))
        h.last = d.get("last")
        return h


SUMMARY = "metrics_summary.json"


def _load_history(run_dir: pathlib.Path) -> History | None:
    try:
        return History.from_json(json.loads((run_dir / SUMMARY).read_text()))
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _rows_after(path: pathlib.Path, position: list[int] | tuple[int, int] | None) -> Iterator[dict[str, Any]]:
    """Rows of the stream written after `position` (inode, offset of the live file as the writer
    saw it): the rest of that file — still live, or the newest rolled part — then what follows.
    Unknown position: every retained row."""
    parts = [*rotated_parts(path), path]
    start = None
    if position and position[0]:
        for i, q in enumerate(parts):
            try:
                if q.suffix != ".gz" and q.stat().st_ino == position[0]:
                    start = i
                    break
            except FileNotFoundError:
                continue
    if start is None:
        yield from iter_jsonl(path)
        return
    for i, q in enumerate(parts[start:]):
        try:
            f = _open_part(q) if q.suffix == ".gz" else open(q, "rb")
        except FileNotFoundError:
            continue
        with f:
            if i == 0:
                f.seek(int(position[1]))
            for line in f:
                if isinstance(line, bytes):
                    if not line.endswith(b"\n"):
                        continue
                elif not line.endswith("\n"):
                    continue
                try:
                    yield json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    continue


def metrics_history(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The run's metrics for a long-run curve or a report, bounded: the downsampled summary the
    writer keeps, plus every row written after it (at most `RunLog.SUMMARY_EVERY` rows, or the
    live file when there is no summary)."""
    p = pathlib.Path(run_dir)
    h = _load_history(p)
    if h is None:
        return read_jsonl(p / "metrics.jsonl")
    return h.rows() + list(_rows_after(p / "metrics.jsonl", h.position))


def atomic_write_text(path: pathlib.Path, text: str, durable: bool = True) -> None:
    """Write via a temp file and rename, so readers never see a partial file. `durable=False`
    skips the fsync (the heartbeat is rewritten every step; losing the last one in a power cut
    is harmless, paying an fsync per step is not)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


class RunLog:
    SUMMARY_EVERY = 250     # metrics rows between re-writes of metrics_summary.json

    def __init__(self, run_dir: pathlib.Path, rotation: Rotation | None = None) -> None:
        self.dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        rotation = rotation or Rotation.from_env()
        # the summary resumes from its file plus what an earlier process wrote after it
        self.history = _load_history(run_dir) or History()
        for row in _rows_after(run_dir / "metrics.jsonl", self.history.position if self.history.n else None):
            self.history.add(row)
        self._unsaved = 0
        self._since_step: int | None = None   # the step of this process's first heartbeat
        self.metrics = JsonlWriter(run_dir / "metrics.jsonl", rotation, on_rotate=self.write_summary, on_row=self._metric)
        self.samples = JsonlWriter(run_dir / "samples.jsonl", rotation)
        self.events = JsonlWriter(run_dir / "events.jsonl", rotation)

    def _metric(self, row: dict[str, Any]) -> None:
        """Each metrics row, once in the file: folded into the downsampled summary."""
        self.history.add(row)
        self._unsaved += 1
        if self._unsaved >= self.SUMMARY_EVERY or row.get("final"):
            self.write_summary()

    def write_summary(self) -> None:
        self.history.position = list(self.metrics.position)
        atomic_write_text(self.dir / SUMMARY, json.dumps(self.history.to_json(), separators=(",", ":")), durable=False)
        self._unsaved = 0

    def event(self, kind: str, step: int, **data: Any) -> None:
        self.events.write({"time": time.time(), "step": step, "event": kind, **data})

    def heartbeat(self, step: int, state: str, **data: Any) -> None:
        """The process's liveness: its step and state, its CPU so far (`cpu_s`) and the step it
        started at (`since_step`: its CPU per step is cpu_s / (step - since_step))."""
        if self._since_step is None:
            self._since_step = step
        row = {"time": time.time(), "pid": os.getpid(), "step": step, "state": state,
               "cpu_s": process_cpu_seconds(), "since_step": self._since_step, **data}
        atomic_write_text(self.dir / "heartbeat.json", json.dumps(_clean(row)), durable=False)

    def close(self) -> None:
        self.write_summary()
        for w in (self.metrics, self.samples, self.events):
            w.close()


def process_cpu_seconds() -> float:
    """CPU seconds of this process (all threads) and its finished children: the worker-CPU meter."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def read_heartbeat(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    p = pathlib.Path(run_dir) / "heartbeat.json"
    try:
        return json.loads(p.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
