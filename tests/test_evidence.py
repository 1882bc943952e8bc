"""Evidence is read incrementally from the run's append-only files."""
from __future__ import annotations

import json

from agents.evidence import _Tail, collect


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


def test_collect_follows_segments_and_evals_incrementally(tmp_path):
    """Each collect reads only what was appended: the current segment and the eval rows stay right
    across appends, a new segment (rollback), final rows, and a replaced file."""
    m = tmp_path / "metrics.jsonl"

    def append(*rows):
        with open(m, "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))

    append(*({"step": s, "segment": 0, "loss": 1.0} for s in range(1, 4)))
    assert [r["step"] for r in collect(tmp_path).metrics] == [1, 2, 3]
    append({"step": 4, "segment": 0, "loss": 0.9, "heldout_acc": 0.3})
    ev = collect(tmp_path)
    assert [r["step"] for r in ev.metrics] == [1, 2, 3, 4] and [r["step"] for r in ev.evals] == [4]
    append({"step": 2, "segment": 1, "loss": 0.8}, {"step": 3, "segment": 1, "loss": 0.7})
    ev = collect(tmp_path)
    assert [(r["segment"], r["step"]) for r in ev.metrics] == [(1, 2), (1, 3)] and ev.step == 3
    assert ev.latest_eval("heldout_acc") == 0.3            # evals of earlier segments stay visible
    append({"step": 3, "segment": 1, "final": True, "heldout_acc": 0.5})
    ev = collect(tmp_path)
    assert ev.step == 3 and [r.get("final") for r in ev.metrics] == [None, None] and ev.latest_eval("heldout_acc") == 0.5
    m.unlink()
    append({"step": 1, "segment": 0, "loss": 2.0})
    ev = collect(tmp_path)
    assert [r["loss"] for r in ev.metrics] == [2.0] and ev.evals == []


def test_memory_stays_bounded_on_a_long_run(tmp_path):
    """The tail and the index keep only the newest rows (at most twice `keep`), read the file in
    chunks, and the index still sees every appended row once — also when one read brings many more
    rows than `keep` (a resume over a long run, a fast trainer during a long wait)."""
    from agents.evidence import _SegmentIndex

    t, idx = _Tail(keep=10, chunk=64), _SegmentIndex(keep=10)
    m = tmp_path / "metrics.jsonl"
    step = 0
    for tick in range(30):
        with open(m, "a") as f:
            for _ in range(7 if tick != 12 else 95):   # one tick brings 95 rows
                step += 1
                row = {"step": step, "segment": 1 if step > 150 else 0, "loss": 1.0}
                if step % 5 == 0:
                    row["heldout_acc"] = step / 1000
                f.write(json.dumps(row) + "\n")
        rows = t.rows(m, on_row=idx.add, on_reset=idx.reset)
        assert len(rows) <= 20 and rows[-1]["step"] == step
        cur, evals = idx.cur, idx.evals
        assert len(cur) <= 20 and cur[-1]["step"] == step and len(evals) <= 20
        assert [r["heldout_acc"] for r in evals] == [(step - step % 5 - 5 * k) / 1000 for k in range(len(evals))][::-1]
        assert [r["step"] for r in cur] == list(range(step - len(cur) + 1, step + 1))   # contiguous, no gaps
    assert all(r["segment"] == 1 for r in cur)
    m.unlink()
    assert t.rows(m, on_row=idx.add, on_reset=idx.reset) == [] and idx.cur == [] and idx.evals == []
