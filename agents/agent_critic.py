"""Agent-run detectors and the HarnessCritic operator for a goal that drives the agent trainer
(`run.agent`, swarm/agent_run.py).

The detectors read what the agent trainer writes for every GRPO step: the share of its sampled
trajectories that ended by each `trainer.agent_rollout.EndReason` (`end_max_turns`,
`end_max_tool_calls`, `end_context_full` on the metrics rows, over all of a step's trajectories) and
the trajectories it keeps in samples.jsonl (`end`, `reward`). A limit that ends most trajectories of
the recent steps under the current harness version is a harness failure mode of
`harness.critic.Mode`; the operator hands it to the critic's own proposing rules
(`harness.critic.propose`), so the edit, its value (from the live harness's fields, never from
trajectory text) and its validation (`harness.agent.check_edit`) are the critic's.

    findings = run_agent_detectors(ev)                  # [Diagnosis(name="agent_turn_limit", ...)]
    AgentHarnessCritic().propose(ev, ctx)               # ctx.harness: the live AgentHarness as a dict

What samples.jsonl does not hold is not diagnosed here: the step-level records (each call's text,
the observation before its cut) that the critic's `malformed_call`, `observation_cut` and
`tool_spec_differs` modes read. Those faults show here only through their symptoms.

The detectors have their own registry, not `agents.detection.DETECTORS`: they run on agent runs
only, and the single-turn detectors' calibration (benchmarks/detector_calibration.py) does not
cover them. Their thresholds are stated, not yet calibrated on healthy agent runs.
"""
from __future__ import annotations

from typing import Any, Callable

from agents.base import Operator, OperatorContext
from agents.detection import make_diagnosis, mean_of
from agents.domain import Diagnosis, Intervention, InterventionKind, Risk
from agents.evidence import Evidence
from harness.agent import AgentHarness
from harness.critic import Finding, Mode, propose

END_SHARE = 0.5      # the recent steps' mean share of trajectories a limit ended, at least
RECENT = 5           # GRPO rows read (the newest, under the current harness version)
MIN_ROWS = 2         # fewer rows under the current harness: nothing is said yet
TRAIN_ALGORITHMS = ("grpo", "grpo_critic")

AgentDetector = Callable[[Evidence], "Diagnosis | None"]
AGENT_DETECTORS: dict[str, AgentDetector] = {}


def agent_detector(name: str) -> Callable[[AgentDetector], AgentDetector]:
    def register(fn: AgentDetector) -> AgentDetector:
        if name in AGENT_DETECTORS:
            raise ValueError(f"agent detector {name!r} is registered twice")
        AGENT_DETECTORS[name] = fn
        return fn
    return register


def current_rows(ev: Evidence) -> list[dict[str, Any]]:
    """The GRPO rows of the current segment under the newest harness version, oldest first."""
    rows = [r for r in ev.metrics if r.get("algorithm") in TRAIN_ALGORITHMS]
    if not rows:
        return []
    hv = rows[-1].get("harness_version")
    i = len(rows)
    while i > 0 and rows[i - 1].get("harness_version") == hv:
        i -= 1
    return rows[i:]


def _limit(ev: Evidence, name: str, column: str, end: str, mode: Mode, what: str) -> Diagnosis | None:
    rows = current_rows(ev)
    recent = rows[-RECENT:]
    shares = [float(r[column]) for r in recent if isinstance(r.get(column), (int, float))]
    if len(shares) < MIN_ROWS:
        return None
    share = mean_of(shares)
    if share < END_SHARE:
        return None
    since = int(rows[0].get("step", 0))
    failed = [s for s in ev.samples if int(s.get("step", -1)) >= since and float(s.get("reward", 0.0) or 0.0) < 1.0]
    ended = sum(1 for s in failed if s.get("end") == end)
    success = mean_of([float(r["success"]) for r in recent if isinstance(r.get("success"), (int, float))])
    return make_diagnosis(ev, name, f"{share:.0%} of the trajectories of the last {len(shares)} GRPO steps ended by {what}",
                          "critical" if success == 0.0 else "warning",
                          {"mode": mode.value, "end_share": share, "rows": len(shares), "success": success,
                           "since_step": since, "window_start_step": int(recent[0].get("step", since)),
                           "samples_failed": len(failed), "samples_ended": ended,
                           "harness_version": rows[-1].get("harness_version"), "threshold": END_SHARE})


