"""Data changes at an unchanged config. `harder_data` read from the trainer's per-step input lengths (`question_chars`, the mean length of
each step's training questions): the step the stream changed at is named wherever it lies in the
metrics' window, also when every sampled question the evidence holds is from after it, and a stream
long from its first step names none. (The trainer's own logging of the field:
tests/test_trainer_perturb.py.) `question_format`: questions carrying characters none of the task's own
questions uses, and the step that began. `answer_format`: the policy's completions carrying characters none of
the task's answers uses, dated by the loss's jump on the changed labels."""
from __future__ import annotations

import dataclasses

from agents.detection import DETECTORS, THRESHOLDS
from test_detectors import HARNESS, KNOWN, make_ev, questions, sft_rows


def logged(at: int, n: int = 150, short: float = 5.0, long: float = 9.0) -> list[dict]:
    """SFT rows whose batches' questions are `short` characters until the update on step `at`'s data
    (row `at` + 1) and `long` from it, with the pass rate falling from 0.9 to 0.3 there."""
    rows = sft_rows(n)
    for r in rows:
        after = r["step"] - 1 >= at
        r.update(question_chars=long if after else short, pass_rate=0.3 if after else 0.9, difficulty=2,
                 harness_version="h1", recipe_version="r1")
    return rows


def test_the_step_the_stream_grew_at_is_named_from_the_rows_when_every_sample_is_newer():
    rows = logged(at=80)
    late = questions(range(120, 150), lambda s, k: f"{s:03d}+{k}4567")      # the newest samples: all long
    d = DETECTORS["harder_data"](make_ev(rows, questions=late), THRESHOLDS, KNOWN)
    assert d is not None and d.evidence["question_chars_then"] == 5.0 and d.evidence["question_chars_now"] == 9.0
    assert d.evidence["good_before_step"] == 80                             # the first step whose batch was long
    # the same samples without the rows' lengths: no earlier block to compare, no step named
    bare = [{k: v for k, v in r.items() if k != "question_chars"} for r in rows]
    assert DETECTORS["harder_data"](make_ev(bare, questions=late), THRESHOLDS, KNOWN) is None
    # unchanged lengths with the same fall of the pass rate: not the data's length
    same = logged(at=80, long=5.0)
    assert DETECTORS["harder_data"](make_ev(same, questions=late), THRESHOLDS, KNOWN) is None


def test_a_change_in_the_first_block_is_named_only_with_a_step_of_the_stream_before_it():
    lens = {1: 3.0, 2: 5.0, 3: 7.0, 4: 9.0}                  # the task's own lengths by difficulty
    knows = dataclasses.replace(KNOWN, question_chars=lens)
    for at, named in ((6, 6), (0, None)):                    # long from step 6, and from the first step
        rows = logged(at=at, n=60)
        for r in rows:
            r["pass_rate"] = 0.0                             # nothing learnt: no fall to see
        d = DETECTORS["harder_data"](make_ev(rows, questions=[]), THRESHOLDS, knows)
        assert d is not None and d.evidence["nearest_task_difficulty"] == 4
        assert d.evidence.get("good_before_step") == named, at



ALPHABET = "+0123456789"        # the task's own questions: sums of numbers


def sums(steps: range, prefix: str = "") -> list[dict]:
    return questions(steps, lambda s, k: f"{prefix}{s % 50}+{k}")


def test_questions_in_another_format_are_found_with_the_step_they_began_at():
    knows = dataclasses.replace(KNOWN, question_alphabet=ALPHABET)
    rows = sft_rows(100)
    qs = sums(range(0, 60)) + sums(range(60, 100), prefix="=")     # an export that writes '=' first, from step 60
    d = DETECTORS["question_format"](make_ev(rows, questions=qs), THRESHOLDS, knows)
    assert d is not None and d.severity == "warning" and d.evidence["new_chars"] == "="
    assert d.evidence["good_before_step"] == 60 and d.evidence["odd_share"] == 1.0
    # written so from the segment's first sample: no step to go back to, reported only
    d = DETECTORS["question_format"](make_ev(rows, questions=sums(range(0, 100), prefix="=")), THRESHOLDS, knows)
    assert d is not None and d.severity == "info" and "good_before_step" not in d.evidence
    assert d.evidence["info_without_onset"] is True
    # the task's own characters, or a rare one in a few questions (a character its probes missed): nothing
    assert DETECTORS["question_format"](make_ev(rows, questions=sums(range(0, 100))), THRESHOLDS, knows) is None
    rare = sums(range(0, 100)) + [{"step": s, "segment": 0, "question": "7-1"} for s in range(80, 100, 4)]
    assert DETECTORS["question_format"](make_ev(rows, questions=rare), THRESHOLDS, knows) is None
    # an earlier segment's questions do not count; the task's alphabet unknown: nothing to hold them against
    old = [{**q, "segment": 0} for q in sums(range(0, 60), prefix="=")]
    assert DETECTORS["question_format"](make_ev(rows, questions=old + [{**q, "segment": 1} for q in sums(range(60, 100))]),
                                        THRESHOLDS, knows) is None
    assert DETECTORS["question_format"](make_ev(rows, questions=qs), THRESHOLDS, KNOWN) is None
    # the source pinned: its newest questions in the task's characters again, the window still mostly
    # in the other format: nothing (no crash on a stretch that ended)
    pinned = sums(range(0, 60)) + sums(range(60, 95), prefix="=") + sums(range(95, 100))
    assert DETECTORS["question_format"](make_ev(rows, questions=pinned), THRESHOLDS, knows) is None
    # a stream that alternates between the two formats has no step to read the source from before
    mixed = [q for s in range(0, 100) for q in (sums(range(s, s + 1), prefix="=" if s % 2 and s >= 40 else ""))]
    d = DETECTORS["question_format"](make_ev(rows, questions=mixed + sums(range(100, 101), prefix="=")), THRESHOLDS, knows)
    assert d is not None and "good_before_step" not in d.evidence and d.severity == "info", d
    # too few sampled steps to judge
    assert DETECTORS["question_format"](make_ev(rows, questions=sums(range(90, 100), prefix="=")), THRESHOLDS, knows) is None


