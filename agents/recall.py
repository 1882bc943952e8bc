"""How operators use what the swarm remembers: retrieved skills and past episodes.

    view = evidence_view(ev, diagnoses, ctx, task="addition")       # the JSON a skill trigger reads
    fired = firing_skills(skills, view, sandbox)                      # [(skill, proposal-or-None)]
    proposals = apply_skills(proposals, fired, operators, ev, ctx)    # attribute / add skill proposals
    Lead(avoid_after_losses=1).arbitrate(proposals, ctx)              # drops fixes memory says lose

Skills (skills/) are retrieved by the controller (vector similarity × measured utility) and put
in `ctx.skills`; an LLM policy reads them in its prompt. For the built-in policies a firing skill
is a candidate proposal:
- an operator already proposes the skill's fix (same signature: diagnosis | kind | fields): the
  proposal records the skill in `skills_used`, so its outcome counts toward the skill's utility;
- no operator proposes it, and the skill knows every value (static `changes`, or its program's
  proposal): the operator whose tools include the kind proposes it, marked with the skill.
A skill program is untrusted code: it only ever runs in the sandbox (skills.verify.run_program),
and its proposal is data, validated like any other change before anything uses it.

Past episodes (memory/) reach `ctx.episodes` as plain summaries; the lead drops a proposal whose
fix (the same fields set to the same values for the same diagnosis) lost (rejected by its backtest
with no gain, or rolled back) at least `avoid_after_losses` times and never won. Restarts and critical rollbacks are never dropped for that.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Iterable

from agents.base import Operator, OperatorContext
from agents.domain import Intervention, InterventionKind, Risk
from agents.evidence import Evidence, as_number
from harness.changes import of_one_run
from trainer.config import apply_changes

log = logging.getLogger(__name__)

VIEW_ROWS = 20            # metric rows kept in an evidence view
SKILL_PROPOSED = "proposed_by_skill"   # diagnosis evidence key of a proposal a skill made on its own
NEVER_AVOID = (InterventionKind.RESTART,)


def _scalar(v: Any) -> Any:
    x = as_number(v)
    if x is not None:
        return x if math.isfinite(x) else str(x)     # JSON-safe: "nan" / "inf" as the run log writes them
    return v if isinstance(v, (str, bool)) or v is None else None


def evidence_view(ev: Evidence, diagnoses: Iterable[Any], ctx: OperatorContext | None = None,
                  task: str | None = None) -> dict[str, Any]:
    """The evidence a skill trigger reads (skills/trigger.py), and what an episode keeps as the
    window that led to it: the newest metric rows (numbers only), the detector findings, the
    recipe and harness the controller knows, the task. No sample text: trajectories stay out of
    skills and memory windows."""
    rows = []
    for r in ev.metrics[-VIEW_ROWS:]:
        row = {k: _scalar(v) for k, v in r.items() if not isinstance(v, (dict, list))}
        rows.append({k: v for k, v in row.items() if v is not None and (k == "step" or not isinstance(v, str) or v in ("nan", "inf", "-inf"))})
    diags = []
    for d in diagnoses:
        evd = {k: _scalar(v) for k, v in (d.evidence or {}).items() if _scalar(v) is not None}
        diags.append({"name": d.name, "severity": d.severity, "summary": d.summary, "evidence": evd})
    return {
        "step": ev.step, "job_status": ev.job_status, "task": task,
        "metrics": rows,
        "evals": [{k: _scalar(v) for k, v in r.items() if k == "step" or k.startswith("heldout")} for r in ev.evals[-5:]],
        "diagnoses": diags,
        "recipe": (ctx.recipe if ctx is not None else None) or ev.recipe or {},
        "harness": (ctx.harness if ctx is not None else None) or ev.harness or {},
    }


def retrieval_text(diagnoses: Iterable[Any], task: str | None) -> str:
    """The query for skills and episodes: what is wrong, in words."""
    parts = [f"{d.name}: {d.summary}" for d in diagnoses if d.severity != "info"]
    return (f"task {task}. " if task else "") + " ".join(parts)


def skill_summary(skill: Any, utility: Any = None, score: float | None = None) -> dict[str, Any]:
    """A retrieved skill as plain data for `ctx.skills` (and so for LLM prompts)."""
    sw = skill.swarmlab
    out: dict[str, Any] = {"name": skill.name, "description": skill.description, "body": skill.body[:1500]}
    if sw is not None:
        out.update(diagnosis=sw.diagnosis, signature=skill.signature())
        if sw.intervention is not None:
            out["intervention"] = {"kind": str(getattr(sw.intervention.kind, "value", sw.intervention.kind)),
                                   "fields": list(sw.intervention.fields), "changes": dict(sw.intervention.changes)}
    if utility is not None:
        out["utility"] = utility.model_dump()
    if score is not None:
        out["score"] = round(score, 4)
    return out


def firing_skills(skills: list[Any], view: dict[str, Any], sandbox: Any = None, timeout_s: float = 5.0,
                  cache: dict[str, Any] | None = None) -> list[tuple[Any, dict[str, Any] | None, str | None]]:
    """(skill, its program's proposal or None, error or None) for each active skill that fires on
    `view`. Declarative triggers are evaluated here (pure data); programs run in the sandbox. A
    program that fails is reported (error) and counts as not firing. With `cache` (a dict the
    caller keeps while the findings stay the same), each program runs once, not every tick."""
    from skills import fires, run_program

    out = []
    for sk in skills:
        sw = sk.swarmlab
        if sw is None or not sk.active:
            continue
        declared = fires(sw.trigger, view) if sw.trigger is not None else None
        if sw.program:
            if declared is False:
                continue       # the declarative trigger must agree; no sandbox run when it already says no
            if cache is not None and sk.name in cache:
                res = cache[sk.name]
            else:
                try:
                    res = run_program(sk, [view], sandbox=sandbox, timeout_s=timeout_s)[0]
                except Exception as e:   # a boundary: a broken program is data about the skill, not a crash
                    res = f"{type(e).__name__}: {e}"
                if cache is not None:
                    cache[sk.name] = res
            if isinstance(res, str):
                out.append((sk, None, res))
                continue
            if res.error:
                out.append((sk, None, res.error))
            elif res.fired:
                out.append((sk, res.proposal, None))
        elif declared:
            out.append((sk, None, None))
    return out


def _owner(kind: InterventionKind, diagnosis: str, operators: list[Operator]) -> Operator | None:
    able = [op for op in operators if kind in op.tools]
    return next((op for op in able if diagnosis in op.detectors), able[0] if able else None)


def backs(skill: Any, iv: Intervention) -> bool:
    """Whether `skill` prescribes the fix `iv` is (see `prescribes`)."""
    return prescribes(skill, iv.kind.value, iv.changes, iv.diagnosis.name)


def prescribes(skill: Any, kind: str, changes: Any, diagnosis: str) -> bool:
    """The same kind and fields, for the skill's diagnosis or any its trigger names (a restart skill
    may answer a crash and a stall alike)."""
    sw = skill.swarmlab
    if sw is None or sw.intervention is None:
        return False
    names = {sw.diagnosis} | set(sw.trigger.diagnosis_names() if sw.trigger is not None else [])
    return (kind == str(getattr(sw.intervention.kind, "value", sw.intervention.kind))
            and sorted(changes) == sorted(sw.intervention.fields) and diagnosis in names)


def apply_skills(proposals: list[Intervention], fired: list[tuple[Any, dict[str, Any] | None, str | None]],
                 operators: list[Operator], diagnoses: list[Any], ctx: OperatorContext) -> list[Intervention]:
    """Proposals with firing skills attributed, plus the proposals of skills no operator matched."""
    out = list(proposals)
    by_diag = {d.name: d for d in diagnoses}
    for sk, program_prop, err in fired:
        if err is not None:
            continue
        match = [iv for iv in out if backs(sk, iv)]
        if match:
            for iv in match:
                if sk.name not in iv.skills_used:
                    iv.skills_used.append(sk.name)
            continue
        sw = sk.swarmlab
        spec = sw.intervention if sw is not None else None
        if spec is None or sw.diagnosis not in by_diag:
            continue     # a skill proposes only for a finding the detectors made (its evidence)
        kind = InterventionKind(getattr(spec.kind, "value", spec.kind))
        changes = dict(spec.changes)
        if program_prop and isinstance(program_prop.get("changes"), dict):
            changes.update(program_prop["changes"])
        if set(spec.fields) != set(changes):
            continue     # the skill does not know every value, or its program strays outside its fields
        if any(of_one_run(k) for k in changes):
            continue     # a step of the run it was learnt from says nothing of this one (an operator computes it here)
        try:
            apply_changes(ctx.recipe or {}, ctx.harness or {}, changes)   # validates the values (data, not code)
        except (ValueError, TypeError) as e:
            log.warning("skill %s: its proposal is invalid, ignored: %s", sk.name, e)
            continue
        op = _owner(kind, sw.diagnosis, operators)
        if op is None or kind in (InterventionKind.ROLLBACK,):
            continue
        # the values are the skill's (from past episodes), not computed from this run's evidence: such a
        # proposal is always backtested (agents.recall.skill_proposed), whatever the skill's record
        d = by_diag[sw.diagnosis].model_copy(deep=True)
        d.evidence[SKILL_PROPOSED] = sk.name
        iv = op.intervention(
            kind, d, changes, risk=Risk(getattr(spec.risk, "value", spec.risk)),
            rationale=f"{d.summary}. Skill {sk.name!r} applies: {sk.description}",
            expected_effect=f"as in the episodes skill {sk.name!r} was learnt from",
            backtest_skipped="restart after a crash or stall: nothing to compare against" if kind == InterventionKind.RESTART else None)
        iv.skills_used.append(sk.name)
        out.append(iv)
    return out


def skill_proposed(iv: Intervention) -> str | None:
    """The skill that proposed `iv` with its own values (no operator proposed that fix), or None."""
    v = iv.diagnosis.evidence.get(SKILL_PROPOSED)
    return v if isinstance(v, str) else None


def episode_summaries(episodes: Iterable[Any]) -> list[dict[str, Any]]:
    """Past episodes as plain data for `ctx.episodes`."""
    out = []
    for ep in episodes:
        out.append({"id": ep.id, "task": ep.task, "diagnosis": ep.diagnosis, "kind": ep.kind, "changes": ep.changes,
                    "signature": ep.signature, "outcome": ep.outcome, "effect": ep.effect, "won": ep.won(),
                    "lost": ep.lost(), "skills_used": list(ep.skills_used)})
    return out


def _same_values(a: Any, b: Any) -> bool:
    """Two changes set the same fields to the same values (numbers to 6 significant digits)."""
    if not isinstance(a, dict) or not isinstance(b, dict) or a.keys() != b.keys():
        return False
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    return all(float(f"{a[k]:.6g}") == float(f"{b[k]:.6g}") if num(a[k]) and num(b[k]) else a[k] == b[k] for k in a)


def memory_verdict(signature: str, episodes: list[dict[str, Any]],
                   changes: dict[str, Any] | None = None) -> tuple[int, int, list[str]]:
    """(wins, losses, episode ids) of one fix in the remembered episodes: the same diagnosis, kind
    and fields (`signature`) and, when `changes` is given, the same values. A value that lost says
    nothing of another value of the same field (a learning rate 10x lower that lost is no verdict
    on one 3x higher)."""
    same = [e for e in episodes if e.get("signature") == signature
            and (changes is None or _same_values(e.get("changes"), changes))]
    return (sum(1 for e in same if e.get("won")), sum(1 for e in same if e.get("lost")),
            [str(e.get("id")) for e in same])


def avoid_reason(iv: Intervention, ctx: OperatorContext, after_losses: int) -> str | None:
    """Why memory advises against `iv`, or None."""
    if after_losses <= 0 or iv.kind in NEVER_AVOID or (iv.kind == InterventionKind.ROLLBACK and iv.diagnosis.severity == "critical"):
        return None
    wins, losses, ids = memory_verdict(iv.signature(), ctx.episodes, iv.changes)
    if losses >= after_losses and wins == 0:
        return f"memory: this fix lost {losses} time(s) and never won (episodes {', '.join(ids[:5])})"
    return None
