"""`repeated_examples`: a stream stuck on a small pool, told from a small question space's chance
repeats and a GRPO group's shared question, and the step such a stream began to repeat at.
Evidence windows are the hand-built ones of test_detectors.py."""
from __future__ import annotations

import random

from agents.detection import DETECTORS, THRESHOLDS
from test_detectors import HARNESS, KNOWN, fired, make_ev, questions, sft_rows


def test_repeated_examples_fires_on_a_stream_stuck_on_a_small_pool_only():
    rows = sft_rows()
    pool = questions(range(20, 60), lambda s, k: f"{(s * 4 + k) % 16}+7")          # 16 questions over and over
    d = fired(make_ev(rows, questions=pool), "repeated_examples")
    assert d.evidence["distinct"] == 16 and d.evidence["repeated_share"] == 0.84   # 16 new, 84 repeats
    fresh = questions(range(20, 60), lambda s, k: f"{s * 4 + k}+7")                # every question new
    assert DETECTORS["repeated_examples"](make_ev(rows, questions=fresh), THRESHOLDS, KNOWN) is None
    # a GRPO group: the completions of one prompt share its question, which is not a repeat
    grouped = questions(range(20, 60), lambda s, k: f"{s}+7")
    assert DETECTORS["repeated_examples"](make_ev(rows, questions=grouped), THRESHOLDS, KNOWN) is None
    # a small question space repeats by chance, less than a pool (1-digit sums: 100 questions)
    rng = random.Random(3)
    small = questions(range(20, 60), lambda s, k: f"{rng.randrange(10)}+{rng.randrange(10)}")
    assert DETECTORS["repeated_examples"](make_ev(rows, questions=small), THRESHOLDS, KNOWN) is None
    # too few questions to judge; the pool of an older segment; a harness that already dedupes
    assert DETECTORS["repeated_examples"](make_ev(rows, questions=pool[:90]), THRESHOLDS, KNOWN) is None
    newer = [dict(q, segment=0) for q in pool] + [dict(q, segment=1) for q in fresh]
    assert DETECTORS["repeated_examples"](make_ev(rows, questions=newer), THRESHOLDS, KNOWN) is None
    deduped = make_ev(rows, questions=pool, harness={**HARNESS, "filters": {"dedupe": True}})
    assert DETECTORS["repeated_examples"](deduped, THRESHOLDS, KNOWN) is None


def test_repeated_examples_names_the_step_a_stream_began_to_repeat_at():
    """Questions sampled at no other step until the pool began: the first sampled step of the pool
    is named (its chance repeats before it, a small question space's, do not move it); a pool from
    the first sampled steps names none."""
    rows = sft_rows()
    rng = random.Random(5)

    def stream(began: int, pool: int = 16):
        return questions(range(0, 100), lambda s, k: f"{rng.randrange(30)}+{rng.randrange(30)}" if s < began
                         else f"{(s * 4 + k) % pool}+7")

    for began in (30, 60, 70):
        d = fired(make_ev(rows, questions=stream(began)), "repeated_examples")
        # never after it (a pin there would read the changed source), at most two steps before
        assert began - 2 <= d.evidence["good_before_step"] <= began, (began, d.evidence)
        assert f"since step {d.evidence['good_before_step']}" in d.summary
    # one question a step (a GRPO group's completions share it), 90% of them from the pool
    grpo = [{"step": s, "segment": 0, "question": f"{s % 16}+7" if s >= 60 and rng.random() < 0.9 else f"{s}+{s}"}
            for s in range(0, 200)]
    began = fired(make_ev(rows, questions=grpo), "repeated_examples").evidence["good_before_step"]
    assert 58 <= began <= 60, began
    for began in (0, 5):
        d = DETECTORS["repeated_examples"](make_ev(rows, questions=stream(began)), THRESHOLDS, KNOWN)
        assert d is not None and "good_before_step" not in d.evidence, began
    # one pool, then another from step 60: the stream repeated before the change too
    two = questions(range(0, 100), lambda s, k: f"{(s * 4 + k) % 8}+{7 if s < 60 else 9}")
    assert "good_before_step" not in fired(make_ev(rows, questions=two), "repeated_examples").evidence
