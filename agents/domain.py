"""Domain objects shared by the controller and the operators: the goal's target, budget, approval
and LLM sections, diagnoses, interventions and their lifecycle.

One home each, at the bottom of the import graph: this module imports no other project module, so
the controller (swarm/), the operators (agents/) and the tests share these types and agents/ never
imports swarm/ (docs/architecture.md, tests/test_layers.py). The operators' view of a run is its
neighbour `agents/evidence.py`. Everything here is plain data (pydantic), so it round-trips through
sqlite, the LangGraph checkpointer, git reports and LLM tool calls.

Evidence is built only from what a run writes (metrics, samples, events, command log,
heartbeat, job status): perturbations are never part of it. Trajectory text inside evidence is
untrusted data — operators quote it, never obey it.
"""
from __future__ import annotations

import enum
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Setting(_Strict):
    """A section of the goal file: like every setting, its floats are finite (`.inf`/`.nan` in YAML
    is refused naming the field). Records (diagnoses, results) may hold a non-finite measurement."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Risk(str, enum.Enum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class InterventionKind(str, enum.Enum):
    RECIPE_EDIT = "recipe_edit"        # changes: {"recipe.lr": 1e-3, ...}
    HARNESS_EDIT = "harness_edit"      # changes: {"harness.template": "...", ...}
    DATA_CHANGE = "data_change"        # changes: {"harness.curriculum.start": 2, "harness.filters.dedupe": true, ...}
    RESTART = "restart"                # restart the job from the last good checkpoint (crash, stall)
    ROLLBACK = "rollback"              # roll the run back to a checkpoint (divergence); changes may hold fixes to apply with it
    DISTILL = "distill"                # switch to rejection-sampling fine-tuning for a while: {"recipe.algorithm": "distill"}


# act on the job itself (a new job or segment): at most one at a time
JOB_ACTIONS = (InterventionKind.RESTART, InterventionKind.ROLLBACK)
# findings that show the run diverged (or its reward did from the task's verifier): a rollback
# they confirm skips the backtest, its control arm would only continue the divergence
DIVERGENCE = frozenset({"nonfinite_loss", "loss_spike", "grad_norm_explosion", "kl_blowup", "reward_hacking"})
# findings that show the live run's config left what the controller set (a field changed behind its
# back): a change they confirm that only goes back to the goal's values skips the backtest, its
# control arm would only continue on the values nobody chose
DEPARTURE = frozenset({"lr_drift", "harness_drift", "recipe_drift"})
# findings that show the job dead or hung
JOB_FINDINGS = frozenset({"crashed_job", "stale_heartbeat"})
# findings that show the job alive on a worker that cannot keep up (its steps wait on the data pipeline)
SLOW_WORKER = frozenset({"input_bound"})
# the only findings a restart may answer (out of memory comes with a crashed job)
RESTART_FINDINGS = JOB_FINDINGS | SLOW_WORKER | {"out_of_memory"}


def cannot_wait(iv: "Intervention") -> bool:
    """A job action that may not wait for another fix's window to be judged: a restart of a dead or
    hung job (nothing trains) or a rollback out of a divergence (every step trains on from it). A
    restart of a job that is only slow (SLOW_WORKER) trains on meanwhile and waits its turn.
    A rollback for anything else (a run that does not learn, a search move from the untrained start)
    throws away the run's progress as much as any fix: it waits its turn like one."""
    return (iv.kind == InterventionKind.RESTART and iv.diagnosis.name not in SLOW_WORKER) or (iv.kind == InterventionKind.ROLLBACK
                                                   and iv.diagnosis.name in DIVERGENCE | DEPARTURE | JOB_FINDINGS)


class JobStatus(str, enum.Enum):
    """A training job's status as the launcher (or the run's heartbeat) reports it."""
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def terminal(cls) -> frozenset["JobStatus"]:
        return frozenset({cls.SUCCEEDED, cls.FAILED, cls.STOPPED})

    @classmethod
    def alive(cls) -> frozenset["JobStatus"]:
        return frozenset({cls.PENDING, cls.RUNNING})


