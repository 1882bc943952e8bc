"""Detectors: pure functions over a run's Evidence that name what is going wrong, with the numbers.

    from agents.detectors import run_detectors, Known
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
Detectors are registered by name in `DETECTORS` (duplicate names are an error); the harness and
data detectors are in `agents.harness_detectors`, which this module imports to register them.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Callable

from swarm.domain import Diagnosis
from swarm.evidence import Evidence, is_eval_row

# ---- thresholds ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Every number a detector compares against. Windows count metric rows (one row per step)."""

    min_rows: int = 8                  # rows of history a trend detector needs before it judges
    recent: int = 5                    # rows in the "now" window
    trailing: int = 30                 # rows in the trailing baseline window
    scan: int = 20                     # how far back (rows) a spike's onset is searched
    # non-finite loss
    nonfinite_min: int = 2             # non-finite rows in the scan window (or the latest row) to fire
    # loss spike: robust z-score of a row vs the median/MAD of the rows before it
    spike_z: float = 6.0
    spike_ratio: float = 1.5           # and at least this multiple of the trailing median
    spike_abs: float = 0.05            # and at least this far above it (nats/token)
    # grad-norm explosion (pre-clip norm)
    grad_z: float = 6.0
    grad_ratio: float = 10.0
    grad_abs: float = 1.0              # and at least this large (a norm of 0.02 after zeros is no explosion)
    # plateau of the target metric over evals, or of the loss when there are no evals
    plateau_evals: int = 4             # evals without improvement
    plateau_min_delta: float = 0.01    # improvement smaller than this is no improvement
    plateau_loss_rows: int = 60        # loss rows compared (first half vs second half)
    plateau_loss_rel: float = 0.02     # relative loss improvement below this is a plateau
    # entropy collapse (GRPO / distill)
    entropy_min: float = 0.05          # nats/token
    entropy_drop: float = 0.1          # or below this fraction of the early-window median
    entropy_pass_max: float = 0.9      # a policy solving ≥ this share may be confident
    # KL blow-up
    kl_max: float = 0.5                # nats/token (k3 estimator)
    kl_min: float = 0.1                # relative blow-up only counts above this
    kl_ratio: float = 10.0
    # truncation / malformed answers
    truncation_max: float = 0.5
    malformed_max: float = 0.8         # persistently above this
    malformed_jump: float = 0.3        # or up this much vs the window's best
    # train reward vs held-out (reward hacking)
    hack_train_min: float = 0.5
    hack_gap: float = 0.3
    hack_unclosed_min: int = 4         # or ≥ this many (and this share) of recent correct samples
    hack_unclosed_share: float = 0.5   # were cut off, while held-out answers close (see the detector)
    # throughput
    throughput_ratio: float = 0.5      # recent median tokens/s below this share of the trailing median
    # heartbeat / crash
    stale_heartbeat_s: float = 30.0    # floor of the stale-heartbeat threshold
    stale_step_factor: float = 10.0    # and at least this many median step times
    # prompt template
    template_mismatch: float = 0.5     # share of recent samples whose prompt lacks the template's text
    template_min_samples: int = 4
    # too-hard curriculum
    too_hard_pass_max: float = 0.02
    too_hard_heldout_max: float = 0.05
    too_hard_jump: int = 2             # a difficulty rise this large within the window is a jump
    # low temperature (GRPO / distill): groups of samples with identical completions
    low_temp_identical: float = 0.8
    low_temp_min_groups: int = 3
    low_temp_pass_max: float = 0.9
    # label noise (SFT): loss flat at a high floor while the policy is mostly right
    label_noise_rows: int = 20
    label_noise_floor: float = 0.15
    label_noise_rel: float = 0.05
    label_noise_pass_min: float = 0.3
    label_noise_heldout_evals: int = 3  # ... and held-out accuracy has stopped improving over this many evals
    # not learning: the loss has barely moved since the run began and held-out stays near zero
    not_learning_rows: int = 100
    not_learning_rel: float = 0.1
    not_learning_heldout_max: float = 0.05

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"Thresholds.{f.name}={v!r}: must be a finite number >= 0")
        for name in ("min_rows", "recent", "trailing", "scan", "plateau_evals", "label_noise_rows",
                     "label_noise_heldout_evals", "not_learning_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"Thresholds.{name}={getattr(self, name)!r}: must be >= 1")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


THRESHOLDS = Thresholds()


@dataclasses.dataclass(frozen=True)
class Known:
    """What the controller knows that the run's files do not say."""

    eval_difficulty: int | None = None     # the difficulty held-out evals run at
    target_metric: str = "heldout_acc"
    target_op: str = ">="
    target_threshold: float | None = None
    template: str | None = None            # the template the controller believes is live


NOTHING = Known()

Detector = Callable[[Evidence, Thresholds, Known], "Diagnosis | None"]
DETECTORS: dict[str, Detector] = {}


def detector(name: str) -> Callable[[Detector], Detector]:
    def deco(fn: Detector) -> Detector:
        if name in DETECTORS:
            raise ValueError(f"detector {name!r} is already registered")
        DETECTORS[name] = fn
        fn.detector_name = name  # type: ignore[attr-defined]
        return fn

    return deco


def run_detectors(ev: Evidence, names: list[str] | tuple[str, ...] | None = None,
                  th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> list[Diagnosis]:
    """The findings of the detectors in `names` (all, in registry order, when None)."""
    out = []
    for name in names if names is not None else list(DETECTORS):
        if name not in DETECTORS:
            raise ValueError(f"unknown detector {name!r}; known: {', '.join(DETECTORS)}")
        d = DETECTORS[name](ev, th, known)
        if d is not None:
            out.append(d)
    return out


# ---- helpers ------------------------------------------------------------------------------------


def _num(x: Any) -> Any:
    """A JSON-safe, readable number for evidence."""
    if isinstance(x, float):
        return float(f"{x:.6g}") if math.isfinite(x) else str(x)
    return x


def _nums(xs: list[float]) -> list[Any]:
    return [_num(x) for x in xs]


def _f(v: Any) -> float | None:
    if isinstance(v, (bool, int, float)) or (isinstance(v, str) and v in ("nan", "inf", "-inf")):
        return float(v)
    return None


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _mad(xs: list[float]) -> float:
    m = _median(xs)
    return _median([abs(x - m) for x in xs])


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _loss_halves(ev: Evidence, n: int) -> tuple[list[float], float, float, float] | None:
    """The last `n` finite losses of the current segment, the medians of their two halves and the
    relative improvement from the first half to the second; None with fewer than `n` rows."""
    loss = _col(current_rows(ev), "loss", skip_skipped=True, finite=True)[1][-n:]
    if len(loss) < n:
        return None
    half = len(loss) // 2
    a, b = _median(loss[:half]), _median(loss[half:])
    return loss, a, b, (a - b) / max(abs(a), 1e-12)


def _diag(ev: Evidence, name: str, summary: str, severity: str, evidence: dict[str, Any]) -> Diagnosis:
    clean = {k: (_nums(v) if isinstance(v, list) else _num(v)) for k, v in evidence.items()}
    return Diagnosis(name=name, summary=summary, severity=severity, operator="detectors", policy="builtin",
                     evidence=clean, step=ev.step)


def algorithm(ev: Evidence) -> str | None:
    for r in reversed(ev.metrics):
        if isinstance(r.get("algorithm"), str):
            return r["algorithm"]
    if ev.recipe and isinstance(ev.recipe.get("algorithm"), str):
        return ev.recipe["algorithm"]
    return None


def current_rows(ev: Evidence) -> list[dict[str, Any]]:
    """Rows since the last change of algorithm (a loss or entropy scale belongs to one algorithm)."""
    rows = ev.metrics
    algo = algorithm(ev)
    i = len(rows)
    while i > 0 and rows[i - 1].get("algorithm", algo) == algo:
        i -= 1
    return rows[i:]


def _col(rows: list[dict[str, Any]], key: str, *, skip_skipped: bool = False,
         skip_eval: bool = False, finite: bool = False) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` over `rows`; optionally without skipped steps, eval rows or
    non-finite values."""
    steps, vals = [], []
    for r in rows:
        if skip_skipped and r.get("skipped"):
            continue
        if skip_eval and is_eval_row(r):
            continue
        v = _f(r.get(key))
        if v is not None and (not finite or math.isfinite(v)):
            steps.append(int(r.get("step", 0)))
            vals.append(v)
    return steps, vals


def eval_difficulty(ev: Evidence, known: Known) -> int | None:
    if known.eval_difficulty is not None:
        return known.eval_difficulty
    cur = (ev.harness or {}).get("curriculum") or {}
    d = cur.get("end") or cur.get("start")
    return int(d) if isinstance(d, int) else None


def known_template(ev: Evidence, known: Known) -> str | None:
    t = known.template or (ev.harness or {}).get("template")
    return t if isinstance(t, str) else None


def _onset(steps: list[int], vals: list[float], th: Thresholds, z_thr: float, ratio: float,
           abs_min: float, groups: list[Any] | None = None) -> dict[str, Any] | None:
    """The earliest of the last `th.scan` rows that is an outlier above the rows before it (robust
    z-score vs the trailing window's median and MAD, and `ratio`× / `abs_min` above the median).
    With `groups` (e.g. each row's difficulty) a row is compared only with rows of its group: a
    curriculum step raises the loss legitimately."""
    n = len(vals)
    for i in range(max(th.min_rows, n - th.scan), n):
        v = vals[i]
        if not math.isfinite(v):
            continue
        lo = max(0, i - th.trailing)
        base = [x for j, x in enumerate(vals[lo:i], lo)
                if math.isfinite(x) and (groups is None or groups[j] == groups[i])]
        if len(base) < th.min_rows:
            continue
        med, mad = _median(base), _mad(base)
        scale = max(1.4826 * mad, 1e-3 * abs(med), 1e-12)
        z = (v - med) / scale
        if z >= z_thr and v >= ratio * med and v - med >= abs_min:
            return {"onset_step": steps[i], "onset_index": i, "value": v, "baseline_median": med,
                    "baseline_mad": mad, "z": z, "baseline": base[-10:]}
    return None


# ---- metric detectors ---------------------------------------------------------------------------


@detector("nonfinite_loss")
def nonfinite_loss(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """Non-finite loss or grad norm (the trainer skips such steps and flags `nonfinite`). One skipped
    step is harmless; several in the scan window, or the latest row, mean the weights or the
    learning rate are broken and the run makes no progress."""
    rows = ev.metrics[-th.scan :]
    bad = [r for r in rows if r.get("nonfinite") or not _finite(_f(r.get("loss", 0.0)))
           or not _finite(_f(r.get("grad_norm", 0.0)))]
    if not bad:
        return None
    latest_bad = bool(rows) and rows[-1] in bad
    if len(bad) < th.nonfinite_min and not latest_bad:
        return None
    steps = [int(r.get("step", 0)) for r in bad]
    return _diag(ev, "nonfinite_loss",
                 f"{len(bad)} of the last {len(rows)} steps had a non-finite loss or gradient norm (first at step {steps[0]})",
                 "critical",
                 {"onset_step": steps[0], "nonfinite_steps": steps[-10:], "window_rows": len(rows),
                  "latest_row_nonfinite": latest_bad, "lr": _f(rows[-1].get("lr")) if rows else None,
                  "threshold_count": th.nonfinite_min})


@detector("loss_spike")
def loss_spike(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """A training loss far above its trailing window (robust z-score ≥ `spike_z`, ≥ `spike_ratio`×
    the median) that has not come back down: the run is diverging (typically a learning rate far
    too high). Only for likelihood losses (SFT, distill); the GRPO surrogate hovers around zero."""
    if algorithm(ev) not in ("sft", "distill"):
        return None
    rows = [r for r in current_rows(ev) if not r.get("skipped") and _f(r.get("loss")) is not None]
    steps, vals = _col(rows, "loss")
    hit = _onset(steps, vals, th, th.spike_z, th.spike_ratio, th.spike_abs,
                 groups=[r.get("difficulty") for r in rows])
    if hit is None:
        return None
    recent = [v for v in vals[-th.recent :] if math.isfinite(v)]
    now = _median(recent) if recent else hit["value"]
    if not (now >= th.spike_ratio * hit["baseline_median"] and now - hit["baseline_median"] >= th.spike_abs):
        return None  # spiked and recovered (near a loss of zero, 1.5x the median is still a recovery)
    i = hit["onset_index"]
    # the lr that trained the rows before the onset (the row just before it may already carry a new lr)
    lrs_before = [x for x in (_f(r.get("lr")) for r in rows[max(0, i - th.trailing) : max(0, i - 1)]) if _finite(x)]
    lr_before = _median(lrs_before) if lrs_before else None
    lr_now = _f(rows[-1].get("lr"))
    return _diag(ev, "loss_spike",
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
    steps, vals = _col(rows, "grad_norm", skip_skipped=True)
    hit = _onset(steps, vals, th, th.grad_z, th.grad_ratio, 0.0)
    if hit is not None and hit["value"] < th.grad_abs:
        return None
    if hit is None:
        return None
    recent = [v for v in vals[-th.recent :] if math.isfinite(v)]
    now = _median(recent) if recent else hit["value"]
    if not now >= th.grad_ratio * hit["baseline_median"] / 2:
        return None
    return _diag(ev, "grad_norm_explosion",
                 f"grad norm jumped to {hit['value']:.3g} at step {hit['onset_step']} from a median of {hit['baseline_median']:.3g}",
                 "critical",
                 {"onset_step": hit["onset_step"], "spike_value": hit["value"], "baseline_median": hit["baseline_median"],
                  "z": hit["z"], "recent": recent, "lr_now": _f(rows[-1].get("lr")) if rows else None,
                  "threshold_z": th.grad_z, "threshold_ratio": th.grad_ratio, "threshold_abs": th.grad_abs})


@detector("plateau")
def plateau(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The target metric has not improved by `plateau_min_delta` over the last `plateau_evals`
    evals (and is not at target); without evals, the loss has not fallen by `plateau_loss_rel`
    between the two halves of its last `plateau_loss_rows` rows. Informational: it says the run is
    stuck, the other detectors say why."""
    metric = known.target_metric
    higher = known.target_op != "<="
    vals = [v for v in (_f(r.get(metric)) for r in ev.evals) if _finite(v)]
    if len(vals) >= th.plateau_evals + 1:
        last = vals[-1]
        if known.target_threshold is not None and (last >= known.target_threshold if higher else last <= known.target_threshold):
            return None
        before, window = vals[: -th.plateau_evals], vals[-th.plateau_evals :]
        best_before = max(before) if higher else min(before)
        best_window = max(window) if higher else min(window)
        gain = (best_window - best_before) if higher else (best_before - best_window)
        if gain < th.plateau_min_delta:
            return _diag(ev, "plateau",
                         f"{metric} has not improved over the last {th.plateau_evals} evals (best {best_window:.3g}, before {best_before:.3g})",
                         "info",
                         {"metric": metric, "evals": vals[-(th.plateau_evals + 3) :], "gain": gain,
                          "threshold_evals": th.plateau_evals, "threshold_min_delta": th.plateau_min_delta})
        return None
    if ev.evals:
        return None
    halves = _loss_halves(ev, th.plateau_loss_rows)
    if halves is None:
        return None
    loss, a, b, rel = halves
    if rel < th.plateau_loss_rel:
        return _diag(ev, "plateau", f"loss flat over {len(loss)} steps ({a:.3g} → {b:.3g})", "info",
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
    _, ent = _col(rows, "entropy", skip_skipped=True, finite=True)
    if len(ent) < th.min_rows:
        return None
    recent = ent[-th.recent :]
    early = _median(ent[: max(th.recent, len(ent) // 4)])
    now = _mean(recent)
    _, pr = _col(rows[-th.recent :], "pass_rate")
    passing = _mean(pr) if pr else 0.0
    if passing >= th.entropy_pass_max:
        return None
    if now < th.entropy_min or (early > th.entropy_min and now < th.entropy_drop * early):
        return _diag(ev, "entropy_collapse",
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
    _, kl = _col(rows, "kl", skip_skipped=True, finite=True)
    if len(kl) < th.min_rows:
        return None
    recent = kl[-th.recent :]
    base = kl[-(th.recent + th.trailing) : -th.recent]
    now, med = _mean(recent), _median(base)
    if now >= th.kl_max or (now >= th.kl_min and base and now >= th.kl_ratio * med):
        return _diag(ev, "kl_blowup", f"KL to the reference is {now:.3g} (trailing median {med:.3g})", "warning",
                     {"kl_recent": recent, "kl_trailing_median": med, "threshold_max": th.kl_max,
                      "threshold_min": th.kl_min, "threshold_ratio": th.kl_ratio})
    return None


@detector("truncation")
def truncation(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """Most completions hit max_new_tokens without the stop text (truncation_rate ≥
    `truncation_max` over the recent rows): answers are cut off and scored truncated. Evidence
    adds the lengths involved (response_len, the longest correct sample) for sizing the fix. Quiet
    while greedy held-out answers fit the limit: sampled ones run on (harder data, high temperature)."""
    rows = ev.metrics
    if len(rows) < th.min_rows:
        return None
    _, tr = _col(rows[-th.recent :], "truncation_rate")
    if len(tr) < min(th.recent, len(rows)) or _mean(tr) < th.truncation_max:
        return None
    last = next((r for r in reversed(ev.evals) if _finite(_f(r.get("heldout_truncated")))), None)
    if last is not None and _f(last["heldout_truncated"]) < th.truncation_max:  # and training was cut off then
        at = int(last.get("step", 0))
        _, then = _col([r for r in rows if at - th.recent < int(r.get("step", 0)) <= at], "truncation_rate")
        if then and _mean(then) >= th.truncation_max:
            return None
    _, rl = _col(rows[-th.recent :], "response_len")
    recent_samples = [s for s in ev.samples if isinstance(s.get("completion"), str)]
    correct = [len(s["completion"]) for s in recent_samples if s.get("verdict") == "correct"]
    truncated = [len(s["completion"]) for s in recent_samples if s.get("truncated")]
    if len(unclosed_correct(ev)) > len(truncated) / 2:
        return None  # the cut-off answers are scored correct: the limit costs no reward (see reward_hacking)
    return _diag(ev, "truncation",
                 f"{_mean(tr):.0%} of recent completions were cut off at max_new_tokens (mean length {_mean(rl) if rl else float('nan'):.3g} tokens)",
                 "warning", {"truncation_rate_recent": tr, "response_len_recent": rl,
                  "response_len_max": max(rl) if rl else None,
                  "longest_correct_chars": max(correct) if correct else None,
                  "longest_truncated_chars": max(truncated) if truncated else None,
                  "samples_truncated": len(truncated), "samples_seen": len(recent_samples),
                  "heldout_truncated": _f(last["heldout_truncated"]) if last else None, "threshold": th.truncation_max})


@detector("malformed_rate")
def malformed_rate(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The share of answers the verifier cannot parse is high: persistently above `malformed_max`,
    or up `malformed_jump` from the best of the window (a regression, e.g. after a harness change).
    Rows of one algorithm only: greedy SFT samples and a GRPO warm-up's sampled ones do not compare."""
    _, mal = _col(current_rows(ev)[-(th.trailing + th.recent) :], "malformed_rate")
    if len(mal) < th.min_rows:
        return None
    recent = mal[-th.recent :]
    now, best = _mean(recent), min(mal[: -th.recent] or recent)
    if now >= th.malformed_max or now - best >= th.malformed_jump:
        return _diag(ev, "malformed_rate", f"{now:.0%} of recent answers are malformed (best in window {best:.0%})",
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
    evals = [(s, v) for s, v in ((int(r.get("step", 0)), _f(r.get("heldout_acc"))) for r in ev.evals) if _finite(v)]
    if not evals or len(ev.metrics) < th.min_rows:
        return None
    eval_step, held = evals[-1]
    # only rows trained on the reward: under SFT the pass rate of sampled answers is measured, not
    # optimised, and runs ahead of the last held-out eval while the model learns fast
    rewarded = [r for r in ev.metrics if r.get("algorithm") != "sft"]
    rows = [r for r in rewarded if int(r.get("step", 0)) <= eval_step][-th.recent :] or rewarded[-th.recent :]
    _, pr = _col(rows, "pass_rate")
    _, rw = _col(rows, "reward_mean")
    if not pr:
        return None
    train = _mean(pr)
    d_eval = eval_difficulty(ev, known)
    _, diffs = _col(rows, "difficulty")
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
        return _diag(ev, "reward_hacking", f"{what}: the training reward accepts wrong answers", "critical",
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
    _, tps = _col(current_rows(ev), "tokens_per_s", skip_eval=True, finite=True)
    if len(tps) < th.recent + th.min_rows:
        return None
    recent, base = tps[-th.recent :], tps[-(th.recent + th.trailing) : -th.recent]
    now, med = _median(recent), _median(base)
    if med > 0 and now < th.throughput_ratio * med:
        return _diag(ev, "throughput_drop", f"throughput fell to {now:.3g} tokens/s from a median of {med:.3g}", "info",
                     {"tokens_per_s_recent": recent, "tokens_per_s_trailing_median": med, "ratio": now / med,
                      "threshold_ratio": th.throughput_ratio})
    return None


# ---- job detectors ------------------------------------------------------------------------------


def stale_threshold(ev: Evidence, th: Thresholds) -> float:
    """Seconds without a heartbeat that count as stale: the floor, or many median step times (an
    eval step may take several)."""
    _, st = _col(ev.metrics[-th.trailing :], "step_time", skip_eval=True)
    _, st_all = _col(ev.metrics[-th.trailing :], "step_time")
    floors = [th.stale_heartbeat_s, 2.0 * max(st_all, default=0.0)]
    return max(floors + ([th.stale_step_factor * _median(st)] if st else []))


@detector("stale_heartbeat")
def stale_heartbeat(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The job says RUNNING but the heartbeat (rewritten every step, and while paused) is older than
    the stale threshold: the worker hangs."""
    if ev.job_status != "RUNNING" or ev.heartbeat_age_s is None or ev.heartbeat_state not in (None, "running"):
        return None  # paused (heartbeats continue) or finished (the job status follows shortly)
    limit = stale_threshold(ev, th)
    if ev.heartbeat_age_s <= limit:
        return None
    return _diag(ev, "stale_heartbeat",
                 f"no heartbeat for {ev.heartbeat_age_s:.0f} s (limit {limit:.0f} s) while the job is RUNNING, last step {ev.step}",
                 "critical",
                 {"heartbeat_age_s": ev.heartbeat_age_s, "threshold_s": limit, "heartbeat_state": ev.heartbeat_state,
                  "job_status": ev.job_status, "last_step": ev.step})


@detector("crashed_job")
def crashed_job(ev: Evidence, th: Thresholds = THRESHOLDS, known: Known = NOTHING) -> Diagnosis | None:
    """The job FAILED, or its status is unknown while the heartbeat still says 'running' but is
    stale and no 'end' event was written: the worker process died without finishing."""
    life = [e.get("event") for e in ev.events if e.get("event") in ("start", "resume", "end")]
    ended = bool(life) and life[-1] == "end"   # the newest segment wrote its end event
    if ev.job_status == "FAILED":
        why = "the job FAILED"
    elif (ev.job_status == "UNKNOWN" and ev.heartbeat_state == "running" and not ended
          and ev.heartbeat_age_s is not None and ev.heartbeat_age_s > stale_threshold(ev, th)):
        why = "the worker stopped writing heartbeats without an end event"
    else:
        return None
    last = ev.events[-1] if ev.events else {}
    return _diag(ev, "crashed_job", f"{why} at step {ev.step}", "critical",
                 {"job_status": ev.job_status, "heartbeat_age_s": ev.heartbeat_age_s,
                  "heartbeat_state": ev.heartbeat_state, "last_step": ev.step, "end_event": ended,
                  "last_event": last.get("event"), "last_event_step": last.get("step"),
                  "threshold_s": stale_threshold(ev, th)})


# harness and data detectors live in their own module; importing it registers them
import agents.harness_detectors  # noqa: E402,F401
