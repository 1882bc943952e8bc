"""The detector contract: thresholds, what the controller knows, the registry and the helpers every
detector shares.

    from agents.detection import run_detectors, Known
    diagnoses = run_detectors(ev, known=Known(eval_difficulty=3))

A detector is a pure function `(Evidence, Thresholds, Known) -> Diagnosis | None`, registered by
name with `@detector("name")` (a duplicate name is an error). The detectors themselves live in
`agents/detectors.py` (metrics, jobs), `agents/step_detectors.py` (the optimiser's step) and
`agents/harness_detectors.py` (harness, data); each imports
this module and none imports another. `agents/__init__.py` imports the three so that the registry
is complete whichever agents module is imported first, in a fixed order (metric and job detectors
first). Thresholds and their calibration are described in `agents/detectors.py`.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Callable

from agents.domain import Diagnosis
from agents.evidence import Evidence, is_eval_row

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
    # input-bound steps: the share of a step spent waiting on the data pipeline (t_data / step_time)
    # rose from at most input_share_before (trailing median) to at least input_share (recent median),
    # and steps got at least input_slowdown times longer. Contention from other processes slows the
    # data pipeline and the model alike and leaves the share where it was
    input_share: float = 0.5
    input_share_before: float = 0.2
    input_slowdown: float = 1.5
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
    label_shift_ratio: float = 2.0     # or: the loss of the latest `label_noise_rows` rows at least this multiple
    label_shift_abs: float = 0.1       # (and this much above) the lowest it reached on the same data and config
    label_answers_z: float = 2.0       # a floor more than this many standard errors below the policy's loss on the
                                       # task's held-out answers fits the targets better than the answers: not noise
    # labels the task rejects: the mean share of a step's SFT labels that the task's own verifier
    # accepts (`label_ok`, written as a target and read back as a completion) over the recent rows
    # is below this; labels made from the task's answers pass every time
    label_ok_min: float = 0.95
    # repeated examples: the training stream repeats questions it sampled a few steps before
    # (over 100 uniform draws a space of 100 questions repeats 37%, of 60 about 50%; a pool of 32 fed
    # 90% of the stream about 60%, smaller pools or larger shares more)
    repeat_share: float = 0.55         # share of the window's per-step distinct questions seen at an earlier step
    repeat_window: int = 100           # the newest this many questions are judged; fewer are not
    # harder data: the questions got longer at an unchanged difficulty and config, the pass rate fell
    shift_rows: int = 20               # steps with samples per block compared
    shift_len_ratio: float = 1.2       # the newest block's median question length at least this multiple
    shift_pass_drop: float = 0.2       # and its median train pass rate at least this much lower
    # questions in another format: the newest `shift_rows` sampled steps' questions carry characters
    # none of the task's own questions use, at least this share of them. A format change rewrites
    # every question; a character the task's probes happened to miss shows in a few
    format_share: float = 0.5
    # not learning: the loss has barely moved since the run began and held-out stays near zero
    not_learning_rows: int = 100
    not_learning_rel: float = 0.1
    not_learning_heldout_max: float = 0.05
    # small updates: an optimiser step moves the weights by a tiny share of their size. Measured on
    # the built-in model from its random init (the suite's five SFT families, 150 steps each): a
    # healthy run's steps move 0.3-1% of the weights' norm (lr 3e-3), a GRPO family's SFT warm-up
    # at lr 3e-4 0.11-0.15%, and runs at 1/30 and 1/200 of 3e-3 0.03-0.07% and ~0.007%: below `small_updates_max` a run that has learnt nothing will not in
    # its budget. Calibrated for training from scratch; a pretrained model's fine-tuning moves less
    # by design (the detector judges only runs at the not-learning level)
    small_updates_rows: int = 40
    small_updates_max: float = 1e-3
    small_updates_aim: float = 7e-3    # the share a healthy run's first steps move: the raise aims there
    # and the ratio grows less than in proportion to the lr: as lr^0.75 (the median slope, in log,
    # from lr x0.03-x0.005 to the family's lr, steps 10-50 of addition2, reverse7, sort4 and
    # countdown2: 0.61-0.82), so the raise is (aim / ratio)^(1 / exponent)
    small_updates_exponent: float = 0.75
    small_updates_raise_max: float = 100.0   # the largest single raise the finding proposes
    # strong decay: AdamW's decoupled weight decay pulls the weights in by lr·wd of their size each
    # step, and the updates push them out. Measured on the built-in model from its random init
    # (addition2, sort4, reverse7 at lr 3e-3, 150 steps): without decay the weights' norm grows 2-5%;
    # wd 0.1 holds it within 2%; wd 0.5 takes 15-18% off; wd 2 about 50% and wd 5 about 75%, most
    # of it in the first 60 steps. At wd 5 the loss is far behind the healthy run's, at wd 2 on one
    # family of three. A norm that fell by `decay_fall` (in log) over at least `decay_rows` rows,
    # where the decay alone pulled at least that much, is the decay's doing; whether it harms is
    # read from held-out (strong_decay)
    decay_rows: int = 30
    decay_fall: float = 0.3
    # small batch: one SFT step in 20 takes its gradient as two half-batch passes (trainer), which
    # estimates the gradient's noise scale B_noise = tr(Σ)/|G|² (McCandlish et al. 2018): a batch of B
    # gives a step whose signal is B/B_noise of its noise. Measured over the first 200 steps from
    # init (addition2, reverse7, sort4 at their lr): B_noise 28-50 at the families' batch of 64
    # (B/B_noise 1.3-2.3), 12-40 at a batch of 2 (0.05-0.15), 12-50 at 6 (0.12-0.5), 31-42 at 16
    # (0.4-0.5, where the loss after 200 steps was 1.5-50x the healthy run's)
    batch_noise_rows: int = 8           # half-batch measurements since the latest change, at least
    batch_snr_min: float = 0.25         # B/B_noise below this: a step is mostly noise
    batch_aim: float = 2.0              # the raise aims at this many times B_noise (its lower bound)
    # |G|² is taken at its mean plus this many standard errors (the bound on B_noise): on the
    # built-in model's sort task (the tests' config) a batch of 2 then reads 0.23 of it after 8
    # measurements and 0.12 after 16, a batch of 64 4-5x it (at 2 SEs: 0.33 and 0.17 against 17-51)
    batch_signal_se: float = 1.0
    # no family's first 200 steps showed a scale above ~150 (50-step windows); a run whose gradient
    # reads far past that has lost its signal, which no batch size names: not judged
    batch_noise_max: float = 256.0
    # departure harm: the target measured since the live config left the controller's, worse than at
    # the checkpoint before it by more than this (about 1.4 binomial SEs of a rate on 200 examples)
    departure_harm: float = 0.05

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"Thresholds.{f.name}={v!r}: must be a finite number >= 0")
        for name in ("min_rows", "recent", "trailing", "scan", "plateau_evals", "label_noise_rows",
                     "label_noise_heldout_evals", "not_learning_rows", "small_updates_rows", "decay_rows",
                     "batch_noise_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"Thresholds.{name}={getattr(self, name)!r}: must be >= 1")
        if not self.input_share_before < self.input_share <= 1.0:
            raise ValueError(f"Thresholds.input_share={self.input_share!r}: must be above input_share_before "
                             f"({self.input_share_before!r}) and at most 1")
        if self.small_updates_exponent <= 0:
            raise ValueError(f"Thresholds.small_updates_exponent={self.small_updates_exponent!r}: must be above 0")
        if self.input_slowdown <= 1.0 or self.label_ok_min > 1.0:
            raise ValueError(f"Thresholds: input_slowdown={self.input_slowdown!r} must be above 1 and "
                             f"label_ok_min={self.label_ok_min!r} at most 1")

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
    stale_heartbeat_s: float | None = None  # the goal's swarm.stale_heartbeat_s (None: Thresholds' floor)
    since_launch_s: float | None = None    # seconds since the live job was launched (a new job's grace)
    harness_version: str | None = None     # the version of the harness the controller set
    recipe_version: str | None = None      # the version of the recipe the controller set
    lr_bounds: tuple[float, float] | None = None   # the lr the controller's recipe gives after its warm-up: (lowest, highest)
    warmup_steps: int = 0                  # the recipe's lr warm-up
    settled_since: float | None = None     # rows written before this time predate the controller's latest change
                                           # (None: the controller tracks none, so nothing is known to be in force)
    question_chars: dict[int, float] | None = None   # the task's own median question length per difficulty
                                           # (measured by the controller once the run has samples; None: not known)
    question_alphabet: str | None = None   # every character the task's own questions use (None: not known)
    answer_alphabet: str | None = None     # every character the task's own answers use (None: not known)
    answer_chars: dict[int, dict[int, int]] | None = None  # per difficulty, how many of the task's own held-out
                                           # answers have each length, where that is the fewest tokens a right answer
                                           # takes (None: not known)


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


def since(row: dict[str, Any], known: Known) -> bool:
    """Whether a row was written since the controller's latest change to the live run (any row, when
    the controller tracks none)."""
    return known.settled_since is None or float(row.get("time", 0.0)) >= known.settled_since


def settled_rows(ev: Evidence, known: Known) -> list[dict[str, Any]]:
    """Training rows of the run's latest segment (since its last rollback or resume) written after
    the controller's latest change: the rows that show what is in force now."""
    rows = [r for r in ev.metrics if not r.get("final") and "step" in r]
    if not rows:
        return []
    seg = rows[-1].get("segment")
    return [r for r in rows if r.get("segment") == seg and since(r, known)]



