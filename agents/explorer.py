"""Exploration: a proposer for a run that is stuck when no detector names a cause.

    Explorer().builtin(ev, ctx)   # [] or one candidate change, the next untried one

A run that is not learning (`not_learning`) or has stopped improving below its target (`plateau`)
while no other finding names a cause (a truncation, a divergence, a config that left what the
controller set, …) gets a targeted search: the fields the trainer declares tunable
(`trainer.config.TUNABLE`, most sensitive first) each moved in both directions from the value in
force, one candidate per tick, each backtested against doing nothing and judged like any other
intervention. It is the explore step of population-based training, gated by the decision model:
a candidate that measures no gain is rejected, its arms counted as spent, and the next one is
proposed. A run whose weights are worth nothing (it never learnt, or its held-out is at the
not-learning level with the weights grown far past their untrained size; its untrained checkpoint
kept: `agents.operators.worthless_weights`) is explored from that checkpoint: the damage is in
the weights, so each candidate rolls back to the start. Candidates tried before in this run (same fields and values)
are skipped, so the search moves on instead of repeating itself; a fix kept moves the search's
centre, and the candidates are computed again from the new values, bracketed by the value the fix
moved away from (`moves`): a run stuck again after a move in one direction gets the move back
first, short of where it came from. A cause whose every fix in this run failed holds the search back
no longer. Nor does one whose fix's backtest measured nothing (every arm at the same bound of the
target: something else holds the run there too); then each candidate carries that fix, as two faults
of the data are fixed together: either alone leaves the other in force and measures nothing.
"""
from __future__ import annotations

import math
from typing import Any

from agents.base import IN_EFFECT, PENDING, Operator, OperatorContext, rollback_target
from agents.detection import run_detectors
from agents.domain import Diagnosis, Intervention, InterventionKind as K, Risk
from agents.evidence import Evidence
from agents.operators import (ClusterOps, DataCuration, Diagnostics, HarnessCritic, held_at_floor, inconclusive,
                              settled_fix, worthless_weights)
from trainer.config import TUNABLE, Tunable
from trainer.runlog import INIT_CHECKPOINT

STUCK = ("not_learning", "plateau")             # symptoms: the run is stuck, not why
# a finding another operator acts on names a cause, unless it is informational (a slower step, a resume):
# then that operator's fix goes, not a search
CAUSES = frozenset(n for op in (ClusterOps, DataCuration, Diagnostics, HarnessCritic) for n in op.detectors) - set(STUCK)
LR_UP, LR_DOWN = 3.0, 10.0                      # the lr: x3 up (not a large move for assign_risk), /10 down
SIZE_FACTOR = 2.0                               # integer sizes: x2 and /2
TEMPERATURE_STEP = 0.3
KIND = {"recipe.": K.RECIPE_EDIT, "harness.curriculum.": K.DATA_CHANGE, "harness.": K.HARNESS_EDIT}


def moves(t: Tunable, cur: float, came_from: float | None = None) -> list[float]:
    """The two candidate values of one tunable field around its value in force (up first for the
    sampling temperature, down first otherwise), within the field's range, without the value itself.
    `came_from`: the value a kept change of this run moved the field from, which left the run stuck
    again. That value was worse than none, so it bounds the search: the move back towards it comes
    first and stops short of it (halfway, on the field's scale, where the usual step would reach or
    pass it) — a line search that brackets, instead of going on in the direction that did not cure it."""
    if t.field == "recipe.lr":
        out = [cur / LR_DOWN, cur * LR_UP]
    elif t.field == "harness.sampling.temperature":
        out = [cur + TEMPERATURE_STEP, cur - TEMPERATURE_STEP]
    elif t.field.startswith("harness.curriculum."):
        out = [cur - 1, cur + 1]
    else:
        out = [cur / SIZE_FACTOR, cur * SIZE_FACTOR]
    if came_from is not None and came_from != cur:
        back = [v for v in out if (v > cur) == (came_from > cur)]
        away = [v for v in out if v not in back]
        geometric = t.field == "recipe.lr" or not (t.field == "harness.sampling.temperature"
                                                   or t.field.startswith("harness.curriculum."))
        mid = (math.sqrt(cur * came_from) if geometric and cur > 0 and came_from > 0 else (cur + came_from) / 2)
        out = [v if abs(v - cur) < abs(came_from - cur) else mid for v in back] + away
        # a bracket narrower than a quarter of the field's own step: the backtest cannot tell such
        # values apart, so the search does not go on inside it
        step = (min(LR_UP, LR_DOWN) if t.field == "recipe.lr" else SIZE_FACTOR) if geometric else \
            (TEMPERATURE_STEP if t.field == "harness.sampling.temperature" else 1.0)
        far = (lambda v: v > 0 and cur > 0 and abs(math.log(v / cur)) >= math.log(step) / 4) if geometric else \
            (lambda v: abs(v - cur) >= step / 4)
        out = [v for v in out if far(v)]
    vals = []
    for v in out:
        v = min(max(v, t.lo), t.hi)
        v = int(round(v)) if t.integer else float(f"{v:.6g}")
        if v != cur and v != came_from and v not in vals:
            vals.append(v)
    return vals


