"""Agent-run detectors and the HarnessCritic operator for a goal that drives the agent trainer
(`run.agent`, swarm/agent_run.py).

Two kinds of detector, both over what the run writes under the current harness version:

- limit detectors read the metrics rows: the share of each GRPO step's sampled trajectories that
  ended by a harness limit (`end_max_turns`, `end_max_tool_calls`, `end_context_full`, over all of
  a step's trajectories), the mean over the recent steps, times the part of the recent step-level
  records ended by that limit whose calls ran. A record that reached the limit while most of its
  calls were refused (`harness.critic.spent_on_refused`: a parser that rejects them, an unknown
  tool, bad arguments) is evidence of the refusal, which a step detector names, not of the limit;
- step detectors read the step-level records the trainer keeps in samples.jsonl for each sampled
  trajectory (`trainer.agent_rollout.Trajectory.record`: every call's text, whether it parsed, the
  tool, its error, the observation as shown and before its cut, the reference answer) and the
  environment's own tool specs (`env_tools`). They hand the recent records under the current
  harness to the critic's own diagnosis (`harness.critic.diagnose`: the calls re-parsed by our own
  parsers, never obeyed) and read one failure mode each: `malformed_call` (a parser that rejects
  the calls), `observation_cut` (a cut that removed what the policy needed), `tool_spec_differs` (a
  tool described otherwise than the environment's spec) and `unknown_tool` (a tool the environment
  declares and the harness does not list: calls of it refused as unknown, or failed trajectories
  that never call it). The share is the failed trajectories that show the mode over the
  trajectories read.

A finding is a harness failure mode of `harness.critic.Mode`; the operator hands it to the critic's
own proposing rules (`harness.critic.propose`, with the environment's tool specs), so the edit, its
value (from the live harness's fields and the environment's specs, never from trajectory text) and
its validation (`harness.agent.check_edit`) are the critic's. Neither kind reads the run's fault
settings (`run.agent.harness_fault`): only the run's own records.

    findings = run_agent_detectors(ev)                  # [Diagnosis(name="agent_turn_limit", ...)]
    AgentHarnessCritic().propose(ev, ctx)               # ctx.harness: the live AgentHarness as a dict

`ev.harness` is the live agent harness (the controller sets it, swarm/agent_run.py); without it the
step detectors say nothing. The detectors have their own registry, not `agents.detection.DETECTORS`:
they run on agent runs only. Thresholds (`END_SHARE`, `STEP_SHARE`) are calibrated on short healthy
and faulted agent runs: benchmarks/agent_detector_calibration.py, results in
benchmarks/results/agent_detector_calibration.md.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from agents.base import Operator, OperatorContext
from agents.detection import make_diagnosis, mean_of
from agents.domain import Diagnosis, Intervention, InterventionKind, Risk
from agents.evidence import Evidence
from harness.agent import AgentHarness
from harness.critic import LIMIT_ENDS, Finding, Mode, diagnose, propose, spent_on_refused
from harness.tools import ToolSpec

# the recent steps' share of trajectories a limit ended with their calls run (`limit_share`), at
# least. Measured as STEP_SHARE: at most 0.02 on 50 healthy windows and 0.06 on the faults no limit
# targets (a parser that rejects the calls reads 0 though it fills the context); at least 0.94 on
# every max_turns=1 window (turn limit)
END_SHARE = 0.5
RECENT = 5           # GRPO rows read (the newest, under the current harness version)
MIN_ROWS = 2         # fewer rows under the current harness: nothing is said yet
# step detectors: the share of the recent sampled trajectories (failed and showing the mode) at
# which each fires. Measured (benchmarks/results/agent_detector_calibration.md, 60 healthy windows
# of 32 trajectories over 10 healthy lookup/calc runs, learned or not): the highest healthy share is
# 0.22 (observation_cut: wrong-key calls whose cut output holds words shown nowhere), 0.03
# (malformed_call), 0 (the others); on the faults each targets the lowest is 0.94 (malformed_call),
# 0.97 (observation_cut), 1.0 (tool_spec_differs; unknown_tool, on lookup from trajectories that
# never call the unlisted tool, on calc from calls of it). 0.5 sits inside every gap with room on
# both sides: 0 of 60 healthy windows fire, every targeted window does.
STEP_SHARE: dict[Mode, float] = {Mode.MALFORMED_CALL: 0.5, Mode.OBSERVATION_CUT: 0.5,
                                 Mode.TOOL_SPEC_DIFFERS: 0.5, Mode.UNKNOWN_TOOL: 0.5}
MIN_SAMPLES = 8      # fewer step-level records under the current harness: nothing is said yet
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


@dataclasses.dataclass(frozen=True)
class LimitShare:
    share: float          # end_share x (1 - refused / ended): what the threshold reads
    end_share: float      # the mean of the column over the rows read
    rows: int             # GRPO rows read
    ended: int            # recent step-level records ended by the limit
    refused: int          # of them, spent on refused calls


def limit_share(ev: Evidence, column: str) -> LimitShare | None:
    """The mean of `column` (a share of trajectories ended by a limit) over the recent GRPO rows of
    the current harness, less the part the recent step-level records of the same harness and end
    spent on refused calls; None with fewer than MIN_ROWS rows. Without such records the mean
    stands as it is."""
    recent = current_rows(ev)[-RECENT:]
    shares = [float(r[column]) for r in recent if isinstance(r.get(column), (int, float))]
    if len(shares) < MIN_ROWS:
        return None
    # a sample is stamped with the step before its row's (the trainer counts a GRPO step after writing it)
    end, since = column.removeprefix("end_"), int(recent[0].get("step", 0))
    ended = [s for s in ev.samples if s.get("end") == end and isinstance(s.get("steps"), list)
             and s.get("harness_version") == recent[-1].get("harness_version") and int(s.get("step", -1)) >= since - 1]
    refused = sum(spent_on_refused(s) for s in ended)
    end_share = mean_of(shares)
    own = 1.0 - refused / len(ended) if ended else 1.0
    return LimitShare(end_share * own, end_share, len(shares), len(ended), refused)


def _limit(ev: Evidence, name: str, column: str, what: str) -> Diagnosis | None:
    got = limit_share(ev, column)
    if got is None or got.share < END_SHARE:
        return None
    end = column.removeprefix("end_")
    rows = current_rows(ev)
    recent = rows[-RECENT:]
    since = int(rows[0].get("step", 0))
    failed = [s for s in ev.samples if int(s.get("step", -1)) >= since - 1 and float(s.get("reward", 0.0) or 0.0) < 1.0]
    ended = sum(1 for s in failed if s.get("end") == end)
    success = mean_of([float(r["success"]) for r in recent if isinstance(r.get("success"), (int, float))])
    n = got.rows
    refused = f" ({got.refused} of {got.ended} sampled ones spent on refused calls)" if got.refused else ""
    return make_diagnosis(ev, name, f"{got.end_share:.0%} of the trajectories of the last {n} GRPO steps ended by "
                                    f"{what}{refused}", "critical" if success == 0.0 else "warning",
                          {"mode": LIMIT_ENDS[end].value, "end_share": got.end_share, "share": got.share, "rows": n,
                           "success": success, "since_step": since,
                           "window_start_step": int(recent[0].get("step", since)), "samples_failed": len(failed),
                           "samples_ended": ended, "samples_refused": got.refused,
                           "harness_version": rows[-1].get("harness_version"), "threshold": END_SHARE})


@agent_detector("agent_turn_limit")
def turn_limit(ev: Evidence) -> Diagnosis | None:
    """Most recent trajectories end because the harness's `max_turns` ran out."""
    return _limit(ev, "agent_turn_limit", "end_max_turns", "the turn limit")


