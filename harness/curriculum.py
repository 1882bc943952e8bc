"""Curriculum: what the run trains on next — the difficulty the schedule asks for at a step, and the
batch drawn at it from the data stream through the harness's filters.

    d = difficulty(spec, step, lo=task.min_difficulty, hi=task.max_difficulty)
    examples, cursor = draw_batch(spec, lambda i: stream(i, d), cursor, batch_size, seen)

The schedule is linear from `curriculum.start` to `curriculum.end` over `ramp_steps` (0 = fixed
at `start`), clamped to the task's range. The stream is the trainer's (the train split as its
data pipeline hands it over, data faults included): the harness only walks it from the cursor,
skipping what the filters reject (`harness/filters.py`). Nothing here is random: the batch is a
function of (spec, cursor, dedupe memory), so a resumed or forked run draws the same one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from harness.filters import fits_prompt, remember
from sandboxes.errors import SwarmlabError

if TYPE_CHECKING:
    from harness.spec import Curriculum, HarnessSpec

class Drawn(Protocol):
    question: str


Ex = TypeVar("Ex", bound=Drawn)

# draws per example of a batch before the filters count as rejecting everything
SCAN_LIMIT = 100


class FiltersRejectEverything(SwarmlabError, RuntimeError):
    """The filters skipped `SCAN_LIMIT` × batch size drawn examples in a row (with dedupe, once more
    after letting repeats in again): no batch can be made. `cursor` is the stream position reached."""

    def __init__(self, message: str, cursor: int) -> None:
        super().__init__(message)
        self.cursor = cursor


def difficulty_at(curriculum: Curriculum, step: int) -> int:
    """The schedule's difficulty at train step `step` (not clamped to a task's range)."""
    end = curriculum.end if curriculum.end is not None else curriculum.start
    if curriculum.ramp_steps <= 0 or end == curriculum.start:
        return curriculum.start
    frac = min(1.0, step / curriculum.ramp_steps)
    return int(round(curriculum.start + frac * (end - curriculum.start)))


def difficulty(spec: HarnessSpec, step: int, lo: int, hi: int) -> int:
    """The difficulty examples are drawn at on step `step`: the schedule's, clamped to [lo, hi]."""
    return min(max(difficulty_at(spec.curriculum, step), lo), hi)


def draw_batch(spec: HarnessSpec, draw: Callable[[int], Ex], cursor: int, size: int,
               seen: dict[str, None]) -> tuple[list[Ex], int]:
    """(`size` examples the filters admit, the cursor after the last one drawn), walking
    `draw(index)` from `cursor`. With dedupe on, `seen` (the dedupe memory) is updated in place; a
    question space smaller than that memory makes the batch take repeats again rather than fail.
    Raises FiltersRejectEverything when no batch can be made."""
    out: list[Ex] = []
    scanned, dedupe = 0, spec.filters.dedupe
    while len(out) < size:
        ex = draw(cursor)
        cursor += 1
        scanned += 1
        if scanned > SCAN_LIMIT * size:
            if not dedupe:
                raise FiltersRejectEverything(
                    f"the data filters rejected {SCAN_LIMIT * size} examples in a row (filters.max_prompt_chars="
                    f"{spec.filters.max_prompt_chars})", cursor)
            scanned, dedupe = 0, False
        if not fits_prompt(spec, ex.question):
            continue
        if dedupe and not remember(seen, ex.question, size):
            continue
        out.append(ex)
    return out, cursor