def came_from(ctx: OperatorContext, field: str) -> float | None:
    """The value the newest change of this run still in effect moved `field` from, if it moved it."""
    for iv in reversed(ctx.history):
        if iv.status in IN_EFFECT and field in iv.changes:
            v = (iv.outcome.before or {}).get(field)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return None


def candidates(ctx: OperatorContext, algorithm: str) -> list[dict[str, Any]]:
    """Every single-field change of the search, in order (field by sensitivity, then direction)."""
    out = []
    for t in TUNABLE:
        if t.algorithms and algorithm not in t.algorithms:
            continue
        cur = ctx.get(t.field)
        if isinstance(cur, bool) or not isinstance(cur, (int, float)):
            continue
        lowest = ctx.min_difficulty if t.field.startswith("harness.curriculum.") else t.lo
        out += [{t.field: v} for v in moves(t, cur, came_from(ctx, t.field)) if v >= lowest]
    return out


def spent(history: list[Intervention], finding: str) -> bool:
    """Whether the newest fix for `finding` failed for good (`settled_fix`, with evidence against it
    or out of retries): the cause it names is then no reason to hold the search back, or one false
    finding would stop it for good. A fix waiting for its retry over a longer horizon is not spent."""
    last = settled_fix(history, finding)
    return last is not None and not inconclusive(last)


def take_fix(fix: Intervention, changes: dict[str, Any], held: set[str], to: set[str | None],
             taken: set[str] = frozenset()) -> bool:
    """Add a fix held at the floor (`held_at_floor`) to a change being built: its fields to `changes`,
    the causes it answers to `held`, the checkpoint it rolls back to to `to`. False, with nothing
    added, where its fields clash with `changes` or `taken`, or it rolls back to another checkpoint
    than the one `to` holds: no one change carries both."""
    target = {rollback_target(fix)} if fix.kind == K.ROLLBACK else set()
    if set(fix.changes) & (set(changes) | set(taken)) or (target and to and to != target):
        return False
    changes.update(fix.changes)
    held |= {fix.diagnosis.name, *(fix.diagnosis.evidence.get("answers") or ())}
    to |= target
    return True


def has_fix(ctx: OperatorContext, finding: str) -> bool:
    """Whether a fix for `finding` goes on: one proposed on this tick by the operators before the
    search (`ctx.proposed`), or one pending or in effect. A finding no operator answers (its
    operator proposes nothing for it in this state) holds no search back, or a symptom named for
    hundreds of steps would stop the search for good. Where the tick's proposals are not known,
    every named cause is taken to have one."""
    if ctx.proposed is None or finding in ctx.proposed:
        return True
    return any(iv.diagnosis.name == finding and (iv.status in PENDING or iv.status in IN_EFFECT) for iv in ctx.history)


def tried(ctx: OperatorContext) -> list[dict[str, Any]]:
    return [iv.changes for iv in ctx.history if iv.changes]


