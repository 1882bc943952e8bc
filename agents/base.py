"""The operator interface: one class per operator, two policies behind one method.

    op = Diagnostics()
    diagnoses = op.diagnose(ev, ctx)              # what its detectors see (info findings included)
    proposals = op.propose(ev, ctx, llm=policy)   # LLM policy if given, built-in if it declines

`builtin(ev, ctx)` is the heuristic policy that needs no model: it runs the operator's detectors
(`agents/detectors.py`) and maps each finding to a typed Intervention. `propose` asks an LLM
policy (`agents/llm.py`, anything with `propose(operator, ev, ctx)`) first and falls back to the
built-in one when it returns None or fails. Every Intervention records the operator's name and
the policy that made it ("builtin" or what the LLM policy wrote, e.g. "llm:<model>").

Trajectory text is untrusted. The built-in policies never take a value from a sample's prompt or
completion; what an LLM policy returns is filtered here too: a kind outside the operator's tools
is dropped, and so is a change whose string value appears in the run's sampled text (unless it
is the value the controller already knows for that field).
"""
from __future__ import annotations

import abc
import logging
import math
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from agents.detection import THRESHOLDS, Known, Thresholds, run_detectors
from agents.domain import Diagnosis, Intervention, InterventionKind, Status, Target
from agents.evidence import Evidence
from agents.prompts import MIN_COPY_CHARS
from harness.spec import HarnessSpec
from trainer.config import Recipe, get_dotted

log = logging.getLogger(__name__)

BUILTIN = "builtin"



