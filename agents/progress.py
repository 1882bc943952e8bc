"""What a run's evals say about the steps a rollback would throw away, and a config section as
dotted fields: shared by the operators that propose rollbacks (agents/operators.py) and the
controller that applies them (swarm/deciding.py).

    evals = eval_series(ev, "heldout_acc")          # [(segment, step, value), ...]
    progress_since(evals, ckpt_step=100, higher_is_better=True)
"""
from __future__ import annotations

import math
from typing import Any

from agents.base import OperatorContext
from agents.evidence import Evidence


def eval_series(ev: Evidence, metric: str) -> list[tuple[int, int, float]]:
    """The run's finite evals of `metric` as (segment, step, value), in the order written."""
    return [(int(r.get("segment", 0)), int(r["step"]), float(r[metric])) for r in ev.evals
            if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric]) and "step" in r]


def progress_since(evals: list[tuple[int, int, float]], ckpt_step: int, higher_is_better: bool) -> float | None:
    """How far the target moved towards the goal over the steps a rollback to the checkpoint at
    `ckpt_step` would throw away: the best eval since it (of the newest segment, steps after the
    checkpoint) against the latest eval at or before it — or, with none there (the untrained start),
    against the first eval since. `evals` are (segment, step, value) in the order written; None
    when no eval follows the checkpoint."""
    if not evals:
        return None
    seg = evals[-1][0]
    after = [v for g, st, v in evals if g == seg and st > ckpt_step]
    if not after:
        return None
    before = [v for _, st, v in evals if st <= ckpt_step]
    sign = 1.0 if higher_is_better else -1.0
    then = before[-1] if before else after[0]
    return max(sign * (v - then) for v in after)


def rollback_stake(evals: list[tuple[int, int, float]], ckpt_step: int, now_step: int, stake_steps: int | None,
                   harm: float, higher_is_better: bool) -> str | None:
    """What going back to the checkpoint at `ckpt_step` would throw away that a departure's fix may
    not bet (None: nothing): the steps since it, when they are more than `stake_steps` (what
    verifying a fix by backtest trains: the most a departure's rollback bets) and moved the target
    towards the goal by more than `harm` (`progress_since`) — steps that measurably gained nothing
    are no stake, however many (a run whose weights a wrong lr wrecked sits at 0). The one rule the
    proposer (`departure_fix`) and the controller applying the rollback later (`too_far_back`) read."""
    lost = now_step - ckpt_step
    if stake_steps is None or lost <= stake_steps:
        return None
    gained = progress_since(evals, ckpt_step, higher_is_better)
    if gained is not None and gained <= harm:
        return None
    moved = f", over which the target moved {gained:+.3g}" if gained is not None else ""
    return f"{lost} steps back{moved}: more than verifying a fix by backtest trains ({stake_steps})"


def departure_harmed(ev: Evidence, ctx: OperatorContext, ckpt_step: int, since: int, harm: float) -> str | None:
    """How the target measured since a departure (the latest eval at or after `since`) is worse than
    at the checkpoint (the latest eval at or before `ckpt_step` that predates the departure) by
    more than `harm`, or None: no eval on either side, or not that much worse."""
    metric, sign = ctx.target.metric, (1.0 if ctx.target.op == ">=" else -1.0)
    evals = [(int(r.get("step", 0)), float(r[metric])) for r in ev.evals
             if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])]
    first_after = next((i for i, (st, _) in enumerate(evals) if st >= since), None)
    if first_after is None:
        return None
    before = [v for st, v in evals[:first_after] if st <= ckpt_step]
    if not before:
        return None
    then, now = before[-1], evals[-1][1]
    if sign * (then - now) <= harm:
        return None
    return f"{metric} fell from {then:.3g} at the checkpoint to {now:.3g} since"


def config_fields(section: str, data: dict[str, Any]) -> dict[str, Any]:
    """Every leaf of the `harness` or `recipe` section (its defaults filled in) as a dotted change;
    of the recipe, every field its version covers (not the run-control fields, which the
    controller sets from the goal's budget and target)."""
    from harness.spec import HarnessSpec
    from trainer.config import RUN_CONTROL, Recipe

    model = {"harness": HarnessSpec, "recipe": Recipe}[section]
    skip = set(RUN_CONTROL) if section == "recipe" else set()
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(f"{prefix}.{k}", v)
        else:
            out[prefix] = node

    walk(section, model.model_validate(data).model_dump(mode="json", exclude=skip))
    return out
