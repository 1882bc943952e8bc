"""Detectors of the optimiser's step: what the trainer measures of each update says about the
learning rate, the weight decay and the batch size, which a loss curve does not.

    small_updates   the steps barely move the weights: the lr is far too low (raise it)
    inflated_weights the weights grew far past their untrained size and the run learnt nothing: the
                    lr is far too high (start over from the untrained weights at a lower one)
    strong_decay    the weights' norm falls as fast as the decay pulls: the weight decay is too strong
    small_batch     a step's gradient is mostly noise: the batch is far below the noise scale

The trainer logs `update_ratio`, `weight_norm` and `weight_growth` (the norm over the untrained
start's) every step (trainer/loop.py `step_norms`) and the
half-batch measurements `grad_dot`, `grad_sq`, `grad_half`, `grad_batch` one SFT step in 20
(`Trainer.backward_halves`). Each finding is a cause (Diagnostics acts on it, the explorer then
stays quiet) and shows harm before it fires: held-out at the not-learning level or stuck short of
the target since the controller's latest change. Thresholds are in `agents.detection.Thresholds`.
"""
from __future__ import annotations

import math
from typing import Any

from agents.detection import (NOTHING, THRESHOLDS, Known, Thresholds, algorithm, column, current_rows, detector,
                              is_finite, make_diagnosis, mean_of, median_of, settled_rows, since, to_float)
from agents.domain import Diagnosis
from agents.evidence import Evidence


NORM_GROWN = 1.5   # weights this many times their untrained size: grown by an lr far too high (healthy: +2-7% in 200 steps)
LR_CEILING = 1e-2   # Adam above ~1e-2 almost never trains a transformer: no raise goes past it
SMALLEST_RAISE = 1.5   # a raise smaller than this is no cure for steps a tenth of a healthy one


def weights_grown(ev: Evidence) -> float | None:
    """How many times their untrained size the weights are (the newest `weight_growth` logged),
    where that is past NORM_GROWN: an lr far too high inflated them, and weights that size are worth
    nothing to carry on from, whatever the lr after (on the suite's five SFT families from their
    init: 1.02-1.07 after 200 steps at the healthy lr; 1.4-2.0 after 30 at 10× it, 3.3-5.4 at
    30×: benchmarks/weight_growth.py). None otherwise, and where the trainer does not log it."""
    g = next((x for x in (to_float(r.get("weight_growth")) for r in reversed(ev.metrics)) if is_finite(x)), None)
    return g if g is not None and g > NORM_GROWN else None


