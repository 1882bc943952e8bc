"""The pilot's search (swarm/pilot.py runs it): successive halving over candidate configs as pure
functions of the recorded rung results, the ranking, and the prediction of the winner's cost to the
target.

Ranking (`rank`), by predicted cost to the target, since the winner's checkpoint starts the run:
a result at the target ends the search at once and its candidate wins (the run goes on from a
checkpoint already there; another pilot run could only add CPU), the one that spent less CPU to
get there first when several are; the others at a rung are ordered first those whose curve
(`predict` on the candidate's own rung ends so far) rises beyond its noise and reaches the target,
by the worker-CPU still to spend from their checkpoint (predicted steps less the steps trained, ×
the candidate's measured CPU per step), then those without a usable prediction (one point, a curve
that does not rise beyond its noise, or a target more than EXTRAPOLATE_MAX times away). Those, and
every candidate when the target is not held-out accuracy `>=`/`>`, are ranked in tiers by what was
measured (`tiers`): held-out accuracy, then the mean training loss over the rung's last steps, each
only where the difference is beyond LEVEL_Z standard errors (a binomial error for accuracy over the
evaluation's examples; the loss tail's standard error of the mean). A tier is the results level
with the best left; within it the plan's prior decides: the candidate with the plan's own values
first, then those one axis away (model size, lr), then two. A difference within the noise is no
evidence against the values the plan chose from the task and memory, and short runs' training
loss in particular favours the higher learning rates (they descend faster in the first steps
whether or not they reach the target sooner). At rung 0 each candidate has one point, so
measurements rank there unless one is at the target; a cost ranking starts at rung 1.

The noise is what differs between seeds, not only what one run measures of itself: one run's
binomial error and loss-tail standard error leave out how much the same candidate moves with
another initialisation and data order. Measured (benchmarks/results/pilot_noise.md: two
candidates on two tasks, five seeds each), held-out accuracy near 0.65 on sort varied between
seeds with 2.4 and 5.8 times its binomial variance (standard deviations 0.07 and 0.11 over 100
examples, where one run's binomial error is 0.05; with five seeds each ratio is uncertain by a
factor of several), while addition's accuracies near 0 varied no more than binomially (0.2 and 0.7
times); the loss-tail mean varied by 2.8–7.1% of the loss beyond one run's standard error (0.7 to
3.6 times that error). So accuracy's variance between two candidates is the binomial one times
ACC_OVERDISPERSION (4, from the two rows where accuracy moved) and the loss's has LOSS_SPREAD
(3.5%, the median of four) of each loss added. A rise of one run's accuracy between two rungs is
tested against the binomial error alone when it is the winner's prediction (`predict`): it is the
same run on the same examples. When the search acts on a curve (the ranking's predicted cost,
`_prior_first`), a rise counts only beyond the spread between seeds. That is a deliberately
conservative gate on extrapolating a short curve, not the error of one run's measurement (the run
that goes on is this run): at 100 held-out examples a rise must be about 0.25 to count. Extrapolating
short curves is optimistic on these tasks: the "on course" projections of the suite's runs came true
after a median 2.43 times the projected CPU (benchmarks/results/outlook_calibration.md), and a sort
candidate whose accuracy rose 0.44 -> 0.64 from 42 to 84 steps (a curve to 0.9 by ~210 steps) sat at
0.7-0.8 until step 1000, while a level candidate at 40% of its CPU per step reached 0.9 by 350. On that
measurement, one seed's sort pilot that kept d_model 192 for its 0.64 against d_model 128's 0.48
compared two candidates whose five-seed means are 0.64 and 0.66. The accuracy test treats two candidates'
evaluations as independent although they score the same held-out examples (a paired test would
be sharper).

The plan's values first (`_prior_first`): with a held-out accuracy target, the candidate with the
plan's own values trains its rung 0 and then its rung 1 before any other candidate runs. When its
curve (`predict`, beyond the spread between seeds) then reaches the target for less CPU than the
other candidates' runs of a complete search would cost, it wins with stop `on_course`. This is an
expected-cost rule, not a bound: the other candidates' runs are priced at the plan's values' CPU
per step (the grid's smaller sizes cost less a step, its larger ones more, about evenly around
it), and a search can end sooner than complete (a result at the target). A search expected to cost
more than the plan's values still need is not worth starting. Otherwise the search goes on as above,
those two results among its own (a rung-1 result counts once the candidate is promoted there). On a
task the plan's values learn quickly, the pilot is then two short runs of the run's own config, not
every candidate's rung 0.

Prediction (what the final report compares with): from the winner's held-out accuracy at its rung
ends, a curve acc = a + b·log2(steps) through its last two points. Steps to the target: the first
rung end at the target when one is; else 2**((threshold - a) / b) when b > 0 and that is within
EXTRAPOLATE_MAX times the winner's steps; else none (the curve does not rise, or rises so little that
the target is more than three doublings away: too short a pilot to say; measured on the minimal
addition goal, held-out accuracy 0.00 -> 0.01 from 112 to 224 steps extrapolated to 10^31 steps).
Worker CPU-s to the target: those steps × the winner's measured CPU per step (its runs' CPU over
its steps, evaluations included). Only for a held-out accuracy target (`heldout_acc >= x` or
`> x`); stated as a rough extrapolation, not a bound.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Literal

ETA = 2                       # each rung keeps the better 1/ETA and trains ETA times the steps
LOSS_TAIL = 10                # training rows at the end of a rung whose mean loss breaks ties
EXTRAPOLATE_MAX = 8           # a prediction reaches at most this many times the winner's steps (3 doublings)
LEVEL_Z = 2.0                 # a measured difference within this many standard errors is no evidence
# the spread between seeds that one run's own error leaves out (benchmarks/results/pilot_noise.md):
ACC_OVERDISPERSION = 4.0      # held-out accuracy's variance between seeds ÷ its binomial variance (measured 2.4 and
                              # 5.8 where accuracy moved, 0.2 and 0.7 near 0)
LOSS_SPREAD = 0.035           # the loss-tail mean's spread between seeds beyond its standard error, a share of the
                              # loss (measured 0.028-0.071, median 0.035)


# ---- records ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RungResult:
    """One finished run: `candidate` trained to `steps` (rung `rung`), then scored."""

    candidate: str
    rung: int
    steps: int
    heldout: float          # held-out accuracy at the rung's end
    loss: float             # mean training loss over the rung's last LOSS_TAIL steps (nan: none)
    cpu_s: float            # process CPU of this run
    status: str = "completed"
    loss_se: float = math.nan   # standard error of that mean (nan: unknown, so no difference is noise)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("loss", "loss_se"):
            d[k] = d[k] if math.isfinite(d[k]) else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RungResult":
        def num(k: str) -> float:
            return float(d[k]) if d.get(k) is not None else math.nan
        return cls(str(d["candidate"]), int(d["rung"]), int(d["steps"]), float(d["heldout"]), num("loss"),
                   float(d["cpu_s"]), str(d.get("status", "completed")), num("loss_se"))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """What the search needs besides the results: the candidates (in the order they run), the steps
    of rung 0, the CPU budget, the factor between rungs, the target, the held-out evaluation's size
    (None: unknown, so every difference counts) and the prior (the candidates nearest the plan's own
    values first; empty: the candidates' order), which orders results the measurements cannot tell
    apart."""

    candidates: tuple[str, ...]
    base_steps: int
    budget_cpu_s: float
    eta: int = ETA
    threshold: float | None = None   # the goal's held-out accuracy target (None: not a heldout_acc >= / > target)
    strict: bool = False             # the target is `> threshold`
    eval_size: int | None = None     # held-out examples behind each accuracy
    prior: tuple[str, ...] = ()      # every candidate once, the plan's own values first

    def __post_init__(self) -> None:
        if not self.candidates or len(set(self.candidates)) != len(self.candidates):
            raise ValueError(f"schedule: candidates={self.candidates!r}: need at least one, each once")
        if self.prior and sorted(self.prior) != sorted(self.candidates):
            raise ValueError(f"schedule: prior={self.prior!r}: must hold every candidate once")
        if self.eval_size is not None and self.eval_size < 1:
            raise ValueError(f"schedule: eval_size={self.eval_size!r}: must be positive")
        if self.base_steps < 1 or self.eta < 2 or not self.budget_cpu_s > 0:
            raise ValueError(f"schedule: base_steps={self.base_steps}, eta={self.eta}, budget_cpu_s={self.budget_cpu_s}: "
                             "need base_steps >= 1, eta >= 2, a positive budget")

    def met(self, r: "RungResult") -> bool:
        """Whether `r` is at the goal's target."""
        if self.threshold is None:
            return False
        return r.heldout > self.threshold if self.strict else r.heldout >= self.threshold

    def rungs(self) -> int:
        """How many rungs a complete search has (n -> n//eta -> … -> 1)."""
        n, r = len(self.candidates), 1
        while n > 1:
            n, r = max(1, n // self.eta), r + 1
        return r

    def steps(self, rung: int) -> int:
        return self.base_steps * self.eta ** rung

    def preferred(self) -> tuple[str, ...]:
        """The candidates in the prior's order (the plan's own values first)."""
        return self.prior or self.candidates

    def step_units(self) -> int:
        """Steps of a complete search in units of base_steps (each rung trains on from the last)."""
        n, total, prev = len(self.candidates), 0, 0
        for rung in range(self.rungs()):
            total += n * (self.eta ** rung - prev)
            n, prev = max(1, n // self.eta), self.eta ** rung
        return total


@dataclasses.dataclass(frozen=True)
class Promote:
    """Run `candidate` to `steps` (rung `rung`) next."""

    rung: int
    steps: int
    candidate: str
    why: str


@dataclasses.dataclass(frozen=True)
class Stop:
    """The search is over: `winner` (None only when nothing ran) and why."""

    winner: str | None
    rung: int
    reason: Literal["one_left", "budget", "target", "on_course"]
    why: str


def rank(results: Iterable[RungResult], order: tuple[str, ...], history: Iterable[RungResult] = (),
         schedule: Schedule | None = None) -> list[RungResult]:
    """Best first, by predicted cost to the target (module docstring, "Ranking"): the results at the
    target, by the CPU their candidate spent to get there; then those whose curve (`predict` on the
    candidate's results in `history` up to the result's rung) rises beyond its noise and reaches the
    target, by the CPU still to spend from their checkpoint; then the rest, by what was measured
    (`tiers`). `order`: the tie-break order without a schedule; with one, its prior."""
    history = list(history)
    order = schedule.preferred() if schedule is not None else order
    groups: dict[int, list[tuple[float, RungResult]]] = {}
    for r in results:
        group, cpu = _cost(r, history, schedule)
        groups.setdefault(group, []).append((cpu, r))
    out: list[RungResult] = []
    for group in sorted(groups):
        rows = groups[group]
        if group < 2:
            out += [r for _, r in sorted(rows, key=lambda x: (x[0], *_measured(x[1], order)))]
        else:
            out += [r for t in tiers([r for _, r in rows], order, schedule.eval_size if schedule else None) for r in t]
    return out


def _cost(r: RungResult, history: list[RungResult], schedule: Schedule | None) -> tuple[int, float]:
    """(group, CPU) of `r` in `rank`: 0 and the CPU spent at the target; 1 and the CPU still to
    spend where its curve predicts the target; 2 otherwise."""
    if schedule is None or schedule.threshold is None:
        return 2, 0.0
    own = [x for x in history if x.candidate == r.candidate and x.rung < r.rung] + [r]
    spent = math.fsum(x.cpu_s for x in own)
    if schedule.met(r):
        return 0, spent
    p = predict(own, r.candidate, schedule.threshold, schedule.strict, schedule.eval_size, between_seeds=True)
    return (1, p.worker_cpu_s - spent) if p.worker_cpu_s is not None else (2, 0.0)


def _acc(r: RungResult) -> float:
    return r.heldout if math.isfinite(r.heldout) else -math.inf


def _loss(r: RungResult) -> float:
    return r.loss if math.isfinite(r.loss) else math.inf


def _measured(r: RungResult, order: tuple[str, ...]) -> tuple[float, float, int]:
    return -_acc(r), _loss(r), order.index(r.candidate)


def acc_level(a: float, b: float, n: int | None, between_seeds: bool = True) -> bool:
    """Whether held-out accuracies `a` and `b`, each over `n` examples, differ by no more than
    LEVEL_Z standard errors of their difference: binomial, times ACC_OVERDISPERSION for what
    differs between seeds when they are two runs' (`between_seeds`; not for two evaluations of
    one run) (n None: only when equal; a non-finite accuracy is level only with another)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return not (math.isfinite(a) or math.isfinite(b))
    if n is None:
        return a == b
    p = (a + b) / 2
    phi = ACC_OVERDISPERSION if between_seeds else 1.0
    return abs(a - b) <= LEVEL_Z * math.sqrt(phi * p * (1 - p) * 2 / n)


def loss_level(a: RungResult, b: RungResult) -> bool:
    """Whether two rung results' mean losses differ by no more than LEVEL_Z standard errors of their
    difference: each run's own standard error, and LOSS_SPREAD of each loss for what differs
    between seeds (an unknown error: only when equal)."""
    if not (math.isfinite(a.loss) and math.isfinite(b.loss)):
        return _loss(a) == _loss(b)
    se = math.sqrt(a.loss_se ** 2 + b.loss_se ** 2 + (LOSS_SPREAD * a.loss) ** 2 + (LOSS_SPREAD * b.loss) ** 2)
    return abs(a.loss - b.loss) <= (LEVEL_Z * se if math.isfinite(se) else 0.0)


def tiers(results: Iterable[RungResult], order: tuple[str, ...], eval_size: int | None) -> list[list[RungResult]]:
    """The results in tiers, best first, by what the runs measured: held-out accuracy, then training
    loss, each only where it tells results apart beyond its noise (`acc_level`, `loss_level`). A
    tier is the results level on accuracy with the best left and, among those, level on loss with
    the lowest; within a tier, `order` (the prior: with no measured difference, the values nearest
    the plan's stand). The next tier is taken the same way from what is left."""
    rest = sorted(results, key=lambda r: _measured(r, order))
    out: list[list[RungResult]] = []
    while rest:
        top = [r for r in rest if acc_level(_acc(r), _acc(rest[0]), eval_size)]
        lead = min(top, key=lambda r: (_loss(r), order.index(r.candidate)))
        tier = sorted((r for r in top if loss_level(r, lead)), key=lambda r: order.index(r.candidate))
        out.append(tier)
        rest = [r for r in rest if r not in tier]
    return out


def _level_note(ranked: list[RungResult], history: list[RungResult], schedule: Schedule, rung: int) -> str:
    """Why the first of a rung's ranking came first when no measurement put it there: the tier it
    shared with others (`tiers`), ordered by the prior. Empty when a measurement or a predicted cost
    decided."""
    first = ranked[0]
    if _cost(first, history, schedule)[0] < 2:
        return ""
    rest = [r for r in ranked if _cost(r, history, schedule)[0] == 2]
    tier = next(t for t in tiers(rest, schedule.preferred(), schedule.eval_size) if first in t)
    level = [r.candidate for r in tier if r is not first]
    if not level:
        return ""
    whose = "the plan's own values" if first.candidate == schedule.preferred()[0] else "the values nearest the plan's"
    return (f"; at rung {rung} it measured level with {', '.join(level)} (held-out and loss within {LEVEL_Z:g} "
            f"standard errors) and holds {whose}")


def next_rung(results: Iterable[RungResult], schedule: Schedule) -> Promote | Stop:
    """The next run of the successive-halving search, or its end, from the recorded results alone.
    A result at the target ends the search (its candidate wins: the run goes on from its checkpoint,
    and any further pilot run could only add CPU); else a rung keeps its better half by `rank`.
    Results of candidates not promoted to a rung are ignored (they cannot be there in a pilot)."""
    results = list(results)
    spent = math.fsum(r.cpu_s for r in results)
    at_target = [r for r in results if schedule.met(r)]
    if at_target:
        best = rank(at_target, schedule.candidates, results, schedule)[0]
        return Stop(best.candidate, best.rung, "target", f"{best.candidate} is at the target after {best.steps} steps "
                    f"(held-out {best.heldout:.3f}, rung {best.rung})")
    first = _prior_first(results, schedule, spent)
    if first is not None:
        return first
    alive = list(schedule.candidates)
    rung, level = 0, ""
    while True:
        done = {r.candidate: r for r in results if r.rung == rung and r.candidate in alive}
        todo = [c for c in alive if c not in done]
        if todo:
            cand, steps = todo[0], schedule.steps(rung)
            best = alive[0] if rung else (rank(done.values(), schedule.candidates, results, schedule)[0].candidate
                                          if done else None)
            if spent >= schedule.budget_cpu_s:
                return Stop(best, rung, "budget", f"the budget is spent ({spent:.1f} of {schedule.budget_cpu_s:.1f} "
                            f"CPU-s) with {len(todo)} of {len(alive)} runs of rung {rung} left{level}")
            est = _estimate(results, cand, steps, rung)
            if est is not None and spent + est > schedule.budget_cpu_s and best is not None:
                return Stop(best, rung, "budget", f"the next run ({cand} to {steps} steps, about {est:.1f} CPU-s) would "
                            f"pass the budget ({spent:.1f} of {schedule.budget_cpu_s:.1f} CPU-s spent){level}")
            why = "rung 0: every candidate" if rung == 0 else f"the better {len(alive)} of rung {rung - 1}"
            return Promote(rung, steps, cand, why)
        if len(alive) == 1:
            return Stop(alive[0], rung, "one_left", f"one candidate remains after rung {rung}{level}")
        ranked = rank(done.values(), schedule.candidates, results, schedule)
        alive = [r.candidate for r in ranked[: max(1, len(alive) // schedule.eta)]]
        level = _level_note(ranked, results, schedule, rung)
        rung += 1


def _prior_first(results: list[RungResult], schedule: Schedule, spent: float) -> Promote | Stop | None:
    """The plan's own values train first (module docstring, "The plan's values first"): their rung 0,
    then their rung 1, before any other candidate; then they win without a search when their curve
    predicts the target for less CPU than the rest of the search would cost. None once another
    candidate has run, without a held-out accuracy target, or when the plan's values do not win so."""
    mine = schedule.preferred()[0]
    if schedule.threshold is None or len(schedule.candidates) < 2 or any(r.candidate != mine for r in results):
        return None
    own = sorted(results, key=lambda r: r.rung)
    if len(own) < 2:   # rung 0, then rung 1: a curve needs two points
        rung = len(own)
        est = _estimate(results, mine, schedule.steps(rung), rung)
        if rung and est is not None and spent + est > schedule.budget_cpu_s:
            return None
        return Promote(rung, schedule.steps(rung), mine, f"the plan's own values first (rung {rung}: a curve needs two points)")
    p = predict(own, mine, schedule.threshold, schedule.strict, schedule.eval_size, between_seeds=True)
    if p.worker_cpu_s is None or p.cpu_per_step is None:
        return None
    still = p.worker_cpu_s - spent
    others = schedule.step_units() - schedule.eta ** (schedule.rungs() - 1)   # a complete search's steps but its winner's
    search = min(schedule.budget_cpu_s - spent, others * schedule.base_steps * p.cpu_per_step)
    if still > search:
        return None
    return Stop(mine, own[-1].rung, "on_course", f"{mine} (the plan's own values) is on course: its curve predicts the "
                f"target at about {p.steps} steps, {max(0.0, still):.1f} more CPU-s, no more than the rest of the "
                f"search is expected to cost (about {search:.1f} CPU-s at its CPU per step)")


def _estimate(results: list[RungResult], cand: str, steps: int, rung: int) -> float | None:
    """CPU-s of running `cand` to `steps`: its own CPU per step so far × the steps it has left; at
    rung 0 the mean of the rung-0 runs so far; None before any run."""
    own = [r for r in results if r.candidate == cand]
    if own:
        last = max(own, key=lambda r: r.steps)
        per_step = math.fsum(r.cpu_s for r in own) / max(1, last.steps)
        return per_step * max(0, steps - last.steps)
    first = [r.cpu_s for r in results if r.rung == 0]
    return math.fsum(first) / len(first) if rung == 0 and first else None


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Expected steps and worker CPU-s to the goal's target, extrapolated from the winner's curve
    (module docstring: the method). None values: not predicted, `why` says why."""

    steps: int | None
    worker_cpu_s: float | None
    cpu_per_step: float | None
    method: str
    why: str = ""

    def line(self) -> str:
        if self.steps is None:
            return f"prediction: none ({self.why})"
        return (f"prediction: about {self.steps} steps and {self.worker_cpu_s:.0f} worker-CPU-s to the target "
                f"({self.method}; {self.cpu_per_step:.3f} CPU-s/step at one thread)")


def predict(results: Iterable[RungResult], winner: str, threshold: float, strict: bool = False,
            eval_size: int | None = None, between_seeds: bool = False) -> Prediction:
    """Steps and CPU-s to held-out accuracy `threshold` (`> threshold` when `strict`) from the
    winner's rung ends (module docstring); with `eval_size`, a rise within the binomial noise of
    two accuracies over that many examples (`acc_level` of one run) is no curve, and with
    `between_seeds` a rise within what differs between seeds (a search choosing between candidates
    by their curves: one run's curve drawn higher by chance is no evidence that the candidate learns
    faster)."""
    method = "held-out accuracy linear in log2(steps) through the winner's last two rung ends"
    own = sorted((r for r in results if r.candidate == winner), key=lambda r: r.steps)
    if not own:
        return Prediction(None, None, None, method, "the winner has no finished run")
    per_step = math.fsum(r.cpu_s for r in own) / own[-1].steps
    reached = next((r for r in own if (r.heldout > threshold if strict else r.heldout >= threshold)), None)
    if reached is not None:
        return Prediction(reached.steps, reached.steps * per_step, per_step, "reached in the pilot")
    if len(own) < 2:
        return Prediction(None, None, per_step, method, "the winner ran one rung: one point is no curve")
    (s0, a0), (s1, a1) = (own[-2].steps, own[-2].heldout), (own[-1].steps, own[-1].heldout)
    b = (a1 - a0) / (math.log2(s1) - math.log2(s0))
    if b <= 0 or acc_level(a0, a1, eval_size, between_seeds=between_seeds):
        return Prediction(None, None, per_step, method, f"held-out accuracy did not rise {'' if b <= 0 else 'beyond its noise '}"
                          f"over the winner's last rungs ({a0:.3f} at {s0} steps, {a1:.3f} at {s1}): too short a pilot "
                          "to extrapolate")
    doublings = (threshold - a1) / b
    if doublings > math.log2(EXTRAPOLATE_MAX):
        return Prediction(None, None, per_step, method, f"the winner's curve ({a0:.3f} at {s0} steps, {a1:.3f} at {s1}) "
                          f"reaches {threshold:g} only beyond {EXTRAPOLATE_MAX}x its steps: too far to extrapolate")
    steps = int(math.ceil(2 ** (math.log2(s1) + doublings)))
    return Prediction(steps, steps * per_step, per_step, method)
