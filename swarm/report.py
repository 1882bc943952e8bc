"""Reports: REPORT.md for each intervention's PR and the final report of a swarm run.

    md, pngs = intervention_report(iv, metrics_rows, samples)   # pngs == {"metrics.png": b"\\x89PNG..."}
    ws.open_pr(iv, md, pngs)
    store.subscribe(LifecycleReports(ws, run_dir))              # rewritten on every status change
    md, files = final_report(goal_dict, store.timeline(), store.list(), metrics_rows, outcome)

Markdown is for a human reviewer; the plots sit beside it: `metrics.png` in a PR (matplotlib),
`curves.svg` in the final report (drawn as text without a plotting library: see swarm/plots.py).

Text written by the policy being trained (prompts and completions in samples, strings in
evidence) is untrusted: it only ever appears inside fenced code blocks, with backticks replaced,
control characters removed and long text cut, so it cannot close the fence, inject HTML or
links, or pass for the report's own words. Table cells are escaped the same way.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import pathlib
import re
from typing import Any, Iterable

from agents.domain import Intervention
from agents.evidence import as_number
from sandboxes.text import clean_text
from swarm.plots import curves, segments, to_png, to_svg

_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def _clean(text: Any) -> str:
    """Escape sequences and control characters out (sandboxes.text.clean_text), zero-width too."""
    return _CTRL.sub("", clean_text(text))


# ---- escaping -------------------------------------------------------------------------------------
def quote_untrusted(text: Any, limit: int = 800) -> str:
    """Untrusted text made safe to place inside a ``` fence: no backticks (they become '),
    no control or bidi characters, at most `limit` characters."""
    s = _clean(str(text).replace("\r\n", "\n").replace("\r", "\n")).replace("`", "'")
    if len(s) > limit:
        s = s[:limit] + f"… [cut, {len(s) - limit} more characters]"
    return s


def _fence(text: str, info: str = "text") -> str:
    return f"```{info}\n{text}\n```"


def cell(v: Any, limit: int = 120) -> str:
    """A value as one markdown table cell: one line, pipes, backticks and angle brackets escaped."""
    if isinstance(v, float):
        s = _num_str(v)
    else:
        s = str(v)
    s = _clean(s).replace("\n", " ").replace("`", "'")
    s = s.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return s if len(s) <= limit else s[:limit] + "…"


def _code(text: Any) -> str:
    """Inline code: shown literally, so only backticks and line breaks need removing."""
    return "`" + _clean(text).replace("`", "'").replace("\n", " ") + "`"


def _prose(text: str) -> str:
    """Text written by an operator (possibly an LLM): kept as markdown, but no raw HTML."""
    return _clean(text).replace("<", "&lt;").replace(">", "&gt;").strip()


def _num_str(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v)


def _table(header: list[str], rows: Iterable[list[Any]]) -> str:
    out = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# ---- numbers out of metric rows -------------------------------------------------------------------
_num = as_number


def metrics_plot(rows: list[dict[str, Any]], marks: list[tuple[int, str]] | None = None,
                 target: tuple[str, float] | None = None, title: str = "") -> bytes:
    """PNG of loss, train reward and held-out accuracy against step (see `swarm.plots.curves`)."""
    return to_png(curves(rows, marks, target, title))


# ---- evidence and samples -------------------------------------------------------------------------
def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _short_list(v: list[Any], n: int = 4) -> str:
    items = [_num_str(_num(x)) if _num(x) is not None else str(x) for x in v]
    if len(items) <= 2 * n:
        return "[" + ", ".join(items) + "]"
    return "[" + ", ".join(items[:n]) + f", … ({len(items)} values) …, " + ", ".join(items[-n:]) + "]"


def _evidence_section(evidence: dict[str, Any]) -> str:
    if not evidence:
        return "_No numeric evidence was recorded with the diagnosis._"
    rows, texts = [], {}
    for k, v in _flatten(evidence).items():
        if v is None or isinstance(v, (bool, int, float)) or _num(v) is not None:
            rows.append([k, _num_str(_num(v) if _num(v) is not None else v)])
        elif isinstance(v, list) and all(_num(x) is not None for x in v):
            rows.append([k, _short_list(v)])
        elif isinstance(v, str) and len(v) <= 80 and "\n" not in v:
            rows.append([k, v])
        else:
            texts[k] = v
    parts = []
    if rows:
        parts.append(_table(["evidence", "value"], rows))
    if texts:
        body = json.dumps(texts, indent=1, default=str, ensure_ascii=False)
        parts.append("Other evidence (may quote trajectories; untrusted):\n\n" + _fence(quote_untrusted(body, 2000), "json"))
    return "\n\n".join(parts)


