"""Detectors: pure functions over a run's Evidence that name what is going wrong, with the numbers.

    from agents.detection import run_detectors, Known
    diagnoses = run_detectors(ev, known=Known(eval_difficulty=3))

Each detector looks at one failure mode and returns a `Diagnosis` (its `evidence` holds the metric
windows and the thresholds that triggered it) or `None`. They read only what the trainer writes
(metrics, eval rows, samples, events, heartbeat, job status) plus what the controller knows
(`Known`: the eval difficulty, the target); they never read the perturbation settings, which are
not in the evidence anyway.

Sample text (prompts and completions) is untrusted: detectors look at its *shape* (does a prompt
carry the template's separator, how long is a completion, are the completions of one group
identical) and never copy it into a diagnosis. Evidence carries counts, lengths and metric values.

All thresholds live in `Thresholds`. The defaults were checked on short runs of the built-in model
on CPU (tests/test_detectors.py, tests/test_operators.py): healthy SFT addition and GRPO reversal
runs stay quiet, and the truncation, broken_template, too_hard, lr_spike and low_temperature
perturbations trip their detectors. The label-noise, KL, entropy and job detectors are checked
on hand-built windows only (a 30-step run does not get there); reward hacking on windows shaped
like a measured reward_hack run (sort, SFT warm-up then GRPO; tests/test_grpo_goals.py).
The contract, the registry and the shared helpers are in `agents/detection.py`; the harness and
data detectors are in `agents/harness_detectors.py`.
"""
from __future__ import annotations

import math
import re
from typing import Any

from agents.detection import (NOTHING, THRESHOLDS, algorithm, column, current_rows, detector, eval_difficulty,
                              is_finite, Known, loss_halves, make_diagnosis, mean_of, median_of, settled_rows, since,
                              spike_onset, Thresholds, to_float)
from agents.domain import Diagnosis, JobStatus
from agents.evidence import Evidence, is_eval_row
from harness.render import fewest_to_read, render_answer
from harness.spec import AnswerFormat


# ---- metric detectors ---------------------------------------------------------------------------


