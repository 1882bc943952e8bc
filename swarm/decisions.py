"""The swarm's decision model: three pure functions with explicit result types.

    worth_verifying(iv, …)     -> None | reason                                     before it is recorded
    plan(iv, facts)            -> Skip(reason) | Refuse(reason) | Backtest(spec)   before any compute
    schedule(seeds, …)         -> the looks of a backtest (one seed first, one more per look)
    retry_horizon(h, k)        -> a longer horizon for a fix whose earlier backtests were inconclusive
    try_share(k)               -> the share of alpha that try spends (all tries of a fix: alpha)
    decide(pairs, rule)        -> Validated | Rejected | Extend                     on the backtest's arms
    judge(window, control, …)  -> Kept | RolledBack(undo) | Pending                 after applying (swarm/judging.py)
    assign_risk(iv, current, start, validated_on) -> RiskCall                       the controller's, not the proposer's
    smaller_step(changes, current) -> the same change cut to a size not rated high   while a high-risk fix waits

Every intervention passes the same decisions whatever proposed it (a built-in policy, an LLM, a
skill). They read recorded data only — the controller (swarm/controller.py) gathers it (runs the
detectors, validates the change as the live trainer would, runs the backtest arms, reads the
evaluation window) and acts on the result. Tested on tables of inputs in tests/test_decisions.py.

The statistical rule (`decide`, and `judge` with the same posterior):
  For a signal (candidate − control, signed so that + is better) each seed i gives a difference
  d_i with a measurement variance v_i: for a held-out rate on n examples the binomial variance of
  both arms with a Laplace-smoothed rate ((k+1)/(n+2), never 0, so one seed or zero variance is
  never certainty); for a training-loss or pass-rate mean the squared standard errors of both
  arms' means. Seeds are combined by inverse-variance weights 1/(v_i + tau^2), tau^2 the spread
  between seeds beyond measurement noise (DerSimonian-Laird). One seed cannot measure that spread,
  so a look at one seed takes tau = SEED_SPREAD (0.05 of a rate or pass rate, 5% of the control's
  loss): more than the spread measured between the two seeds of 65 backtests of the benchmark
  suites (rms 0.039 of the per-seed effect, binomial noise included). With a flat prior
  the mean effect is Normal(mean, se^2) and P(gain) = P(effect > delta), P(harm) = P(effect < -delta)
  with delta the minimum effect (one held-out example, 1/n, on a rate; 1% of the control's loss;
  0.01 of pass rate).
  Signals in order: (1) the target metric, (2) the held-out answer loss at the arm's end: the mean
  negative log-likelihood of the task's own answers to the held-out questions, with its standard
  error over the questions (delta 1% of the control's; only when both arms train SFT on the same
  targets, so the answers are rendered alike), (3) the held-out format-failure rate (truncated +
  malformed), (4) the mean SFT training loss over the horizon's second half (the same
  condition), (5) the mean training pass rate over the second half (only when both arms train on
  the same data). Neither loss is read for a change that lowers the lr in force with both arms
  going on from one trained state (`swarm.backtest.anneals`): within a horizon a lower lr lowers
  the loss whatever it does to the run. The first conclusive signal decides: P(harm) >= 1 - alpha →
  Rejected; P(gain) >= 1 - share x alpha/m → Validated, unless it is a secondary signal and a held-out
  signal later in the order is credibly worse (conflicting held-out evidence: Extend while a look
  remains, else Rejected) (share: 1/2 at a fix's first try, `try_share`), with m = (signals available) x (looks planned: a
  second, longer look when the finding is critical). A secondary signal is consulted only while
  the target is not lower by more than delta on average (lower, not credibly worse: Extend when a
  look remains, else Rejected), except the held-out answer loss, whose credible gain at the last
  look with no held-out signal credibly worse validates over such a target (one credibly worse:
  Extend while a look remains, else Rejected as harm). Nothing conclusive: Extend when a look remains, else Rejected — no
  measured gain is a rejection, never a validation.
  Looks (`schedule`): the first runs one seed's pair of arms, each next one adds a seed, and a
  critical finding's fix gets one more over `extend_factor` x the horizon with every seed. A clear
  effect (for or against) is decided on the first pair; only an unclear one pays for the others.
  Error rate: under the Normal model the chance that a change with no effect of at least delta on
  any signal is validated is at most alpha over all signals and looks (Bonferroni), and over all
  the tries of one fix (`try_share` splits alpha between them). It holds while the spread between
  seeds is within what a one-seed look assumes (SEED_SPREAD): simulated in
  tests/test_decision_alpha.py, which also shows it failing at a larger spread.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Union

from agents.detection import THRESHOLDS
from agents.domain import DEPARTURE, DIVERGENCE, JOB_FINDINGS, RESTART_FINDINGS, SLOW_WORKER, Intervention, InterventionKind as K, Risk
from harness.changes import OBJECTIVE_FIELDS, TASK_SCORING, changes_data, positional, reads_later_data

# ---- plan ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BacktestSpec:
    horizon_steps: int
    seeds: tuple[int, ...]
    label: str = ""


@dataclass(frozen=True)
class Skip:
    """No backtest: the controller's own detectors confirm the claim (or a trusted skill backs it)."""
    reason: str


@dataclass(frozen=True)
class Refuse:
    """Rejected before any compute: invalid, a no-op, a claim the evidence does not confirm, or a
    fix whose backtests ran out of longer horizons without a measured gain (`exhausted`: a loss)."""
    reason: str
    exhausted: bool = False


