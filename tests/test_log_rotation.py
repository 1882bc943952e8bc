"""The run log stays bounded over days (trainer/runlog.py): streams roll past a size, old parts are
gzipped and dropped, every reader follows the parts, and the long-run curve comes from a bounded,
downsampled summary.

    .venv/bin/python -m pytest tests/test_log_rotation.py -q
"""
from __future__ import annotations

import pathlib

import pytest

from trainer.runlog import History, Rotation, RunLog, iter_jsonl, metrics_history, rotated_parts, tail_jsonl


def _row(i: int, seg: int = 0) -> dict:
    r = {"step": i, "segment": seg, "loss": 1.0 / i, "time": float(i)}
    if i % 25 == 0:
        r["heldout_acc"] = min(1.0, i / 1000)
    return r


def test_streams_roll_gzip_and_keep_only_the_newest_parts(tmp_path):
    log = RunLog(tmp_path, Rotation(max_bytes=4096, keep=3))
    for i in range(1, 2001):
        log.metrics.write(_row(i))
    log.close()
    parts = rotated_parts(tmp_path / "metrics.jsonl")
    assert len(parts) == 3
    assert [p.suffix for p in parts] == [".gz", ".gz", ".jsonl"]        # the newest part stays plain
    streams = [p for p in tmp_path.iterdir() if ".jsonl" in p.name]
    assert sum(p.stat().st_size for p in streams) < 4 * 4096 + 400      # bounded: 2,000 rows are ~110 KB
    rows = list(iter_jsonl(tmp_path / "metrics.jsonl"))
    steps = [r["step"] for r in rows]
    assert steps == list(range(steps[0], 2001)) and steps[0] > 1        # what is retained, in order, no gap
    assert [r["step"] for r in tail_jsonl(tmp_path / "metrics.jsonl", 5)] == [1996, 1997, 1998, 1999, 2000]
    # a tail longer than the live file reaches back into the rolled parts
    assert [r["step"] for r in tail_jsonl(tmp_path / "metrics.jsonl", len(rows))] == steps


def test_the_summary_covers_the_whole_run_bounded_and_survives_a_restart(tmp_path):
    log = RunLog(tmp_path, Rotation(max_bytes=4096, keep=2))
    log.history = History(cap=50)
    for i in range(1, 3001):
        log.metrics.write(_row(i))
    log.metrics.close()          # a killed trainer: no close(), the summary is up to 250 rows behind
    hist = metrics_history(tmp_path)
    steps = [r["step"] for r in hist]
    assert steps == sorted(steps) and steps[0] == 1 and steps[-1] == 3000
    assert len(hist) <= 3 * 50 + 250 + 2
    # the first eval that reached 0.6 is kept exactly (a record), whatever the downsampling
    assert next(r["step"] for r in hist if r.get("heldout_acc", 0) >= 0.6) == 600
    # a resumed trainer picks the summary up and folds in what the killed one wrote after it
    log2 = RunLog(tmp_path, Rotation(max_bytes=4096, keep=2))
    assert log2.history.n == 3000
    for i in range(3001, 3101):
        log2.metrics.write(_row(i, seg=1))
    log2.close()
    hist = metrics_history(tmp_path)
    assert hist[-1]["step"] == 3100 and hist[-1]["segment"] == 1 and len(hist) <= 3 * 50 + 2


def test_rotation_settings_from_the_environment_are_checked():
    assert Rotation.from_env({"SWARMLAB_LOG_ROTATE_BYTES": "65536", "SWARMLAB_LOG_KEEP_ROTATED": "2"}) == Rotation(65536, 2)
    assert Rotation.from_env({}) == Rotation()
    with pytest.raises(ValueError, match=r"SWARMLAB_LOG_ROTATE_BYTES='big' is not an integer"):
        Rotation.from_env({"SWARMLAB_LOG_ROTATE_BYTES": "big"})
    with pytest.raises(ValueError, match=r"keep=0 must be >= 1"):
        Rotation.from_env({"SWARMLAB_LOG_KEEP_ROTATED": "0"})


def test_the_evidence_tail_follows_a_roll_without_skipping_or_repeating(tmp_path):
    from agents.evidence import Tail

    log = RunLog(tmp_path, Rotation(max_bytes=2048, keep=4))
    tail, seen = Tail(keep=10_000, chunk=256), []
    path: pathlib.Path = tmp_path / "metrics.jsonl"
    for i in range(1, 601):
        log.metrics.write(_row(i))
        if i % 7 == 0:             # reads between writes, some across a roll
            tail.rows(path, on_row=seen.append)
    tail.rows(path, on_row=seen.append)
    assert len(rotated_parts(path)) == 4 and [r["step"] for r in seen] == list(range(1, 601))
    # a reader that starts on a rolled stream (a resumed controller) sees the newest rolled part too
    fresh = Tail().rows(path)
    live = sum(1 for _ in open(path))
    assert len(fresh) > live and fresh[-1]["step"] == 600
    log.close()