@agent_detector("agent_tool_call_limit")
def tool_call_limit(ev: Evidence) -> Diagnosis | None:
    """Most recent trajectories end because the harness's `max_tool_calls` ran out."""
    return _limit(ev, "agent_tool_call_limit", "end_max_tool_calls", "the tool-call limit")


@agent_detector("agent_context_full")
def context_full(ev: Evidence) -> Diagnosis | None:
    """Most recent trajectories end with the policy's context full, their calls having run."""
    return _limit(ev, "agent_context_full", "end_context_full", "a full context")


# ---- step detectors ------------------------------------------------------------------------------
def live_harness(ev: Evidence) -> AgentHarness | None:
    """The live agent harness `ev` carries, None when it carries none that validates."""
    try:
        return AgentHarness.model_validate(ev.harness) if ev.harness else None
    except ValueError:
        return None


def step_records(ev: Evidence, harness: AgentHarness) -> tuple[list[dict[str, Any]], list[ToolSpec]]:
    """The samples with step-level records under `harness` (oldest first) and the environment's
    tool specs the newest of them names (none when they do not validate)."""
    recs = [s for s in ev.samples if isinstance(s.get("steps"), list) and "end" in s
            and s.get("harness_version") == harness.version]
    try:
        tools = [ToolSpec.model_validate(t) for t in (recs[-1].get("env_tools") or [])] if recs else []
    except ValueError:
        tools = []
    return recs, tools


def step_shares(ev: Evidence) -> tuple[dict[Mode, Finding], int, int] | None:
    """The critic's findings on the recent step-level records under the live harness, by mode, with
    the records read and failed; None when the evidence has no live harness or too few records."""
    harness = live_harness(ev)
    if harness is None:
        return None
    recs, tools = step_records(ev, harness)
    if len(recs) < MIN_SAMPLES:
        return None
    # the critic counts episodes by uid; a GRPO group samples one episode many times, each its own trajectory
    findings, read, failed = diagnose([{**r, "uid": f"{r.get('uid')}#{k}"} for k, r in enumerate(recs)], harness, tools)
    return {f.mode: f for f in findings}, read, failed


