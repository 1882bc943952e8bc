"""The plan as the run's first PR: the chosen config, each field's source and reason, the pilot's
table and curve, and its prediction, opened in the workspace when the run starts.

    md, files = plan_report(record, target)      # record: swarm.pilot.plan_run's; files: {"pilot.svg": …}
    branch = open_plan_pr(ws, record, target)    # "iv/plan-recipe_edit", merged into main

The PR is an intervention PR of the workspace (swarm/workspace.py) with the id `plan`: a branch
with `reports/plan/REPORT.md`, its attachments, `reports/plan/intervention.json` and the recipe
and harness fields the plan sets that main does not have yet (the pilot's lr: the files on main
were written from the goal before the pilot ran). It is merged as soon as it is opened: the plan
is what the live run trains from its first step, nothing waits for a human, and a PR left open
would read as a change still to decide. It is not an intervention of the run's store, so the
cockpit's intervention pages, `swarm approve` and the lifecycle reports leave it alone; its report
stays on main (`reports/plan/REPORT.md`). Only a planned run has one (the plan fills fields: the
task comes from the goal's words); a goal that writes `run.task` trains as written. The id `plan`
cannot be an intervention's (theirs are 8 hex digits).
"""
from __future__ import annotations

from typing import Any

from agents.domain import Diagnosis, Intervention, InterventionKind, Risk, Status
from swarm.plots import Chart, Panel, Series, to_svg
from swarm.report import _code, _num_str, _prose, _table, cell

PLAN_ID = "plan"
# matplotlib's tab10: the pilot has up to 9 candidates, one colour each
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def pilot_chart(pilot: dict[str, Any], threshold: float | None = None) -> Chart:
    """Held-out accuracy and training loss at each rung end, one line per candidate (its rungs)."""
    held, loss = Panel("held-out", target=threshold), Panel("loss")
    for i, c in enumerate(pilot["candidates"]):
        own = sorted((r for r in pilot["results"] if r["candidate"] == c["name"]), key=lambda r: r["steps"])
        if not own:
            continue
        colour = PALETTE[i % len(PALETTE)]
        label = ("* " if c["name"] == pilot["winner"]["name"] else "") + c["name"]
        xs = [int(r["steps"]) for r in own]
        held.series.append(Series(label, colour, [(xs, [float(r["heldout"]) for r in own])], True, []))
        pts = [(int(r["steps"]), float(r["loss"])) for r in own if r.get("loss") is not None]
        if pts:
            loss.series.append(Series(label, colour, [([x for x, _ in pts], [y for _, y in pts])], True, []))
    return Chart([held, loss], [], "pilot: each candidate at its rung ends (* the winner)")


def plan_report(rec: dict[str, Any], target: Any) -> tuple[str, dict[str, bytes]]:
    """REPORT.md of the plan PR and its attachments (the pilot's curve as `pilot.svg`)."""
    plan, pilot = rec["plan"], rec.get("pilot")
    rows = [[c["field"], _value(c["value"]), c["source"], c.get("why") or ""] for c in plan["choices"]]
    notes = "\n".join(f"- {_prose(n)}" for n in plan.get("notes") or [])
    md = [f"# Plan\n\n> {_prose(plan['goal'])}\n",
          f"Target {_code(f'{target.metric} {target.op} {target.threshold:g}')}. The task: "
          f"{_code(plan['task']['name'])} (from the {'words' if plan['task_from'] == 'words' else 'goal run.task'}).",
          "This PR is merged when the run starts: the plan is what the run trains from its first step; "
          "nothing here waits for approval. Fields the goal writes (`user`) are never changed by a plan.\n",
          "## The config\n", _table(["field", "value", "source", "why"], rows)]
    if notes:
        md += ["\n" + notes]
    files: dict[str, bytes] = {}
    if pilot is None:
        md += [f"\n## Pilot\n\nNo pilot: {_prose(rec.get('pilot_skipped') or 'not run')}."]
    else:
        md += ["\n## Pilot\n", _pilot_section(pilot, plan), "\n![pilot curves](pilot.svg)"]
        thr = target.threshold if target.metric == "heldout_acc" else None
        files["pilot.svg"] = to_svg(pilot_chart(pilot, thr), panel_h=180)
    return "\n".join(md) + "\n", files