@dataclass(frozen=True)
class Backtest:
    spec: BacktestSpec


Plan = Union[Skip, Refuse, Backtest]


@dataclass(frozen=True)
class Facts:
    """What the controller established about a proposal on the current evidence."""
    findings: frozenset[str]            # names of the detectors firing now (the controller's own run)
    risk: Risk                          # assign_risk's, never the proposer's
    spec: BacktestSpec
    invalid: str | None = None          # why the live trainer would refuse the change
    noop: str | None = None             # why the change would change nothing
    trusted: str | None = None          # a skill's record that lets the fix skip its backtest
    restores: bool = True               # every field it sets goes back to the goal's starting value
    reverts: bool = True                # every field it sets goes back to the value the controller set (in force
                                        # by its record: the goal's, or an applied intervention's)
    tries_without_gain: int = 0         # earlier backtests of this fix (this run) with a gain too small to tell


# the fields a departure finding says left what the controller set (dotted prefixes)
DEPARTED_FIELDS = {"harness_drift": ("harness.",), "recipe_drift": ("recipe.",), "lr_drift": ("recipe.lr",)}


def departures_covering(changes: dict[str, Any], findings: frozenset[str]) -> frozenset[str]:
    """The departure findings among `findings` whose fields hold every field of `changes` (none
    for a change that sets nothing or sets a field no departure finding covers)."""
    found = {n: DEPARTED_FIELDS[n] for n in findings & DEPARTURE if n in DEPARTED_FIELDS}
    held = {n for n, prefixes in found.items() if any(k == p or k.startswith(p) for k in changes for p in prefixes)}
    if not changes or not all(any(k == p or k.startswith(p) for n in held for p in found[n]) for k in changes):
        return frozenset()
    return frozenset(held)


def plan(iv: Intervention, facts: Facts) -> Plan:
    """One rule: Refuse when something the controller checked disqualifies the proposal (the first
    of `refusals`); else Skip the backtest when the evidence confirms the claim now and a control
    arm would show nothing (the first of `shortcuts`), never for a high-risk change; else Backtest."""
    refused = next((r for r in refusals(iv, facts) if r is not None), None)
    if refused is not None:
        return refused
    if facts.risk != Risk.HIGH:
        skip = next((r for r in shortcuts(iv, facts) if r), None)
        if skip:
            return Skip(skip)
    return Backtest(facts.spec)


def refusals(iv: Intervention, facts: Facts) -> list[Refuse | None]:
    """What disqualifies a proposal before any compute, in order: a change the live trainer would
    refuse; one that changes nothing; a fix backtested more than RETRY_DOUBLINGS times with gains
    too small to tell, its last look already over the longest retry horizon (a loss); a restart
    whose diagnosis the detectors do not find now among the findings a restart answers (a crashed,
    stale or input-bound job, out of memory): what the proposer claims does not restart a job."""
    return [
        Refuse(f"the live trainer would refuse it: {facts.invalid}") if facts.invalid else None,
        Refuse(facts.noop) if facts.noop else None,
        Refuse(f"backtested {facts.tries_without_gain} times without a measured gain, the last over "
               f"{2 ** RETRY_DOUBLINGS}x the horizon (swarm.decisions.retry_horizon): a loss", exhausted=True)
        if facts.tries_without_gain > RETRY_DOUBLINGS else None,
        Refuse(f"restart for {iv.diagnosis.name!r}: the detectors see no crashed, stale or input-bound job now"
               if not facts.findings & RESTART_FINDINGS else
               f"restart for {iv.diagnosis.name!r}: no such finding now (a restart answers "
               f"{', '.join(sorted(facts.findings & RESTART_FINDINGS))} only as itself)")
        if iv.kind == K.RESTART and iv.diagnosis.name not in facts.findings & RESTART_FINDINGS else None,
    ]


def shortcuts(iv: Intervention, facts: Facts) -> list[str]:
    """Why a proposal needs no backtest ('' where a reason does not hold), in order:
    - a restart of a job the detectors find crashed or stale: a dead or hung job trains nothing to
      compare against; or input-bound: a restart changes no field and no weight, so arms forked
      from one checkpoint would train the same steps (the judge compares step times instead);
    - going back where the detectors confirm now that the run left where it was put: a rollback
      claiming a divergence, with a divergence finding, that sets every field back to the goal's
      starting value (`restores`); a change whose every field lies where the detectors find the
      live config left what the controller set (departures_covering: the harness for
      harness_drift, the recipe for recipe_drift, the lr for lr_drift), whatever its proposer
      named, that sets every field back to the controller's value (`reverts`). The finding
      justifies going back, not a new value; the post-apply judgement compares with the value
      measured just before applying;
    - a fix a trusted skill backs whose diagnosis is confirmed now, other than a divergence
      rollback (its checkpoint and lr are this run's own, which no skill knows)."""
    seen = sorted(facts.findings & JOB_FINDINGS)
    slow = sorted(facts.findings & SLOW_WORKER)
    diverges = iv.kind == K.ROLLBACK and iv.diagnosis.name in DIVERGENCE
    diverged = facts.findings & DIVERGENCE if diverges and facts.restores else frozenset()
    departed = departures_covering(iv.changes, facts.findings) if facts.reverts else frozenset()
    whose = "the goal's values" if diverged else "the values the controller set"
    return [
        f"restart of a job the detectors find {' and '.join(seen)}: nothing to compare against"
        if iv.kind == K.RESTART and seen else "",
        f"restart of a job the detectors find {' and '.join(slow)}: it changes no field and no weight, arms from "
        "one checkpoint would train the same steps" if iv.kind == K.RESTART and not iv.changes and slow else "",
        f"goes back to {whose}; the detectors find the run left them ({', '.join(sorted(diverged | departed))}): "
        "the control arm would only continue there" if diverged | departed else "",
        facts.trusted or "" if iv.diagnosis.name in facts.findings and not diverges else "",
    ]