class Status(str, enum.Enum):
    PROPOSED = "proposed"
    BACKTESTING = "backtesting"
    REJECTED = "rejected"
    VALIDATED = "validated"
    AWAITING_APPROVAL = "awaiting_approval"
    APPLIED = "applied"
    EVALUATING = "evaluating"
    KEPT = "kept"
    ROLLED_BACK = "rolled_back"

    @classmethod
    def undecided(cls) -> tuple["Status", ...]:
        """Waiting for the backtest, the gate or a human."""
        return (cls.PROPOSED, cls.BACKTESTING, cls.VALIDATED, cls.AWAITING_APPROVAL)

    @classmethod
    def to_backtest(cls) -> tuple["Status", ...]:
        """Not yet through the backtest."""
        return (cls.PROPOSED, cls.BACKTESTING)

    @classmethod
    def before_gate(cls) -> tuple["Status", ...]:
        """Not yet through the gate (one of a kind at a time)."""
        return (cls.PROPOSED, cls.BACKTESTING, cls.VALIDATED)

    @classmethod
    def passed(cls) -> tuple["Status", ...]:
        """Through the backtest, not yet applied."""
        return (cls.VALIDATED, cls.AWAITING_APPROVAL)

    @classmethod
    def judging(cls) -> tuple["Status", ...]:
        """Being judged, or kept (a human may still roll it back)."""
        return (cls.EVALUATING, cls.KEPT)

    @classmethod
    def in_flight(cls) -> tuple["Status", ...]:
        """Proposed and not yet judged, except those waiting for a human."""
        return (cls.PROPOSED, cls.BACKTESTING, cls.VALIDATED, cls.APPLIED, cls.EVALUATING)

    @classmethod
    def open(cls) -> tuple["Status", ...]:
        """Not yet at a final verdict (kept counts as final: only a human undoes it)."""
        return cls.undecided() + (cls.APPLIED, cls.EVALUATING)

    @classmethod
    def in_force(cls) -> tuple["Status", ...]:
        """Applied to the live run and not undone."""
        return (cls.APPLIED, cls.EVALUATING, cls.KEPT)

    @classmethod
    def judged(cls) -> tuple["Status", ...]:
        """A measured outcome: an episode for memory."""
        return (cls.KEPT, cls.ROLLED_BACK, cls.REJECTED)


# the lifecycle: which status may follow which
TRANSITIONS: dict[Status, set[Status]] = {
    Status.PROPOSED: {Status.BACKTESTING, Status.VALIDATED, Status.REJECTED, Status.AWAITING_APPROVAL, Status.APPLIED},
    Status.BACKTESTING: {Status.REJECTED, Status.VALIDATED},
    Status.VALIDATED: {Status.AWAITING_APPROVAL, Status.APPLIED, Status.REJECTED},
    Status.AWAITING_APPROVAL: {Status.APPLIED, Status.REJECTED},
    Status.APPLIED: {Status.EVALUATING, Status.ROLLED_BACK, Status.KEPT},
    Status.EVALUATING: {Status.KEPT, Status.ROLLED_BACK},
    Status.KEPT: {Status.ROLLED_BACK},
    Status.REJECTED: set(),
    Status.ROLLED_BACK: set(),
}


class Target(_Setting):
    metric: str = Field("heldout_acc", description="a held-out metric the trainer writes on eval steps, one of "
                        "trainer.runlog.HELDOUT_METRICS (accuracy, malformed and truncated rates)")
    op: Literal[">=", "<="] = Field(">=", description="how the metric compares with the threshold when the goal is met")
    threshold: float = Field(0.95, description="the value the metric must reach; the run stops there unless `stop` "
                             "is false (a held-out metric is a rate: in [0, 1])")
    stop: bool = Field(True, description="end the run when the target is met; false: train on to the budget, "
                       "watched as before (a drop below the target is a problem like any other). Either way the run "
                       "is judged on its final value, and the time the target was first met is reported")

    def met(self, value: float | None) -> bool:
        if value is None:
            return False
        return value >= self.threshold if self.op == ">=" else value <= self.threshold


class Budget(_Setting):
    wall_s: float = Field(3600.0, gt=0, description="wall-clock seconds of the whole swarm run")
    steps: int = Field(100_000, gt=0, description="total trainer steps over all segments")
    worker_cpu_s: float = Field(7200.0, gt=0, description="CPU seconds of every trainer process: the run, its "
                                "restarts and every backtest arm")
    llm_usd: float = Field(1.0, ge=0, description="LLM spend cap in USD; at the cap the built-in policies decide")


class ApprovalPolicy(_Setting):
    auto: list[Risk] = Field(default_factory=lambda: [Risk.LOW, Risk.MEDIUM], description="risk levels applied automatically")

    def needs_human(self, risk: Risk) -> bool:
        return risk not in self.auto


