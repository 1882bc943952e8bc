"""Harness spec: everything outside the weights that shapes trajectories and the learning signal.

The prompt template, how the answer is written and extracted, sampling parameters, the reward
configuration, the curriculum and data filters. A harness is versioned by the SHA-256 of its
canonical JSON (`HarnessSpec.version`), so two runs with the same version saw the same harness.
Only interventions change it (`harness_edit`, `data_change`); the trainer switches versions at a safe point.

This module declares the harness; what it does lives beside it: rendering and answer parsing in
`harness/render.py`, verifier choice and reward shaping in `harness/reward.py`, the filters in
`harness/filters.py`, the difficulty schedule and batch draw in `harness/curriculum.py`, change
validation and no-op checks in `harness/changes.py`.
"""
from __future__ import annotations

import hashlib
import json
import re
import string
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.curriculum import difficulty_at
from harness.render import extract_answer, render_answer, render_prompt


class _Strict(BaseModel):
    # allow_inf_nan=False: every float setting is finite; `.inf`/`.nan` is refused naming the field
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class AnswerFormat(_Strict):
    """How the answer sits in the completion. `regex` must have one capture group; the last match
    wins. `stop` ends generation once emitted (the closing delimiter)."""

    regex: str = Field(r"^\s*(\S+?)\s*$", description="regex with one group capturing the answer; last match wins")
    stop: str | None = Field("\n", description="text that ends generation (e.g. the closing tag); None = only max_new_tokens")
    prefix: str = Field("", description="text a well-formed completion writes before the answer (e.g. the opening tag)")
    reverse_digits: bool = Field(
        False, description="the answer is written with its digits reversed (easier for small models on arithmetic)"
    )

    @field_validator("regex")
    @classmethod
    def _one_group(cls, v: str) -> str:
        try:
            pat = re.compile(v, re.S)
        except re.error as e:
            raise ValueError(f"answer.regex {v!r} does not compile: {e}") from None
        if pat.groups != 1:
            raise ValueError(f"answer.regex {v!r} must have exactly one capture group, has {pat.groups}")
        return v

    def extract(self, completion: str) -> str | None:
        """The answer in `completion` (`harness.render.extract_answer`)."""
        return extract_answer(self, completion)

    def render(self, answer: str) -> str:
        """The completion a perfect policy writes for `answer` (SFT targets)."""
        return render_answer(self, answer)


class Sampling(_Strict):
    temperature: float = Field(1.0, ge=0.0, le=5.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling: keep the smallest set of tokens with this "
                         "much probability (1 = all)")
    max_new_tokens: int = Field(16, ge=1, le=4096, description="longest completion in tokens; a longer one is cut off")


class RewardConfig(_Strict):
    """`exact`: 1 for a correct answer. `partial`: the task's graded credit where it has one.
    `format_bonus`: reward for a well-formed but wrong answer (shaping). `verifier` names the
    verifier; `digits_any_order` is a deliberately exploitable one used by the reward_hack
    perturbation (it accepts the right digits in any order)."""

    kind: Literal["exact", "partial"] = Field("exact", description="exact: 1 for a correct answer; partial: the task's "
                                              "graded credit where it has one")
    format_bonus: float = Field(0.0, ge=0.0, le=0.5, description="reward for a well-formed but wrong answer (shaping)")
    verifier: Literal["task", "digits_any_order"] = Field("task", description="the task's verifier, or digits_any_order: "
                                                          "deliberately exploitable (the reward_hack fault)")


class Curriculum(_Strict):
    """Difficulty schedule: linear from `start` to `end` over `ramp_steps` train steps (0 = fixed at
    `start`). `pass_rate_filter`: drop prompts whose group pass rate is outside [min, max] from the
    GRPO update (all-correct or all-wrong groups carry no advantage signal)."""

    start: int = Field(3, ge=1, le=64, description="training difficulty at step 0 (e.g. digits for addition)")
    end: int | None = Field(None, ge=1, le=64, description="difficulty after ramp_steps; None = start")
    ramp_steps: int = Field(0, ge=0, description="steps of the linear ramp from start to end (0 = fixed at start)")
    pass_rate_min: float = Field(0.0, ge=0.0, le=1.0, description="GRPO: drop prompts whose group pass rate is below this")
    pass_rate_max: float = Field(1.0, ge=0.0, le=1.0, description="GRPO: drop prompts whose group pass rate is above this "
                                 "(all-correct groups carry no advantage signal)")

    @model_validator(mode="after")
    def _check(self) -> "Curriculum":
        if self.pass_rate_min > self.pass_rate_max:
            raise ValueError(
                f"curriculum.pass_rate_min={self.pass_rate_min} > curriculum.pass_rate_max={self.pass_rate_max}"
            )
        return self

    def difficulty_at(self, step: int) -> int:
        """The schedule's difficulty at `step` (`harness.curriculum.difficulty_at`)."""
        return difficulty_at(self, step)


