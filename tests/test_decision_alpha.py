"""The decision model's error-rate claim, simulated: a fix with no effect is validated at most
`alpha` of the time, over all of a backtest's signals and looks and over every try of the same fix
(swarm.decisions: `run_looks`, `decide`, `try_share`, `retry_horizon`).

Each simulated backtest runs the controller's own look procedure (`run_looks` over `schedule`'s
looks) on arms drawn from one model: at every seed each arm's true held-out rate is the base rate
plus training noise (sd `spread` per arm, so the per-seed difference between the arms has sd
`spread` x sqrt 2), then `eval_size` held-out examples are scored binomially; a format-failure rate
and an SFT loss (with the standard error the trainer reports) are drawn the same way. With no
effect, the candidate and the control come from the same distribution. A fix whose backtest ends
inconclusive with a positive effect, or with every arm at the same bound of the rate, is tried again
(`agents.operators.inconclusive`), up to RETRY_DOUBLINGS more times, as the controller does.

Odds: 1500 simulated fixes per case give a standard error of about 0.01 on a rate near 0.2; the
bounds below leave three of them (a false failure about once in 700 runs of each case).
"""
from __future__ import annotations

import numpy as np
import pytest

from agents.domain import BacktestResult
from swarm.decisions import (RETRY_DOUBLINGS, ArmScore, Look, Pair, Rejected, Rule, Validated, run_looks, schedule,
                             try_share)

ALPHA, N_EVAL, TRIES = 0.2, 200, 1500


def simulate(rate: float, spread: float, *, effect: float = 0.0, retries: bool = True, secondary: bool = True,
             spend: bool = True, seed: int = 0, n: int = TRIES) -> float:
    """The share of `n` fixes with true `effect` on the target that end validated."""
    rng = np.random.default_rng(seed)
    looks = schedule((0, 1), critical=True, extend_factor=4)

    def arm(shift: float) -> ArmScore:
        q = float(np.clip(rate + shift + rng.normal(0, spread), 0.0, 1.0))
        if not secondary:
            return ArmScore(rng.binomial(N_EVAL, q) / N_EVAL)
        f = float(np.clip(0.2 + rng.normal(0, spread), 0.0, 1.0))
        loss = 1.0 + rng.normal(0, 0.02)          # the loss's seed-to-seed spread is twice its reported se
        held_loss = 2.0 + rng.normal(0, 0.04)     # the held-out answer loss's too
        return ArmScore(rng.binomial(N_EVAL, q) / N_EVAL, rng.binomial(N_EVAL, f) / N_EVAL, loss, 0.01,
                        heldout_loss=held_loss, heldout_loss_se=0.02)

    def measure(look: Look, seeds: list[int]) -> list[Pair]:
        return [Pair(s, arm(effect), arm(0.0)) for s in seeds]

    validated = 0
    for _ in range(n):
        for k in range(RETRY_DOUBLINGS + 1 if retries else 1):
            d, pairs, _, _ = run_looks(looks, measure, lambda i: Rule(alpha=ALPHA, eval_size=N_EVAL, losses_compare=secondary, heldout_compares=secondary,
                                                                        looks=len(looks), look=i,
                                                                        share=try_share(k) if spend else 1.0))
            if isinstance(d, Validated):
                validated += 1
                break
            # as agents.operators.inconclusive: a positive effect too small to tell, no credible harm, or arms that all
            # stayed at a bound of the rate (BacktestResult.measured_nothing)
            at_bound = BacktestResult(metric="heldout_acc", candidate=[p.candidate.target for p in pairs],
                                      control=[p.control.target for p in pairs], effect=0.0, p_value=1.0, test="",
                                      horizon_steps=1, seeds=[], passed=False, eval_size=N_EVAL).measured_nothing()
            inconclusive = isinstance(d, Rejected) and ((d.signals and d.signals[0].effect > 0) or not d.harmed or at_bound)
            if not inconclusive:
                break
    return validated / n


def test_the_tries_of_a_fix_share_alpha():
    shares = [try_share(k) for k in range(RETRY_DOUBLINGS + 1)]
    assert sum(shares) == pytest.approx(1.0)
    assert shares == sorted(shares, reverse=True) and try_share(RETRY_DOUBLINGS + 3) == shares[-1]


@pytest.mark.parametrize("rate", [0.005, 0.05, 0.3, 0.6, 0.9])   # 0.005: arms near the floor are retried
@pytest.mark.parametrize("spread", [0.0, 0.025, 0.035])
def test_a_fix_with_no_effect_is_validated_at_most_alpha_of_the_time(rate, spread):
    """Up to a per-seed difference between the arms with sd 0.05 (SEED_SPREAD: 0.035 per arm; the
    suites measured 0.039), retries included."""
    assert simulate(rate, spread, seed=int(rate * 100) + int(spread * 1000)) <= ALPHA + 0.03


def test_the_simulation_sees_a_violation():
    """It can fail: at almost three times the spread between seeds a one-seed look assumes, more
    than alpha of the fixes that do nothing are validated; at 1.4 times it, with every retry
    spending the whole alpha (no `try_share`), too (0.25, against 0.17 with it)."""
    assert simulate(0.5, 0.1, seed=1) > ALPHA + 0.03
    assert simulate(0.5, 0.05, spend=False, seed=3) > ALPHA + 0.02
    assert simulate(0.5, 0.05, seed=3) <= ALPHA + 0.03


def test_a_fix_with_a_real_effect_is_validated_most_of_the_time():
    """The other side of the trade: spending alpha over tries and over five signals (the simulated
    fix moves only the target) still validates a fix that gains 0.1 held-out at the usual spread in
    most backtests (0.88; 0.94 without `try_share`; at a gain of 0.05, 0.47 against 0.63)."""
    assert simulate(0.4, 0.025, effect=0.1, seed=2, n=400) >= 0.85
