"""Data curation's built-in policy: labels the task rejects, a stream that repeats a pool or got
harder, and the data source read as it was before the step a finding names as the first whose data
changed (`harness.filters.as_of_step`), alone or with the other data fixes at once.

Evidence windows are the hand-built ones of test_detectors.py.
"""
from __future__ import annotations

import math

from agents.base import rollback_target
from agents.data_curation import PIN, DataCuration
from agents.domain import InterventionKind as K, Risk
from test_detectors import HARNESS, make_ev, sft_rows, shifted
from test_operators import check_record, ctx


def test_data_curation_filters_labels_the_task_rejects_while_some_pass():
    op = DataCuration()
    rows = sft_rows()
    for r in rows:
        r["label_ok"] = 1.0
    for r in rows[-8:]:
        r["label_ok"] = 0.6
    ivs = [iv for iv in op.builtin(make_ev(rows), ctx()) if iv.diagnosis.name == "labels_fail_check" and PIN not in iv.changes]
    assert len(ivs) == 1
    iv = ivs[0]
    check_record(iv, op)
    assert iv.kind == K.DATA_CHANGE and iv.changes == {"harness.filters.check_labels": True} and iv.risk == Risk.LOW
    # the filter already on: nothing more to propose (the finding is reported)
    on = make_ev(rows, harness={**HARNESS, "filters": {"check_labels": True}})
    assert not [iv for iv in op.builtin(on, ctx()) if iv.diagnosis.name == "labels_fail_check" and PIN not in iv.changes]


def test_the_checkpoint_before_an_onset_whose_weights_answered_right():
    c = ctx(checkpoints=[{"name": f"step_{s:07d}", "step": s} for s in (10, 30, 50)])
    evals = [{"step": 10, "heldout_acc": None}, {"step": 10, "heldout_acc": 0.5}, {"step": 30, "heldout_acc": 0.0},
             {"step": 40, "heldout_acc": float("nan")}]
    assert c.answering_before(45, evals)["name"] == "step_0000010"   # 30 answered nothing; 50 is after the onset
    assert c.answering_before(5, evals) is None and c.answering_before(None, evals) is None


def test_data_curation_trains_without_labels_when_none_passes_the_check():
    op = DataCuration()
    op.builtin = lambda ev, ctx, b=op.builtin: [iv for iv in b(ev, ctx) if PIN not in iv.changes]   # the pin: below
    rows = sft_rows()
    for r in rows:
        r["label_ok"] = 1.0
    for r in rows[-8:]:
        r["label_ok"] = 0.0   # every label in another format, say: a filter would keep nothing
    evals = [{"step": 40, "heldout_acc": 0.3}, {"step": 60, "heldout_acc": 0.0}]
    ivs = [iv for iv in op.builtin(make_ev(rows, evals=evals), ctx()) if iv.diagnosis.name == "labels_fail_check"]
    assert len(ivs) == 1
    iv = ivs[0]
    check_record(iv, op)
    assert iv.changes["recipe.algorithm"] == "distill" and iv.risk == Risk.MEDIUM
    assert "nothing to train on" in iv.rationale
    # the steps since the onset (53) learnt the wrong labels: from the newest checkpoint before it
    assert iv.kind == K.ROLLBACK and rollback_target(iv) == "step_0000048"
    # no checkpoint before the onset, or none whose weights answered right: from where the run is
    for kept, seen in (([55], evals), ([20], [{"step": 10, "heldout_acc": 0.0}] + evals)):
        c = ctx(checkpoints=[{"name": f"step_{s:07d}", "step": s} for s in kept])
        assert [iv.kind for iv in op.builtin(make_ev(rows, evals=seen), c)
                if iv.diagnosis.name == "labels_fail_check"] == [K.DISTILL]
    # a window that fails throughout (steps 101-160, checkpoints before and inside it) shows no onset:
    # its first row is not where the labels went wrong, so from where the run is
    late = [{**r, "step": r["step"] + 100, "label_ok": 0.0} for r in rows]
    kept = ctx(checkpoints=[{"name": f"step_{s:07d}", "step": s} for s in (2, 100, 120)])
    seen = [{"step": 90, "heldout_acc": 0.3}, {"step": 150, "heldout_acc": 0.0}]
    assert [iv.kind for iv in op.builtin(make_ev(late, evals=seen), kept)
            if iv.diagnosis.name == "labels_fail_check"] == [K.DISTILL]
    for r in rows[:-8]:
        r["label_ok"] = 1.0
    # with the filter on as well, none passes it: the same
    on = make_ev(rows, evals=evals, harness={**HARNESS, "filters": {"check_labels": True}})
    assert [iv.kind for iv in op.builtin(on, ctx()) if iv.diagnosis.name == "labels_fail_check"] == [K.ROLLBACK]
    # a policy that never answered a held-out question right has nothing of its own to train on
    never = [{"step": 40, "heldout_acc": 0.0}, {"step": 60, "heldout_acc": 0.0}]
    assert not [iv for iv in op.builtin(make_ev(rows, evals=never), ctx()) if iv.diagnosis.name == "labels_fail_check"]


