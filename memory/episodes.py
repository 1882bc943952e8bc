"""An episode: one evaluated intervention — what the swarm saw (diagnosis and the metric window),
what it changed, and what that did — the unit the swarm learns from across runs.

`document()` is the text that gets embedded (so "answers cut off … raise max_new_tokens" finds
past truncation fixes); `metadata()` is the flat scalar view that `where` filters run on.
JSON here keeps NaN/Infinity (`allow_nan=True`): a metric window may hold a NaN loss, and that is
evidence, not an error.
"""
from __future__ import annotations

import json
import math
import time
from typing import Any, Literal

from pydantic import BaseModel, Field


def _plain(o: Any) -> Any:
    """numpy scalars and arrays (common in metric windows) as Python values; anything else as str."""
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def dumps(obj: Any) -> str:
    """Canonical JSON (sorted keys, NaN kept) — the log format and the identity of a record."""
    return json.dumps(obj, allow_nan=True, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                      default=_plain)


def signature(diagnosis: str, kind: str, changes: dict[str, Any]) -> str:
    """`"<diagnosis>|<kind>|<sorted comma-joined change keys>"`: what kind of fix for what problem."""
    return f"{diagnosis}|{kind}|{','.join(sorted(changes))}"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, allow_nan=True, sort_keys=True)[:200]
    return str(v)


class Episode(BaseModel, extra="forbid"):
    id: str = Field(description='"<workspace>/<intervention id>"')
    workspace: str
    task: str = Field(description='task family, e.g. "addition"')
    operator: str
    policy: str
    diagnosis: str = Field(description='detector name, e.g. "truncation"')
    diagnosis_summary: str = ""
    severity: str = "warning"
    kind: str = Field(description='intervention kind, e.g. "harness_edit"')
    changes: dict[str, Any] = {}
    before: dict[str, Any] = Field({}, description="the changed fields' values in force when the intervention was applied "
                                   "(as the live run published them), where recorded: a field set to the value it had is no part of the fix")
    signature: str = Field(description='"<diagnosis>|<kind>|<sorted comma-joined change keys>"')
    outcome: Literal["kept", "rolled_back", "rejected"]
    effect: float | None = Field(None, description="backtest effect (+ = better) or measured effect after applying")
    p_value: float | None = None
    metric: str = "heldout_acc"
    window: dict[str, Any] = Field({}, description="the evidence view at proposal time (any JSON; NaN allowed)")
    skills_used: list[str] = []
    worker_cpu_s: float | None = Field(None, description="CPU spent on this intervention's backtest, if known")
    measured_nothing: bool = Field(False, description="rejected after a backtest whose arms all measured the same bound of a "
                                   "rate (all 0 or all 1): no evidence either way (not a loss)")
    inconclusive: bool = Field(False, description="rejected after a backtest that found no credible harm (a gain or a loss "
                               "too small to tell), before the fix's longer retries ran out: not a loss")
    step: int = 0
    time: float = Field(default_factory=time.time)

    def won(self) -> bool:
        return self.outcome == "kept"

    def lost(self) -> bool:
        """Rolled back, or rejected without a positive effect. A rejected backtest with a positive
        effect (not significant, say), one whose arms all measured the same bound of a rate, or one
        that found no credible harm (`inconclusive`) is inconclusive: neither won nor lost."""
        if self.outcome == "rolled_back":
            return True
        if self.outcome == "rejected" and (self.measured_nothing or self.inconclusive):
            return False
        if self.outcome == "rejected":
            return self.effect is None or not self.effect > 0  # NaN counts as no effect
        return False

    def document(self) -> str:
        changes = ", ".join(f"{k} = {_fmt(v)}" for k, v in sorted(self.changes.items())) or "no changes"
        diag = f"Diagnosis: {self.diagnosis} ({self.severity})"
        if self.diagnosis_summary:
            diag += f": {self.diagnosis_summary}"
        result = f"Outcome: {self.outcome.replace('_', ' ')}"
        if self.effect is not None:
            result += f", effect on {self.metric} {self.effect:+.4g}"
        if self.p_value is not None:
            result += f" (p = {self.p_value:.3g})"
        return "\n".join([f"Task: {self.task}.", diag + ".", f"Intervention: {self.kind}: {changes}.",
                          result + "."])

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "workspace": self.workspace, "task": self.task, "operator": self.operator,
            "policy": self.policy, "diagnosis": self.diagnosis, "kind": self.kind,
            "signature": self.signature, "outcome": self.outcome, "step": self.step,
            "time": self.time, "skills_used": ",".join(self.skills_used),
        }
        if self.effect is not None and math.isfinite(self.effect):
            meta["effect"] = self.effect
        return meta

    def dump(self) -> str:
        """One log line (canonical JSON, NaN kept)."""
        return dumps(self.model_dump())
