"""Harness changes: apply dotted `harness.*` fields to a harness as the live trainer does, say why
the trainer would refuse a change, and whether a change is a no-op on the live run.

    apply_changes(spec, {"harness.sampling.temperature": 0.7})            # -> HarnessSpec
    check_change(spec, {"harness.sampling.temperature": 9}, task.check_difficulty)
        # -> "harness.sampling.temperature=9: Input should be less than or equal to 5"
    noop_change(spec, changes, live_version="3f2a…")                        # -> a reason, or None

The live trainer sets fields through `apply_changes` (`Trainer.apply_overrides`: a command's
`set_fields`, a fork's overrides, a perturbation's), one key at a time, each step re-validating the
whole harness, so a change the swarm checks here is refused or accepted exactly as the trainer
would. Then the trainer checks the curriculum's start difficulty against the task's range; callers
pass the task's `check_difficulty` for that. The messages name the key and the value as the run
config's validation does (`trainer.config.format_validation_error`).

Also here, what a change of each harness field touches, for the decisions that compare arms and
rate risk: the objective (`reward`), the data trained on (`curriculum`, `filters`), or neither the
SFT targets nor the data (`template`, `sampling`).
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from harness.spec import HarnessSpec, RewardConfig
from sandboxes.errors import SwarmlabError

PREFIX = "harness."

# fields whose value says what counts as correct in training
OBJECTIVE_FIELDS = ("harness.reward.",)
# fields that change which examples are trained on
DATA_FIELDS = ("harness.curriculum.", "harness.filters.")
# fields whose number is a position (a difficulty, a step of the data source's history), not a
# magnitude: how far such a value moves says nothing of how large the change is
SOURCE_REVISION = "harness.filters.as_of_step"   # the data source read as it was before this step of the run
POSITION_FIELDS = ("harness.curriculum.", SOURCE_REVISION)
# fields that change neither the SFT targets nor the examples: the template (it wraps the same
# question; it can hold nothing but {question}) and sampling (SFT does not sample)
SAME_SFT_TARGET_FIELDS = ("harness.template", "harness.sampling.")
# the reward under which training scores an answer as the task does: the task's own verifier,
# exact credit, no shaping (the reward section's defaults)
TASK_SCORING = {f"{PREFIX}reward.{n}": f.default for n, f in RewardConfig.model_fields.items()}


class HarnessChangeError(SwarmlabError, ValueError):
    """A harness change the live trainer refuses; the message names the key and the value."""


def changes_objective(key: str) -> bool:
    return key.startswith(OBJECTIVE_FIELDS)


def changes_data(key: str) -> bool:
    return key.startswith(DATA_FIELDS)


def positional(key: str) -> bool:
    return key.startswith(POSITION_FIELDS)


def of_one_run(key: str) -> bool:
    """Whether the field's value is a step of one run's history: no value for another run."""
    return key == SOURCE_REVISION


def reads_later_data(key: str, cur: Any, new: Any) -> bool:
    """Whether setting `key` from `cur` to `new` reads data a pinned revision kept out: a later
    revision than the one pinned, or none (the source as it is now)."""
    return key == SOURCE_REVISION and isinstance(cur, int) and (new is None or (isinstance(new, int) and new > cur))


def keeps_sft_targets(key: str) -> bool:
    return key.startswith(SAME_SFT_TARGET_FIELDS)


def _describe(e: ValidationError) -> str:
    """One line per error, `harness.field=value: message`, as the run config reports it."""
    parts = []
    for err in e.errors():
        loc = ".".join(["harness"] + [str(x) for x in err["loc"]])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] in ("value_error", "assertion_error"):
            parts.append(f"{loc}: {msg}")
        elif err["type"] == "extra_forbidden":
            parts.append(f"{loc}: unknown field")
        else:
            parts.append(f"{loc}={err.get('input')!r}: {msg}")
    return "invalid config: " + "; ".join(parts)


def _as_data(spec: HarnessSpec | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(spec, HarnessSpec):
        return spec.model_dump(mode="json")
    return _validate(copy.deepcopy(dict(spec))).model_dump(mode="json")


def _validate(data: dict[str, Any]) -> HarnessSpec:
    try:
        return HarnessSpec.model_validate(data)
    except ValidationError as e:
        raise HarnessChangeError(_describe(e)) from None


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `harness.a.b` in the harness dict `data`; the field must exist (a None value counts)."""
    if not key.startswith(PREFIX):
        raise HarnessChangeError(f"not a harness field: {key!r} (a harness change sets harness.* fields)")
    *path, last = key[len(PREFIX):].split(".")
    node: Any = data
    for p in path:
        node = node.get(p) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        raise HarnessChangeError(f"unknown config field {key!r}")
    node[last] = value


def apply_changes(spec: HarnessSpec | Mapping[str, Any], changes: Mapping[str, Any], *,
                  stepwise: bool = True) -> HarnessSpec:
    """The harness with dotted `harness.*` `changes` set in order. `stepwise` (the live trainer's
    way): the whole harness re-validated after each key, so a change that passes through an invalid
    harness is refused; else validated once, at the end. Raises HarnessChangeError naming the key
    and value."""
    data = _as_data(spec)
    out = spec if isinstance(spec, HarnessSpec) else HarnessSpec.model_validate(data)
    for key, value in changes.items():
        _set(data, key, value)
        if stepwise:
            out = _validate(data)
            data = out.model_dump(mode="json")
    return out if stepwise or not changes else _validate(data)


def check_change(spec: HarnessSpec | Mapping[str, Any], changes: Mapping[str, Any],
                 check_difficulty: Callable[[int], Any] | None = None) -> str | None:
    """Why the live trainer would refuse the harness `changes` on a run with harness `spec` (its
    `set_fields`: every field re-validated, then the curriculum's start difficulty checked by the
    task's `check_difficulty`, when given), else None."""
    try:
        new = apply_changes(spec, changes)
        if check_difficulty is not None:
            check_difficulty(new.curriculum.start)
    except (ValueError, TypeError) as e:
        return str(e).replace("invalid config: ", "")
    return None


def noop_change(spec: HarnessSpec | Mapping[str, Any], changes: Mapping[str, Any],
                live_version: str | None) -> str | None:
    """Why a harness change needs no backtest (the reason, else None): applied to `spec` (the harness
    the controller knows) it makes the harness version the live run already reports (`live_version`,
    its newest metrics row's `harness_version`) — e.g. a rollback applied after the change was
    proposed restored what it wanted. The change is applied as a whole (what it makes, not the path
    there). With the live version unknown, or a harness the change cannot make, it is never a no-op."""
    if not changes or live_version is None:
        return None
    try:
        want = apply_changes(spec, changes, stepwise=False).version
    except (ValueError, TypeError):
        return None
    if want == live_version:
        return f"no backtest: the live run already is what this edit makes (harness version {want})"
    return None