def test_data_curation_pins_the_source_before_the_step_its_data_changed():
    """A finding that names the step its data changed from (`good_before_step`) gets the data source
    read as it was before it, proposed first: from a checkpoint before it whose weights answered
    right when the steps since learnt wrong labels, from where the run is when they only learnt less."""
    op = DataCuration()
    rows = sft_rows()
    for r in rows:
        r["label_ok"] = 0.6 if r["step"] > rows[-8]["step"] - 1 else 1.0
    onset = rows[-8]["step"]                                   # the first row whose labels failed: step onset - 1's data
    evals = [{"step": 40, "heldout_acc": 0.3}]
    c = ctx(checkpoints=[{"name": f"step_{s:07d}", "step": s} for s in (20, 40, 55)])
    iv = op.builtin(make_ev(rows, evals=evals), c)[0]
    check_record(iv, op)
    assert iv.changes == {PIN: onset - 1} and iv.kind == K.ROLLBACK and rollback_target(iv) == "step_0000040"
    assert f"before step {onset - 1}" in iv.rationale and "unpins" in iv.rationale
    # weights that answered nothing yet before the change learnt nothing wrong either: from the untrained start
    start = ctx(checkpoints=[{"name": "init", "step": 0}, {"name": "step_0000055", "step": 55}])
    iv = op.builtin(make_ev(rows, evals=[{"step": 40, "heldout_acc": 0.0}]), start)[0]
    assert iv.kind == K.ROLLBACK and rollback_target(iv) == "init" and iv.changes == {PIN: onset - 1}
    # no checkpoint before it: from where the run is; a pin to that revision or an earlier one in force: none
    assert [(iv.kind, iv.changes) for iv in op.builtin(make_ev(rows, evals=evals), ctx(checkpoints=[]))][0] == \
        (K.DATA_CHANGE, {PIN: onset - 1})
    pinned = {**HARNESS, "filters": {"as_of_step": onset - 5}}
    c_pinned = ctx(harness=pinned, checkpoints=c.checkpoints)
    assert all(PIN not in iv.changes for iv in op.builtin(make_ev(rows, evals=evals, harness=pinned), c_pinned))
    # with the label check filter on, the steps since learnt none of the failing labels: no rollback
    filtered = {**HARNESS, "filters": {"check_labels": True}}
    assert [(iv.kind, iv.changes) for iv in op.builtin(make_ev(rows, evals=evals, harness=filtered), c)
            if PIN in iv.changes] == [(K.DATA_CHANGE, {PIN: onset - 1})]
    # harder problems only teach less: pinned from where the run is, before the lowered curriculum
    rows, qs = shifted(60)
    lens = {1: 3.0, 2: 5.0, 3: 7.0, 4: 9.0, 5: 11.0}
    ivs = op.builtin(make_ev(rows, questions=qs), ctx(question_chars=lens, harness={**HARNESS, "curriculum": {"start": 3}},
                                                      checkpoints=[{"name": "step_0000040", "step": 40}]))
    assert [iv.kind for iv in ivs] == [K.DATA_CHANGE, K.DATA_CHANGE] and PIN in ivs[0].changes
    assert 50 <= ivs[0].changes[PIN] <= 60 and ivs[0].risk == Risk.LOW
    # data wrong from the first step shows no step it changed from: no pin
    rows, qs = shifted(0, drop=False)
    for r in rows:
        r["pass_rate"] = 0.0
    assert all(PIN not in iv.changes for iv in op.builtin(make_ev(rows, questions=qs), ctx(question_chars=lens)))


