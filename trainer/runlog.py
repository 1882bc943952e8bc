"""The run's observable record: append-only JSONL streams and a heartbeat, readable while live.

    RUN_DIR/metrics.jsonl      one row per step (eval fields on eval steps)
    RUN_DIR/samples.jsonl      sampled rollouts: question, prompt, completion, reward, verdict
    RUN_DIR/events.jsonl       notable events: start, resume, checkpoint, non-finite loss, …
    RUN_DIR/heartbeat.json     rewritten atomically every step and while paused
    RUN_DIR/config.yaml        the resolved config (perturbations removed)

Each line is flushed on write so a reader (`read_jsonl`) sees whole rows; a torn last line from a
crash is skipped by the reader, never fatal.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import time
from typing import Any, Iterator

INIT_CHECKPOINT = "init"      # the checkpoint a fresh run saves before its first update (checkpoints/init.pt)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # "nan"/"inf": JSON has no literal for them
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class JsonlWriter:
    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(_clean(row), separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_jsonl(path: str | os.PathLike, start: int = 0) -> list[dict[str, Any]]:
    """All complete rows from line `start` on; a torn or corrupt line is skipped."""
    return list(iter_jsonl(path, start))


def iter_jsonl(path: str | os.PathLike, start: int = 0) -> Iterator[dict[str, Any]]:
    p = pathlib.Path(path)
    if not p.exists():
        return
    with open(p, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < start or not line.endswith("\n"):
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


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
    def __init__(self, run_dir: pathlib.Path) -> None:
        self.dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = JsonlWriter(run_dir / "metrics.jsonl")
        self.samples = JsonlWriter(run_dir / "samples.jsonl")
        self.events = JsonlWriter(run_dir / "events.jsonl")

    def event(self, kind: str, step: int, **data: Any) -> None:
        self.events.write({"time": time.time(), "step": step, "event": kind, **data})

    def heartbeat(self, step: int, state: str, **data: Any) -> None:
        row = {"time": time.time(), "pid": os.getpid(), "step": step, "state": state,
               "cpu_s": process_cpu_seconds(), **data}
        atomic_write_text(self.dir / "heartbeat.json", json.dumps(_clean(row)), durable=False)

    def close(self) -> None:
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