# ---- worth it? ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outlook:
    """Where the target is heading with no intervention, from the run's latest held-out evals."""
    steps_to_target: float | None         # projected training steps until the target (None: no projection)
    slope: float | None = None            # target units per step, + towards the target
    evals: int = 0
    why: str = ""


def outlook(evals: list[tuple[int, float]], threshold: float, higher_is_better: bool, k: int = 4) -> Outlook:
    """A least-squares line through the last `k` evals (step, value) of the current timeline,
    extended to the threshold: the steps the run needs to reach it at its current rate. No
    projection with fewer than two evals or a line not heading towards the target."""
    pts = evals[-k:]
    if len(pts) < 2 or len({x for x, _ in pts}) < 2:
        return Outlook(None, None, len(pts), "fewer than two evals to draw a trend through")
    sign = 1.0 if higher_is_better else -1.0
    xs, ys = [float(x) for x, _ in pts], [sign * float(y) for _, y in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    if slope <= 0:
        return Outlook(None, slope, len(pts), f"the last {len(pts)} evals are not heading towards the target")
    now = my + slope * (xs[-1] - mx)
    steps = max(0.0, (sign * threshold - now) / slope)
    return Outlook(steps, slope, len(pts), f"the last {len(pts)} evals move {slope * 100:.3g} per 100 steps "
                                           f"towards the target: there in ~{steps:.0f} steps")


# A line through the last evals is optimistic near the target, where learning curves flatten:
# replayed on the suite's plain and oracle runs that went on to the target, projections shorter
# than a tenth of the budget left came true only after a median 2.43x the projected worker CPU
# (90th percentile 8.5x; benchmarks/outlook_calibration.py, benchmarks/results/outlook_calibration.md).
# A fix is held back for the outlook only when the projection stretched by this factor is shorter
# than verifying it, and within the budget.
OUTLOOK_SLACK = 2.43


# findings after which the run's own trend says nothing: the job is not training, or its loss is not finite
NO_TREND = JOB_FINDINGS | {"nonfinite_loss"}


# a finding acts once it was seen on two looks at least PERSIST_STEPS steps apart (the detectors'
# `recent` window: the second look reads rows the first did not) among the last PERSIST_WITHIN looks
# of the current timeline (since the latest applied change), in a row or not. Replayed tick by tick,
# the detectors that fire on healthy runs fire there on one tick each (truncation, malformed answers,
# entropy collapse, loss spikes: 9, 10, 9 and 3 fires on 9, 10, 9 and 3 of 39 healthy runs), while
# on the faulted runs they detect they hold for many (benchmarks/results/detector_calibration.md) —
# but not on every look: a detector that reads noisy statistics (a loss median over 20 rows, the
# best of the last few evals) misses some looks while its fault is in force, and a look every ~40
# steps lands on a miss about as often as on a fire. A streak that a miss resets deferred such a fix
# for most of a run; a false alarm's single tick is still one look however they are counted.
PERSIST_LOOKS = 2
PERSIST_STEPS = THRESHOLDS.recent
PERSIST_WITHIN = 10


@dataclass(frozen=True)
class Sighting:
    """One look of the controller at which a finding was seen: its ordinal among the controller's
    looks, the run's step and the wall-clock time."""
    n: int
    step: int
    time: float


def persistence(looks: list[Sighting], now: Sighting, since: float) -> tuple[int, int] | None:
    """(looks, steps) a finding has held for: how many of the last PERSIST_WITHIN looks up to `now`
    and of the current timeline (looks at or after `since`, the latest applied change's time) saw it,
    and the steps from the first of them to `now`; None when none did."""
    seen = [x for x in looks if x.time >= since and now.n - PERSIST_WITHIN < x.n <= now.n]
    if not seen:
        return None
    return len(seen), max(0, now.step - seen[0].step)


TASK_FACT = "the task's facts"


def corroborated_by(diagnosis: Any, findings: list[Any], changes: dict[str, Any] | None = None) -> str | None:
    """The departure finding (DEPARTURE: the live config left what the controller set, read from the
    versions and lr the run reports) that began at or before `diagnosis`' onset, or None. A finding
    that follows a config change nobody commanded is not the one-look false alarm of a healthy run:
    on those nothing changed. A departure finding corroborates itself (it already holds on
    `recent` rows in a row). So does a finding the detectors read now from the config and the task's
    own facts, no statistic (evidence `task_fact`: the field whose value the task's answers contradict),
    for a change of that field (`changes`), answered TASK_FACT: it holds on every look or on none."""
    if diagnosis.name in DEPARTURE:
        return diagnosis.name
    if any(d.name == diagnosis.name and d.evidence.get("task_fact") in (changes or {}) for d in findings):
        return TASK_FACT
    onset = diagnosis.evidence.get("onset_step", diagnosis.step)
    for d in findings:
        since = d.evidence.get("since_step")
        if d.name in DEPARTURE and isinstance(since, (int, float)) and isinstance(onset, (int, float)) and since <= onset:
            return d.name
    return None


def arm_step_cost(backtests: list[Any], live_cpu_s: float, live_step: int) -> float:
    """What one training step of a backtest arm costs in steps of the live job, measured on this
    run: the median over its finished backtests of their worker CPU per arm-step (`cpu_s` over 2 ×
    seeds × horizon), divided by the live job's CPU per step. An arm pays its start, its fork and
    its closing evaluation on top of its steps, which counting its steps alone leaves out. 1.0
    (never less) until a backtest and the live job have both been measured."""
    per = [b.cpu_s / (2 * len(b.seeds) * b.horizon_steps) for b in backtests
           if b is not None and b.cpu_s and b.seeds and b.horizon_steps]
    if not per or live_cpu_s <= 0 or live_step <= 0:
        return 1.0
    return max(1.0, statistics.median(per) / (live_cpu_s / live_step))


def segment_steps(heartbeat: dict[str, Any]) -> int:
    """Steps the live job's current process has trained, from its heartbeat (`step - since_step`;
    0 when the heartbeat does not say where it started). A process that started at step 0 names 0."""
    step, since = heartbeat.get("step"), heartbeat.get("since_step")
    return max(0, int(step) - int(since)) if isinstance(step, int) and isinstance(since, int) else 0


def too_new(held_for: tuple[int, int] | None, corroborated: str | None = None) -> bool:
    """Whether a finding seen `held_for` (looks, steps: `persistence`) is too new to act on: on fewer
    than PERSIST_LOOKS looks spanning PERSIST_STEPS steps, and no departure or task fact corroborates
    it (`worth_verifying`)."""
    return corroborated is None and held_for is not None and (held_for[0] < PERSIST_LOOKS or held_for[1] < PERSIST_STEPS)


def worth_verifying(iv: Intervention, findings: frozenset[str], view: Outlook, verify_steps: int,
                    next_eval_in: int | None = None, held_for: tuple[int, int] | None = None,
                    corroborated: str | None = None, steps_left: int | None = None, measured: bool = True) -> str | None:
    """Why an intervention is not worth its cost now (None: it may be), before it is recorded.
    Every change is verified — by a backtest, or by its evaluation window — and `verify_steps` is
    the smaller of the two: the backtest's candidate and control arms over its horizon, in training
    steps of the same config, or 0 for a change `plan` lets skip its backtest (its window is the
    live run's own training, so verifying it costs nothing extra and it is never held). The most a fix can save is what the run still needs to reach the
    target, so when the run is on course to the target in fewer steps than that (`outlook`), the
    fix cannot pay for itself and waits: it is proposed again on later ticks, when the trend may
    have turned. With fewer than two evals there is no trend yet: when the next eval is due in
    fewer steps (`next_eval_in`) than verifying would train, the fix waits for it — the eval costs
    less than the backtest and says whether the fix can pay at all. A restart, or a run whose loss
    is not finite, is never held (no trend to project). Before any of that, a fix for a finding
    seen on fewer than PERSIST_LOOKS looks spanning PERSIST_STEPS steps (`held_for`: the looks of
    the current timeline's last PERSIST_WITHIN that saw it and the steps since the first of them, as
    `persistence()` counts them; None when its diagnosis is no current finding) waits for a later look:
    holding for one look only is how false alarms look — unless
    a departure finding `corroborated` it (corroborated_by: the config changed behind the
    controller's back at or before its onset), or the task's facts did (TASK_FACT: the config keeps
    the target out of reach, which no eval of it can contradict, so there is no eval to wait for
    either). A run is on course only if it gets there within its
    budget: a projection past `steps_left` (the training steps the budget still pays for at the
    run's CPU per step so far, arms included) holds nothing back. The projection is stretched by
    OUTLOOK_SLACK before either comparison: near the target a straight line is optimistic.
    A change that skips its backtest (`verify_steps` 0) is judged against the value of the target
    measured just before applying: with none measured yet (`measured` False) the judge would have
    nothing to compare it with, and a fix that worked would count as a loss; it waits for the next
    eval."""
    if iv.kind == K.RESTART or findings & NO_TREND:
        return None
    if verify_steps == 0 and not measured and next_eval_in is not None:
        return (f"nothing measured yet to judge it against after applying (it skips its backtest): it waits for the "
                f"next held-out eval, due in {next_eval_in} steps")
    if too_new(held_for, corroborated):
        return (f"{iv.diagnosis.name} seen on {held_for[0]} look(s) over {held_for[1]} step(s): on healthy runs a "
                f"detector's false alarm lasts one look, so the fix waits for a look at newer rows")
    if view.evals < 2 and next_eval_in is not None and next_eval_in < verify_steps and corroborated != TASK_FACT:
        return (f"no trend yet ({view.evals} held-out eval(s) in this timeline): the next eval, due in {next_eval_in} steps, "
                f"costs less than verifying this change ({verify_steps} steps of arms) and says whether it can pay for itself")
    if view.steps_to_target is None:
        return None
    expected = view.steps_to_target * OUTLOOK_SLACK     # the projection, stretched as the suite's runs needed
    if steps_left is not None and expected > steps_left:
        return None
    if expected < verify_steps:
        return (f"on course to the target: {view.why} (~{expected:.0f} as such projections come true), fewer than "
                f"verifying this change would train ({verify_steps} steps of arms): it cannot pay for itself")
    return None


# ---- risk ---------------------------------------------------------------------------------------
#
# Risk says what could go wrong that the swarm could not undo by itself. A config edit (recipe or
# harness fields) is reversible: it is applied after a `pre-` checkpoint, and the post-apply judge
# compares the target with a control and, on credible harm, rolls the weights back to that
# checkpoint with the fields; the most it costs is the judge's window of training. So an edit is
# MEDIUM, and LOW for a restart, a curriculum change to data no harder than now, or a data change
# that pins the data source to an earlier revision (a position, never rated by size; a later revision
# or none, which reads data a pin kept out, is MEDIUM). Three things make
# a change HIGH, because the judge could not see or undo them: (1) it changes the objective — a
# reward field set to a value under which training no longer scores an answer the way the target
# does (neither the goal's starting value nor the task's own scoring), or a new algorithm (other than
# distillation, which trains on verified answers only, or the goal's own); (2) a numeric field moved
# more than RAISE_HIGH× up or LOWER_HIGH× down from its value in force with no gain measured on
# held-out behaviour behind it (before its backtest, after a skipped one, or validated only on a
# training loss or pass rate, which such a move can improve while held-out answers do not), since
# damage of such a move may build up past the judge's window — except, once a backtest validated
# it, a raise of a field that only says how many samples an update averages over (SAMPLE_SIZE): the
# update's expected direction stays the same with less noise, so it cannot teach the weights what
# the examples do not; and any move of a field the run's updates never read (SFT_UNREAD under
# `algorithm` sft, which trains on the targets whole: what the policy writes when sampled): it
# changes what the evals and samples show, which the judge measures and undoes, and no weights.
# Either costs compute, which the budget counts, and its arm ran it on this machine, so its memory
# fits; (3) a numeric field with no value in force to compare with. A rollback discards the steps since its checkpoint: the controller caps
# that at the backtest's stake when it applies one (`too_far_back`). The proposer's risk is ignored.
# Stated as a table in docs/decisions.md and tested row by row in tests/test_decisions.py.

RAISE_HIGH = 3.0        # a numeric field raised more than this factor is a large move
# fields that say how many examples one update averages over (not GRPO's group size: advantages are
# normalised within a group and the pass-rate filter reads it, so the expected update changes with it)
SAMPLE_SIZE = ("recipe.batch_size", "recipe.sft_warmup_batch_size")
SFT_UNREAD = ("harness.sampling.",)    # what an SFT update never reads: it trains on the targets whole
LOWER_HIGH = 1000.0     # or lowered more than this factor
# fields whose value says what counts as correct (the harness says which of its own do), or how
# the run is trained
_OBJECTIVE = (*OBJECTIVE_FIELDS, "recipe.algorithm")
# the reward under which training scores an answer as the target metric does: the task's own
# verifier, exact credit, no shaping (the reward's defaults; harness/changes.py)
# signals of `decide` that measure held-out behaviour (the others are training statistics)
TARGET_SIGNAL, FORMAT_SIGNAL, HELDOUT_LOSS_SIGNAL = "target", "held-out format failures", "held-out answer loss"
HELD_OUT_SIGNALS = (TARGET_SIGNAL, FORMAT_SIGNAL, HELDOUT_LOSS_SIGNAL)


class RiskCall(NamedTuple):
    risk: Risk
    why: str
    cause: str = ""          # what makes it high: "objective", "size" or "unknown" ("" when not high)


def assign_risk(iv: Intervention, current: dict[str, Any], start: dict[str, Any],
                validated_on: str | None = None, algorithm: str | None = None) -> RiskCall:
    """The risk of a change by the model above: `current` holds the dotted fields' values in force
    (the live run's where it reports them), `start` the goal's starting values, `validated_on` the
    signal a passed backtest validated it on (None before one, or when it skipped one), `algorithm`
    the recipe's in force (the change's own, where it sets one)."""
    if iv.kind == K.RESTART and not iv.changes:
        return RiskCall(Risk.LOW, "a restart changes no field")
    risk = Risk.LOW if iv.kind == K.DATA_CHANGE else Risk.MEDIUM
    why = f"{iv.kind.value} of {', '.join(sorted(iv.changes)) or 'no field'}"
    algorithm = iv.changes.get("recipe.algorithm", algorithm)    # what the run trains with once it is applied
    measured = validated_on in HELD_OUT_SIGNALS
    for k, v in iv.changes.items():
        if k in start and start[k] == v:
            continue                                    # back to the goal's own value
        if k.startswith(_OBJECTIVE):
            if (k == "recipe.algorithm" and v == "distill") or (k in TASK_SCORING and TASK_SCORING[k] == v):
                risk = max(risk, Risk.MEDIUM, key=_RANK.get)
                continue
            return RiskCall(Risk.HIGH, f"{k} → {v!r} changes what counts as correct or how the run trains", "objective")
        cur = current.get(k)
        if reads_later_data(k, cur, v):
            risk = max(risk, Risk.MEDIUM, key=_RANK.get)     # back to data from after a pinned revision
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            if not changes_data(k):
                risk = max(risk, Risk.MEDIUM, key=_RANK.get)
            continue
        if not isinstance(cur, (int, float)) or isinstance(cur, bool) or not math.isfinite(float(cur)):
            if positional(k):
                continue
            return RiskCall(Risk.HIGH, f"{k} → {v!r}: no value in force to compare with", "unknown")
        cur, new = float(cur), float(v)
        if positional(k):
            if k.startswith("harness.curriculum.") and k.rsplit(".", 1)[-1] in ("start", "end") and new > cur:
                risk = max(risk, Risk.MEDIUM, key=_RANK.get)             # harder data than now
            continue
        if cur > 0 and new > 0 and (new / cur > RAISE_HIGH or cur / new > LOWER_HIGH):
            move = f"raises it {new / cur:.3g}×" if new > cur else f"lowers it {cur / new:.3g}×"
            if k in SAMPLE_SIZE and new > cur and validated_on is not None:
                why += f"; {k} {cur:g} → {new:g} {move}: more samples per update, validated on the {validated_on}"
            elif not measured and algorithm == "sft" and k.startswith(SFT_UNREAD) and validated_on is not None:
                why += f"; {k} {cur:g} → {new:g} {move}: no SFT update reads it, validated on the {validated_on}"
            elif not measured:
                return RiskCall(Risk.HIGH, f"{k} {cur:g} → {new:g} {move} with no held-out gain measured", "size")
            else:
                why += f"; {k} {cur:g} → {new:g} {move}, validated on the held-out {validated_on}"
        if new != cur or iv.kind == K.DATA_CHANGE:
            risk = max(risk, Risk.MEDIUM, key=_RANK.get)
    return RiskCall(risk, why)


def smaller_step(changes: dict[str, Any], current: dict[str, Any]) -> dict[str, Any] | None:
    """The same change with every numeric move larger than RAISE_HIGH× up or LOWER_HIGH× down cut to
    that bound, in the same direction (integers rounded towards the value in force): the step of
    the change that `assign_risk` does not rate high for its size. None when no field moves that far."""
    out, cut = dict(changes), False
    for k, v in changes.items():
        cur = current.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or isinstance(cur, bool) or not isinstance(cur, (int, float)):
            continue
        if not (cur > 0 and v > 0) or positional(k):
            continue
        if v / cur > RAISE_HIGH:
            step = cur * RAISE_HIGH
        elif cur / v > LOWER_HIGH:
            step = cur / LOWER_HIGH
        else:
            continue
        step = (math.floor(step) if v > cur else math.ceil(step)) if isinstance(v, int) else float(f"{step:.6g}")
        if step != cur:
            out[k], cut = step, True
    return out if cut else None


_RANK = {Risk.LOW: 0, Risk.MEDIUM: 1, Risk.HIGH: 2}


# ---- decide -------------------------------------------------------------------------------------


RETRY_DOUBLINGS = 2     # a fix backtested again after inconclusive gains: its horizon doubles, at most this often


def retry_horizon(horizon: int, inconclusive_before: int) -> int:
    """The horizon of a fix's backtest after `inconclusive_before` earlier backtests of the same fix
    (same signature) in this run ended with a positive effect that was not conclusive: twice the
    horizon per such backtest, at most RETRY_DOUBLINGS times. A gain too small to tell over H steps
    says nothing about 2H (a fix that acts through learning, e.g. an eased curriculum, shows on
    held-out only later); the same look again would only repeat it."""
    return horizon * 2 ** min(max(inconclusive_before, 0), RETRY_DOUBLINGS)


def try_share(inconclusive_before: int) -> float:
    """The share of alpha one backtest of a fix may spend on validating it, after
    `inconclusive_before` earlier ones of the same fix: every retry is one more chance to validate
    a fix that does nothing, so the tries split alpha — half to the first, half of the rest to each
    next, the last try the remainder (1/2, 1/4, 1/4 with RETRY_DOUBLINGS = 2) — and over all of them
    a fix with no effect is validated at most alpha of the time (tests/test_decision_alpha.py).
    Rejecting for credible harm spends nothing (it validates nothing) and keeps the whole alpha."""
    k = min(max(inconclusive_before, 0), RETRY_DOUBLINGS)
    return 2.0 ** -(k + 1) if k < RETRY_DOUBLINGS else 2.0 ** -RETRY_DOUBLINGS


@dataclass(frozen=True)
class Look:
    seeds: tuple[int, ...]                # the seeds whose pairs this look reads (earlier looks' included)
    horizon_factor: int = 1               # x the backtest's horizon


def schedule(seeds: tuple[int, ...] | list[int], critical: bool, extend_factor: int) -> tuple[Look, ...]:
    """The looks of a backtest: one seed's pair of arms first, one more seed per look until every
    seed is in, then — for a fix of a critical finding — every seed again over `extend_factor` x
    the horizon (a restored template, say, pays off only once a slow run starts to learn)."""
    seeds = tuple(seeds)
    looks = [Look(seeds[:i]) for i in range(1, len(seeds) + 1)]
    if critical and extend_factor > 1:
        looks.append(Look(seeds, extend_factor))
    return tuple(looks)



def run_looks(looks: tuple[Look, ...], measure: Callable[[Look, list[int]], list[Pair]],
              rule_at: Callable[[int], "Rule"]) -> tuple["Decision", list[Pair], Look, list[tuple[Look, "Decision"]]]:
    """A backtest's looks in order: each measures the pairs of the seeds it adds at its horizon
    factor (`measure(look, new_seeds)`: the controller runs the arms, a test scripts or simulates
    them), joins them to that horizon's earlier pairs and asks `decide` with the look's rule, until
    a decision is not Extend or the looks run out. Returns the last decision, the pairs it read,
    its look, and each extended look with its decision."""
    done: dict[int, list[Pair]] = {}
    extended: list[tuple[Look, Decision]] = []
    for n, look in enumerate(looks, 1):
        have = done.setdefault(look.horizon_factor, [])
        have.extend(measure(look, [sd for sd in look.seeds if sd not in {p.seed for p in have}]))
        pairs = list(have)
        d = decide(pairs, rule_at(n))
        if not isinstance(d, Extend) or n == len(looks):
            return d, pairs, look, extended
        extended.append((look, d))
    raise ValueError("run_looks: no looks")


@dataclass(frozen=True)
class ArmScore:
    """One arm's measurements at the end of its horizon (None: not measured)."""
    target: float | None
    format_fail: float | None = None      # held-out truncated + malformed share
    loss: float | None = None             # mean SFT loss over the second half
    loss_se: float | None = None          # its standard error (step-to-step spread / sqrt(rows))
    pass_rate: float | None = None        # mean training pass rate over the second half
    pass_se: float | None = None
    heldout_loss: float | None = None     # mean NLL of the task's answers to the held-out questions (SFT)
    heldout_loss_se: float | None = None


@dataclass(frozen=True)
class Pair:
    seed: int
    candidate: ArmScore
    control: ArmScore


@dataclass(frozen=True)
class Rule:
    alpha: float = 0.2
    higher_is_better: bool = True
    eval_size: int = 200                  # held-out examples behind each arm's target
    target_is_rate: bool = True           # a share of eval_size examples (binomial noise known)
    losses_compare: bool = False          # both arms train SFT on the same targets
    heldout_compares: bool = False        # both arms score the same held-out answers the same way
    same_data: bool = False               # both arms train on the same data (pass rates compare)
    looks: int = 1                        # looks planned at this fork (`schedule`)
    look: int = 1                         # this look's number
    share: float = 1.0                    # of alpha, what validating at this try may spend (`try_share`)


@dataclass(frozen=True)
class Signal:
    name: str
    effect: float                         # posterior mean, + is better
    se: float
    delta: float
    p_gain: float
    p_harm: float

    def text(self) -> str:
        return (f"{self.name}: effect {self.effect:+.4g} ± {self.se:.2g}, P(gain > {self.delta:.3g}) = {self.p_gain:.3f}, "
                f"P(harm) = {self.p_harm:.3f}")


@dataclass(frozen=True)
class Validated:
    signal: Signal
    level: float                          # the P(gain) needed (1 - share x alpha/m)
    signals: tuple[Signal, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class Rejected:
    reason: str
    signals: tuple[Signal, ...] = ()
    level: float = 0.0
    harmed: bool = False                  # a signal credibly worse: evidence against the fix, not its absence


@dataclass(frozen=True)
class Extend:
    reason: str
    signals: tuple[Signal, ...] = ()
    level: float = 0.0


Decision = Union[Validated, Rejected, Extend]


def phi(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def rate_var(p: float, n: int) -> float:
    """Binomial variance of a rate measured on n examples, Laplace-smoothed (never 0)."""
    q = (min(max(p, 0.0), 1.0) * n + 1.0) / (n + 2.0)
    return q * (1.0 - q) / n


def combine(diffs: list[float], variances: list[float | None], delta: float, name: str,
            one_seed_tau: float = 0.0) -> Signal | None:
    """The posterior of the mean effect from per-seed differences and their measurement variances
    (None: unknown — then the spread between seeds is all there is, and one seed says nothing).
    `one_seed_tau`: the spread between seeds assumed when one seed cannot measure it."""
    n = len(diffs)
    if n == 0:
        return None
    if any(v is None for v in variances):
        if n < 2:
            return None
        mean = sum(diffs) / n
        sd2 = sum((d - mean) ** 2 for d in diffs) / (n - 1)
        if sd2 <= 0:
            return None                  # zero spread with unknown noise: no basis for odds
        se = math.sqrt(sd2 / n)
    else:
        vs = [max(float(v), 1e-12) for v in variances]  # type: ignore[arg-type]
        tau2 = one_seed_tau ** 2
        if n >= 2:
            m0 = sum(diffs) / n
            tau2 = max(0.0, sum((d - m0) ** 2 for d in diffs) / (n - 1) - sum(vs) / n)
        w = [1.0 / (v + tau2) for v in vs]
        mean = sum(wi * d for wi, d in zip(w, diffs)) / sum(w)
        se = 1.0 / math.sqrt(sum(w))
    return Signal(name, mean, se, delta, phi((mean - delta) / se), phi((-delta - mean) / se))


SEED_SPREAD = 0.05     # the between-seed spread a one-seed look assumes (a share: of a rate, or of the control's loss)


def signals(pairs: list[Pair], rule: Rule) -> list[Signal]:
    """The signals of `decide`, in order, that these arms measure."""
    n = rule.eval_size
    sign = 1.0 if rule.higher_is_better else -1.0
    out: list[Signal] = []
    ok = [p for p in pairs if p.control.target is not None]   # a seed without a control says nothing
    worst = 0.0 if rule.higher_is_better else 1.0
    tgt = [(sign * ((p.candidate.target if p.candidate.target is not None else worst) - p.control.target),
            (rate_var(p.candidate.target if p.candidate.target is not None else worst, n) + rate_var(p.control.target, n))
            if rule.target_is_rate else None) for p in ok]
    t = combine([d for d, _ in tgt], [v for _, v in tgt], 1.0 / n if rule.target_is_rate else 0.0, TARGET_SIGNAL, SEED_SPREAD)
    if t is not None:
        out.append(t)
    # the answers' likelihood before the format-failure rate: it reads the whole answer, its stop
    # included, where a format count moves by whole examples (noise, early in learning)
    hl = [p for p in ok if None not in (p.candidate.heldout_loss, p.control.heldout_loss,
                                        p.candidate.heldout_loss_se, p.control.heldout_loss_se)]
    if rule.heldout_compares and hl and len(hl) == len(ok):
        ref = sum(p.control.heldout_loss for p in hl) / len(hl)
        s = combine([p.control.heldout_loss - p.candidate.heldout_loss for p in hl],
                    [p.candidate.heldout_loss_se ** 2 + p.control.heldout_loss_se ** 2 for p in hl], 0.01 * abs(ref),
                    HELDOUT_LOSS_SIGNAL, SEED_SPREAD * abs(ref))
        if s is not None:
            out.append(s)
    ff = [p for p in ok if p.candidate.format_fail is not None and p.control.format_fail is not None]
    if ff:
        s = combine([p.control.format_fail - p.candidate.format_fail for p in ff],
                    [rate_var(p.candidate.format_fail, n) + rate_var(p.control.format_fail, n) for p in ff],
                    1.0 / n, FORMAT_SIGNAL, SEED_SPREAD)
        if s is not None:
            out.append(s)
    if rule.losses_compare:
        lp = [p for p in ok if None not in (p.candidate.loss, p.control.loss, p.candidate.loss_se, p.control.loss_se)]
        if lp and len(lp) == len(ok):
            ref = sum(p.control.loss for p in lp) / len(lp)
            s = combine([p.control.loss - p.candidate.loss for p in lp],
                        [p.candidate.loss_se ** 2 + p.control.loss_se ** 2 for p in lp], 0.01 * abs(ref), "SFT training loss",
                        SEED_SPREAD * abs(ref))
            if s is not None:
                out.append(s)
    if rule.same_data:
        pp = [p for p in ok if None not in (p.candidate.pass_rate, p.control.pass_rate, p.candidate.pass_se, p.control.pass_se)]
        if pp and len(pp) == len(ok):
            s = combine([p.candidate.pass_rate - p.control.pass_rate for p in pp],
                        [p.candidate.pass_se ** 2 + p.control.pass_se ** 2 for p in pp], 0.01, "training pass rate",
                        SEED_SPREAD)
            if s is not None:
                out.append(s)
    return out


def decide(pairs: list[Pair], rule: Rule) -> Decision:
    """Validated, Rejected or Extend by the rule in this module's docstring."""
    sig = signals(pairs, rule)
    if not sig or sig[0].name != "target":
        return Rejected("no control arm measured the target: nothing to compare", tuple(sig))
    m = len(sig) * max(rule.looks, 1)
    level = 1.0 - rule.alpha * rule.share / m
    harm = 1.0 - rule.alpha
    target = sig[0]
    for i, s in enumerate(sig):
        if s.p_harm >= harm:
            return Rejected(f"{s.name} credibly worse ({s.text()})", tuple(sig), level, harmed=True)
        if s.p_gain >= level:
            # a secondary signal's gain with a held-out signal later in the order credibly worse: the
            # held-out evidence disagrees, and neither side is read away (one more seed, else no
            # validation). A gain on the target itself decides, as it always has.
            worse = next((o for o in sig[i + 1 :] if o.name in HELD_OUT_SIGNALS and o.p_harm >= harm), None) if i else None
            if worse is not None:
                why = f"{s.name} better ({s.text()}) but {worse.name} credibly worse ({worse.text()})"
                if rule.look < rule.looks:
                    return Extend(f"{why} at look {rule.look} of {rule.looks}", tuple(sig), level)
                return Rejected(why, tuple(sig), level, harmed=True)
            extra = "" if i == 0 else f"; target {target.effect:+.4g} (not lower than {target.delta:.3g} on average)"
            return Validated(s, level, tuple(sig), f"{s.text()} ≥ {level:.3f}{extra}")
        if i == 0 and target.effect < -target.delta:
            # exact match moves by whole examples (near a bound, by noise); the answers' likelihood
            # reads every answer: its credible gain, with no held-out signal credibly worse,
            # outweighs a target that is lower but not credibly so
            # (at the last look: an earlier one adds a seed first, as for any lower target)
            lik = next((o for o in sig if o.name == HELDOUT_LOSS_SIGNAL), None)
            if lik is not None and lik.p_gain >= level:
                worse = next((o for o in sig if o.name in HELD_OUT_SIGNALS and o.p_harm >= harm), None)
                if worse is not None:       # as the conflict rule: the held-out evidence disagrees
                    why = f"{lik.name} better ({lik.text()}) but {worse.name} credibly worse ({worse.text()})"
                    if rule.look < rule.looks:
                        return Extend(f"{why} at look {rule.look} of {rule.looks}", tuple(sig), level)
                    return Rejected(why, tuple(sig), level, harmed=True)
                if rule.look >= rule.looks:
                    return Validated(lik, level, tuple(sig), f"{lik.text()} ≥ {level:.3f}; target "
                                                             f"{target.effect:+.4g}, lower but not credibly")
            if rule.look < rule.looks:     # lower, not credibly worse: one seed's noise can do that
                return Extend(f"target lower for the candidate, not credibly, at look {rule.look} of {rule.looks} "
                              f"({target.text()})", tuple(sig), level)
            return Rejected(f"target lower for the candidate ({target.text()}): no secondary signal outweighs it",
                            tuple(sig), level)
    text = "; ".join(s.text() for s in sig)
    if rule.look < rule.looks:
        return Extend(f"inconclusive at look {rule.look} of {rule.looks} ({text})", tuple(sig), level)
    return Rejected(f"no measured gain: nothing conclusive at P ≥ {level:.3f} ({text})", tuple(sig), level)
