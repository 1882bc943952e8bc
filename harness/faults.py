"""Harness faults: the named ways a single-turn harness is broken for evaluation, each a set of
dotted `harness.*` fields. The trainer's perturbations (`trainer/perturb.py`) apply them silently
as `override` faults under these names; the benchmark's scenario generator composes the same
mechanism. Every one names only fields the harness spec has, with values it accepts
(tests/test_harness_faults.py).
"""
from __future__ import annotations

from typing import Any

HARNESS_FAULTS: dict[str, dict[str, Any]] = {
    # a format spec left on the placeholder: the prompt keeps only the question's first 3
    # characters (for 2-digit addition "12+34=" becomes "12+=": the second operand is gone)
    "broken_template": {"harness.template": "{question:.3}="},
    # problems harder than the model can start on
    "too_hard": {"harness.curriculum.start": 8, "harness.curriculum.end": 8},
    # sampling so cold that a GRPO group has no reward variance
    "low_temperature": {"harness.sampling.temperature": 0.05},
    # completions cut off before the answer is closed
    "truncation": {"harness.sampling.max_new_tokens": 2},
    # the exploitable training verifier (harness/reward.py `digits_any_order`)
    "reward_hack": {"harness.reward.verifier": "digits_any_order"},
}