def _step(ev: Evidence, name: str, mode: Mode) -> Diagnosis | None:
    got = step_shares(ev)
    if got is None:
        return None
    found, read, failed = got
    f = found.get(mode)
    share = f.count / read if f is not None else 0.0
    if f is None or share < STEP_SHARE[mode]:
        return None
    harness = live_harness(ev)
    assert harness is not None, "step_shares read a harness"
    recs, tools = step_records(ev, harness)
    success = sum((r.get("result") or {}).get("verdict") == "correct" for r in recs) / len(recs)
    return make_diagnosis(ev, name, f"{share:.0%} of the last {read} sampled trajectories failed with {mode.value}: "
                                    f"{f.evidence}", "critical" if success == 0.0 else "warning",
                          {"mode": mode.value, "share": share, "samples_read": read, "samples_failed": failed,
                           "count": f.count, "success": success, "detail": f.detail, "examples": list(f.examples),
                           "env_tools": [t.model_dump(mode="json") for t in tools],
                           "since_step": int(recs[0].get("step", 0)), "harness_version": harness.version,
                           "threshold": STEP_SHARE[mode]})


@agent_detector("agent_malformed_call")
def malformed_call(ev: Evidence) -> Diagnosis | None:
    """Most recent trajectories fail with calls the harness's parser rejected."""
    return _step(ev, "agent_malformed_call", Mode.MALFORMED_CALL)


@agent_detector("agent_observation_cut")
def observation_cut(ev: Evidence) -> Diagnosis | None:
    """Most recent trajectories fail with an observation whose cut removed what the policy needed."""
    return _step(ev, "agent_observation_cut", Mode.OBSERVATION_CUT)


@agent_detector("agent_tool_spec_differs")
def tool_spec_differs(ev: Evidence) -> Diagnosis | None:
    """Most recent trajectories fail around a tool the harness describes otherwise than the environment."""
    return _step(ev, "agent_tool_spec_differs", Mode.TOOL_SPEC_DIFFERS)


@agent_detector("agent_unknown_tool")
def unknown_tool(ev: Evidence) -> Diagnosis | None:
    """Most recent trajectories fail around a tool the environment has and the harness does not list:
    they call it and the harness refuses it as unknown, or they never call it."""
    return _step(ev, "agent_unknown_tool", Mode.UNKNOWN_TOOL)


# what each detector thresholds: a limit detector's metrics column, a step detector's critic mode
LIMIT_COLUMNS = {"agent_turn_limit": "end_max_turns", "agent_tool_call_limit": "end_max_tool_calls",
                 "agent_context_full": "end_context_full"}
STEP_MODES = {"agent_malformed_call": Mode.MALFORMED_CALL, "agent_observation_cut": Mode.OBSERVATION_CUT,
              "agent_tool_spec_differs": Mode.TOOL_SPEC_DIFFERS, "agent_unknown_tool": Mode.UNKNOWN_TOOL}


def detector_shares(ev: Evidence) -> dict[str, float | None]:
    """The share each agent detector compares with its threshold on `ev` (None: it says nothing
    yet): what benchmarks/agent_detector_calibration.py measures."""
    out: dict[str, float | None] = {}
    for name, column in LIMIT_COLUMNS.items():
        got = limit_share(ev, column)
        out[name] = got.share if got else None
    steps = step_shares(ev)
    for name, mode in STEP_MODES.items():
        f = steps[0].get(mode) if steps else None
        out[name] = None if steps is None else (f.count / steps[1] if f is not None else 0.0)
    return out


def run_agent_detectors(ev: Evidence) -> list[Diagnosis]:
    return [d for d in (fn(ev) for fn in AGENT_DETECTORS.values()) if d is not None]


def finding(d: Diagnosis) -> Finding:
    """A detector's diagnosis as the critic's `Finding`: a step detector's with the critic's own
    counts and detail; a limit detector's with its counts from the samples, else the rows."""
    e = d.evidence
    if isinstance(e.get("detail"), dict):
        return Finding(Mode(e["mode"]), int(e["count"]), int(e["samples_failed"]), d.summary,
                       tuple(e.get("examples") or ()), dict(e["detail"]))
    return Finding(Mode(e["mode"]), int(e.get("samples_ended") or e.get("rows") or 1),
                   int(e.get("samples_failed") or e.get("rows") or 1), d.summary)


class AgentHarnessCritic(Operator):
    """The HarnessCritic on an agent run: a finding of the agent detectors → the critic's first
    valid typed edit of the live agent harness (`ctx.harness`), as a harness edit."""

    name = "agent_harness_critic"
    role = ("Reads an agent training run's trajectories (how they end, by which harness limit; each call, its "
            "parse, the observation before and after its cut) and proposes "
            "typed edits of the agent harness (harness.<AgentHarness field>), validated as the live trainer would.")
    tools = frozenset({InterventionKind.HARNESS_EDIT})
    detectors = tuple(AGENT_DETECTORS)

    def diagnose(self, ev: Evidence, ctx: OperatorContext) -> list[Diagnosis]:
        if ctx.findings is None and not ev.harness and ctx.harness:   # the step detectors read the live harness
            ev = ev.model_copy(update={"harness": ctx.harness})
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
            try:
                tools = [ToolSpec.model_validate(t) for t in d.evidence.get("env_tools") or []]
            except ValueError:
                tools = []
            edits, _ = propose([finding(d)], harness, tools)
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