class LLMSettings(_Setting):
    model: str | None = Field(None, description="litellm model string, e.g. openai/gpt-4o-mini; None = built-in policies")
    api_base: str | None = Field(None, description="base URL of the provider, e.g. a local OpenAI-compatible server; "
                                 "None = the provider's default")
    api_key_env: str | None = Field(None, description="environment variable holding the API key")
    timeout_s: float = Field(60.0, gt=0, description="seconds one LLM call may wait for a read")
    max_retries: int = Field(2, ge=0, le=10, description="retries after a malformed reply before the built-in policy decides")
    temperature: float = Field(0.0, ge=0, le=2, description="sampling temperature of the LLM policy (0 = deterministic)")
    record_dir: str | None = Field(None, description="record every exchange here (JSONL) for replay")
    replay: bool = Field(False, description="answer from record_dir instead of calling the provider")


SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}     # most severe first


class Diagnosis(_Strict):
    name: str                              # e.g. "loss_spike", "stale_heartbeat"
    summary: str
    severity: Literal["info", "warning", "critical"] = "warning"
    operator: str
    policy: str                            # "builtin" or "llm:<model>"
    evidence: dict[str, Any] = Field(default_factory=dict)
    step: int = 0


# a backtest's arms that all stay within this many held-out examples of a bound (none right, or
# all) have not left it: the rule of three (3/n is the 95% upper bound of a rate none of n showed)
FLOOR_EXAMPLES = 3


class BacktestResult(_Strict):
    metric: str
    candidate: list[float]
    control: list[float]
    effect: float                          # the deciding signal's posterior mean effect, + is better
    p_value: float                         # 1 - P(gain ≥ the minimum effect) of the deciding signal
    test: str                              # the statistical rule used, stated
    horizon_steps: int
    seeds: list[int]
    passed: bool
    note: str = ""
    signal: str = Field("target", description="the signal that decided (swarm.decisions.decide)")
    cpu_s: float | None = Field(None, description="worker CPU seconds of the backtest's arms")
    eval_size: int | None = Field(None, description="held-out examples behind each arm's target, when it is a rate")
    control_heldout_loss: float | None = Field(None, description="the control arms' mean held-out answer loss at the "
                                               "horizon (SFT evals; None: not measured by every control arm)")
    control_heldout_loss_se: float | None = Field(None, description="its standard error (the arms' own, combined)")
    fork_step: int | None = Field(None, description="the live run's step its arms started from (None: not recorded)")
    candidate_arms: list[str] = Field(default_factory=list, description="the candidate arms' folders under the "
                                      "backtests folder, in the order of `seeds` (a validated change may adopt one: "
                                      "swarm.backtest.adoptable)")
    harmed: bool | None = Field(None, description="rejected because a signal was credibly worse (swarm.decisions.decide): "
                                "evidence against the fix; False: rejected without it (no gain found, which is not a "
                                "loss); None: not recorded (a result stored before the field existed)")

    def measured_nothing(self) -> bool:
        """Every arm, candidate and control, measured the same bound of a rate (all at a held-out
        accuracy of 0 over a horizon too short to leave the floor, or all at 1), or, with the eval
        size known, stayed within FLOOR_EXAMPLES examples of it (at most 3 of 200 right: 3/n bounds
        a rate of which none of n was seen, at 95%): arms that have not left a bound cannot show a
        difference, so their effect, whatever its sign, is no evidence against the fix. Equal arms
        inside the range did measure something: that the change made no difference."""
        values = [*self.candidate, *self.control]
        if not self.candidate or not self.control:
            return False
        if len(set(values)) == 1 and set(values) <= {0.0, 1.0}:
            return True
        slack = FLOOR_EXAMPLES / self.eval_size if self.eval_size else 0.0
        return bool(slack) and (max(values) <= slack or min(values) >= 1.0 - slack)