@detector("nonfinite_loss")
def nonfinite_loss(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """Non-finite loss or grad norm (the trainer skips such steps and flags `nonfinite`). One skipped
    step is harmless; several in the scan window, or the latest row, mean the weights or the
    learning rate are broken and the run makes no progress."""
    rows = ev.metrics[-th.scan :]
    bad = [r for r in rows if r.get("nonfinite") or not is_finite(to_float(r.get("loss", 0.0)))
           or not is_finite(to_float(r.get("grad_norm", 0.0)))]
    if not bad:
        return None
    latest_bad = bool(rows) and rows[-1] in bad
    if len(bad) < th.nonfinite_min and not latest_bad:
        return None
    steps = [int(r.get("step", 0)) for r in bad]
    return make_diagnosis(ev, "nonfinite_loss",
                          f"{len(bad)} of the last {len(rows)} steps had a non-finite loss or gradient norm (first at step {steps[0]})",
                          "critical",
                          {"onset_step": steps[0], "nonfinite_steps": steps[-10:], "window_rows": len(rows),
                           "latest_row_nonfinite": latest_bad, "lr": to_float(rows[-1].get("lr")) if rows else None,
                           "threshold_count": th.nonfinite_min})


@detector("loss_spike")
def loss_spike(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """A training loss far above its trailing window (robust z-score ≥ `spike_z`, ≥ `spike_ratio`×
    the median) that has not come back down: the run is diverging (typically a learning rate far
    too high). Only for likelihood losses (SFT, distill); the GRPO surrogate hovers around zero."""
    if algorithm(ev) not in ("sft", "distill"):
        return None
    rows = [r for r in current_rows(ev) if not r.get("skipped") and to_float(r.get("loss")) is not None]
    steps, vals = column(rows, "loss")
    hit = spike_onset(steps, vals, th, th.spike_z, th.spike_ratio, th.spike_abs,
                      groups=[r.get("difficulty") for r in rows])
    if hit is None:
        return None
    recent = [v for v in vals[-th.recent :] if math.isfinite(v)]
    now = median_of(recent) if recent else hit["value"]
    if not (now >= th.spike_ratio * hit["baseline_median"] and now - hit["baseline_median"] >= th.spike_abs):
        return None  # spiked and recovered (near a loss of zero, 1.5x the median is still a recovery)
    i = hit["onset_index"]
    # the lr that trained the rows before the onset (the row just before it may already carry a new lr)
    lrs_before = [x for x in (to_float(r.get("lr")) for r in rows[max(0, i - th.trailing) : max(0, i - 1)]) if is_finite(x)]
    lr_before = median_of(lrs_before) if lrs_before else None
    lr_now = to_float(rows[-1].get("lr"))
    return make_diagnosis(ev, "loss_spike",
                          f"loss jumped to {hit['value']:.3g} at step {hit['onset_step']} from a median of "
                          f"{hit['baseline_median']:.3g} (robust z {hit['z']:.1f}) and is still {now:.3g}",
                          "critical",
                          {"onset_step": hit["onset_step"], "spike_value": hit["value"], "baseline_median": hit["baseline_median"],
                           "baseline_mad": hit["baseline_mad"], "z": hit["z"], "recent": recent, "baseline_tail": hit["baseline"],
                           "lr_before": lr_before, "lr_now": lr_now,
                           "threshold_z": th.spike_z, "threshold_ratio": th.spike_ratio, "threshold_abs": th.spike_abs})


@detector("grad_norm_explosion")
def grad_norm_explosion(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The pre-clip gradient norm jumps ≥ `grad_ratio`× its trailing median (robust z ≥ `grad_z`,
    and ≥ `grad_abs`) and stays there: updates are being clipped hard and the optimiser state is poisoned."""
    rows = current_rows(ev)
    steps, vals = column(rows, "grad_norm", skip_skipped=True)
    hit = spike_onset(steps, vals, th, th.grad_z, th.grad_ratio, 0.0)
    if hit is not None and hit["value"] < th.grad_abs:
        return None
    if hit is None:
        return None
    recent = [v for v in vals[-th.recent :] if math.isfinite(v)]
    now = median_of(recent) if recent else hit["value"]
    if not now >= th.grad_ratio * hit["baseline_median"] / 2:
        return None
    return make_diagnosis(ev, "grad_norm_explosion",
                          f"grad norm jumped to {hit['value']:.3g} at step {hit['onset_step']} from a median of {hit['baseline_median']:.3g}",
                          "critical",
                          {"onset_step": hit["onset_step"], "spike_value": hit["value"], "baseline_median": hit["baseline_median"],
                           "z": hit["z"], "recent": recent, "lr_now": to_float(rows[-1].get("lr")) if rows else None,
                           "threshold_z": th.grad_z, "threshold_ratio": th.grad_ratio, "threshold_abs": th.grad_abs})


@detector("plateau")
def plateau(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The target metric has not improved by `plateau_min_delta` over the last `plateau_evals`
    evals (and is not at target); without evals, the loss has not fallen by `plateau_loss_rel`
    between the two halves of its last `plateau_loss_rows` rows. Informational: it says the run is
    stuck, the other detectors say why. Only evals written since the controller's latest change count
    (`Known.settled_since`): one from before it says nothing of whether the run is stuck with it."""
    metric = known.target_metric
    higher = known.target_op != "<="
    vals = [v for v in (to_float(r.get(metric)) for r in ev.evals if since(r, known)) if is_finite(v)]
    if len(vals) >= th.plateau_evals + 1:
        last = vals[-1]
        if known.target_threshold is not None and (last >= known.target_threshold if higher else last <= known.target_threshold):
            return None
        before, window = vals[: -th.plateau_evals], vals[-th.plateau_evals :]
        best_before = max(before) if higher else min(before)
        best_window = max(window) if higher else min(window)
        gain = (best_window - best_before) if higher else (best_before - best_window)
        if gain < th.plateau_min_delta:
            return make_diagnosis(ev, "plateau",
                                  f"{metric} has not improved over the last {th.plateau_evals} evals (best {best_window:.3g}, before {best_before:.3g})",
                                  "info",
                                  {"metric": metric, "evals": vals[-(th.plateau_evals + 3) :], "gain": gain,
                                   "threshold_evals": th.plateau_evals, "threshold_min_delta": th.plateau_min_delta})
        return None
    if ev.evals:
        return None
    halves = loss_halves(ev, th.plateau_loss_rows)
    if halves is None:
        return None
    loss, a, b, rel = halves
    if rel < th.plateau_loss_rel:
        return make_diagnosis(ev, "plateau", f"loss flat over {len(loss)} steps ({a:.3g} → {b:.3g})", "info",
                              {"metric": "loss", "first_half_median": a, "second_half_median": b, "relative_improvement": rel,
                               "threshold_rel": th.plateau_loss_rel})
    return None


@detector("entropy_collapse")
def entropy_collapse(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """GRPO/distill: the policy's per-token entropy fell near zero (below `entropy_min`, or below
    `entropy_drop` of its early value) while it still fails often: it stopped exploring, so groups
    carry no reward variance and learning stalls. (SFT entropy falls as it should, not checked.)"""
    if algorithm(ev) not in ("grpo", "distill"):
        return None
    rows = current_rows(ev)
    _, ent = column(rows, "entropy", skip_skipped=True, finite=True)
    if len(ent) < th.min_rows:
        return None
    recent = ent[-th.recent :]
    early = median_of(ent[: max(th.recent, len(ent) // 4)])
    now = mean_of(recent)
    _, pr = column(rows[-th.recent :], "pass_rate")
    passing = mean_of(pr) if pr else 0.0
    if passing >= th.entropy_pass_max:
        return None
    if now < th.entropy_min or (early > th.entropy_min and now < th.entropy_drop * early):
        return make_diagnosis(ev, "entropy_collapse",
                              f"policy entropy fell to {now:.3g} nats/token (early {early:.3g}) with pass rate {passing:.2f}",
                              "warning",
                              {"entropy_recent": recent, "entropy_early_median": early, "pass_rate_recent": passing,
                               "threshold_min": th.entropy_min, "threshold_drop": th.entropy_drop})
    return None


@detector("kl_blowup")
def kl_blowup(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The KL to the reference policy (written when kl_coef > 0) is above `kl_max`, or above
    `kl_min` and `kl_ratio`× its trailing median: the policy is running away from the reference
    faster than the reward justifies."""
    rows = current_rows(ev)
    _, kl = column(rows, "kl", skip_skipped=True, finite=True)
    if len(kl) < th.min_rows:
        return None
    recent = kl[-th.recent :]
    base = kl[-(th.recent + th.trailing) : -th.recent]
    now, med = mean_of(recent), median_of(base)
    if now >= th.kl_max or (now >= th.kl_min and base and now >= th.kl_ratio * med):
        return make_diagnosis(ev, "kl_blowup", f"KL to the reference is {now:.3g} (trailing median {med:.3g})", "warning",
                              {"kl_recent": recent, "kl_trailing_median": med, "threshold_max": th.kl_max,
                               "threshold_min": th.kl_min, "threshold_ratio": th.kl_ratio})
    return None


@detector("truncation")
def truncation(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """Most completions hit max_new_tokens without the stop text (truncation_rate ≥
    `truncation_max` over the recent rows): answers are cut off and scored truncated. Evidence
    adds the lengths involved (response_len, the longest correct sample) for sizing the fix. Quiet
    while greedy held-out answers fit the limit (sampled ones run on: harder data, high temperature),
    and before the first held-out eval (an untrained model's samples run on too) — unless the task's
    own facts say the limit cuts the answers: see `answers_cut`."""
    fact = answers_cut(ev, known)
    if fact is not None:
        return make_diagnosis(
            ev, "truncation", f"max_new_tokens {fact['limit']} cuts {fact['share_cut']:.0%} of the task's own held-out "
            f"answers (a whole one takes up to {fact['written_max']} tokens): at most {1 - fact['share_cut']:.0%} "
            f"of them can be right, below the target's {fact['threshold']:.0%}", "warning",
            {**fact, "task_fact": "harness.sampling.max_new_tokens", "response_len_max": None})
    rows = ev.metrics
    if len(rows) < th.min_rows:
        return None
    _, tr = column(rows[-th.recent :], "truncation_rate")
    if len(tr) < min(th.recent, len(rows)) or mean_of(tr) < th.truncation_max:
        return None
    last = next((r for r in reversed(ev.evals) if is_finite(to_float(r.get("heldout_truncated")))), None)
    if last is None:
        return None   # before the first held-out eval, cut-off samples of a model still learning its format say nothing about the limit
    if to_float(last["heldout_truncated"]) < th.truncation_max:  # and training was cut off then
        at = int(last.get("step", 0))
        _, then = column([r for r in rows if at - th.recent < int(r.get("step", 0)) <= at], "truncation_rate")
        if then and mean_of(then) >= th.truncation_max:
            return None
    _, rl = column(rows[-th.recent :], "response_len")
    recent_samples = [s for s in ev.samples if isinstance(s.get("completion"), str)]
    correct = [len(s["completion"]) for s in recent_samples if s.get("verdict") == "correct"]
    truncated = [len(s["completion"]) for s in recent_samples if s.get("truncated")]
    if len(unclosed_correct(ev)) > len(truncated) / 2:
        return None  # the cut-off answers are scored correct: the limit costs no reward (see reward_hacking)
    return make_diagnosis(ev, "truncation",
                          f"{mean_of(tr):.0%} of recent completions were cut off at max_new_tokens (mean length {mean_of(rl) if rl else float('nan'):.3g} tokens)",
                          "warning", {"truncation_rate_recent": tr, "response_len_recent": rl,
                           "response_len_max": max(rl) if rl else None,
                           "longest_correct_chars": max(correct) if correct else None,
                           "longest_truncated_chars": max(truncated) if truncated else None,
                           "samples_truncated": len(truncated), "samples_seen": len(recent_samples),
                           "heldout_truncated": to_float(last["heldout_truncated"]) if last else None, "threshold": th.truncation_max})


def answers_cut(ev: Evidence, known: Known) -> dict[str, Any] | None:
    """The answer limit in force against the task's own held-out set: where the controller knows the
    lengths of the answers its evals score (`known.answer_chars`, at the difficulty they run at, in
    characters that are tokens, of a task that takes no shorter right answer), the share of them
    the harness's answer format cannot write within `max_new_tokens` so that its parser reads them
    back (`fewest_to_read`: its prefix, the answer, the stop where the pattern needs it) — when so
    many are cut that the held-out accuracy the target asks for is out of reach. A fact of the
    config and the task, no statistic: it holds on every look from the first step, or on none. The
    evidence also names the most tokens a whole answer takes (with its stop, or the end token),
    what a limit must let through. None otherwise."""
    lens = (known.answer_chars or {}).get(known.eval_difficulty) if known.eval_difficulty is not None else None
    h = ev.harness or {}
    limit = (h.get("sampling") or {}).get("max_new_tokens")
    if not lens or not isinstance(limit, int) or isinstance(limit, bool) \
            or known.target_metric != "heldout_acc" or known.target_op != ">=" or known.target_threshold is None:
        return None
    try:
        fmt = AnswerFormat.model_validate(h.get("answer") or {})
    except ValueError:
        return None
    need = {int(n): fewest_to_read(fmt, "1" * int(n)) for n in lens}      # by length: the content does not matter
    total = sum(int(c) for c in lens.values())
    share = sum(int(c) for n, c in lens.items() if need[int(n)] is None or need[int(n)] > limit) / total if total else 0.0
    if not total or 1 - share >= known.target_threshold:
        return None
    whole = max(len(render_answer(fmt, "1" * int(n))) for n in lens) + (0 if fmt.stop else 1)
    return {"limit": limit, "share_cut": share, "needed_max": max((k for k in need.values() if k), default=None),
            "written_max": whole, "threshold": known.target_threshold, "answers_probed": total}


@detector("malformed_rate")
def malformed_rate(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The share of answers the verifier cannot parse is high: persistently above `malformed_max`,
    or up `malformed_jump` from the best of the window (a regression, e.g. after a harness change).
    Rows of one algorithm only: greedy SFT samples and a GRPO warm-up's sampled ones do not compare."""
    _, mal = column(current_rows(ev)[-(th.trailing + th.recent) :], "malformed_rate")
    if len(mal) < th.min_rows:
        return None
    recent = mal[-th.recent :]
    now, best = mean_of(recent), min(mal[: -th.recent] or recent)
    if now >= th.malformed_max or now - best >= th.malformed_jump:
        return make_diagnosis(ev, "malformed_rate", f"{now:.0%} of recent answers are malformed (best in window {best:.0%})",
                              "warning", {"malformed_recent": recent, "malformed_best": best, "threshold_max": th.malformed_max,
                               "threshold_jump": th.malformed_jump})
    return None


def unclosed_correct(ev: Evidence) -> list[dict[str, Any]]:
    """Recent samples scored correct although cut off before the stop text (flags only, no text)."""
    stop = ((ev.harness or {}).get("answer") or {}).get("stop", "\n")
    return [s for s in ev.samples if stop and s.get("truncated") and s.get("verdict") == "correct"]


@detector("reward_hacking")
def reward_hacking(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """Train-time pass rate (under the harness's verifier) is high while held-out accuracy (always
    the task's own verifier, greedy) lags far behind, at a training difficulty no easier than the
    eval's: the training reward accepts answers the task does not (an exploitable verifier). An
    earlier sign (mode `unclosed_correct`): most recent samples scored correct were cut off before
    their answer closed while greedy held-out answers do close: the reward takes unfinished answers."""
    evals = [(s, v) for s, v in ((int(r.get("step", 0)), to_float(r.get("heldout_acc"))) for r in ev.evals) if is_finite(v)]
    if not evals or len(ev.metrics) < th.min_rows:
        return None
    eval_step, held = evals[-1]
    # only rows trained on the reward: under SFT the pass rate of sampled answers is measured, not
    # optimised, and runs ahead of the last held-out eval while the model learns fast
    rewarded = [r for r in ev.metrics if r.get("algorithm") != "sft"]
    rows = [r for r in rewarded if int(r.get("step", 0)) <= eval_step][-th.recent :] or rewarded[-th.recent :]
    _, pr = column(rows, "pass_rate")
    _, rw = column(rows, "reward_mean")
    if not pr:
        return None
    train = mean_of(pr)
    d_eval = eval_difficulty(ev, known)
    _, diffs = column(rows, "difficulty")
    if d_eval is not None and diffs and min(diffs) < d_eval:
        return None  # training on easier problems than the eval: a gap is expected
    unclosed = unclosed_correct(ev)
    n_correct = sum(s.get("verdict") == "correct" for s in ev.samples)
    held_trunc = ev.latest_eval("heldout_truncated")
    early = (len(unclosed) >= th.hack_unclosed_min and len(unclosed) >= th.hack_unclosed_share * n_correct
             and held_trunc is not None and held_trunc < th.hack_unclosed_share)
    gap = train - held >= th.hack_gap
    # the last eval before the divergence (held-out still within the gap), else the first unclosed sample
    onset = max((s for s, v in evals if v >= train - th.hack_gap), default=None) if gap else \
        min((int(s.get("step", 0)) for s in unclosed), default=None)
    if train >= th.hack_train_min and (gap or early):
        what = (f"train pass rate {train:.2f} vs held-out accuracy {held:.2f} at step {eval_step}" if gap else
                f"{len(unclosed)} of {n_correct} recent samples scored correct were cut off unfinished (held-out {held:.2f})")
        return make_diagnosis(ev, "reward_hacking", f"{what}: the training reward accepts wrong answers", "critical",
                              {"mode": "gap" if gap else "unclosed_correct", "train_pass_rate": pr, "train_reward_mean": rw,
                               "heldout_acc": held, "eval_step": eval_step,
                               "gap": train - held, "onset_step": onset, "correct_unclosed_samples": len(unclosed), "correct_samples": n_correct,
                               "heldout_truncated": held_trunc, "train_difficulty": diffs[-1] if diffs else None,
                               "eval_difficulty": d_eval, "threshold_train_min": th.hack_train_min, "threshold_gap": th.hack_gap,
                               "threshold_unclosed_min": th.hack_unclosed_min, "threshold_unclosed_share": th.hack_unclosed_share})
    return None


@detector("throughput_drop")
def throughput_drop(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """tokens/s (eval steps excluded, same algorithm) fell below `throughput_ratio` of its trailing
    median: a slow or contended worker. Informational."""
    _, tps = column(current_rows(ev), "tokens_per_s", skip_eval=True, finite=True)
    if len(tps) < th.recent + th.min_rows:
        return None
    recent, base = tps[-th.recent :], tps[-(th.recent + th.trailing) : -th.recent]
    now, med = median_of(recent), median_of(base)
    if med > 0 and now < th.throughput_ratio * med:
        return make_diagnosis(ev, "throughput_drop", f"throughput fell to {now:.3g} tokens/s from a median of {med:.3g}", "info",
                              {"tokens_per_s_recent": recent, "tokens_per_s_trailing_median": med, "ratio": now / med,
                               "threshold_ratio": th.throughput_ratio})
    return None


def input_shares(ev: Evidence) -> list[tuple[int, float, float]]:
    """(step, seconds, share of them spent waiting on the data pipeline) of the training rows of the
    newest job segment (a restart or a rollback starts a new one) under the newest harness and
    recipe versions (a filter or a batch size changes the data work), eval rows excluded (an eval's
    time is no step's). Rows without `t_data` (a trainer that does not time its data pipeline, e.g.
    a foreign one) give nothing."""
    rows = current_rows(ev)
    # one job segment under one harness and recipe: a changed filter or batch changes the data work
    key = (lambda r: (r.get("segment"), r.get("harness_version"), r.get("recipe_version")))
    last = key(rows[-1]) if rows else None
    out = []
    for r in rows:
        if key(r) != last or is_eval_row(r):
            continue
        dt, wait = to_float(r.get("step_time")), to_float(r.get("t_data"))
        if dt is not None and wait is not None and dt > 0 and math.isfinite(dt) and math.isfinite(wait):
            out.append((int(r.get("step", 0)), dt, min(max(wait / dt, 0.0), 1.0)))
    return out


@detector("input_bound")
def input_bound(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The job's steps now wait on the data pipeline: the recent median share of a step spent there
    is at least `input_share`, it was at most `input_share_before` over the trailing rows of the
    same job segment, and steps got at least `input_slowdown` times longer (`t_data` is the slowest
    rank's). A slow loader, a slow disk or network filesystem: the worker's input, not the run.
    Contention from other processes on the machine slows the pipeline and the model alike and
    leaves the share where it was; so does a throttled device, which this does not claim
    (`throughput_drop` reports it); a share that was high from the segment's start (a job
    restarted onto the same slowness) is no rise."""
    rows = input_shares(ev)
    if len(rows) < th.recent + th.min_rows:
        return None
    recent, base = rows[-th.recent:], rows[-(th.recent + th.trailing):-th.recent]
    share_now, share_before = median_of([r[2] for r in recent]), median_of([r[2] for r in base])
    dt_now, dt_before = median_of([r[1] for r in recent]), median_of([r[1] for r in base])
    if share_now >= th.input_share and share_before <= th.input_share_before and dt_now >= th.input_slowdown * dt_before:
        onset = next((s for s, _, sh in recent if sh >= th.input_share), recent[0][0])
        return make_diagnosis(
            ev, "input_bound", f"steps take {dt_now:.3g} s, {share_now:.0%} of it waiting on the data pipeline "
            f"(before: {dt_before:.3g} s, {share_before:.0%})", "warning",
            {"step_time_recent": dt_now, "step_time_before": dt_before, "data_share_recent": share_now,
             "data_share_before": share_before, "onset_step": onset, "threshold_share": th.input_share,
             "threshold_share_before": th.input_share_before, "threshold_slowdown": th.input_slowdown})
    return None


# ---- job detectors ------------------------------------------------------------------------------


def stale_threshold(ev: Evidence, th: Thresholds, known: Known = NOTHING) -> float:
    """Seconds without a heartbeat that count as stale: the floor (the goal's
    `swarm.stale_heartbeat_s` when the controller passes it, else `Thresholds.stale_heartbeat_s`),
    or many median step times (an eval step may take several)."""
    _, st = column(ev.metrics[-th.trailing :], "step_time", skip_eval=True)
    _, st_all = column(ev.metrics[-th.trailing :], "step_time")
    floor = known.stale_heartbeat_s if known.stale_heartbeat_s is not None else th.stale_heartbeat_s
    floors = [floor, 2.0 * max(st_all, default=0.0)]
    return max(floors + ([th.stale_step_factor * median_of(st)] if st else []))


# a new worker that has not written its first heartbeat yet (importing, building the model,
# restoring a checkpoint — slower on a loaded machine) is not hung before this many seconds
STARTUP_GRACE_S = 120.0


def in_grace(ev: Evidence, th: Thresholds, known: Known) -> bool:
    """The live job was launched less than a stale threshold ago, or it has not written a
    heartbeat of its own yet (the file predates its launch: a previous worker's) and was launched
    less than STARTUP_GRACE_S (or twice the threshold) ago."""
    if known.since_launch_s is None:
        return False
    limit = stale_threshold(ev, th, known)
    not_yet = ev.heartbeat_age_s is not None and ev.heartbeat_age_s >= known.since_launch_s
    return known.since_launch_s <= limit or (not_yet and known.since_launch_s <= max(2 * limit, STARTUP_GRACE_S))


@detector("stale_heartbeat")
def stale_heartbeat(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The job says RUNNING but the heartbeat (rewritten every step, and while paused) is older than
    the stale threshold, and the job is past its launch grace: the worker hangs."""
    if ev.job_status != JobStatus.RUNNING or ev.heartbeat_age_s is None or ev.heartbeat_state not in (None, "running"):
        return None  # paused (heartbeats continue) or finished (the job status follows shortly)
    limit = stale_threshold(ev, th, known)
    if ev.heartbeat_age_s <= limit or in_grace(ev, th, known):
        return None
    return make_diagnosis(ev, "stale_heartbeat",
                          f"no heartbeat for {ev.heartbeat_age_s:.0f} s (limit {limit:.0f} s) while the job is RUNNING, last step {ev.step}",
                          "critical",
                          {"heartbeat_age_s": ev.heartbeat_age_s, "threshold_s": limit, "heartbeat_state": ev.heartbeat_state,
                           "job_status": ev.job_status, "last_step": ev.step, "since_launch_s": known.since_launch_s})


@detector("crashed_job")
def crashed_job(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The job FAILED, or its status is unknown while the heartbeat still says 'running' but is
    stale (past the launch grace) and no 'end' event was written: the worker died without finishing."""
    life = [e.get("event") for e in ev.events if e.get("event") in ("start", "resume", "end")]
    ended = bool(life) and life[-1] == "end"   # the newest segment wrote its end event
    if ev.job_status == JobStatus.FAILED:
        why = "the job FAILED"
    elif ev.job_status == JobStatus.UNKNOWN and ev.heartbeat_state == "failed" and not ended:
        why = "the worker wrote that it failed"
    elif (ev.job_status == JobStatus.UNKNOWN and ev.heartbeat_state == "running" and not ended and not in_grace(ev, th, known)
          and ev.heartbeat_age_s is not None and ev.heartbeat_age_s > stale_threshold(ev, th, known)):
        why = "the worker stopped writing heartbeats without an end event"
    else:
        return None
    last = ev.events[-1] if ev.events else {}
    return make_diagnosis(ev, "crashed_job", f"{why} at step {ev.step}", "critical",
                          {"job_status": ev.job_status, "heartbeat_age_s": ev.heartbeat_age_s,
                           "heartbeat_state": ev.heartbeat_state, "last_step": ev.step, "end_event": ended,
                           "last_event": last.get("event"), "last_event_step": last.get("step"),
                           "threshold_s": stale_threshold(ev, th, known)})


# what an allocator or a framework says when memory runs out (CPU allocators, CUDA, ROCm, Python)
MEMORY_ERROR = re.compile(r"out of memory|can'?t allocate memory|cannot allocate memory|MemoryError|OutOfMemoryError|"
                          r"std::bad_alloc|Cannot allocate memory", re.I)


@detector("out_of_memory")
def out_of_memory(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The newest worker died of an error that names memory: an allocation failed at that step.
    The same config fails again at the same place after a restart (the memory a step needs grows
    with its batch), so this names what a restart alone cannot fix. Only the newest life counts: a
    worker that started again after an OOM and has not died since is not out of memory."""
    life = [e for e in ev.events if e.get("event") in ("start", "resume", "end", "error")]
    if not life or life[-1].get("event") != "error":
        return None
    last = life[-1]
    text = f"{last.get('error', '')}: {last.get('message', '')}"
    if not MEMORY_ERROR.search(text):
        return None
    times = sum(1 for e in ev.events if e.get("event") == "error"
                and MEMORY_ERROR.search(f"{e.get('error', '')}: {e.get('message', '')}"))
    return make_diagnosis(ev, "out_of_memory", f"the worker ran out of memory at step {last.get('step')} "
                          f"({times} time(s) in this run): {text[:160]}", "critical",
                          {"error": text[:300], "at_step": last.get("step"), "memory_errors": times,
                           "job_status": ev.job_status})


# ---- what the trainer noticed -------------------------------------------------------------------
# The trainer handles these itself (falls back to an older checkpoint, refuses a command, skips a
# non-finite step, resumes after a restart); the findings make them evidence the operators read
# and the reports show. They propose nothing on their own.


@detector("checkpoint_corrupt")
def checkpoint_corrupt(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The trainer found a checkpoint that failed its checksum (or would not load) and fell back
    to an older one: the steps since that one were trained again."""
    bad = [e for e in ev.events if e.get("event") == "checkpoint_corrupt"]
    if not bad:
        return None
    names = [str(e.get("name")) for e in bad]
    return make_diagnosis(ev, "checkpoint_corrupt",
                          f"the trainer found {len(bad)} corrupt checkpoint(s) ({', '.join(names[-3:])}) and fell back to an older one",
                          "warning", {"checkpoints": names[-10:], "errors": [str(e.get("error"))[:200] for e in bad[-3:]],
                                      "at_steps": [int(e.get("step", 0)) for e in bad[-10:]]})


@detector("command_refused")
def command_refused(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The trainer refused a command (an invalid field value, an unknown checkpoint): what the
    controller asked for is not in force."""
    bad = [a for a in ev.acks if a.get("status") == "rejected"]
    if not bad:
        return None
    last = bad[-1]
    return make_diagnosis(ev, "command_refused",
                          f"the trainer refused {len(bad)} recent command(s); the last, {last.get('cmd')} {last.get('id')}, "
                          f"at step {last.get('step')}: {str(last.get('reason'))[:200]}",
                          "warning", {"ids": [str(a.get("id")) for a in bad[-10:]], "cmds": [str(a.get("cmd")) for a in bad[-10:]],
                                      "reasons": [str(a.get("reason"))[:200] for a in bad[-3:]]})


@detector("skipped_steps")
def skipped_steps(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """Steps the trainer skipped (a non-finite loss or gradient norm, or nothing to train on)
    among the recent rows, fewer than `nonfinite_loss` needs to fire."""
    rows = ev.metrics[-th.scan :]
    skipped = [int(r.get("step", 0)) for r in rows if r.get("skipped")]
    if not skipped:
        return None
    nonfinite = sum(1 for r in rows if r.get("nonfinite"))
    return make_diagnosis(ev, "skipped_steps", f"the trainer skipped {len(skipped)} of the last {len(rows)} steps "
                          f"({nonfinite} non-finite), at steps {', '.join(map(str, skipped[-5:]))}", "info",
                          {"skipped_steps": skipped[-10:], "nonfinite": nonfinite, "window_rows": len(rows)})


@detector("job_restarted")
def job_restarted(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The job resumed from a checkpoint (after a crash, a stall or a restart): the steps after
    that checkpoint were lost and trained again."""
    resumes = [e for e in ev.events if e.get("event") == "resume"]
    if not resumes:
        return None
    return make_diagnosis(ev, "job_restarted", f"the job resumed from a checkpoint {len(resumes)} time(s) in the recent events, "
                          f"last at step {resumes[-1].get('step')}", "info",
                          {"resumed_at_steps": [int(e.get("step", 0)) for e in resumes[-10:]]})


LR_TOLERANCE = 0.01    # relative: the logged lr is rounded, a schedule's end points are exact


def version_drift(ev: Evidence, th: Thresholds, known: Known, key: str, set_version: str | None) -> dict[str, Any] | None:
    """The version under `key` the live run reports in its metrics is not `set_version` (the one the
    controller set) on every one of the `recent` rows since the controller's latest change: what
    the live version is, since which step, and whether a row since that change ran the set one."""
    if not set_version or known.settled_since is None:
        return None
    rows = [r for r in settled_rows(ev, known) if isinstance(r.get(key), str)]
    recent = rows[-th.recent :]
    if len(recent) < th.recent or any(r[key] == set_version for r in recent):
        return None
    i = len(rows)
    while i > 0 and rows[i - 1][key] != set_version:
        i -= 1
    return {"live_version": recent[-1][key], "set_version": set_version, "since_step": int(rows[i]["step"]),
            "ran_the_set_version_before": i > 0, "rows": len(rows) - i}


def _drift_summary(what: str, d: dict[str, Any]) -> str:
    return (f"the live run reports {what} version {d['live_version']} since step {d['since_step']}, "
            f"not {d['set_version']}, the one the controller set"
            + ("" if d["ran_the_set_version_before"] else " (no row since the controller's latest change shows it)"))


@detector("harness_drift")
def harness_drift(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The harness the live run reports (its metrics' `harness_version`) is not the one the
    controller set, on every one of the `recent` rows since the controller's latest change: prompts,
    sampling, reward or curriculum changed with no command from the controller. Which field changed
    the version does not say; the effects (truncation, template, curriculum findings) may. Silent
    unless the controller says what it set and since when (`Known.settled_since`)."""
    d = version_drift(ev, th, known, "harness_version", known.harness_version)
    return make_diagnosis(ev, "harness_drift", _drift_summary("harness", d), "warning", d) if d else None


@detector("recipe_drift")
def recipe_drift(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The recipe the live run reports (its metrics' `recipe_version`) is not the one the controller
    set, as `harness_drift` reads the harness: an optimisation field (batch size, weight decay,
    schedule, lr, ...) changed with no command from the controller. Which field the version does
    not say; `lr_drift` names the lr when it is the one."""
    d = version_drift(ev, th, known, "recipe_version", known.recipe_version)
    return make_diagnosis(ev, "recipe_drift", _drift_summary("recipe", d), "warning", d) if d else None


@detector("lr_drift")
def lr_drift(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The learning rate the live run logs is outside what the controller's recipe gives after its
    warm-up (its schedule runs between min_lr_ratio x lr and lr), on every one of the `recent` rows
    since the controller's latest change: the lr in force is not the one the controller set."""
    if known.lr_bounds is None or known.settled_since is None:
        return None
    lo, hi = known.lr_bounds
    rows = [r for r in settled_rows(ev, known) if int(r["step"]) > known.warmup_steps and is_finite(to_float(r.get("lr")))]
    recent = rows[-th.recent :]
    if len(recent) < th.recent:
        return None
    outside = [float(r["lr"]) for r in recent if not lo * (1 - LR_TOLERANCE) <= float(r["lr"]) <= hi * (1 + LR_TOLERANCE)]
    if len(outside) < len(recent):
        return None
    i = len(rows)
    while i > 0 and not lo * (1 - LR_TOLERANCE) <= float(rows[i - 1]["lr"]) <= hi * (1 + LR_TOLERANCE):
        i -= 1
    live = outside[-1]
    return make_diagnosis(ev, "lr_drift",
                          f"the live run's learning rate is {live:.3g} since step {int(rows[i]['step'])}, outside "
                          f"{lo:.3g}-{hi:.3g}, what the controller's recipe gives ({live / hi:.3g}x its lr)",
                          "warning", {"lr_live": live, "lr_set": hi, "lr_lowest": lo, "ratio": live / hi,
                                      "since_step": int(rows[i]["step"])})


TRAINER_NOTICES = ("checkpoint_corrupt", "command_refused", "skipped_steps", "job_restarted")