def test_data_curation_fixes_two_faults_of_the_data_together_first():
    """A stream that repeats a small pool from its first sampled step and got harder at step 60:
    each fix alone leaves the other fault in force, so the first proposal makes both (the pin and
    the dedupe filter); the single ones follow."""
    from test_detectors import questions

    op = DataCuration()
    rows, _ = shifted(60)
    qs = questions(range(0, 100), lambda s, k: f"{(s * 4 + k) % 8:03d}+{k}" + ("4" if s < 60 else "4567"))
    ivs = op.builtin(make_ev(rows, questions=qs), ctx())
    assert sorted(iv.diagnosis.name for iv in ivs[1:]) == ["harder_data", "repeated_examples"]
    joint = ivs[0]
    check_record(joint, op)
    assert joint.kind == K.DATA_CHANGE and set(joint.changes) == {PIN, "harness.filters.dedupe"}
    assert joint.changes == {**ivs[1].changes, **ivs[2].changes} and "together" in joint.rationale
    # a finding whose data changed after the pin's step has no part: the pin undoes it already
    rows, qs = shifted(60)
    for r in rows:
        r["label_ok"] = 0.6 if r["step"] > 40 else 1.0           # labels wrong from step 40's data
    lens = {1: 3.0, 2: 5.0, 3: 7.0, 4: 9.0, 5: 11.0}
    ivs = op.builtin(make_ev(rows, questions=qs), ctx(question_chars=lens, checkpoints=[],
                                                      harness={**HARNESS, "curriculum": {"start": 3}}))
    assert ivs[0].changes == {PIN: 40} and any("harness.curriculum.start" in iv.changes for iv in ivs)
    assert not any(PIN in iv.changes and len(iv.changes) > 1 for iv in ivs), [iv.changes for iv in ivs]
    # one finding: nothing to join
    assert [iv.changes for iv in op.builtin(make_ev(*shifted(60)[:1], questions=shifted(60)[1]), ctx())] == \
        [{PIN: joint.changes[PIN]}]


def test_data_curation_turns_dedupe_on_for_a_stream_that_repeats_a_small_pool():
    op = DataCuration()
    pool = [{"step": s, "segment": 0, "question": f"{(s * 4 + k) % 16}+7"} for s in range(20, 60) for k in range(4)]
    [iv] = op.builtin(make_ev(sft_rows(), questions=pool), ctx())
    check_record(iv, op)
    assert iv.kind == K.DATA_CHANGE and iv.diagnosis.name == "repeated_examples"
    assert iv.changes == {"harness.filters.dedupe": True} and iv.risk == Risk.LOW


def test_a_stream_that_began_to_repeat_at_a_step_is_read_from_before_it_first():
    """New questions at every step until step 60, a pool of 16 from there: the source read as it was
    before step 60 is proposed first, from where the run is (a pool teaches less, nothing wrong),
    and the dedupe filter follows; with harder problems from the same step, the pin undoes both,
    so no joint change adds the filter to it."""
    from test_detectors import questions

    op = DataCuration()
    qs = questions(range(0, 100), lambda s, k: f"{s * 4 + k}+7" if s < 60 else f"{(s * 4 + k) % 16}+7")
    ivs = op.builtin(make_ev(sft_rows(), questions=qs), ctx(checkpoints=[{"name": "step_0000040", "step": 40}]))
    for iv in ivs:
        check_record(iv, op)
    assert [iv.kind for iv in ivs] == [K.DATA_CHANGE, K.DATA_CHANGE] and list(ivs[0].changes) == [PIN]
    assert 58 <= ivs[0].changes[PIN] <= 60 and ivs[1].changes == {"harness.filters.dedupe": True}
    assert f"since step {ivs[0].changes[PIN]}" in ivs[0].diagnosis.summary and ivs[0].risk == Risk.LOW
    rows, _ = shifted(60)
    qs = questions(range(0, 100), lambda s, k: f"{s:03d}+{k}4" if s < 60 else f"{(s * 4 + k) % 8:03d}+{k}4567")
    ivs = op.builtin(make_ev(rows, questions=qs), ctx())
    assert list(ivs[0].changes) == [PIN] and 50 <= ivs[0].changes[PIN] <= 60     # harder_data names its first window
    assert not any(len(iv.changes) > 1 for iv in ivs), [iv.changes for iv in ivs]


