"""Evidence: what the operators see of a run, built only from the files the run writes.

    ev = collect(run_dir, job_status="RUNNING")

Metrics of the current segment (after a resume or rollback the step counter repeats; only the
newest segment's rows are kept, so a window never mixes timelines), the held-out eval history,
recent samples (untrusted trajectory text), events, command acknowledgements, heartbeat age and
the job's status. Perturbation settings are never in any of these files, so never in evidence.
"""
from __future__ import annotations

import json
import math
import pathlib
import time
from typing import Any

from pydantic import BaseModel, Field

from trainer.runlog import read_heartbeat


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


class _Tail:
    """Incremental reader of an append-only JSONL file: each call parses only the bytes appended
    since the last one (a torn last line waits for its newline), so observing a long run costs
    per tick what the run wrote since the previous tick, not its whole history. Only the newest
    `keep` rows (at most twice that between trims) stay in memory: a run of days appends millions."""

    def __init__(self, keep: int = 5000) -> None:
        self.keep = keep
        self.files: dict[str, tuple[int, int, list[dict[str, Any]], int, int]] = {}  # path -> (inode, offset, rows, total, epoch)
        self._epochs = 0

    def read(self, path: pathlib.Path) -> tuple[list[dict[str, Any]], int, int]:
        """(the newest rows, how many rows the file has had, an epoch that changes whenever the
        file was replaced or truncated and reading started over)."""
        key = str(path)
        try:
            st = path.stat()
        except FileNotFoundError:
            self.files.pop(key, None)
            return [], 0, -1
        ino, off, rows, total, epoch = self.files.get(key, (st.st_ino, 0, [], 0, -1))
        if epoch < 0 or ino != st.st_ino or st.st_size < off:  # new, replaced or truncated: start over
            self._epochs += 1
            ino, off, rows, total, epoch = st.st_ino, 0, [], 0, self._epochs
        if st.st_size > off:
            with open(path, "rb") as f:
                f.seek(off)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            for line in chunk[:end].splitlines():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
                total += 1
            off += end
            if len(rows) > 2 * self.keep:
                del rows[: -self.keep]
        self.files[key] = (ino, off, rows, total, epoch)
        return rows, total, epoch

    def rows(self, path: pathlib.Path) -> list[dict[str, Any]]:
        return self.read(path)[0]


_TAIL = _Tail()


def is_eval_row(r: dict[str, Any]) -> bool:
    """A metrics row that carries held-out results (a periodic or final evaluation)."""
    return any(k.startswith("heldout") for k in r)


class _MetricsIndex:
    """The current segment's rows and the eval rows of one metrics file, kept up to date from the
    rows appended since the last call (a scan of the whole history per tick cost O(steps)); the
    newest `keep` of each (at most twice that between trims)."""

    def __init__(self, keep: int = 5000) -> None:
        self.keep = keep
        self.files: dict[str, tuple[int, int, int, list, list]] = {}  # path -> (epoch, seen, seg, cur, evals)

    def update(self, key: str, rows: list[dict[str, Any]], total: int, epoch: int
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ep, seen, seg, cur, evals = self.files.get(key, (epoch, 0, 0, [], []))
        if ep != epoch or seen > total:   # the file was replaced: the tail started over
            seen, seg, cur, evals = 0, 0, [], []
        new = total - seen
        for r in (rows[-new:] if new > 0 else []):
            rs = r.get("segment", 0)
            if rs > seg:
                seg, cur = rs, []
            if rs == seg and not r.get("final"):
                cur.append(r)
            if is_eval_row(r):
                evals.append(r)
        for xs in (cur, evals):
            if len(xs) > 2 * self.keep:
                del xs[: -self.keep]
        self.files[key] = (epoch, total, seg, cur, evals)
        return cur, evals


_METRICS = _MetricsIndex()


def collect(run_dir: str | pathlib.Path, job_status: str = "UNKNOWN", window: int = 200,
            n_samples: int = 32, harness: dict | None = None, recipe: dict | None = None) -> Evidence:
    p = pathlib.Path(run_dir)
    cur, evals = _METRICS.update(str(p / "metrics.jsonl"), *_TAIL.read(p / "metrics.jsonl"))
    samples = _TAIL.rows(p / "samples.jsonl")[-n_samples:]
    hb = read_heartbeat(p)
    # built from our own parser's lists and dicts: no validation pass (it copied every row per tick)
    return Evidence.model_construct(
        run_dir=str(p), job_status=job_status, step=(cur[-1]["step"] if cur else 0),
        metrics=cur[-window:], evals=evals[-50:], samples=samples,
        events=_TAIL.rows(p / "events.jsonl")[-50:], acks=_TAIL.rows(p / "command_log.jsonl")[-20:],
        heartbeat_age_s=(time.time() - hb["time"]) if hb else None,
        heartbeat_state=hb.get("state") if hb else None, harness=harness, recipe=recipe,
    )