@agent_detector("agent_turn_limit")
def turn_limit(ev: Evidence) -> Diagnosis | None:
    """Most recent trajectories end because the harness's `max_turns` ran out."""
    return _limit(ev, "agent_turn_limit", "end_max_turns", "max_turns", Mode.MAX_TURNS, "the turn limit")


@agent_detector("agent_tool_call_limit")
def tool_call_limit(ev: Evidence) -> Diagnosis | None:
    """Most recent trajectories end because the harness's `max_tool_calls` ran out."""
    return _limit(ev, "agent_tool_call_limit", "end_max_tool_calls", "max_tool_calls", Mode.MAX_TOOL_CALLS,
                  "the tool-call limit")


@agent_detector("agent_context_full")
def context_full(ev: Evidence) -> Diagnosis | None:
    """Most recent trajectories end with the policy's context full."""
    return _limit(ev, "agent_context_full", "end_context_full", "context_full", Mode.CONTEXT_FULL, "a full context")


def run_agent_detectors(ev: Evidence) -> list[Diagnosis]:
    return [d for d in (fn(ev) for fn in AGENT_DETECTORS.values()) if d is not None]


def finding(d: Diagnosis) -> Finding:
    """A detector's diagnosis as the critic's `Finding` (its counts from the samples, else the rows)."""
    e = d.evidence
    return Finding(Mode(e["mode"]), int(e.get("samples_ended") or e.get("rows") or 1),
                   int(e.get("samples_failed") or e.get("rows") or 1), d.summary)


class AgentHarnessCritic(Operator):
    """The HarnessCritic on an agent run: a finding of the agent detectors → the critic's first
    valid typed edit of the live agent harness (`ctx.harness`), as a harness edit."""

    name = "agent_harness_critic"
    role = ("Reads an agent training run's trajectories (how they end, by which harness limit) and proposes "
            "typed edits of the agent harness (harness.<AgentHarness field>), validated as the live trainer would.")
    tools = frozenset({InterventionKind.HARNESS_EDIT})
    detectors = tuple(AGENT_DETECTORS)

    def diagnose(self, ev: Evidence, ctx: OperatorContext) -> list[Diagnosis]:
        found = ([d for d in ctx.findings if d.name in self.detectors] if ctx.findings is not None
                 else run_agent_detectors(ev))
        return [d.model_copy(update={"operator": self.name, "policy": "builtin"}) for d in found]

    def builtin(self, ev: Evidence, ctx: OperatorContext) -> list[Intervention]:
        try:
            harness = AgentHarness.model_validate(ctx.harness)
        except ValueError:
            return []       # no live agent harness known yet (no metrics row names one)
        out = []
        for d in self.diagnose(ev, ctx):
            edits, _ = propose([finding(d)], harness)
            if not edits:
                continue
            e = edits[0]
            was = harness.model_dump(mode="json")
            for part in e.path.split("."):
                was = was.get(part) if isinstance(was, dict) else None
            out.append(self.intervention(
                InterventionKind.HARNESS_EDIT, d, {f"harness.{e.path}": e.value}, risk=Risk.MEDIUM,
                rationale=f"{d.summary}. The HarnessCritic's rule for {e.mode.value}: {e.reason}; "
                          f"harness.{e.path} {was!r} → {e.value!r}.",
                expected_effect=f"fewer trajectories ended by {e.mode.value}; held-out success up"))
        return out