def test_data_curation_lowers_the_curriculum_by_the_levels_the_questions_rose():
    op = DataCuration()
    rows, qs = shifted(60)
    ev = make_ev(rows, questions=qs)
    lens = {1: 3.0, 2: 5.0, 3: 7.0, 4: 9.0, 5: 11.0}            # the task's own: 2-digit sums are 5 characters
    harness = {**HARNESS, "curriculum": {"start": 2, "end": 3}}
    pin, iv = op.builtin(ev, ctx(question_chars=lens, harness=harness, min_difficulty=1))
    check_record(iv, op)
    assert PIN in pin.changes                                  # proposed first (above)
    # the stream's 9-character questions are difficulty 4, two above the 2 asked for
    assert iv.kind == K.DATA_CHANGE and iv.diagnosis.name == "harder_data" and iv.risk == Risk.LOW
    assert iv.changes == {"harness.curriculum.start": 1, "harness.curriculum.end": 1}   # floored at the task's lowest
    assert [iv.changes for iv in op.builtin(ev, ctx(harness=harness))] == [pin.changes]   # lengths unknown: no level
    floor = {**HARNESS, "curriculum": {"start": 1}}
    assert [iv.changes for iv in op.builtin(ev, ctx(question_chars=lens, harness=floor, min_difficulty=1))] \
        == [pin.changes]                                                                    # nowhere lower


def test_the_controller_keeps_where_a_data_change_began_while_its_finding_holds(tmp_path):
    """A look after the evidence's window moved past the change still finds the fault, and the pin
    it proposes still reads the source from before where it began (Deciding.with_onsets)."""
    from agents.domain import Diagnosis
    from test_claims import close, controller

    ctrl = controller(tmp_path)

    def look(**evidence):
        d = Diagnosis(name="label_noise", summary="s", operator="detectors", policy="builtin", evidence=evidence)
        return ctrl.with_onsets([d])[0].evidence.get("good_before_step")

    assert look(good_before_step=250, rose_at_step=251) == 250
    assert look(rose_at_step=None) == 250                       # named no longer: kept
    ctrl.with_onsets([])                                         # a look without it
    assert look() is None
    # a finding reported only for want of a step to go back to is a warning once one is kept for it;
    # one reported for another reason (a filter already on) stays as reported
    for extra, want in (({"info_without_onset": True}, "warning"), ({"filter_on": True}, "info")):
        name = "question_format" if extra.get("info_without_onset") else "labels_fail_check"
        seen = Diagnosis(name=name, summary="s", operator="detectors", policy="builtin", evidence={"good_before_step": 60})
        ctrl.with_onsets([seen])
        d = ctrl.with_onsets([seen.model_copy(update={"severity": "info", "evidence": extra})])[0]
        assert (d.severity, d.evidence.get("good_before_step")) == (want, 60), extra
        assert "info_without_onset" not in d.evidence
    close(ctrl)


def test_questions_in_another_format_get_the_source_as_it_was_before_they_began():
    """The questions carry a character the task's own never use from step 60: the source is read as
    it was before step 60, from where the run is (the labels stayed right: nothing wrong was learnt).
    Written so from the first sample, there is no revision to go back to: no proposal."""
    from test_data_shift import ALPHABET, sums
    from test_detectors import sft_rows as rows_of

    op = DataCuration()
    ev = make_ev(rows_of(100), questions=sums(range(0, 60)) + sums(range(60, 100), prefix="="))
    (iv,) = op.builtin(ev, ctx(question_alphabet=ALPHABET, question_chars={3: 4.0}))
    check_record(iv, op)
    assert iv.diagnosis.name == "question_format" and iv.kind == K.DATA_CHANGE and iv.changes == {PIN: 60}
    assert iv.risk == Risk.LOW and "step 60" in iv.rationale
    always = make_ev(rows_of(100), questions=sums(range(0, 100), prefix="="))
    assert op.builtin(always, ctx(question_alphabet=ALPHABET, question_chars={3: 4.0})) == []


def test_labels_in_another_format_roll_back_to_before_they_changed_and_pin_the_source_there():
    """The policy writes a character the task's answers never use from step 68, after its loss jumped
    on step 60's labels: the steps since learnt the other format, so the run rolls back to the
    newest checkpoint before step 60 and reads the source as it was before it."""
    from test_data_shift import completions
    from test_detectors import sft_rows as rows_of

    rows = rows_of(100)
    for r in rows:
        if r["step"] >= 61:           # the new targets' loss jumps, and falls as the policy learns them
            r["loss"] = 0.1 + 4.0 * math.exp(-(r["step"] - 61) / 5)
    ev = make_ev(rows, questions=completions(range(0, 68)) + completions(range(68, 100), suffix="="))
    c = ctx(answer_alphabet="0123456789", checkpoints=[{"name": f"step_{s:07d}", "step": s} for s in (40, 60, 80)])
    (iv,) = [iv for iv in DataCuration().builtin(ev, c) if iv.diagnosis.name == "answer_format"]
    check_record(iv, DataCuration())
    assert iv.kind == K.ROLLBACK and rollback_target(iv) == "step_0000060" and iv.changes == {PIN: 60}