def _pilot_section(p: dict[str, Any], plan: dict[str, Any]) -> str:
    written = {c["field"]: c["value"] for c in plan["choices"] if c["source"] == "user"}   # every candidate's
    size = {c["name"]: {**written, **c["fields"]} for c in p["candidates"]}
    rows = []
    for r in sorted(p["results"], key=lambda r: (r["rung"], r["candidate"])):
        f = size.get(r["candidate"], {})
        rows.append([("* " if r["candidate"] == p["winner"]["name"] else "") + r["candidate"],
                     _num_str(f.get("model.d_model")), _num_str(f.get("model.n_layers")), _num_str(f.get("recipe.lr")),
                     r["rung"], r["steps"], f"{float(r['cpu_s']):.1f}", f"{float(r['heldout']):.3f}",
                     _num_str(r.get("loss"))])
    pred, stop = p.get("prediction") or {}, p.get("stop") or {}
    if pred.get("steps") is not None:
        said = (f"about {pred['steps']} steps and {float(pred['worker_cpu_s']):.0f} worker-CPU-s to the target "
                f"({pred.get('method')}; {float(pred['cpu_per_step']):.3f} CPU-s/step at one thread)")
    else:
        said = f"none ({pred.get('why', '')})"
    start = next((c for c in plan["choices"] if c["field"] == "fork_from" and c["source"] == "pilot"), None)
    if start is not None:
        begins = (f"the run goes on from the winner's last checkpoint: its {start['evidence'].get('steps')} steps count "
                  "toward the run (`fork_from`, `fork_mode: full`)")
    else:
        begins = next((n for n in plan.get("notes") or () if n.startswith("the run starts from scratch")),
                      "the run starts from scratch")
    return "\n".join([
        f"{len(p['candidates'])} candidates (model size × lr; a size or lr the goal writes is not varied), "
        f"successive halving from {p['base_steps']} steps, doubling. CPU: {float(p['cpu_s']):.1f} worker-CPU-s of "
        f"{float(p['budget_cpu_s']):.1f} allowed ({float(p['spent_share']):.1%} of budget.worker_cpu_s, counted in the "
        "run's meter).\n",
        _table(["candidate", "d_model", "n_layers", "lr", "rung", "steps", "CPU-s", "held-out", "loss"], rows),
        f"\nWinner: {_code(p['winner']['name'])} ({cell(stop.get('why', ''), 300)}): "
        + ", ".join(f"{_code(k)} = {_code(v)}" for k, v in p["winner"]["fields"].items()) + ".",
        f"\nPrediction: {cell(said, 400)}. The final report compares it with what the run did.",
        f"\nStart: {cell(begins, 400)}.",
    ])


def _value(v: Any) -> str:
    import json

    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= 80 else s[:79] + "…"


def plan_changes(ws: Any, rec: dict[str, Any]) -> dict[str, Any]:
    """The recipe/harness fields of the plan whose value main does not hold: those chosen after the
    workspace was made (by the pilot, or from memory), whatever their source, so that main holds
    what the live job trains (the controller's departure detectors compare the two)."""
    from trainer.config import get_dotted

    main = {"recipe": ws.current_recipe(), "harness": ws.current_harness()}
    out = {}
    for c in rec["plan"]["choices"]:
        if c["field"].startswith(("recipe.", "harness.")):
            found, value = get_dotted(main, c["field"])
            if not found or value != c["value"]:
                out[c["field"]] = c["value"]
    return out


def open_plan_pr(ws: Any, rec: dict[str, Any], target: Any) -> str:
    """Open the plan PR and merge it (module docstring); idempotent: a merged one is left as it is.
    Returns its branch."""
    try:
        if ws.pr_state(PLAN_ID) == "merged":
            return f"iv/{PLAN_ID}-{InterventionKind.RECIPE_EDIT.value}"
    except ValueError:
        pass   # no plan PR yet
    md, files = plan_report(rec, target)
    winner = (rec.get("pilot") or {}).get("winner", {}).get("name")
    iv = Intervention(
        id=PLAN_ID, kind=InterventionKind.RECIPE_EDIT, changes=plan_changes(ws, rec), operator="lead",
        policy="builtin", risk=Risk.LOW, status=Status.APPLIED, applied_step=0,
        diagnosis=Diagnosis(name="plan", summary="the run's starting config", severity="info", operator="lead",
                            policy="builtin"),
        rationale="The starting config: each field the goal leaves out chosen from the words, the task's facts, "
                  "memory, the pilot" + (f" (winner {winner})" if winner else "") + " or defaults; reports/plan/REPORT.md.")
    branch = ws.open_pr(iv, md, files)
    ws.approve(PLAN_ID)
    return branch