def _failing(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def fails(s: dict[str, Any]) -> bool:
        if "verdict" in s:
            return s["verdict"] != "correct"
        r = _num(s.get("reward"))
        return r is not None and r <= 0
    return [s for s in samples if fails(s)]


def _samples_section(samples: list[dict[str, Any]], n: int) -> str:
    bad = _failing(samples)[-n:]
    if not bad:
        return f"_No failing trajectory among the {len(samples)} most recent samples._"
    parts = [f"{len(bad)} of the {len(_failing(samples))} failing trajectories among the {len(samples)} most "
             "recent samples. Trajectory text is untrusted model output, quoted as data "
             "(backticks replaced by ', control characters removed, long text cut)."]
    for s in bad:
        head = (f"**step {cell(s.get('step', '?'))}** · verdict `{cell(s.get('verdict', '?'), 20)}` · "
                f"reward {cell(_num_str(_num(s.get('reward'))))}"
                + (" · truncated" if s.get("truncated") else ""))
        body = (f"prompt:\n{quote_untrusted(s.get('prompt', ''), 400)}\n\n"
                f"completion:\n{quote_untrusted(s.get('completion', ''), 800)}")
        parts.append(head + "\n\n" + _fence(body))
    return "\n\n".join(parts)


def _backtest_section(iv: Intervention) -> str:
    bt = iv.backtest
    if bt is None:
        if iv.backtest_skipped:
            return f"Skipped: {_prose(iv.backtest_skipped)}"
        return f"Not run (status: {iv.status.value})."
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    rows = [
        ["metric", bt.metric],
        ["effect (candidate − control, + is better)", f"{bt.effect:+.4g}"],
        ["p-value", _num_str(bt.p_value)],
        ["test", bt.test],
        ["seeds", ", ".join(map(str, bt.seeds))],
        ["horizon (steps)", bt.horizon_steps],
        ["candidate", f"mean {_num_str(mean(bt.candidate))} over {len(bt.candidate)}: {_short_list(bt.candidate)}"],
        ["control", f"mean {_num_str(mean(bt.control))} over {len(bt.control)}: {_short_list(bt.control)}"],
        ["verdict", "passed" if bt.passed else "failed"],
    ]
    if bt.note:
        rows.append(["note", bt.note])
    return _table(["backtest", ""], rows)


def _history_rows(iv: Intervention) -> list[list[Any]]:
    return [[_ts(h.get("time")), h.get("from", ""), h.get("to", ""), h.get("note", "")] for h in iv.history]


def _ts(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "—"
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# ---- the two reports ------------------------------------------------------------------------------
def intervention_report(iv: Intervention, metrics_rows: list[dict[str, Any]], samples: list[dict[str, Any]],
                        max_samples: int = 5) -> tuple[str, dict[str, bytes]]:
    """REPORT.md of one intervention's PR and its PNGs (`metrics.png`)."""
    d = iv.diagnosis
    mark_step = iv.applied_step if iv.applied_step is not None else d.step
    png = metrics_plot(metrics_rows, marks=[(mark_step, f"{iv.id} ({d.name})")],
                       title=f"intervention {iv.id}: {iv.kind.value} after {d.name}")
    changes = _table(["field", "new value"], [[k, json.dumps(v, default=str)] for k, v in iv.changes.items()]) \
        if iv.changes else "_No recipe or harness field changes._"
    skills = ", ".join(f"`{cell(s, 60)}`" for s in iv.skills_used) if iv.skills_used else "none"
    md = f"""# Intervention {cell(iv.id)}: {iv.kind.value} — {cell(d.name)}

| | |
|---|---|
| status | {iv.status.value} |
| risk | {iv.risk.value} |
| proposed by | {cell(iv.operator)} (policy: {cell(iv.policy)}) |
| diagnosed by | {cell(d.operator)} (policy: {cell(d.policy)}) |
| diagnosed at step | {d.step} |
| applied at step | {_num_str(iv.applied_step)} |
| branch | {cell(iv.branch or f"iv/{iv.id}-{iv.kind.value}")} |

## Diagnosis

**{cell(d.name)}** ({d.severity}): {_prose(d.summary)}

## Evidence

{_evidence_section(d.evidence)}

![metrics around the intervention](metrics.png)

The dotted line marks step {mark_step}.

### Sample failing trajectories

{_samples_section(samples, max_samples)}

## Change

{changes}

## Rationale

{_prose(iv.rationale) or '_none given_'}

Expected effect: {_prose(iv.expected_effect) or '_not stated_'}

## Backtest

{_backtest_section(iv)}

## Risk

{iv.risk.value} (the goal's approval policy decides whether this level is applied automatically or waits for a human)

## Who decided

- Proposal: operator **{cell(iv.operator)}**, policy **{cell(iv.policy)}**.
- Diagnosis: operator **{cell(d.operator)}**, policy **{cell(d.policy)}**.
- Skills used: {skills}.
"""
    if iv.history:
        md += "\n### Lifecycle\n\n" + _table(["time", "from", "to", "note"], _history_rows(iv)) + "\n"
    if iv.outcome.recorded():
        md += "\n## Outcome\n\n" + _table(["measure", "value"], [[k, _num_str(v)] for k, v in _flatten(iv.outcome.recorded()).items()]) + "\n"
    return clean_text(md), {"metrics.png": png}


class LifecycleReports:
    """Keeps each intervention's REPORT.md in step with its lifecycle: subscribed to the store
    (`store.subscribe(LifecycleReports(ws, run_dir))`), it rewrites the report, with its plot
    and intervention.json, in the intervention's PR on every status change (applied at step,
    evaluating, kept or rolled back, rejected), from the run's metrics and samples as they are
    then. An intervention with no PR yet is skipped: its PR opens with the current report."""

    def __init__(self, ws: Any, run_dir: Any, samples: int = 200) -> None:
        self.ws, self.run_dir, self.samples = ws, pathlib.Path(run_dir), samples

    def __call__(self, iv: Intervention) -> None:
        from trainer.runlog import metrics_history, tail_jsonl   # bounded reads: this runs on every status change

        try:
            self.ws.pr_state(iv.id)
        except ValueError:
            return          # no PR yet (proposed, backtesting): nothing to draw a plot for
        md, files = intervention_report(iv, metrics_history(self.run_dir),
                                        tail_jsonl(self.run_dir / "samples.jsonl", self.samples))
        self.ws.update_report(iv, md, files)


def _target(goal: dict[str, Any]) -> tuple[str, str, float] | None:
    t = goal.get("target")
    if isinstance(t, dict) and "threshold" in t:
        return str(t.get("metric", "heldout_acc")), str(t.get("op", ">=")), float(t["threshold"])
    return None


def _event_summary(row: dict[str, Any]) -> str:
    data = {k: v for k, v in row.items() if k not in ("seq", "time", "kind")}
    return ", ".join(f"{k}={_num_str(v) if isinstance(v, (int, float)) else v}" for k, v in data.items())


def _skills_section(sk: Any) -> str:
    """Which skills fired, were used by interventions, and what the miner changed."""
    if not isinstance(sk, dict):
        return "_No skill library in this run._"
    lines = [f"Library at the end: {len(sk.get('library') or [])} active skill(s)."]
    rows = [[cell(n, 60), c, ", ".join(cell(x, 40) for x in (sk.get("used") or {}).get(n, [])) or "—"]
            for n, c in sorted((sk.get("fired") or {}).items())]
    rows += [[cell(n, 60), 0, ", ".join(cell(x, 40) for x in used)] for n, used in sorted((sk.get("used") or {}).items())
             if n not in (sk.get("fired") or {})]
    lines.append(_table(["skill", "times fired", "interventions that used it (status)"], rows) if rows else "No skill fired.")
    for what in ("added", "updated", "retired", "refused"):
        items = sk.get(what) or []
        if items:
            lines.append(f"**{what.capitalize()} by the skill miner:** " + "; ".join(
                f"`{cell(i.get('name'), 60)}` ({cell(i.get('reason'), 160)})" for i in items))
    if sk.get("avoided"):
        lines.append(f"Proposals not made again because memory says they lost before: {sk['avoided']}.")
    return "\n\n".join(lines)


def _plan_section(p: Any) -> str:
    """The pilot's prediction beside what the run did (swarm.pilot.prediction_vs_outcome)."""
    if not isinstance(p, dict):
        return ""
    said_steps = _num_str(p.get("predicted_steps")) if p.get("predicted_steps") is not None else "none"
    cpu = p.get("predicted_worker_cpu_s")
    said_cpu = f"{float(cpu):.0f}" if isinstance(cpu, (int, float)) else "none"
    got_steps = _num_str(p.get("steps_to_target")) if p.get("reached") else "not reached"
    got_cpu = p.get("worker_cpu_s_to_target")
    got_cpu = f"{float(got_cpu):.0f}" if isinstance(got_cpu, (int, float)) else "not reached"
    rows = [["steps to the target", said_steps, got_steps], ["worker-CPU-s to the target (the run after the pilot)",
                                                             said_cpu, got_cpu]]
    live = p.get("predicted_worker_cpu_s_at_live_cost")
    if isinstance(live, (int, float)):
        rows.append([f"the predicted steps at the live job's {float(p['live_cpu_per_step']):.3g} worker-CPU-s per step",
                     f"{float(live):.0f}", got_cpu])
    why = f" Prediction: {cell(p.get('prediction_why'), 300)}." if p.get("prediction_why") else ""
    return (f"""
## Plan: prediction and outcome

The pilot ({_num_str(p.get('pilot_cpu_s'))} worker-CPU-s, counted above) chose {_code(p.get('winner'))}; the plan is
`reports/plan/REPORT.md` (its PR `iv/plan-recipe_edit`).{why}

{_table(["", "predicted by the pilot", "this run"], rows)}
""")


def final_report(goal: dict[str, Any], timeline: list[dict[str, Any]], interventions: list[Intervention],
                 metrics_rows: list[dict[str, Any]], outcome: dict[str, Any],
                 max_events: int = 200) -> tuple[str, dict[str, bytes]]:
    """The run's summary: outcome against the target, curves with every applied intervention
    marked, the interventions table and the timeline of decisions."""
    tgt = _target(goal)
    applied = [iv for iv in interventions if iv.applied_step is not None]
    svg = to_svg(curves(metrics_rows, marks=[(iv.applied_step, f"{iv.id} {iv.kind.value}") for iv in applied],
                        target=(tgt[0], tgt[2]) if tgt else None, title="run curves"))

    # outcome against the target
    values = [v for xs_ys in segments(metrics_rows, tgt[0]) for v in xs_ys[1] if math.isfinite(v)] if tgt else []
    best = (max(values) if tgt[1] == ">=" else min(values)) if values else None
    final = outcome.get("final_metric", values[-1] if values else None)
    reached = outcome.get("reached")
    if reached is None and tgt:
        reached = final is not None and (final >= tgt[2] if tgt[1] == ">=" else final <= tgt[2])
    verdict = "**reached**" if reached else "**not reached**"
    target_line = f"{tgt[0]} {tgt[1]} {tgt[2]:g}" if tgt else "no target stated"
    out_rows = [[k, _num_str(v) if not isinstance(v, (dict, list)) else json.dumps(v, default=str)]
                for k, v in outcome.items() if k not in ("interventions", "skills", "plan_prediction")]

    iv_rows = []
    for iv in interventions:
        bt = iv.backtest
        iv_rows.append([iv.id, iv.kind.value, iv.operator, iv.policy, iv.status.value, _num_str(iv.applied_step),
                        f"{bt.effect:+.3g}" if bt else ("skipped" if iv.backtest_skipped else "—"),
                        _num_str(bt.p_value) if bt else "—", iv.diagnosis.name,
                        ", ".join(cell(x, 60) for x in iv.skills_used) or "—"])
    by_status: dict[str, int] = {}
    for iv in interventions:
        by_status[iv.status.value] = by_status.get(iv.status.value, 0) + 1
    policies = sorted({iv.policy for iv in interventions} | {iv.diagnosis.policy for iv in interventions})

    events = timeline[-max_events:]
    t0 = timeline[0]["time"] if timeline and isinstance(timeline[0].get("time"), (int, float)) else None
    ev_rows = [[f"{r['time'] - t0:.1f}" if t0 is not None and isinstance(r.get("time"), (int, float)) else "—",
                r.get("kind", ""), _event_summary(r)] for r in events]

    goal_text = goal.get("goal") or goal.get("description") or goal.get("text") or ""
    md = f"""# Swarm run report

{('> ' + _prose(str(goal_text)).replace(chr(10), chr(10) + '> ')) if goal_text else ''}

## Outcome

Target {_code(target_line)}: {verdict}. Final {cell(tgt[0] if tgt else 'metric')}: {_num_str(final)}; best: {_num_str(best)}.

{_table(["measure", "value"], out_rows) if out_rows else ''}

![training curves](curves.svg)

Dotted lines: applied interventions; dashed: the target.
{_plan_section(outcome.get("plan_prediction"))}
## Interventions

{len(interventions)} proposed; {', '.join(f'{n} {s}' for s, n in sorted(by_status.items())) or 'none'}.
Decisions made by: {', '.join(cell(p) for p in policies) or '—'}.

{_table(["id", "kind", "operator", "policy", "status", "applied step", "effect", "p", "diagnosis", "skills"], iv_rows) if iv_rows else '_No interventions._'}

Each intervention's full report is `reports/<id>/REPORT.md` on its branch `iv/<id>-<kind>`.

## Skills

{_skills_section(outcome.get("skills"))}

## Timeline

{_table(["t (s)", "event", "details"], ev_rows) if ev_rows else '_No events recorded._'}
"""
    if len(timeline) > max_events:
        md += f"\n_(showing the last {max_events} of {len(timeline)} events)_\n"
    if goal.get("sandbox") == "unsafe_plain":
        md = md.replace("\n## Outcome\n", "\n> **Warning: `sandbox: unsafe_plain`.** Where neither Docker, "
                        "bubblewrap nor unshare isolated, untrusted code (skill programs, code-task rewards) ran "
                        "in a plain subprocess sharing this machine's network and files.\n\n## Outcome\n", 1)
    return clean_text(md), {"curves.svg": svg}


__all__ = ["intervention_report", "final_report", "LifecycleReports", "metrics_plot", "quote_untrusted", "cell"]


def summary_row(iv: Any, wasted_cpu_s: float) -> dict[str, Any]:
    """One intervention as the run's summary lists it."""
    return {"id": iv.id, "kind": iv.kind.value, "operator": iv.operator, "policy": iv.policy,
            "diagnosis": iv.diagnosis.name, "status": iv.status.value,
            "effect": iv.backtest.effect if iv.backtest else None,
            "p_value": iv.backtest.p_value if iv.backtest else None,
            "signal": iv.backtest.signal if iv.backtest else None, "risk": iv.risk.value,
            "backtest_cpu_s": iv.outcome.backtest_cpu_s, "wasted_cpu_s": wasted_cpu_s,
            "backtest_skipped": iv.backtest_skipped, "applied_step": iv.applied_step,
            "gain": iv.outcome.gain, "refused": iv.outcome.refused, "changes": iv.changes, "created": iv.created}


def skills_in_run(store: Any, knowledge: Any) -> dict[str, Any]:
    """What skills did in a run, from its timeline (`store`) and library (`knowledge`)."""
    out: dict[str, Any] = {"library": [sk.name for sk in knowledge.skills if sk.active],
                           "fired": {}, "used": {}, "added": [], "updated": [], "retired": [], "refused": [], "avoided": 0}
    for r in store.timeline("skill_fired"):    # by kind (indexed), not the whole timeline
        out["fired"][r["name"]] = out["fired"].get(r["name"], 0) + 1
    for what in ("added", "updated", "retired", "refused"):
        out[what] = [{"name": r.get("name"), "reason": r.get("reason")} for r in store.timeline(f"skill_{what}")]
    out["avoided"] = len(store.timeline("avoided"))
    for iv in store.list():
        for name in iv.skills_used:
            out["used"].setdefault(name, []).append(f"{iv.id} ({iv.status.value})")
    return out
