"""Evidence: what the operators see of a run, built only from the files the run writes.

    ev = collect(run_dir, job_status="RUNNING")

Metrics of the current segment (after a resume or rollback the step counter repeats; only the
newest segment's rows are kept, so a window never mixes timelines), the held-out eval history,
recent samples (untrusted trajectory text), events, command acknowledgements, heartbeat age and
the job's status. Perturbation settings are never in any of these files, so never in evidence.
"""
from __future__ import annotations

import gzip
import json
import math
import pathlib
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from trainer.runlog import read_heartbeat, rotated_parts


def as_number(v: Any) -> float | None:
    """A metric value as a float: numbers, and the strings "nan"/"inf"/"-inf" the run log writes
    for non-finite values (JSON has no literal for them); anything else (bools included) → None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return None


class Evidence(BaseModel):
    run_dir: str
    job_status: str = "UNKNOWN"          # RUNNING | SUCCEEDED | FAILED | STOPPED | PENDING | UNKNOWN
    step: int = 0
    metrics: list[dict[str, Any]] = Field(default_factory=list)   # newest last, current segment only
    evals: list[dict[str, Any]] = Field(default_factory=list)     # rows with the target metric
    samples: list[dict[str, Any]] = Field(default_factory=list)   # newest last; untrusted text
    questions: list[dict[str, Any]] = Field(default_factory=list) # step, segment, question, completion of more samples; newest last
    events: list[dict[str, Any]] = Field(default_factory=list)
    acks: list[dict[str, Any]] = Field(default_factory=list)
    heartbeat_age_s: float | None = None
    heartbeat_state: str | None = None
    harness: dict[str, Any] | None = None                         # the harness the run last stored/was given
    recipe: dict[str, Any] | None = None

    def series(self, key: str) -> list[float]:
        return [x for x in (as_number(r.get(key)) for r in self.metrics) if x is not None]

    def last(self, key: str) -> float | None:
        s = self.series(key)
        return s[-1] if s else None

    def latest_eval(self, metric: str) -> float | None:
        for r in reversed(self.evals):
            v = r.get(metric)
            if isinstance(v, (int, float)) and math.isfinite(v):
                return float(v)
        return None


Row = dict[str, Any]


class Tail:
    """Incremental reader of an append-only JSONL stream: each call parses only the bytes appended
    since the last one (a torn last line waits for its newline), so observing a long run costs
    per tick what the run wrote since the previous tick, not its whole history. Bytes are read in
    `chunk` pieces and only the newest `keep` rows (at most twice that between trims) stay in
    memory: a run of days appends millions. `on_row` sees every row once, in order, as it is
    parsed; `on_reset` is called when reading starts over (a replaced or truncated file), so an
    index built from the rows can start over too.

    It follows the stream's rotation (trainer/runlog.py): when the live file was rolled, the rest
    of the rolled part is read before the new live file, so nothing is skipped or read twice; a
    reader that starts (or starts over) on a rolled stream first reads the newest rolled part, so
    a controller resumed after a roll still sees the recent history."""

    def __init__(self, keep: int = 5000, chunk: int = 1 << 22) -> None:
        self.keep, self.chunk = keep, chunk
        self.files: dict[str, tuple[int, int, list[Row]]] = {}  # path -> (inode, offset, newest rows)

    def rows(self, path: pathlib.Path, on_row: Callable[[Row], None] | None = None,
             on_reset: Callable[[], None] | None = None) -> list[Row]:
        key = str(path)
        try:
            st = path.stat()
        except FileNotFoundError:
            if self.files.pop(key, None) is not None and on_reset:
                on_reset()
            return []
        state = self.files.get(key)
        rows: list[Row]
        if state is not None and state[0] != st.st_ino and (old := self._rolled(path, state[0])) is not None:
            _, off, rows = state      # rolled since the last call: finish the old file, then the new one
            with open(old, "rb") as f:
                self._read(f, off, rows, on_row)
            state = (st.st_ino, 0, rows)
        elif state is None or state[0] != st.st_ino or st.st_size < state[1]:   # new, replaced or truncated
            if on_reset:
                on_reset()
            rows = []
            parts = rotated_parts(path)
            if parts:       # the newest rolled part first: the history just before the live file
                try:
                    with (gzip.open(parts[-1], "rb") if parts[-1].suffix == ".gz" else open(parts[-1], "rb")) as f:
                        self._read(f, 0, rows, on_row)
                except FileNotFoundError:
                    pass
            state = (st.st_ino, 0, rows)
        ino, off, rows = state
        if st.st_size > off:
            with open(path, "rb") as f:
                off = self._read(f, off, rows, on_row)
        self.files[key] = (ino, off, rows)
        return rows

    @staticmethod
    def _rolled(path: pathlib.Path, ino: int) -> pathlib.Path | None:
        """The rolled part that was the live file with inode `ino` (still plain), if any."""
        for q in reversed(rotated_parts(path)):
            if q.suffix == ".gz":
                continue
            try:
                if q.stat().st_ino == ino:
                    return q
            except FileNotFoundError:
                continue
        return None

    def _read(self, f: Any, off: int, rows: list[Row], on_row: Callable[[Row], None] | None) -> int:
        """Parse whole lines from byte `off` to the end into `rows`; returns the offset reached."""
        f.seek(off)
        buf = b""
        while chunk := f.read(self.chunk):
            buf += chunk
            end = buf.rfind(b"\n") + 1
            for line in buf[:end].splitlines():
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    continue
                rows.append(row)
                if on_row:
                    on_row(row)
            off += end
            buf = buf[end:]
            if len(rows) > 2 * self.keep:
                del rows[: -self.keep]
        return off


_Tail = Tail


_TAIL = _Tail()


def is_eval_row(r: dict[str, Any]) -> bool:
    """A metrics row that carries held-out results (a periodic or final evaluation)."""
    return any(k.startswith("heldout") for k in r)


class _SegmentIndex:
    """The current segment's rows and the eval rows of one metrics file, fed every row once as the
    tail parses it (a scan of the whole history per tick cost O(steps)); the newest `keep` of each
    (at most twice that between trims)."""

    def __init__(self, keep: int = 5000) -> None:
        self.keep = keep
        self.reset()

    def reset(self) -> None:
        self.seg, self.cur, self.evals = 0, [], []

    def add(self, r: Row) -> None:
        rs = r.get("segment", 0)
        if rs > self.seg:
            self.seg, self.cur = rs, []
        if rs == self.seg and not r.get("final"):
            self.cur.append(r)
            if len(self.cur) > 2 * self.keep:
                del self.cur[: -self.keep]
        if is_eval_row(r):
            self.evals.append(r)
            if len(self.evals) > 2 * self.keep:
                del self.evals[: -self.keep]


_INDEX: dict[str, _SegmentIndex] = {}


def collect(run_dir: str | pathlib.Path, job_status: str = "UNKNOWN", window: int = 200,
            n_samples: int = 32, harness: dict | None = None, recipe: dict | None = None,
            n_questions: int = 400) -> Evidence:
    p = pathlib.Path(run_dir)
    idx = _INDEX.setdefault(str(p / "metrics.jsonl"), _SegmentIndex())
    _TAIL.rows(p / "metrics.jsonl", on_row=idx.add, on_reset=idx.reset)
    cur, evals = idx.cur, idx.evals
    sampled = _TAIL.rows(p / "samples.jsonl")
    samples = sampled[-n_samples:]
    # only the questions of a longer stretch: what the data stream repeats shows over hundreds of samples
    questions = [{"step": r.get("step"), "segment": r.get("segment", 0), "question": r.get("question"),
                  "completion": r.get("completion")} for r in sampled[-n_questions:]]
    hb = read_heartbeat(p)
    # built from our own parser's lists and dicts: no validation pass (it copied every row per tick)
    return Evidence.model_construct(
        run_dir=str(p), job_status=job_status, step=(cur[-1]["step"] if cur else 0),
        metrics=cur[-window:], evals=evals[-50:], samples=samples, questions=questions,
        events=_TAIL.rows(p / "events.jsonl")[-50:], acks=_TAIL.rows(p / "command_log.jsonl")[-20:],
        heartbeat_age_s=(time.time() - hb["time"]) if hb else None,
        heartbeat_state=hb.get("state") if hb else None, harness=harness, recipe=recipe,
    )