def test_the_tasks_question_alphabet_covers_its_questions_at_every_difficulty():
    from swarm.backtest import question_alphabet
    from trainer.tasks import Split, make_task

    for name in ("countdown", "addition"):
        a, t = set(question_alphabet({"task": {"name": name}, "seed": 0})), make_task(name, seed=0)
        # questions the probes never drew (other indices) are written in the same characters
        assert all(set(t.example(Split.TRAIN, i, d).question) <= a
                   for d in range(t.min_difficulty, t.max_difficulty + 1) for i in range(500, 540)), name
    assert "=" not in question_alphabet({"task": {"name": "countdown"}, "seed": 0})


def completions(steps: range, suffix: str = "") -> list[dict]:
    """The policy's sampled completions, 4 per step: numbers as the task answers them, then `suffix`
    and the stop."""
    return [{"step": s, "segment": 0, "question": f"{s}+{k}", "completion": f"{(s + k) % 97}{suffix}\n"}
            for s in range(steps.start, steps.stop) for k in range(4)]


def test_labels_in_another_format_are_found_from_the_completions_and_dated_by_the_loss_jump():
    knows = dataclasses.replace(KNOWN, answer_alphabet="0123456789")
    rows = sft_rows(100)
    for r in rows:
        if r["step"] >= 61:                      # row 61 is the update on step 60's data: the new labels
            r["loss"] = 4.0 - 0.05 * (r["step"] - 61)
    # the policy writes '=' after its answers from step 68 on, 8 steps after its labels changed
    cs = completions(range(0, 68)) + completions(range(68, 100), suffix="=")
    d = DETECTORS["answer_format"](make_ev(rows, questions=cs), THRESHOLDS, knows)
    assert d is not None and d.severity == "warning" and d.evidence["new_chars"] == "="
    assert d.evidence["written_since_step"] == 68 and d.evidence["good_before_step"] == 60
    assert d.evidence["loss_jump"] > THRESHOLDS.spike_ratio
    # no jump in the loss: no step to say when the labels changed (the step written otherwise comes
    # after it, and a pin there reads the changed labels), reported only
    flat = sft_rows(100)
    d = DETECTORS["answer_format"](make_ev(flat, questions=cs), THRESHOLDS, knows)
    assert d is not None and d.severity == "info" and "good_before_step" not in d.evidence
    assert d.evidence["written_since_step"] == 68 and d.evidence["info_without_onset"] is True
    # written so from the first sample (an untrained policy writes any of its characters): reported only
    d = DETECTORS["answer_format"](make_ev(rows, questions=completions(range(0, 100), "=")), THRESHOLDS, knows)
    assert d is not None and d.severity == "info" and "good_before_step" not in d.evidence
    # the task's own characters; a prefix or a stop the live harness writes; an unknown alphabet; GRPO: nothing
    assert DETECTORS["answer_format"](make_ev(rows, questions=completions(range(0, 100))), THRESHOLDS, knows) is None
    marked = {**HARNESS, "answer": {**HARNESS.get("answer", {}), "prefix": "=", "stop": "\n"}}
    assert DETECTORS["answer_format"](make_ev(rows, questions=cs, harness=marked), THRESHOLDS, knows) is None
    assert DETECTORS["answer_format"](make_ev(rows, questions=cs), THRESHOLDS, KNOWN) is None
    grpo = [{**r, "algorithm": "grpo"} for r in rows]
    assert DETECTORS["answer_format"](make_ev(grpo, questions=cs), THRESHOLDS, knows) is None
