"""Detectors of faults that leave the run's config as it was set: a worker whose steps come to wait
on its data pipeline (`input_bound`) and labels the task's own check rejects (`labels_fail_check`),
on hand-built rows and on short real runs of the built-in trainer."""
from __future__ import annotations

import pytest

from agents.detection import DETECTORS, THRESHOLDS
from test_detectors import HARNESS, KNOWN, fired, grpo_rows, make_ev, names, real_run, sft_rows


def timed_rows(wait: float = 0.01) -> list[dict]:
    """Healthy SFT rows whose data pipeline takes `wait` of each 0.25 s step."""
    rows = sft_rows()
    for r in rows:
        r["t_data"] = wait
    return rows


def slowed_rows(wait: float, **also: float) -> list[dict]:
    """`timed_rows()` whose last 6 training steps take 1.25 s, `wait` of it on the data pipeline
    (`also`: other fields of those rows)."""
    rows = timed_rows()
    for r in rows[-6:]:
        if "heldout_acc" not in r:
            r.update(step_time=1.25, t_data=wait, **also)
    return rows


def test_input_bound_fires_when_steps_come_to_wait_on_the_data_pipeline():
    rows = slowed_rows(1.01)      # a loader a second slower per step
    d = fired(make_ev(rows), "input_bound")
    assert d.severity == "warning"
    assert d.evidence["data_share_recent"] > 0.75 and d.evidence["data_share_before"] < 0.1
    assert d.evidence["step_time_recent"] == pytest.approx(1.25) and d.evidence["step_time_before"] == pytest.approx(0.25)
    assert d.evidence["onset_step"] == rows[-6]["step"] + (1 if "heldout_acc" in rows[-6] else 0)


def test_input_bound_is_quiet_under_contention_a_restart_onto_the_same_slowness_and_without_timings():
    # the machine is contended: the pipeline and the model slow alike, the share stays
    ev = make_ev(slowed_rows(0.05))
    assert DETECTORS["input_bound"](ev, THRESHOLDS, KNOWN) is None
    # a new job segment slow from its first step: no rise within the segment
    rows = timed_rows()
    for r in rows[-20:]:
        r.update(segment=1, **({} if "heldout_acc" in r else {"step_time": 1.25, "t_data": 1.01}))
    assert DETECTORS["input_bound"](make_ev(rows), THRESHOLDS, KNOWN) is None
    # a trainer that does not time its data pipeline: nothing to read
    rows = sft_rows()
    for r in rows[-6:]:
        r["step_time"] = 1.25
    assert DETECTORS["input_bound"](make_ev(rows), THRESHOLDS, KNOWN) is None


def test_labels_fail_check_reads_the_share_of_labels_the_task_accepts():
    rows = sft_rows()
    for r in rows:
        r["label_ok"] = 1.0
    assert DETECTORS["labels_fail_check"](make_ev(rows), THRESHOLDS, KNOWN) is None
    for r in rows[-8:]:
        r["label_ok"] = 0.6                            # 40% of the labels came out wrong from step 53 on
    d = fired(make_ev(rows), "labels_fail_check")
    assert d.severity == "warning" and d.evidence["label_ok_mean"] == pytest.approx(0.6)
    assert d.evidence["onset_step"] == rows[-8]["step"] and d.evidence["label_ok_before"] == pytest.approx(1.0)
    assert d.evidence["filter_on"] is False and "40%" in d.summary
    on = fired(make_ev(rows, harness={**HARNESS, "filters": {"check_labels": True}}), "labels_fail_check")
    assert on.evidence["filter_on"] is True and on.severity == "info"
    # a passing newest row with the recent mean still below the bound: the onset is in the window
    for r, v in zip([r for r in rows if "heldout_acc" not in r][-5:], [0.75, 0.875, 0.75, 0.875, 1.0]):
        r["label_ok"] = v
    d = fired(make_ev(rows), "labels_fail_check")
    assert d.evidence["label_ok_mean"] == pytest.approx(0.85) and d.evidence["onset_step"] <= rows[-2]["step"]
    # wrong from the first checked step: no level before
    for r in rows:
        r["label_ok"] = 0.0
    assert fired(make_ev(rows), "labels_fail_check").evidence["label_ok_before"] is None
    # a trainer that does not check its labels, and GRPO rows: nothing to read
    assert DETECTORS["labels_fail_check"](make_ev(sft_rows()), THRESHOLDS, KNOWN) is None
    rows = grpo_rows()
    for r in rows:
        r["label_ok"] = 0.0
    assert DETECTORS["labels_fail_check"](make_ev(rows), THRESHOLDS, KNOWN) is None


def test_real_run_slow_worker_is_input_bound(tmp_path):
    ev = real_run(tmp_path, [{"kind": "slow_worker", "at_step": 15, "seconds": 0.3}])
    d = fired(ev, "input_bound")
    assert d.evidence["data_share_recent"] >= 0.5 and d.evidence["step_time_recent"] >= 0.3
    # the healthy real runs above leave it quiet (test_real_run: only throughput_drop may report)


def test_real_run_slow_compute_is_not_input_bound(tmp_path):
    """A worker whose compute slows (a throttled device) waits no longer on its data: input_bound
    does not claim it (throughput_drop reports it)."""
    ev = real_run(tmp_path, [{"kind": "slow_worker", "at_step": 15, "seconds": 0.3, "where": "compute"}])
    assert DETECTORS["input_bound"](ev, THRESHOLDS, KNOWN) is None
    assert "throughput_drop" in names(ev)


@pytest.mark.parametrize("fault, at_most", [
    ({"kind": "label_noise", "at_step": 15, "fraction": 0.5, "noise": "off_by_one"}, 0.8),
    ({"kind": "data_format", "at_step": 15, "style": "answer_prefix"}, 0.0),   # every label written '=…'
])
def test_real_run_labels_the_task_rejects(tmp_path, fault, at_most):
    ev = real_run(tmp_path, [fault])
    d = fired(ev, "labels_fail_check")
    assert d.evidence["label_ok_mean"] <= at_most and d.evidence["label_ok_before"] == 1.0
    assert 15 <= d.evidence["onset_step"] <= 17
