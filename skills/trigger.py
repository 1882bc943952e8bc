"""Declarative skill triggers: when a skill applies, as data evaluated in-process (no code runs).

A trigger lives in a skill's front matter (`swarmlab.trigger`) and reads an *evidence view*, the
JSON dict the controller builds for each tick (agents.recall.evidence_view):

    {"metrics": [{"step": 40, "truncation_rate": 0.8, ...}, ...],   # oldest first
     "diagnoses": [{"name": "truncation", "severity": "warning", "evidence": {...}}],
     "recipe": {...}, "harness": {...}, "task": "addition"}

    trigger:
      diagnosis: truncation                  # a finding with this name (or any of a list) is present
      all: [{metric: truncation_rate, op: ">=", value: 0.5, window: 5}]   # every condition holds
      any: [{metric: loss, op: nonfinite}]   # at least one condition holds (when given)

    fires({"diagnosis": "truncation"}, view)  # -> bool

A condition compares the mean of the metric over the last `window` rows that carry it. A metric
no row carries makes its condition false. Values may be numbers or the strings "nan", "inf",
"-inf" (how evidence views write non-finite numbers); a NaN mean fails every comparison (an
infinite one compares as infinity does), and op "nonfinite" is true when any value in the window is non-finite. `fires` never raises for
a malformed evidence view: what it cannot read does not hold.
"""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Op = Literal[">=", "<=", ">", "<", "nonfinite"]
OPS: tuple[str, ...] = (">=", "<=", ">", "<", "nonfinite")
_NONFINITE_TEXT = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf}


class Condition(BaseModel):
    """One metric condition: mean(metric over the last `window` rows carrying it) `op` `value`."""

    model_config = ConfigDict(strict=True, extra="forbid")

    metric: str = Field(min_length=1, description="a column of the metric rows, e.g. truncation_rate")
    op: Op = Field(description="comparison of the window mean with value; 'nonfinite': any value non-finite")
    value: float | None = Field(None, description="threshold (required for every op but 'nonfinite')")
    window: int = Field(5, ge=1, description="newest rows carrying the metric that the mean is taken over")

    @model_validator(mode="after")
    def _value_needed(self) -> "Condition":
        if self.op != "nonfinite" and self.value is None:
            raise ValueError(f"value: op {self.op!r} needs a value")
        return self


class TriggerSpec(BaseModel):
    """When a skill applies. Every part that is given must hold; at least one part is required."""

    model_config = ConfigDict(strict=True, extra="forbid")

    diagnosis: str | list[str] | None = Field(
        None, description="a detector finding with this name (or any of these names) is in the evidence")
    all: list[Condition] = Field(default_factory=list, description="conditions that must all hold")
    any: list[Condition] = Field(default_factory=list, description="conditions of which one must hold (if given)")

    @model_validator(mode="after")
    def _not_empty(self) -> "TriggerSpec":
        names = self.diagnosis_names()
        if not names and not self.all and not self.any:
            raise ValueError("a trigger needs a diagnosis or at least one condition (an empty trigger would always fire)")
        if isinstance(self.diagnosis, list) and (not names or any(not n for n in names)):
            raise ValueError("diagnosis: a list of non-empty names")
        if isinstance(self.diagnosis, str) and not self.diagnosis:
            raise ValueError("diagnosis: must be a non-empty name")
        return self

    def diagnosis_names(self) -> list[str]:
        if self.diagnosis is None:
            return []
        return [self.diagnosis] if isinstance(self.diagnosis, str) else list(self.diagnosis)


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        return _NONFINITE_TEXT.get(v.strip().lower())
    return None


def window_values(evidence: dict[str, Any], metric: str, window: int) -> list[float]:
    """The metric's values in the newest `window` rows that carry it (oldest first)."""
    rows = evidence.get("metrics") if isinstance(evidence, dict) else None
    if not isinstance(rows, list):
        return []
    vals: list[float] = []
    for row in reversed(rows):
        if len(vals) >= window:
            break
        if isinstance(row, dict):
            x = _number(row.get(metric))
            if x is not None:
                vals.append(x)
    return vals[::-1]


def holds(cond: Condition, evidence: dict[str, Any]) -> bool:
    vals = window_values(evidence, cond.metric, cond.window)
    if not vals:
        return False
    if cond.op == "nonfinite":
        return any(not math.isfinite(v) for v in vals)
    mean = sum(vals) / len(vals)      # nan if any value is nan (or +inf meets -inf): no comparison holds
    if math.isnan(mean):
        return False
    assert cond.value is not None, "validated: every op but nonfinite has a value"
    return {">=": mean >= cond.value, "<=": mean <= cond.value,
            ">": mean > cond.value, "<": mean < cond.value}[cond.op]


def diagnosis_names(evidence: dict[str, Any]) -> set[str]:
    found = evidence.get("diagnoses") if isinstance(evidence, dict) else None
    if not isinstance(found, list):
        return set()
    return {d["name"] for d in found if isinstance(d, dict) and isinstance(d.get("name"), str)}


def fires(trigger: dict[str, Any] | TriggerSpec, evidence: dict[str, Any]) -> bool:
    """Whether `trigger` holds on `evidence`. A dict trigger is validated first (ValueError if bad)."""
    spec = trigger if isinstance(trigger, TriggerSpec) else TriggerSpec.model_validate(trigger)
    names = spec.diagnosis_names()
    if names and not (set(names) & diagnosis_names(evidence)):
        return False
    if not all(holds(c, evidence) for c in spec.all):
        return False
    if spec.any and not any(holds(c, evidence) for c in spec.any):
        return False
    return True