def readable(x: Any) -> Any:
    """A JSON-safe, readable number for evidence."""
    if isinstance(x, float):
        return float(f"{x:.6g}") if math.isfinite(x) else str(x)
    return x


def readables(xs: list[float]) -> list[Any]:
    return [readable(x) for x in xs]


def to_float(v: Any) -> float | None:
    if isinstance(v, (bool, int, float)) or (isinstance(v, str) and v in ("nan", "inf", "-inf")):
        return float(v)
    return None


def is_finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def median_of(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def mad_of(xs: list[float]) -> float:
    m = median_of(xs)
    return median_of([abs(x - m) for x in xs])


def mean_of(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def loss_halves(ev: Evidence, n: int) -> tuple[list[float], float, float, float] | None:
    """The last `n` finite losses of the current segment, the medians of their two halves and the
    relative improvement from the first half to the second; None with fewer than `n` rows."""
    loss = column(current_rows(ev), "loss", skip_skipped=True, finite=True)[1][-n:]
    if len(loss) < n:
        return None
    half = len(loss) // 2
    a, b = median_of(loss[:half]), median_of(loss[half:])
    return loss, a, b, (a - b) / max(abs(a), 1e-12)


def make_diagnosis(ev: Evidence, name: str, summary: str, severity: str, evidence: dict[str, Any]) -> Diagnosis:
    clean = {k: (readables(v) if isinstance(v, list) else readable(v)) for k, v in evidence.items()}
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


def column(rows: list[dict[str, Any]], key: str, *, skip_skipped: bool = False,
           skip_eval: bool = False, finite: bool = False) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` over `rows`; optionally without skipped steps, eval rows or
    non-finite values."""
    steps, vals = [], []
    for r in rows:
        if skip_skipped and r.get("skipped"):
            continue
        if skip_eval and is_eval_row(r):
            continue
        v = to_float(r.get(key))
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


def spike_onset(steps: list[int], vals: list[float], th: Thresholds, z_thr: float, ratio: float,
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
        med, mad = median_of(base), mad_of(base)
        if ratio > 0 and med <= 0:
            continue   # a multiple of nothing: from a baseline of zeros (no gradient at all) any value "spikes"
        scale = max(1.4826 * mad, 1e-3 * abs(med), 1e-12)
        z = (v - med) / scale
        if z >= z_thr and v >= ratio * med and v - med >= abs_min:
            return {"onset_step": steps[i], "onset_index": i, "value": v, "baseline_median": med,
                    "baseline_mad": mad, "z": z, "baseline": base[-10:]}
    return None
