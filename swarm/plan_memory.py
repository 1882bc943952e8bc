"""Plans in memory: a planned run's model size and lr, and whether they reached its target, kept in
the vector memory (memory/, the reports collection) at the end of the run; a later planned run on
the same task family starts from the closest one that reached its target (source `memory`) instead
of running the pilot.

    remember_plan(knowledge, record, summary)      # node_finish: the plan and its outcome
    hit = recall_plan(knowledge, goal)              # node_plan, before the pilot: a MemoryPlan or None
    plan = hit.choose(goal.plan(), goal)            # its fields, source memory, with their evidence

What is kept (one report per run, id `<workspace>/plan`, kind `plan`): the goal's sentence as the
text the search embeds, and as metadata the task family (`task`), whether the run reached its
target, the fields in PILOT_FIELDS it trained (a JSON string), their sources, the steps and
worker-CPU-s to the target. What is recalled: among the reports of kind `plan` on the same task
family that reached their target, from another workspace, the one whose sentence is closest
(cosine distance of the memory's embedder); its fields replace the plan's choices for the fields
the goal does not write. A run whose plan came from memory is remembered too (its sources say
`memory`), so a chain of runs keeps the size and lr that keep working.

Deviations from the issue: "similar task" is the same task family (addition after addition at
another difficulty), not a neighbouring family (sort after reverse): the distance between two
families' sentences is not calibrated against what transfers, so it does not decide here.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from swarm.pilot import PILOT_FIELDS

KIND = "plan"


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """A past run's plan that reached its target: where it ran, what it trained, what it cost."""

    workspace: str
    goal: str
    fields: dict[str, Any]
    distance: float
    steps_to_target: int | None
    worker_cpu_s_to_target: float | None

    def choose(self, plan: Any, goal: Any) -> Any:
        """`plan` with this run's fields for every PILOT_FIELDS field the goal does not write."""
        from swarm.plan import Choice, Source
        from trainer.config import get_dotted

        evidence = {"workspace": self.workspace, "goal": self.goal, "distance": round(self.distance, 4),
                    "steps_to_target": self.steps_to_target, "worker_cpu_s_to_target": self.worker_cpu_s_to_target}
        cost = f", {self.worker_cpu_s_to_target:.0f} worker-CPU-s" if self.worker_cpu_s_to_target is not None else ""
        why = f"a past run on the same task reached its target with it ({self.workspace}: {self.goal!r}{cost})"
        for field in PILOT_FIELDS:
            if field in self.fields and not get_dotted(goal.run, field)[0]:
                plan = plan.choose(Choice(field, self.fields[field], Source.MEMORY, why, evidence))
        return plan


def recall_plan(knowledge: Any, goal: Any) -> MemoryPlan | None:
    """The closest past plan on this goal's task family that reached its target (module docstring)."""
    plan = goal.plan()
    if plan is None:
        return None
    where = {"kind": KIND, "task": plan.task.name, "reached": True}
    hits = knowledge.memory.search_reports(goal.goal, n=8, where=where)
    for h in sorted(hits, key=lambda h: h.distance):
        meta = h.metadata
        if meta.get("workspace") == knowledge.name:   # this run's own record (a resumed run)
            continue
        try:
            fields = json.loads(meta.get("fields") or "{}")
        except ValueError:
            continue
        if not isinstance(fields, dict) or not fields:
            continue
        steps, cpu = meta.get("steps_to_target"), meta.get("worker_cpu_s_to_target")
        return MemoryPlan(str(meta.get("workspace")), h.document, {k: v for k, v in fields.items() if k in PILOT_FIELDS},
                          float(h.distance), int(steps) if isinstance(steps, (int, float)) and steps >= 0 else None,
                          float(cpu) if isinstance(cpu, (int, float)) and cpu >= 0 else None)
    return None


def remember_plan(knowledge: Any, rec: dict[str, Any] | None, summary: dict[str, Any], steps: int | None) -> bool:
    """Keep a planned run's plan and outcome (`summary`, `steps` to its target) in memory (module
    docstring); False for a run that was not planned (its goal writes run.task, or a script)."""
    if not rec or not rec.get("plan") or not rec["plan"].get("applied"):
        return False
    choices = {c["field"]: c for c in rec["plan"]["choices"]}
    fields = {f: choices[f]["value"] for f in PILOT_FIELDS if f in choices}
    cpu = summary.get("worker_cpu_s_to_target")
    if isinstance(cpu, (int, float)):   # the run's own, as the final report gives it: the pilot's is not the plan's cost
        cpu = max(0.0, float(cpu) - float(((rec.get("pilot") or {}).get("cpu_s")) or 0.0))
    knowledge.record_report(KIND, rec["plan"]["goal"], kind=KIND, reached=bool(summary.get("reached")),
                            fields=json.dumps(fields, sort_keys=True),
                            sources=json.dumps({f: choices[f]["source"] for f in fields}, sort_keys=True),
                            steps_to_target=int(steps) if isinstance(steps, int) else -1,
                            worker_cpu_s_to_target=float(cpu) if isinstance(cpu, (int, float)) else -1.0)
    return True