class Outcome(_Strict):
    """What happened to an intervention, filled in as it moves through its lifecycle (None: not
    reached, or not measured). Recorded with the intervention; only the fields that are set are
    written (`recorded`)."""

    # the controller's risk (swarm.deciding: assess, reassess, smaller_alternative)
    proposed_risk: str | None = Field(None, description="the proposer's risk, which the controller replaces with its own")
    risk_reason: str | None = Field(None, description="why the controller rated it as it did (swarm.decisions.assign_risk)")
    risk_cause: str | None = Field(None, description="what made it high: size, objective, unknown (None: not high)")
    risk_before_backtest: str | None = Field(None, description="its risk before a held-out gain was measured")
    smaller_step_of: str | None = Field(None, description="the high-risk intervention this one is a smaller step of")
    alternative: str | None = Field(None, description="the smaller step proposed while this one waits for a human")
    # plan and backtest
    refused: str | None = Field(None, description="refused before or at apply (invalid, a no-op, the trainer said no): a loss")
    exhausted: str | None = Field(None, description="its backtests ran out of longer horizons without a gain: a loss")
    backtest_cpu_s: float | None = Field(None, description="worker CPU-s its backtest's arms used")
    paused_for_backtest: bool | None = Field(None, description="the live job is paused while its arms run")
    fork_tries: int | None = Field(None, description="failed tries to fork the live run for its arms")
    # apply
    before: dict[str, Any] | None = Field(None, description="the values it replaced, as the live run published them")
    step_left: int | None = Field(None, description="the run's step when it was applied (a rollback's window starts there)")
    baseline: float | None = Field(None, description="the target metric just before applying")
    since_time: float | None = Field(None, description="rows after this time belong to the timeline it created")
    pace_before: float | None = Field(None, description="a restart of a slow job: the median seconds per training "
                                      "step over the last rows before it, as the controller read them")
    cpu_at_apply: float | None = Field(None, description="the live run's worker CPU-s when it was applied")
    faults_at_apply: list[str] | None = Field(None, description="the causes the detectors named when it was applied, "
                                              "other than its own diagnosis: faults the run was already under")
    carried_over: list[str] | None = Field(None, description="later fixes set again after its rollback")
    rollback_skipped: str | None = Field(None, description="why its rollback only set the fields again")
    adopted: str | None = Field(None, description="the backtest arm whose state the live run took on when it was "
                                "applied (swarm.backtest.adoptable), and that state's step")
    not_adopted: str | None = Field(None, description="why it was applied to the live state, not by adopting an arm")
    # judge (swarm.judging.judge)
    looks: int | None = Field(None, description="evaluation windows looked at")
    pending: str | None = Field(None, description="why the last look was inconclusive")
    fell: bool | None = Field(None, description="the last look found it credibly worse, not by enough to undo "
                              "on one look: the next undoes it if it finds it so too")
    after: float | None = Field(None, description="the target metric at the end of its window")
    window_steps: int | None = Field(None, description="training steps of its window")
    control: float | None = Field(None, description="the value it was compared with")
    control_source: str | None = Field(None, description="where the control came from")
    window_cpu_s: float | None = Field(None, description="worker CPU-s of its window")
    rule: str | None = Field(None, description="the rule that judged it")
    gain: bool | None = Field(None, description="a measured gain over the control")
    undone: bool | None = Field(None, description="rolled back (False: no gain, left in force)")

    def recorded(self) -> dict[str, Any]:
        """The fields that are set."""
        return self.model_dump(mode="json", exclude_none=True)


class Intervention(_Strict):
    id: str = Field(default_factory=lambda: uuid.uuid4().hex[:8])
    kind: InterventionKind
    changes: dict[str, Any] = Field(default_factory=dict, description="dotted recipe.*/harness.* fields to set")
    diagnosis: Diagnosis
    rationale: str
    risk: Risk = Risk.LOW
    expected_effect: str = ""
    operator: str
    policy: str
    skills_used: list[str] = Field(default_factory=list)
    status: Status = Status.PROPOSED
    backtest: BacktestResult | None = None
    backtest_skipped: str | None = Field(None, description="why the backtest was skipped (crash restart, divergence rollback)")
    checkpoint_before: str | None = None
    applied_step: int | None = None
    branch: str | None = None
    outcome: Outcome = Field(default_factory=lambda: Outcome())
    history: list[dict[str, Any]] = Field(default_factory=list)
    created: float = Field(default_factory=time.time)

    @model_validator(mode="after")
    def _changes_are_fields(self) -> "Intervention":
        for k in self.changes:
            if not (k.startswith("recipe.") or k.startswith("harness.")):
                raise ValueError(f"intervention change {k!r}: only recipe.* and harness.* fields can change")
        return self

    @field_serializer("outcome")
    def _outcome_set_fields(self, o: Outcome) -> dict[str, Any]:
        return o.recorded()

    def move(self, to: Status, note: str = "") -> None:
        if to not in TRANSITIONS[self.status]:
            raise ValueError(f"intervention {self.id}: cannot go from {self.status.value} to {to.value}")
        self.history.append({"from": self.status.value, "to": to.value, "time": time.time(), "note": note})
        self.status = to

    def signature(self) -> str:
        """What makes two interventions 'the same fix' (for dedupe and skill mining)."""
        return f"{self.diagnosis.name}|{self.kind.value}|{','.join(sorted(self.changes))}"
