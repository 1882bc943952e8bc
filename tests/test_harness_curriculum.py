"""harness/curriculum.py and harness/filters.py: the difficulty schedule, the batch draw through the
filters (against a reference: the trainer's loop before it moved into the harness, kept here
verbatim), the dedupe memory, a question space smaller than it, filters that reject everything,
and the GRPO pass-rate band.

    .venv/bin/python -m pytest tests/test_harness_curriculum.py -q
"""
from __future__ import annotations

import pytest
import torch

from harness import curriculum, filters
from harness.spec import Curriculum, HarnessSpec
from trainer.tasks.base import Split, make_task


class _Stop(Exception):
    pass


def _ref_draw(harness, draw, cursor, B, seen):
    """trainer/loop.py `next_examples`'s loop before the move (StopRun as _Stop)."""
    f = harness.filters
    out = []
    scanned, dedupe = 0, f.dedupe
    while len(out) < B:
        ex = draw(cursor)
        cursor += 1
        scanned += 1
        if scanned > 100 * B:
            if not dedupe:
                raise _Stop(cursor)
            scanned, dedupe = 0, False
        if len(harness.render(ex.question)) > f.max_prompt_chars:
            continue
        if dedupe:
            if ex.question in seen:
                continue
            seen[ex.question] = None
            while len(seen) > 16 * B:
                del seen[next(iter(seen))]
        out.append(ex)
    return out, cursor


@pytest.mark.parametrize("cur, steps, want", [
    ({"start": 3}, [0, 10, 1000], [3, 3, 3]),
    ({"start": 1, "end": 5, "ramp_steps": 8}, [0, 1, 2, 4, 6, 8, 100], [1, 2, 2, 3, 4, 5, 5]),
    ({"start": 6, "end": 2, "ramp_steps": 4}, [0, 1, 2, 4], [6, 5, 4, 2]),
    ({"start": 2, "end": 9, "ramp_steps": 0}, [0, 50], [2, 2]),
])
def test_difficulty_schedule(cur, steps, want):
    c = Curriculum(**cur)
    assert [curriculum.difficulty_at(c, s) for s in steps] == want == [c.difficulty_at(s) for s in steps]


def test_difficulty_is_clamped_to_the_task():
    spec = HarnessSpec(curriculum={"start": 1, "end": 12, "ramp_steps": 10})
    assert [curriculum.difficulty(spec, s, 2, 8) for s in (0, 5, 10)] == [2, 6, 8]


@pytest.mark.parametrize("task_name, d, filt, B, batches", [
    ("addition", 3, {}, 8, 3),
    ("addition", 3, {"max_prompt_chars": 7}, 8, 1),         # every 3-digit prompt is 8 characters: rejects all
    ("addition", 2, {"max_prompt_chars": 6}, 8, 3),         # keeps only the shorter 2-digit sums
    ("addition", 3, {"dedupe": True}, 16, 4),
    ("addition", 1, {"dedupe": True}, 16, 8),               # 100 questions < the memory of 16 batches: repeats again
    ("sort", 2, {"dedupe": True, "max_prompt_chars": 3}, 4, 3),
])
def test_draw_batch_equals_the_pre_move_reference(task_name, d, filt, B, batches):
    task = make_task(task_name)
    spec = HarnessSpec(filters=filt)
    draw = lambda i: task.example(Split.TRAIN, i, d)   # noqa: E731
    cur_a = cur_b = 0
    seen_a: dict[str, None] = {}
    seen_b: dict[str, None] = {}
    for _ in range(batches):
        try:
            want = _ref_draw(spec, draw, cur_b, B, seen_b)
        except _Stop as stop:
            with pytest.raises(curriculum.FiltersRejectEverything) as got:
                curriculum.draw_batch(spec, draw, cur_a, B, seen_a)
            assert got.value.cursor == stop.args[0] and seen_a == seen_b
            return
        out, cur_a = curriculum.draw_batch(spec, draw, cur_a, B, seen_a)
        assert (out, cur_a, list(seen_a)) == (want[0], want[1], list(seen_b))
        cur_b = want[1]


def test_dedupe_memory_is_bounded_and_ordered():
    seen: dict[str, None] = {}
    assert filters.remember(seen, "a", 1) and not filters.remember(seen, "a", 1)
    for q in map(str, range(100)):
        filters.remember(seen, q, 2)
    assert len(seen) == filters.DEDUPE_BATCHES * 2 and list(seen)[-1] == "99" and "a" not in seen


def test_prompt_length_filter_reads_the_rendered_prompt():
    spec = HarnessSpec(template="Q: {question}=", filters={"max_prompt_chars": 8})
    assert filters.fits_prompt(spec, "12+3") and not filters.fits_prompt(spec, "12+34")


def test_pass_band_keeps_groups_inside_the_bounds():
    rates = torch.tensor([[0.0], [0.25], [0.5], [1.0]])          # (P, 1)
    keep = filters.in_pass_band(Curriculum(pass_rate_min=0.25, pass_rate_max=0.5), rates)
    assert keep.shape == (4, 1) and keep.squeeze(-1).tolist() == [False, True, True, False]
    assert filters.in_pass_band(Curriculum(), rates).all()