class DataFilters(_Strict):
    max_prompt_chars: int = Field(512, ge=1, description="skip examples whose rendered prompt is longer")
    dedupe: bool = Field(False, description="skip examples whose question the run trained on in its last 16 batches "
                         "(a task with fewer questions than that takes repeats again rather than stopping)")
    check_labels: bool = Field(False, description="SFT: skip examples whose label, written as this harness writes a "
                               "target and read back as it reads a completion, the task's own verifier does not accept "
                               "(a label the run would learn wrong); tasks verified in a sandbox are not checked")
    as_of_step: int | None = Field(None, ge=1, description="read the data source as it was before this step of the run "
                                   "(a pinned revision: a change made to the source at or after it is not read); "
                                   "None reads the source as it is now")


# fields added after versions were recorded: at their default they stay out of the content hash,
# so a spec that does not set them keeps the version it always had
UNHASHED_DEFAULTS = {("filters", "check_labels"): False, ("filters", "as_of_step"): None}


TEMPLATE_MAX_CHARS = 8192      # a prompt template, before the question goes in
FORMAT_MAX_WIDTH = 4096        # width or precision in {question:...} (one number per character rendered)


class HarnessSpec(_Strict):
    template: str = Field("{question}=", description="prompt template; must contain {question}")
    answer: AnswerFormat = Field(default_factory=AnswerFormat, description="how the answer is written and extracted")
    sampling: Sampling = Field(default_factory=Sampling, description="how completions are sampled during training")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="how a completion is scored")
    curriculum: Curriculum = Field(default_factory=Curriculum, description="the difficulty schedule and the pass-rate filter")
    filters: DataFilters = Field(default_factory=DataFilters, description="which training examples are skipped")

    @field_validator("template")
    @classmethod
    def _has_question(cls, v: str) -> str:
        if len(v) > TEMPLATE_MAX_CHARS:
            raise ValueError(f"template of {len(v)} characters: at most {TEMPLATE_MAX_CHARS}")
        shown = v if len(v) <= 80 else v[:77] + "..."
        try:
            parts = [(f, spec) for _, f, spec, _ in string.Formatter().parse(v) if f is not None]
        except ValueError as e:
            raise ValueError(f"template {shown!r} does not parse as a format string: {e}") from None
        for f, spec in parts:
            if f != "question":
                raise ValueError(f"template {shown!r} has a placeholder other than {{question}}: {{{f}}}")
            # checked before formatting: "{question:1000000000}" would allocate a gigabyte here
            # and at every render; a nested field ("{question:{question}}") takes its spec from
            # the question itself, which is different for every example
            if "{" in spec or "}" in spec:
                raise ValueError(f"template {shown!r}: the format spec {spec!r} of {{question}} has a nested field")
            big = [int(n) for n in re.findall(r"\d+", spec) if int(n) > FORMAT_MAX_WIDTH]
            if big:
                raise ValueError(f"template {shown!r}: width/precision {big[0]} in {{question:{spec}}} is more than "
                                 f"{FORMAT_MAX_WIDTH}")
        try:
            v.format(question="x")
        except (KeyError, IndexError, ValueError, AttributeError, TypeError) as e:
            raise ValueError(f"template {shown!r} does not format: {e}") from None
        if not parts:   # a format spec or conversion is allowed: {question!r}, {question:>8}
            raise ValueError(f"template {shown!r} must contain the placeholder {{question}}")
        return v

    def render(self, question: str) -> str:
        """The prompt for `question` (`harness.render.render_prompt`)."""
        return render_prompt(self.template, question)

    @property
    def version(self) -> str:
        data = self.model_dump(mode="json")
        for (section, name), default in UNHASHED_DEFAULTS.items():
            if data[section].get(name) == default:
                del data[section][name]
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]
