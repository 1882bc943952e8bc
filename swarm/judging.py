"""After applying: whether an intervention is kept, and what it cost without a gain.

    judge(window, control, alpha)   -> Kept | RolledBack(undo) | Pending
    wasted(status, outcome)         -> Waste
    restart_hold(restarts, …)       -> None | why no restart may be proposed now

The posterior is `swarm.decisions`' (one observation, binomial noise on a rate, the control's own
standard error); the controller (swarm/deciding.py) reads the window and acts on the verdict.
Tested on tables in tests/test_decisions.py and tests/test_decision_paths.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Union

from agents.domain import InterventionKind as K, Outcome
from swarm.decisions import SEED_SPREAD, phi, rate_var

# a restart of a slow worker is kept when its steps got at least this many times faster (the
# input_bound finding needs a slowdown of Thresholds.input_slowdown; this asks for most of it back)
RESTART_SPEEDUP = 1.25
# a fall credible at 1 - alpha/CONFIRM is undone on one look; one credible only at 1 - alpha needs
# the next look to find it too (at alpha 0.2: P(harm) 0.95 at once, 0.8 on two looks in a row)
CONFIRM = 4


@dataclass(frozen=True)
class AnswerLoss:
    """The held-out answer loss (mean NLL of the task's answers, SFT evals) of the live run at most
    the backtest's horizon after its fork, and the mean of the backtest's `arms` control arms at the
    horizon: from one state, the live run with the change for at most as many steps."""
    after: float
    after_se: float
    control: float
    control_se: float
    arms: int = 1


@dataclass(frozen=True)
class Window:
    """What the live run showed after applying."""
    kind: K
    after: float | None                   # the target's latest eval in the window
    steps: int                            # steps the window covered
    window_steps: int                     # steps the window should cover
    eval_size: int = 200
    target_is_rate: bool = True
    higher_is_better: bool = True
    look: int = 1                         # this look's number (one per window; the error rate is spent over them)
    last_look: bool = True                # no look after this one (the run ends)
    # a restart of a slow worker: median seconds per training step before it and in the window
    pace_before: float | None = None
    pace_after: float | None = None
    # a change validated on the answer loss: the changed run's, at most the horizon past the fork,
    # and the control arms' at it (None: not measured, not comparable)
    loss: AnswerLoss | None = None
    # faults the detectors named when it was applied, other than the one it answers, that they
    # still name: the run was under them before the change and still is
    confounded: tuple[str, ...] = ()
    # the previous look found the window credibly worse and waited for this one to confirm it
    fell: bool = False


@dataclass(frozen=True)
class Control:
    """What the run would have shown without the intervention: the backtest's control arms (their
    mean with its standard error), else the value measured just before applying."""
    value: float | None
    se: float | None
    source: str


@dataclass(frozen=True)
class Kept:
    reason: str


@dataclass(frozen=True)
class RolledBack:
    reason: str
    undo: bool            # True: the window is credibly worse than the control, restore the pre-apply state


@dataclass(frozen=True)
class Pending:
    """Inconclusive, and a later window will be looked at (`fell`: this one was credibly worse, but
    not by enough to undo on one look; the next look undoes it if it is worse there too)."""
    reason: str
    fell: bool = False


Judgement = Union[Kept, RolledBack, Pending]


def judge(window: Window, control: Control, alpha: float = 0.2) -> Judgement:
    """Kept only on a measured gain. A restart is kept when the job trained the whole window again
    (the control, a dead or hung job, trains none). Any other intervention: the target after the
    window against the control, with the posterior of `decide` (one observation, binomial noise on
    a rate, the control's own standard error): P(worse by delta) >= 1 - alpha → RolledBack(undo)
    (confirmed by a second look unless steep: below);
    P(better by delta) >= 1 - alpha / 2^look → Kept (the error rate spent over the looks: at most
    alpha in all, however many windows are looked at); otherwise Pending until the last look
    (the end of the run), then RolledBack(undo=False): no measured gain is counted as a loss, and
    the run is not set back for it (the pre-apply state was no better). Where the window carries
    the held-out answer loss of the changed run, at most the backtest's horizon past its fork, and
    of the backtest's control arms at the horizon (`AnswerLoss`), it is a second signal: the two split the error rate, and a credible
    drop of the loss keeps the change with the target not lower (lower within its noise: at the
    last look only). A restart of a job that
    was alive but slow (`pace_before`) is kept when its steps in the window are at least
    RESTART_SPEEDUP times faster than before it; a slow job trains too, so steps alone prove nothing.
    A fall that faults the change does not answer may explain is not undone (`worse`).

    A fall is undone at once when it is credible at 1 - alpha/CONFIRM, the last look, or the
    previous look found one too (`Window.fell`); a fall credible only at 1 - alpha waits one look
    for that confirmation (Pending(fell=True)). A run's held-out evals move between evals by more
    than their binomial noise (benchmarks/judge_calibration.py): one eval's dip below the control
    undid changes that did nothing, and undoing costs the window's training and the change's gain."""
    if window.kind == K.RESTART and window.pace_before is not None:
        if not window.last_look and (window.pace_after is None or window.steps < window.window_steps):
            return Pending(f"the job trained {window.steps} of {window.window_steps} steps after the restart so far")
        if window.pace_after is None:
            return RolledBack(f"the job trained no step after the restart ({window.steps} of {window.window_steps})",
                              undo=False)
        what = f"{window.pace_before:.3g} s per step before the restart, {window.pace_after:.3g} s over {window.steps} steps after"
        if window.pace_after * RESTART_SPEEDUP <= window.pace_before:
            return Kept(f"{what}: faster")
        return RolledBack(f"{what}: not faster (the slowness is not the worker's)", undo=False)
    if window.kind == K.RESTART:
        if window.steps >= window.window_steps:
            return Kept(f"the job trained {window.steps} steps after the restart (a dead job trains none)")
        if not window.last_look:
            return Pending(f"the job trained {window.steps} of {window.window_steps} steps after the restart so far")
        return RolledBack(f"the job trained only {window.steps} of {window.window_steps} steps after the restart", undo=False)
    if (window.after is None or control.value is None) and not window.last_look:
        return Pending(f"nothing to compare yet ({control.source} {control.value}, after {window.after})")
    if window.after is None or control.value is None:
        return RolledBack(f"no measured gain: nothing to compare ({control.source} {control.value}, after {window.after})",
                          undo=False)
    n = window.eval_size
    sign = 1.0 if window.higher_is_better else -1.0
    d = sign * (window.after - control.value)
    var = (rate_var(window.after, n) if window.target_is_rate else 0.0) + (control.se or 0.0) ** 2
    if not window.target_is_rate and not control.se:
        var = 0.0
    delta = 1.0 / n if window.target_is_rate else 0.0
    what = f"{control.value:.4g} ({control.source}) → {window.after:.4g} over {window.steps} steps"
    if var <= 0:
        if d > delta:
            return Kept(f"{what}: better")
        if d >= -delta and not window.last_look:
            return Pending(f"{what}: no measured gain yet")
        return worse(f"{what}: no measured gain", window) if d < -delta else \
            RolledBack(f"{what}: no measured gain", undo=False)
    se = math.sqrt(var)
    p_gain, p_harm = phi((d - delta) / se), phi((-delta - d) / se)
    odds = f"P(gain) = {p_gain:.3f}, P(harm) = {p_harm:.3f}"
    if p_harm >= 1 - alpha:
        # a fall faults the change does not answer may explain is held by `worse`, never confirmed
        if p_harm >= 1 - alpha / CONFIRM or window.fell or window.last_look or window.confounded:
            return worse(f"{what}: credibly worse ({odds})" + (" on two looks in a row" if window.fell else ""), window)
        return Pending(f"{what}: worse ({odds}); undone if the next look finds it credibly worse too", fell=True)
    # the answer loss, where measured, is a second signal: the error rate is split between the two
    loss = answer_loss(window.loss)
    level = 1 - alpha / (2 if loss else 1) / 2 ** max(window.look, 1)
    if p_gain >= level:
        return Kept(f"{what}: credibly better ({odds})")
    if loss is not None and loss[1] >= level and (d >= -delta or window.last_look):
        # exact match moves by whole examples, and a run leaving the floor shows in the answers'
        # likelihood first: a credible gain there, the target not credibly worse, is a measured gain
        # (a target lower within its noise only at the last look, as in `decide`)
        return Kept(f"{what}, {loss[0]}: credibly better on the held-out answer loss ({odds})")
    if not window.last_look:
        return Pending(f"{what}: no measured gain yet ({odds})")
    return RolledBack(f"{what}: no measured gain ({odds})", undo=False)


def worse(why: str, window: Window) -> RolledBack | Pending:
    """A window below its control: undone, unless faults the run was under before the change, which
    it does not answer, still hold it (`Window.confounded`). The control's value is from the arms'
    horizon (or from before applying), earlier than the window's end: a fault left in force that
    keeps wearing the run down takes the window below it whatever the change did, and undoing the
    change would leave that fault and take away the gain its backtest measured against a control
    under it. Then the change waits for a later window (Pending), while that fault's own fixes go
    on; still so at the last look, it is counted as a loss and left in force."""
    if not window.confounded:
        return RolledBack(why, undo=True)
    held = f"{why}, with {', '.join(window.confounded)} named before it was applied and still"
    if not window.last_look:
        return Pending(f"{held}: judged again once they are answered")
    return RolledBack(f"{held}: not the change's fall to undo", undo=False)


def answer_loss(m: AnswerLoss | None) -> tuple[str, float] | None:
    """The answer loss's (text, P(gain)): the control's minus the changed run's, against the noise
    of both evals and a between-seed spread of SEED_SPREAD of the control's loss (the live run and
    the arms train on different seeds, as a one-seed look of `decide` assumes) for the live run and
    for the arms' mean (unpaired: τ²(1 + 1/arms)); the minimum effect is 1% of the control's loss,
    as there. None where not measured."""
    if m is None or not all(math.isfinite(x) for x in (m.after, m.after_se, m.control, m.control_se)):
        return None
    d = m.control - m.after
    tau2 = (SEED_SPREAD * abs(m.control)) ** 2 * (1.0 + 1.0 / max(m.arms, 1))
    se = math.sqrt(m.after_se ** 2 + m.control_se ** 2 + tau2)
    if se <= 0:
        return None
    p = phi((d - 0.01 * abs(m.control)) / se)
    return f"answer loss {m.control:.4g} (control arms) → {m.after:.4g}, P(gain) = {p:.3f}", p


@dataclass(frozen=True)
class Waste:
    """Worker CPU an intervention spent without a measured gain."""
    backtest_cpu_s: float = 0.0
    window_cpu_s: float = 0.0
    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total(self) -> float:
        return self.backtest_cpu_s + self.window_cpu_s


def wasted(status: str, outcome: Outcome) -> Waste:
    """What of an intervention's recorded CPU was spent for nothing: its backtest's when it was
    rejected, rolled back or kept without a gain; its evaluation window's when it was undone."""
    bt = float(outcome.backtest_cpu_s or 0.0)
    win = float(outcome.window_cpu_s or 0.0)
    if status == "rejected":
        return Waste(bt, 0.0, ("backtest of a rejected change",) if bt else ())
    if status == "rolled_back":
        undone = outcome.undone is not False
        return Waste(bt, win if undone else 0.0, ("backtest and window of an intervention rolled back" if undone
                                                  else "backtest of an intervention with no measured gain",))
    return Waste()


# ---- restarts -----------------------------------------------------------------------------------


def restart_hold(restarts: int, max_restarts: int, since_launch_s: float | None, grace_s: float) -> str | None:
    """Why no restart may be proposed now (None: one may). One cap over all restarts of the run,
    whatever their cause; and an exponential backoff: the live job gets grace_s × 2^restarts
    seconds from its launch before it can be restarted (the first launch's grace is grace_s)."""
    if restarts >= max_restarts:
        return f"max_restarts={max_restarts} reached ({restarts} restarts)"
    wait = grace_s * 2 ** restarts
    if since_launch_s is not None and since_launch_s < wait:
        return f"backoff: the job was launched {since_launch_s:.0f} s ago, restart {restarts + 1} waits {wait:.0f} s"
    return None