class Explorer(Operator):
    name = "explorer"
    role = ("Exploration: when the run is stuck (not learning, or no better over its last evals) and no other "
            "finding names a cause, proposes the next untried change of one tunable field (the learning rate "
            "first, then sampling temperature, answer length, batch size and difficulty), each direction in "
            "turn; every candidate is backtested against doing nothing.")
    tools = frozenset({K.RECIPE_EDIT, K.HARNESS_EDIT, K.DATA_CHANGE, K.ROLLBACK})
    detectors = STUCK

    def propose(self, ev: Evidence, ctx: OperatorContext, llm: Any = None) -> list[Intervention]:
        """Nothing, and no LLM call, unless the run is stuck; then the LLM policy's or the built-in search's."""
        if not self.diagnose(ev, ctx):
            return []
        return super().propose(ev, ctx, llm)

    def builtin(self, ev: Evidence, ctx: OperatorContext) -> list[Intervention]:
        found = {d.name: d for d in self.diagnose(ev, ctx)}
        stuck = next((found[n] for n in STUCK if n in found), None)
        if stuck is None:
            return []
        findings = ctx.findings if ctx.findings is not None else run_detectors(self.view(ev, ctx), known=ctx.known())
        causes = [d.name for d in findings if d.name in CAUSES and d.severity != "info" and not spent(ctx.history, d.name)]
        fixes = {n: held_at_floor(ctx.history, n) for n in causes}
        # a joint fix answers each of its parts: they are held at the floor with it
        answered = {a for fix in fixes.values() if fix is not None for a in fix.diagnosis.evidence.get("answers") or ()}
        if any(fix is None and n not in answered and has_fix(ctx, n) for n, fix in fixes.items()):
            return []               # that cause's fix goes on (or was never tried): not a search
        carried: dict[str, Any] = {}
        held: set[str] = set()
        back: set[str | None] = set()
        for fix in {f.id: f for f in fixes.values() if f is not None}.values():
            if not take_fix(fix, carried, held, back):
                return []           # fields that clash, or two checkpoints: no one candidate carries both
        done = tried(ctx)
        algo = str(carried.get("recipe.algorithm") or ctx.get("recipe.algorithm") or "sft")
        every = [c for c in candidates(ctx, algo) if not set(c) & set(carried)]
        todo = [c for c in every if {**c, **carried} not in done]
        if not todo:
            return []
        (field, value), = todo[0].items()
        change = {**todo[0], **carried}
        cause = ("No detector names a cause" if not held else
                 f"The fix for {', '.join(held)} ({', '.join(f'{k}={v!r}' for k, v in carried.items())}) measured nothing: "
                 "every arm of its backtest stayed at the same bound, so something else holds the run there too. "
                 "Each candidate carries that fix")
        why = (f"{stuck.summary}. {cause}, so the fields the trainer declares tunable are searched, "
               f"most sensitive first: candidate {len(every) - len(todo) + 1} of {len(every)}, {field} "
               f"{ctx.get(field)!r} → {value!r} ({len(done)} change(s) tried in this run so far); the backtest "
               "compares it with carrying on")
        if held:       # the causes whose fixes it carries are its to answer (`Intervention` answers)
            stuck = stuck.model_copy(update={"evidence": {**stuck.evidence, "answers": sorted(held)}})
        spoilt = worthless_weights(ev, ctx.checkpoints, self.thresholds.not_learning_heldout_max)
        if spoilt is not None and stuck.name == "not_learning":
            return [self._propose(K.ROLLBACK, stuck, change, why + f", both from the untrained checkpoint "
                                  f"{INIT_CHECKPOINT!r}: {spoilt}, so the damage may be in the weights.",
                                  rollback_to=INIT_CHECKPOINT)]
        if back:       # the carried fix rolls back: so does each candidate, to the same checkpoint
            (to,) = back
            return [self._propose(K.ROLLBACK, stuck, change, why + f", from the checkpoint {to!r} the carried fix "
                                  "rolls back to.", rollback_to=to)]
        kind = next(k for prefix, k in KIND.items() if field.startswith(prefix))
        return [self._propose(kind, stuck, change, why + ".")]

    def _propose(self, kind: K, d: Diagnosis, change: dict[str, Any], why: str,
                 rollback_to: str | None = None) -> Intervention:
        return self.intervention(kind, d, change, risk=Risk.MEDIUM, rationale=why, rollback_to=rollback_to,
                                 expected_effect="the target rising faster than in the control arm over the "
                                                 "backtest's horizon; if not, the next candidate")