def finite(x: Any) -> float | None:
    """`x` as a float when it is a finite number (not a bool), else None."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None

class OperatorContext(BaseModel):
    """What the controller knows beyond the run's files. Plain data (it goes into LLM prompts and
    the checkpointed graph state); perturbation settings are never part of it."""

    model_config = ConfigDict(extra="forbid")
    goal: str = Field("", description="the user's free-text goal")
    target: Target = Field(default_factory=Target)
    recipe: dict[str, Any] = Field(default_factory=dict, description="the recipe as the controller last set it")
    harness: dict[str, Any] = Field(default_factory=dict, description="the harness as the controller last set it")
    start_harness: dict[str, Any] | None = Field(None, description="the goal's starting harness (template restores)")
    eval_difficulty: int | None = Field(None, description="difficulty held-out evals run at")
    min_difficulty: int = Field(1, ge=0, description="the task's lowest difficulty (curriculum edits stay above it)")
    question_chars: dict[int, float] = Field(default_factory=dict, description="the task's own fact: the median "
                                             "length in characters of a training question at each difficulty")
    question_alphabet: str = Field("", description="the task's own fact: every character its training questions "
                                   "use at any difficulty (empty: not known)")
    answer_alphabet: str = Field("", description="the task's own fact: every character its training answers (or "
                                 "solutions) use at any difficulty, where a built-in model writes them (empty: not known)")
    answer_chars: dict[int, dict[int, int]] = Field(default_factory=dict, description="the task's own fact: at each "
                                                    "difficulty, how many of its held-out answers have each length, where "
                                                    "that is the fewest tokens a right answer takes (empty: not known)")
    history: list[Intervention] = Field(default_factory=list, description="interventions so far, oldest first")
    checkpoints: list[dict[str, Any]] = Field(
        default_factory=list, description="checkpoints of the run: {'name': str, 'step': int}, any order")
    skills: list[dict[str, Any]] = Field(default_factory=list, description="retrieved skills (front matter + body)")
    episodes: list[dict[str, Any]] = Field(default_factory=list, description="past episodes of the fixes at hand "
                                           "(agents.recall.episode_summaries), from this and earlier runs")
    verify_steps: int | None = Field(None, ge=0, description="training steps verifying a fix by backtest costs (its "
                                     "arms): the most a departure's rollback may throw away; None: no bound")
    settled_since: float | None = Field(None, description="time of the controller's latest change to the live run "
                                        "(0: none yet): rows before it predate what is in force; None: not tracked, "
                                        "so the recipe and harness here are not known to be the ones in force")

    _findings: list[Diagnosis] | None = PrivateAttr(None)   # not data for prompts: a per-tick cache
    _proposed: frozenset[str] | None = PrivateAttr(None)    # likewise

    @property
    def findings(self) -> list[Diagnosis] | None:
        """Every detector's findings on this tick's evidence, when the controller computed them."""
        return self._findings

    def with_findings(self, findings: list[Diagnosis]) -> "OperatorContext":
        self._findings = list(findings)
        return self

    @property
    def proposed(self) -> frozenset[str] | None:
        """The findings the operators before this one proposed a fix for on this tick (a joint
        change's parts too), when the controller tracks them; None: not known."""
        return self._proposed

    def with_proposed(self, proposals: list[Intervention] | None) -> "OperatorContext":
        self._proposed = None if proposals is None else frozenset(
            n for iv in proposals for n in (iv.diagnosis.name, *(iv.diagnosis.evidence.get("answers") or ())))
        return self

    def known(self) -> Known:
        version, bounds, warmup = None, None, 0
        try:
            version = HarnessSpec.model_validate(self.harness).version if self.harness else None
        except ValueError:
            pass
        try:
            r = Recipe.model_validate(self.recipe) if self.recipe else None
        except ValueError:
            r = None
        if r is not None:
            bounds = (r.lr * (1.0 if r.schedule == "constant" else r.min_lr_ratio), r.lr)
            warmup = r.warmup_steps
        return Known(eval_difficulty=self.eval_difficulty, target_metric=self.target.metric,
                     target_op=self.target.op, target_threshold=self.target.threshold,
                     template=self.harness.get("template") if isinstance(self.harness.get("template"), str) else None,
                     harness_version=version, recipe_version=r.version if r is not None else None,
                     lr_bounds=bounds, warmup_steps=warmup, settled_since=self.settled_since,
                     question_chars=dict(self.question_chars) or None, answer_chars=dict(self.answer_chars) or None,
                     question_alphabet=self.question_alphabet or None, answer_alphabet=self.answer_alphabet or None)

    def get(self, dotted: str, default: Any = None) -> Any:
        """A known field by its dotted name (`recipe.lr`, `harness.sampling.max_new_tokens`)."""
        found, v = get_dotted({"recipe": self.recipe, "harness": self.harness}, dotted)
        return default if not found or v is None else v

    def checkpoint_before(self, step: int) -> dict[str, Any] | None:
        """The newest checkpoint taken at or before `step`."""
        ok = [c for c in self.checkpoints if isinstance(c.get("step"), int) and c["step"] <= step and c.get("name")]
        return max(ok, key=lambda c: c["step"]) if ok else None

    def answering_before(self, onset: Any, evals: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The newest checkpoint before step `onset` (every step from it on learnt what went wrong)
        whose weights answered held-out questions right (the last of `evals` at or before it above
        0). None when the checkpoints kept hold none."""
        if not isinstance(onset, int):
            return None
        seen = sorted(((r["step"], float(r["heldout_acc"])) for r in evals if isinstance(r.get("step"), int)
                       and isinstance(r.get("heldout_acc"), (int, float)) and math.isfinite(r["heldout_acc"])),
                      key=lambda x: x[0])
        for c in sorted(self.checkpoints, key=lambda c: -c["step"] if isinstance(c.get("step"), int) else 1):
            step = c.get("step")
            if isinstance(step, int) and step < onset and c.get("name"):
                before = [acc for s, acc in seen if s <= step]
                if before and before[-1] > 0:
                    return c
        return None


@runtime_checkable
class LLMPolicyLike(Protocol):
    """An LLM policy (agents/llm.py). Returns interventions, [] for 'nothing to do', or None to
    hand the decision to the built-in policy (no model, spend cap reached, replies malformed)."""

    def propose(self, operator: "Operator", ev: Evidence, ctx: OperatorContext) -> list[Intervention] | None: ...


def rollback_target(iv: Intervention) -> str | None:
    """The checkpoint a ROLLBACK intervention rolls back to (kept in its diagnosis' evidence)."""
    v = iv.diagnosis.evidence.get("rollback_to")
    return v if isinstance(v, str) else None


def sampled_text(ev: Evidence) -> list[str]:
    return [s[k] for s in ev.samples for k in ("prompt", "completion") if isinstance(s.get(k), str)]


def tainted(iv: Intervention, ev: Evidence, ctx: OperatorContext, min_len: int = MIN_COPY_CHARS) -> str | None:
    """The first change whose string value occurs in the run's sampled text (and is not what the
    controller already knows for that field), or None. Such a value could only have come from the
    trajectories, which are data, never instructions."""
    texts = sampled_text(ev)
    for k, v in iv.changes.items():
        if not isinstance(v, str) or len(v) < min_len:
            continue
        if v in (ctx.get(k), get_dotted(ctx.start_harness or {}, k.removeprefix("harness."))[1]):
            continue
        if any(v in t for t in texts):
            return k
    return None


class Operator(abc.ABC):
    """An operator agent. Subclasses set `name`, `role`, `tools`, `detectors` and write `builtin`."""

    name: ClassVar[str]
    role: ClassVar[str]                                   # one paragraph for LLM prompts
    tools: ClassVar[frozenset[InterventionKind]]          # the kinds it may propose
    detectors: ClassVar[tuple[str, ...]] = ()             # names in agents.detectors.DETECTORS

    def __init__(self, thresholds: Thresholds = THRESHOLDS) -> None:
        self.thresholds = thresholds
        self.last_llm_error: str | None = None

    # ---- evidence -------------------------------------------------------------------------------
    @staticmethod
    def view(ev: Evidence, ctx: OperatorContext) -> Evidence:
        """Evidence with the controller's harness/recipe filled in where the collector left them out."""
        upd = {}
        if ev.harness is None and ctx.harness:
            upd["harness"] = ctx.harness
        if ev.recipe is None and ctx.recipe:
            upd["recipe"] = ctx.recipe
        return ev.model_copy(update=upd) if upd else ev

    def diagnose(self, ev: Evidence, ctx: OperatorContext) -> list[Diagnosis]:
        """This operator's detector findings (informational ones too), stamped with its name. When
        the controller already ran every detector on this evidence (`ctx.findings`, same default
        thresholds), those findings are used instead of running them again."""
        pre = ctx.findings if self.thresholds is THRESHOLDS else None
        if pre is not None:
            by = {d.name: d for d in pre}
            found = [by[n] for n in self.detectors if n in by]
        else:
            found = run_detectors(self.view(ev, ctx), self.detectors, self.thresholds, ctx.known())
        return [d.model_copy(update={"operator": self.name, "policy": BUILTIN}) for d in found]

    # ---- policies -------------------------------------------------------------------------------
    @abc.abstractmethod
    def builtin(self, ev: Evidence, ctx: OperatorContext) -> list[Intervention]:
        """The heuristic policy: detectors → typed interventions. Never reads values from samples."""

    def propose(self, ev: Evidence, ctx: OperatorContext, llm: LLMPolicyLike | None = None) -> list[Intervention]:
        """The LLM policy's proposals when it gives any (filtered to this operator's tools, text from
        trajectories refused), else the built-in policy's."""
        self.last_llm_error = None
        if llm is not None:
            try:
                out = llm.propose(self, ev, ctx)
            except Exception as e:  # a boundary: a failing LLM policy becomes a recorded fallback
                self.last_llm_error = f"{type(e).__name__}: {e}"
                log.warning("%s: LLM policy failed, built-in policy decides: %s", self.name, self.last_llm_error)
                out = None
            if out is not None:
                return self._accept_llm(out, ev, ctx)
        return self.builtin(ev, ctx)

    def _accept_llm(self, out: list[Intervention], ev: Evidence, ctx: OperatorContext) -> list[Intervention]:
        kept = []
        for iv in out:
            if iv.kind not in self.tools:
                log.warning("%s: dropped an LLM proposal of kind %s (not one of its tools)", self.name, iv.kind.value)
                continue
            field = tainted(iv, ev, ctx)
            if field is not None:
                log.warning("%s: dropped an LLM proposal: %s takes its value from trajectory text", self.name, field)
                continue
            policy = iv.policy if iv.policy.startswith("llm") else "llm"
            kept.append(iv.model_copy(update={
                "operator": self.name, "policy": policy,
                "diagnosis": iv.diagnosis.model_copy(update={"operator": self.name, "policy": policy})}))
        return kept

    # ---- building interventions -----------------------------------------------------------------
    def intervention(self, kind: InterventionKind, diagnosis: Diagnosis, changes: dict[str, Any], *,
                     rationale: str, risk, expected_effect: str, backtest_skipped: str | None = None,
                     rollback_to: str | None = None) -> Intervention:
        assert kind in self.tools, f"{self.name} may not propose {kind.value}"
        d = diagnosis.model_copy(update={"operator": self.name, "policy": BUILTIN})
        if rollback_to is not None:
            d = d.model_copy(update={"evidence": {**d.evidence, "rollback_to": rollback_to}})
        return Intervention(kind=kind, changes=changes, diagnosis=d, rationale=rationale, risk=risk,
                            expected_effect=expected_effect, operator=self.name, policy=BUILTIN,
                            backtest_skipped=backtest_skipped)


PENDING = (Status.PROPOSED, Status.BACKTESTING, Status.VALIDATED, Status.AWAITING_APPROVAL)
IN_EFFECT = (Status.APPLIED, Status.EVALUATING, Status.KEPT)
FAILED = (Status.REJECTED, Status.ROLLED_BACK)
