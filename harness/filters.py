"""Filters: every rule of the harness that keeps data out of training, wherever its knob sits in the
spec.

Before a step (`filters` section), on each drawn example: a prompt longer than
`max_prompt_chars` is skipped, and with `dedupe` a question trained on in the last
`DEDUPE_BATCHES` batches is skipped. Inside a GRPO step (`curriculum.pass_rate_min/max`): a
group whose pass rate is outside the band is dropped from the loss (all-correct or all-wrong groups
carry no advantage signal; DAPO's dynamic sampling without the resampling).

    fits_prompt(spec, question)              # the length filter
    remember(seen, question, batch_size)     # the dedupe filter (updates its memory)
    in_pass_band(spec.curriculum, rates)     # (P, 1) bool tensor from (P, 1) pass rates
    labels_verify(task, spec, examples, labels)  # which SFT labels the task's verifier accepts

Inside an SFT step (`filters.check_labels`): a label the task's own verifier does not accept, once
written as the harness writes a target and read back as it reads a completion, is dropped. The
trainer logs the share that pass (`label_ok`) on every SFT step whether the filter is on or not:
the evidence that a data source's labels went wrong.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.render import render_prompt, sft_target
from harness.reward import CORRECT, verify_all

if TYPE_CHECKING:
    from harness.spec import Curriculum, HarnessSpec

# the dedupe filter remembers the questions of this many batches: a pool that repeats within them
# is dropped, while a small task's whole question space is not used up (a run of days keeps no more)
DEDUPE_BATCHES = 16


def fits_prompt(spec: HarnessSpec, question: str) -> bool:
    """Whether the rendered prompt of `question` is within `filters.max_prompt_chars`."""
    return len(render_prompt(spec.template, question)) <= spec.filters.max_prompt_chars


def remember(seen: dict[str, None], question: str, batch_size: int) -> bool:
    """The dedupe filter: False when `question` is in `seen` (the newest questions, oldest first);
    else True, with `question` remembered and the memory cut to `DEDUPE_BATCHES` batches of
    `batch_size`."""
    if question in seen:
        return False
    seen[question] = None
    while len(seen) > DEDUPE_BATCHES * batch_size:
        del seen[next(iter(seen))]
    return True


def in_pass_band(curriculum: Curriculum, rates: Any) -> Any:
    """Which groups the GRPO loss keeps: pass rate within [pass_rate_min, pass_rate_max]. `rates` is
    an array (a torch tensor, shape (P, 1)); the result is the boolean array of the same shape."""
    return (rates >= curriculum.pass_rate_min) & (rates <= curriculum.pass_rate_max)


def labels_verify(task: Any, spec: HarnessSpec, examples: list[Any], labels: list[str]) -> list[bool | None] | None:
    """For each (example, label): whether the task's verifier accepts the label written as the
    harness writes an SFT target (`sft_target`) and read back with its answer parser, checked
    against the answer the task works out again from the question (`Task.reference`), never the
    stored one (a source that gets a label wrong may get its stored answer wrong too); None for an
    example whose answer the task cannot work out. None for the whole batch when the task is
    verified in a sandbox (`verify_many`: running code for every label of every step costs more
    than the step) or has no `reference`."""
    if hasattr(task, "verify_many") or not hasattr(task, "reference"):
        return None
    refs = [task.reference(ex) for ex in examples]
    idx = [i for i, r in enumerate(refs) if r is not None]
    targets = [sft_target(spec, labels[i]) for i in idx]
    verdicts = verify_all(task, spec, [refs[i] for i in idx], targets, [False] * len(idx))
    out: list[bool | None] = [None] * len(examples)
    for i, r in zip(idx, verdicts):
        out[i] = r.verdict == CORRECT
    return out