@detector("small_updates")
def small_updates(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The optimiser's steps barely move the weights and held-out does not rise: over the newest
    `small_updates_rows` SFT or distill rows of the segment, the median update ratio (the trainer's
    ‖Δθ‖/‖θ‖ per step), scaled to the recipe's lr where the schedule's lr in force is lower (a
    warm-up, a decay: the ratio goes with the lr to the power `small_updates_exponent`), is below `small_updates_max`, and
    the newest held-out eval of the segment is at the not-learning level (≤ `not_learning_heldout_max`:
    a run that learnt part of the task, a pretrained model above all, moves by small steps by
    design) and no better than the one before it (if there is one). The learning
    rate is far too low: a loss that falls slowly looks like learning, but the run will not get
    anywhere in its budget. The evidence carries the ratio and the lr that would move the weights
    by `small_updates_aim` (the ratio grows as the lr to the power `small_updates_exponent`; at most
    `small_updates_raise_max`× the lr). Rows and evals from before the
    controller's latest change do not count (they show the lr it replaced). GRPO steps move the
    weights less by design; they are not judged here."""
    if algorithm(ev) not in ("sft", "distill") or known.target_metric != "heldout_acc":
        return None
    rows = [r for r in current_rows(ev) if not r.get("skipped") and since(r, known)]
    peak = to_float((ev.recipe or {}).get("lr"))
    scaled = []
    for r in rows[-th.small_updates_rows :]:
        u, lr = to_float(r.get("update_ratio")), to_float(r.get("lr"))
        if is_finite(u) and is_finite(lr) and lr > 0:
            scaled.append(u * max(1.0, (peak or lr) / lr) ** th.small_updates_exponent)
    if len(scaled) < th.small_updates_rows:
        return None
    ratio = median_of(scaled)
    if ratio >= th.small_updates_max:
        return None
    # a step's share of weights that grew far past their starting size (an lr far too high before)
    # is small because they are large, not because the lr is low
    if weights_grown(ev) is not None:
        return None
    # held-out measured in this segment (an eval before a change of harness says nothing of now)
    start, seg = int(rows[0].get("step", 0)), rows[-1].get("segment")
    held = [v for v in (to_float(r.get(known.target_metric)) for r in ev.evals
                        if r.get("segment", seg) == seg and int(r.get("step", 0)) >= start and since(r, known))
            if is_finite(v)]
    higher = known.target_op != "<="
    if not held or (len(held) > 1 and (held[-1] > held[-2] + th.plateau_min_delta if higher
                                       else held[-1] < held[-2] - th.plateau_min_delta)):
        return None
    # a run that has learnt some of the task (a pretrained model being fine-tuned, above all) moves
    # its weights by small steps by design: only a run that has learnt nothing is judged
    if held[-1] > th.not_learning_heldout_max:
        return None
    lr = peak or to_float(rows[-1].get("lr"))
    factor = min(th.small_updates_raise_max, (th.small_updates_aim / max(ratio, 1e-12)) ** (1 / th.small_updates_exponent))
    suggested = float(f"{min(lr * factor, LR_CEILING):.3g}") if lr else None
    if suggested is None or suggested < SMALLEST_RAISE * lr:
        return None     # no raise worth a backtest left (the lr at the ceiling): not this finding's to name
    # a raise must not turn a weak weight decay into a strong one (strong_decay): at the raised lr
    # the decay pulls lr·wd per step, so it comes down with the raise where that would be strong
    wd = to_float((ev.recipe or {}).get("weight_decay")) or 0.0
    wd_suggested = (float(f"{DECAY_PULL_FLAT / suggested:.2g}")
                    if wd > 0 and suggested * wd >= DECAY_STRONG * DECAY_PULL_FLAT else None)
    return make_diagnosis(ev, "small_updates",
                          f"each step moves the weights by {ratio:.2g} of their size (median of {len(scaled)} steps) and "
                          f"held-out is {held[-1]:.3g}: the learning rate is too low to learn",
                          "warning",
                          {"update_ratio_median": ratio, "lr": lr,
                           "lr_suggested": suggested, "weight_decay": wd, "weight_decay_suggested": wd_suggested,
                           "heldout": held[-2:], "rows": len(scaled), "threshold_ratio": th.small_updates_max,
                           "aim_ratio": th.small_updates_aim})


def held_out_stuck(ev: Evidence, th: Thresholds, known: Known, seg: Any, start: int,
                   floor_counts: bool = False) -> list[float] | None:
    """The target's held-out evals of segment `seg` from step `start` written since the controller's
    latest change, where they show harm rather than assume it: at least two, the newest short of
    the target and no better than the best of the two before it (or, with `floor_counts`, at the
    not-learning level); else None."""
    held = [v for r in ev.evals for v in [to_float(r.get(known.target_metric))]
            if r.get("segment", seg) == seg and int(r.get("step", 0)) >= start and since(r, known) and is_finite(v)]
    higher = known.target_op != "<="
    if len(held) < 2:
        return None
    before = max(held[-3:-1]) if higher else min(held[-3:-1])
    stuck = held[-1] <= before + th.plateau_min_delta if higher else held[-1] >= before - th.plateau_min_delta
    if not (stuck or (floor_counts and higher and held[-1] <= th.not_learning_heldout_max)):
        return None
    if known.target_threshold is not None and (
            held[-1] >= known.target_threshold if higher else held[-1] <= known.target_threshold):
        return None
    return held


# a decay whose pull on the weights' size per step (lr·wd) is at most this held a healthy SFT run's
# norm about flat (wd 0.1 at lr 3e-3, the probe in Thresholds): the lowered weight decay aims there
DECAY_PULL_FLAT = 3e-4
DECAY_STRONG = 5.0   # a decay pulling less than this many times that is not judged (wd 0.5 at lr 3e-3 is 5x)
DECAY_CUT = 10.0     # the least a lowering divides the weight decay by


@detector("inflated_weights")
def inflated_weights(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """A learning rate far too high inflated the weights, and the run has learnt nothing: they are
    more than NORM_GROWN× their untrained size (`weights_grown`) and the newest held-out eval of the
    current segment written since the controller's latest change is at the not-learning level
    (≤ `not_learning_heldout_max`), as every one before it in the segment is, or the one before it
    too. SFT and distill, where the growth was measured
    (benchmarks/weight_growth.py), and only where a row of the segment shows them grown that far by
    step `not_learning_rows` of training. Weights grow this far in the first few steps at such an lr and stay
    grown, while the loss may fall back from its blow-up to a level it then holds: this names the
    cause at the first eval, where `not_learning` waits for `not_learning_rows` rows of a loss that
    does not move."""
    if algorithm(ev) not in ("sft", "distill") or known.target_metric != "heldout_acc":
        return None
    grown = weights_grown(ev)
    rows = current_rows(ev)
    if grown is None or not rows:
        return None
    seg = rows[-1].get("segment")
    # grown that far by step `not_learning_rows` of training (steps count from the untrained start,
    # as the growth does; a rollback or a resume restores both): a long run at a sane lr grows its
    # weights slowly, and one stuck for another reason gets there after thousands of steps
    if not any((to_float(r.get("weight_growth")) or 0.0) > NORM_GROWN
               for r in rows if r.get("segment") == seg and int(r.get("step", 0)) <= th.not_learning_rows):
        return None
    held = [v for v in (to_float(r.get("heldout_acc")) for r in ev.evals
                        if r.get("segment", seg) == seg and since(r, known)) if is_finite(v)]
    low = th.not_learning_heldout_max
    # never above the not-learning level in this segment, or back at it on its last two evals (one
    # low eval after a good one is not a run that stopped learning)
    if not held or held[-1] > low or (max(held) > low and (len(held) < 2 or held[-2] > low)):
        return None
    lr = to_float((ev.recipe or {}).get("lr")) or to_float(rows[-1].get("lr"))
    return make_diagnosis(ev, "inflated_weights",
                          f"the weights are {grown:.3g}× their untrained size and held-out is {held[-1]:.3g}: a learning "
                          "rate far too high inflated them", "warning",
                          {"weight_growth": grown, "threshold_growth": NORM_GROWN, "heldout_acc": held[-1], "lr_now": lr})


@detector("strong_decay")
def strong_decay(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The weight decay pulls the weights in faster than the updates move them. Over the rows of one
    recipe version written since the controller's latest change (at least `decay_rows` of them, in
    the run's latest segment):
    - the decay in force pulls at least `DECAY_STRONG`× `DECAY_PULL_FLAT` per step at the recipe's
      lr (what a healthy run's updates offset: a decay below that is not judged);
    - the weights' norm (the trainer's `weight_norm`) fell by at least `decay_fall` in log and is
      not growing again (its newest value at most the window's middle one), and the decoupled decay
      alone pulled at least that much (Σ −log(1 − lr·wd) over the same steps): the fall is the
      decay's doing, not something else shrinking the weights; or the weights are held at least
      `decay_fall` in log below their untrained size (the trainer's `weight_growth`), where the
      decay and the updates balance and the norm no longer falls (a window after a change), and
      the decay pulled at least that much over the rows of this recipe version in the latest segment;
    - of the held-out evals since the change, at least two, the newest is short of the target and
      no better than the best of the two before it (the harm is shown, not assumed: a run that
      learns under a strong decay is left to learn).
    Shrinking weights turn a step of the same size into a larger change of what they compute, and
    the decay undoes what the steps learnt. Any algorithm: the pull is AdamW's, whatever the loss
    (the thresholds were measured on SFT runs). The evidence carries the weight decay that pulls at
    most `DECAY_PULL_FLAT` per step at the recipe's lr, and at most a `DECAY_CUT`-th of the one in force."""
    wd = to_float((ev.recipe or {}).get("weight_decay"))
    if not wd or wd <= 0:
        return None
    rows = [r for r in settled_rows(ev, known) if not r.get("skipped")
            and is_finite(to_float(r.get("weight_norm"))) and is_finite(to_float(r.get("lr")))]
    version = rows[-1].get("recipe_version") if rows else None
    rows = [r for r in rows if r.get("recipe_version") == version]      # one wd over the window
    if len(rows) < th.decay_rows or not to_float(rows[-1]["weight_norm"]) > 0:
        return None
    lr = to_float((ev.recipe or {}).get("lr")) or max(float(r["lr"]) for r in rows)
    if not lr > 0 or lr * wd < DECAY_STRONG * DECAY_PULL_FLAT or max(float(r["lr"]) for r in rows) * wd >= 1:
        return None
    first, mid, last = (float(rows[i]["weight_norm"]) for i in (0, len(rows) // 2, -1))
    fall = math.log(first / last)
    pull = -sum(math.log1p(-float(r["lr"]) * wd) for r in rows[1:])
    # held down: the weights already at `decay_fall` (in log) below their untrained size, where the
    # decay and the updates balance and the norm no longer falls within the window, and the decay
    # pulled at least that much over the rows of this recipe version in the run's latest segment (it
    # can account for the shrink; rows of an abandoned timeline or replayed after a resume do not count)
    growth = to_float(rows[-1].get("weight_growth"))
    below = -math.log(growth) if is_finite(growth) and growth > 0 else 0.0
    pulled = -sum(math.log1p(-float(r["lr"]) * wd) for r in current_rows(ev)
                  if r.get("recipe_version") == version and is_finite(to_float(r.get("lr"))) and not r.get("skipped"))
    held_down = below >= th.decay_fall and pulled >= below
    if not (fall >= th.decay_fall and pull >= fall and last <= mid) and not held_down:
        return None
    start, seg = int(rows[0].get("step", 0)), rows[-1].get("segment")
    held = held_out_stuck(ev, th, known, seg, start)
    if held is None:
        return None
    suggested = float(f"{min(wd / DECAY_CUT, DECAY_PULL_FLAT / lr):.2g}")
    how = (f"the weights' norm fell from {first:.3g} to {last:.3g} over {len(rows)} steps, which the weight decay "
           f"{wd:g} alone accounts for (it pulled {pull:.2g} in log)" if not held_down else
           f"the weights are held at {growth:.2f} of their untrained size under a weight decay of {wd:g} "
           f"(it pulls {lr * wd:.2g} per step at the lr)")
    return make_diagnosis(ev, "strong_decay", f"{how}, and held-out is {held[-1]:.3g}: the decay undoes what the steps learn",
                          "warning",
                          {"weight_decay": wd, "weight_decay_suggested": suggested, "lr": lr,
                           "norm_first": first, "norm_last": last, "log_fall": fall, "decay_pull": pull,
                           "log_below_untrained": below,
                           "rows": len(rows), "from_step": start, "heldout": held[-3:],
                           "threshold_fall": th.decay_fall})


BATCH_MAX = 1024     # the largest batch the raise proposes (trainer.config.TUNABLE's range)
BATCH_RAISE_MAX = 32  # the largest single raise (x): where no signal stands above the noise, this one


def noise_scale(rows: list[dict[str, Any]], se: float = 1.0) -> float | None:
    """A lower bound on the gradient noise scale B_noise = tr(Σ)/|G|² from the trainer's half-batch
    measurements (`grad_dot` ≈ |G|², `grad_sq` ≈ |G|² + tr(Σ)/`grad_half`) over `rows`: |G|² is
    taken at its mean plus `se` standard errors, so a window of near-zero products with a few
    large ones cannot make the scale look large (inf only where even that bound is not above
    zero). None without two measurements."""
    m = [(float(r["grad_dot"]), float(r["grad_sq"]), float(r["grad_half"])) for r in rows
         if all(is_finite(to_float(r.get(k))) for k in ("grad_dot", "grad_sq", "grad_half"))]
    if len(m) < 2:
        return None
    dots = [d for d, _, _ in m]
    mean = sum(dots) / len(dots)
    sd_mean = math.sqrt(sum((d - mean) ** 2 for d in dots) / (len(dots) - 1) / len(dots))
    signal = mean + se * sd_mean
    noise = sum(q for _, q, _ in m) / len(m) - signal
    half = median_of([h for _, _, h in m])
    return half * max(noise, 0.0) / signal if signal > 0 else math.inf


@detector("small_batch")
def small_batch(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """Each SFT step's gradient is mostly noise: over the half-batch measurements of the rows written
    since the controller's latest change (at least `batch_noise_rows`, in the run's latest segment,
    of a run whose recipe is SFT), the batch the steps trained on (`grad_batch`) is below
    `batch_snr_min`× a lower bound on the gradient's noise scale (`noise_scale`), its labels pass
    the task's check where the trainer checks them (wrong labels add noise of their own), and of
    at least two held-out evals since the change the newest is short of the target and either at
    the not-learning level or no better than the best of the two before it. Averaging more examples
    per step is the cure the noise scale names: the evidence carries the batch that is
    `batch_aim`× that bound (at least twice the recipe's batch, at most `BATCH_RAISE_MAX`× it and
    `BATCH_MAX`)."""
    if (ev.recipe or {}).get("algorithm", "sft") != "sft" or algorithm(ev) != "sft":
        return None
    recipe_batch = to_float((ev.recipe or {}).get("batch_size"))
    rows = [r for r in current_rows(ev) if since(r, known) and is_finite(to_float(r.get("grad_dot")))
            and is_finite(to_float(r.get("grad_batch")))]
    seg = rows[-1].get("segment") if rows else None
    rows = [r for r in rows if r.get("segment") == seg]
    if not recipe_batch or recipe_batch >= BATCH_MAX or len(rows) < th.batch_noise_rows:
        return None
    _, checked = column(current_rows(ev)[-th.recent :], "label_ok", skip_eval=True, finite=True)
    if checked and mean_of(checked) < th.label_ok_min:
        return None
    batch = median_of([float(r["grad_batch"]) for r in rows])
    scale = noise_scale(rows, th.batch_signal_se)
    # a scale past any a learning run showed means the gradient lost its signal: the run is stuck
    # for a reason no batch cures (an lr, a decay, a template), or near its end
    if scale is None or scale > th.batch_noise_max or not batch < th.batch_snr_min * scale:
        return None
    start = int(rows[0].get("step", 0))
    held = held_out_stuck(ev, th, known, seg, start, floor_counts=True)
    if held is None:
        return None
    # the aim is for the batch trained on; the recipe's is larger where a label filter drops some
    aim = th.batch_aim * scale * recipe_batch / batch
    suggested = int(min(BATCH_MAX, BATCH_RAISE_MAX * recipe_batch, max(2 * recipe_batch, math.ceil(aim))))
    return make_diagnosis(ev, "small_batch",
                          f"a step's gradient is mostly noise: its batch of {batch:g} is at most {batch / scale:.2g} of "
                          f"the gradient's noise scale (at least {scale:.3g}, from {len(rows)} half-batch measurements), and "
                          f"held-out is {held[-1]:.3g}", "warning",
                          {"batch_size": recipe_batch, "batch_trained": batch, "batch_suggested": suggested,
                           "noise_scale_lower": scale, "measurements": len(rows), "from_step": start,
                           "heldout": held[-3:], "threshold_snr": th.batch_snr_min, "aim": th.batch_aim})
