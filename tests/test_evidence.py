"""Evidence is read incrementally from the run's append-only files."""
from __future__ import annotations

import json

from swarm.evidence import _Tail, collect


def test_tail_reads_only_complete_new_lines_and_restarts_on_replacement(tmp_path):
    t = _Tail()
    p = tmp_path / "m.jsonl"
    p.write_text('{"a":1}\n{"a":2}\n{"a":')
    assert [r["a"] for r in t.rows(p)] == [1, 2]  # the torn line waits for its newline
    with open(p, "a") as f:
        f.write('3}\nnot json\n{"a":4}\n')
    assert [r["a"] for r in t.rows(p)] == [1, 2, 3, 4]  # a corrupt line is skipped
    p.unlink()
    p.write_text('{"a":9}\n')
    assert [r["a"] for r in t.rows(p)] == [9]  # a replaced file is read from the start
    assert t.rows(tmp_path / "missing.jsonl") == []


def test_collect_keeps_the_newest_segment_and_all_evals(tmp_path):
    rows = [{"step": s, "segment": 0, "loss": 1.0} for s in range(1, 6)]
    rows += [{"step": 3, "segment": 1, "loss": 0.5, "heldout_acc": 0.2}, {"step": 4, "segment": 1, "loss": 0.4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = collect(tmp_path, "RUNNING")
    assert [r["step"] for r in ev.metrics] == [3, 4] and ev.step == 4
    assert ev.latest_eval("heldout_acc") == 0.2 and ev.series("loss") == [0.5, 0.4]
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 5, "segment": 1, "loss": "nan"}) + "\n")
    ev = collect(tmp_path, "RUNNING")
    assert ev.step == 5 and str(ev.series("loss")[-1]) == "nan"
