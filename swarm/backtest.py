"""Backtests: does an intervention beat doing nothing, from the same checkpoint, on the same data?

For each seed, two arms fork the live run's checkpoint with `fork_mode: state` (weights,
optimiser, data cursor and the run's current recipe and harness): the control keeps them, the
candidate applies the intervention's changes. Both train `horizon_steps` with the same seed
(hence the same data and sampling stream) and end with a held-out eval of the target metric.

Statistical test (stated in every result): one-sided paired t-test over seeds on
candidate − control of the target metric (signed so that + is better). With zero variance of
the differences the sign decides (p = 0 if all improve, 1 otherwise). When both arms score the
same on the target metric for every seed (e.g. both 0 early in a run), the mean training loss
over the horizon's second half breaks the tie when both arms train SFT on the same targets (same
data; the harness differs at most in the template or sampling; lower is better), else the mean
training pass rate over the second half does. The result's `test` names the one used. A candidate that does not
move the target significantly (but is no worse on any seed) is still validated when it
significantly reduces the held-out format-failure rate (truncated + malformed answers): the
symptom the harness fixes target — or, when the arms' SFT losses compare and the candidate forks
from the same checkpoint, significantly lowers the training loss (the target no worse than one
held-out example on any seed): a fix whose effect the target cannot show within the horizon.
"""
from __future__ import annotations

import math
import pathlib
import shutil
import time
from typing import Any

import psutil
import yaml

from agents.domain import BacktestResult, Intervention, Target
from swarm.jobs import Jobs
from trainer.runlog import read_heartbeat, read_jsonl


def paired_one_sided_p(diffs: list[float]) -> float:
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return 0.0 if mean > 0 else 1.0
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    if var <= 1e-18:
        return 0.0 if mean > 0 else 1.0
    t = mean / math.sqrt(var / n)
    from scipy.stats import t as student_t

    return float(student_t.sf(t, df=n - 1))


def arm_config(base: dict[str, Any], name: str, out_dir: str, ckpt: str, seed: int, step: int,
               horizon: int, eval_size: int, changes: dict[str, Any], private: list[dict]) -> dict[str, Any]:
    cfg = {k: v for k, v in base.items() if k not in ("perturbations", "fork_from", "fork_mode", "fork_overrides")}
    overrides = {"recipe.steps": step + horizon, "recipe.eval_interval": horizon, "recipe.eval_size": eval_size,
                 "recipe.stop_at_heldout": None, **changes}
    return {**cfg, "name": name, "out_dir": out_dir, "seed": seed, "fork_from": ckpt, "fork_mode": "state",
            "fork_overrides": overrides, "checkpoint": {"interval": 0, "keep_last": 1}, "samples_per_step": 1,
            "perturbations": private}


def arm_score(run_dir: pathlib.Path, metric: str, horizon: int) -> tuple[float | None, float, float, float | None]:
    """(target metric at the end, mean train pass rate over the second half, held-out format
    failure rate = truncated + malformed at the end, mean training loss over the second half —
    None when any loss there is not finite)."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    final = [r for r in rows if metric in r and isinstance(r[metric], (int, float))]
    train = [r.get("pass_rate", 0.0) for r in rows if "loss" in r and isinstance(r.get("pass_rate"), (int, float))]
    half = train[len(train) // 2 :] or [0.0]
    fail = (final[-1].get("heldout_truncated", 0.0) + final[-1].get("heldout_malformed", 0.0)) if final else 1.0
    losses = [r["loss"] for r in rows if isinstance(r.get("loss"), (int, float)) or r.get("loss") in ("nan", "inf")]
    lh = [float(x) for x in losses[len(losses) // 2 :]]
    loss = sum(lh) / len(lh) if lh and all(math.isfinite(x) for x in lh) else None
    return (final[-1][metric] if final else None), sum(half) / len(half), float(fail), loss


# harness fields that change neither the SFT targets nor which examples are trained on: the
# template (it wraps the same question; it can hold nothing but {question}) and sampling (SFT
# does not sample)
_SAME_TARGETS = ("harness.template", "harness.sampling.")


def sft_comparable(base: dict[str, Any], changes: dict[str, Any]) -> bool:
    """Both arms train SFT on the same targets, so their training losses compare (the negative
    log-likelihood of the same answers): the run's algorithm is sft and the intervention changes
    neither the algorithm nor the targets and examples the loss is computed on."""
    algo = ((base.get("recipe") or {}).get("algorithm") or "sft")
    return algo == "sft" and not any(k == "recipe.algorithm" or (k.startswith("harness.") and not k.startswith(_SAME_TARGETS))
                                     for k in changes)


def noop_harness_edit(changes: dict[str, Any], harness: dict[str, Any], live_version: str | None) -> str | None:
    """Why a harness-only edit needs no backtest (the reason, else None): applied to `harness` (what
    the controller knows) it gives the version the live run already reports — e.g. a rollback
    applied after the edit was proposed restored the harness it wanted."""
    if not changes or not all(k.startswith("harness.") for k in changes):
        return None
    from harness.spec import HarnessSpec
    from trainer.config import apply_changes

    try:
        want = HarnessSpec.model_validate(apply_changes({}, harness, changes)[1]).version
    except ValueError:
        return None
    if live_version == want:
        return f"no backtest: the live harness already is the one this edit makes (version {want})"
    return None


def leftover_arm(run_dir: pathlib.Path, cfg_path: pathlib.Path) -> psutil.Process | bool | None:
    """An arm a previous controller started (arms outlive a killed controller): its process while
    it still runs here, False when it finished (its files hold the result), None otherwise."""
    for p in psutil.process_iter(["cmdline"]):
        if str(cfg_path) in (p.info.get("cmdline") or []) and _running(p):
            return p
    return False if (read_heartbeat(run_dir) or {}).get("state") == "completed" else None


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run_backtest(iv: Intervention, *, base_config: dict[str, Any], ckpt: str, step: int, target: Target,
                 horizon: int, seeds: list[int], eval_size: int, alpha: float, jobs: Jobs,
                 workdir: pathlib.Path, private_perturbations: list[dict] | None = None,
                 config_dir: pathlib.Path | None = None, timeout_s: float = 1800.0,
                 candidate_ckpt: str | None = None, candidate_step: int | None = None, label: str = "") -> BacktestResult:
    """`config_dir` holds the arms' job configs (they may carry the evaluation's perturbations,
    so the controller puts them under .swarm/private); the arms' run files go to `workdir`.
    A rollback is tested from where it rolls back to: `candidate_ckpt` (at `candidate_step`) is the
    candidate arms' fork point; the control arms carry on from `ckpt`. Both train `horizon` steps.
    `label` tells the arms of a second backtest of the same intervention from the first's."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_dir = config_dir or workdir
    config_dir.mkdir(parents=True, exist_ok=True)
    handles: dict[tuple[str, int], tuple[Any, pathlib.Path]] = {}   # a job handle, or a leftover arm
    for seed in seeds:
        for arm, changes in (("candidate", iv.changes), ("control", {})):
            name = f"bt-{iv.id}{label}-{arm}-s{seed}"
            fork, at = (candidate_ckpt, candidate_step) if arm == "candidate" and candidate_ckpt else (ckpt, step)
            cfg = arm_config(base_config, name, str(workdir), fork, seed, at or 0, horizon, eval_size, changes,
                             private_perturbations or [])
            path = config_dir / f"{name}.yaml"
            left = leftover_arm(workdir / name, path)   # after a controller restart: reuse, don't rerun
            if left is None:
                shutil.rmtree(workdir / name, ignore_errors=True)   # a partial arm's files would mix in
                path.write_text(yaml.safe_dump(cfg, sort_keys=False))
                left = jobs.start(name, path)
            handles[(arm, seed)] = (left, workdir / name)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        states = {k: (jobs.status(h) if isinstance(h, str) else ("RUNNING" if h and _running(h) else "SUCCEEDED"))
                  for k, (h, _) in handles.items()}
        if all(s in ("SUCCEEDED", "FAILED", "STOPPED") for s in states.values()):
            break
        time.sleep(0.5)
    else:
        for h, _ in handles.values():
            if isinstance(h, str):
                jobs.stop(h)
            elif h:
                h.kill()
    sign = 1.0 if target.op == ">=" else -1.0
    cand, ctrl, cand_tb, ctrl_tb, cand_ff, ctrl_ff, failed = [], [], [], [], [], [], []
    cand_loss, ctrl_loss = [], []
    for seed in seeds:
        c, ctb, cff, cl = arm_score(handles[("candidate", seed)][1], target.metric, horizon)
        k, ktb, kff, kl = arm_score(handles[("control", seed)][1], target.metric, horizon)
        cand_loss.append(cl)
        ctrl_loss.append(kl)
        cand_ff.append(cff)
        ctrl_ff.append(kff)
        if c is None:
            failed.append(f"candidate seed {seed}")
        if k is None:
            failed.append(f"control seed {seed}")
        cand.append(c if c is not None else (0.0 if sign > 0 else 1.0))
        ctrl.append(k if k is not None else (0.0 if sign > 0 else 1.0))
        cand_tb.append(ctb)
        ctrl_tb.append(ktb)
    diffs = [sign * (a - b) for a, b in zip(cand, ctrl)]
    target_diffs = list(diffs)
    losses_compare = sft_comparable(base_config, iv.changes) and None not in cand_loss and None not in ctrl_loss
    note = "; ".join(f"{f} produced no eval (counted as worst)" for f in failed)
    test = "one-sided paired t-test over seeds on the target metric"
    # a tie: equal on every seed, or an inconclusive difference of at most one held-out example per
    # seed (e.g. 0.005 vs 0 at eval_size 200 while nothing scores yet) — then the next signal decides
    one_example = 1.0 / eval_size + 1e-9 if target.metric == "heldout_acc" else 1e-12
    near = all(abs(d) <= one_example for d in diffs) and not (sum(diffs) / len(diffs) > 0 and paired_one_sided_p(diffs) <= alpha)
    if all(abs(d) < 1e-12 for d in diffs) or near:
        tie = "tie" if all(abs(d) < 1e-12 for d in diffs) else f"near-tie (|difference| ≤ one held-out example of {eval_size} per seed)"
        target_effect = sum(diffs) / len(diffs)
        if losses_compare:
            # SFT arms on the same targets: their loss is the finer signal (a training pass rate of a
            # few percent in a run that barely scores is noise: a policy guessing a frequent answer)
            diffs = [b - a for a, b in zip(cand_loss, ctrl_loss)]
            test = (f"{tie} on the target metric → one-sided paired t-test on the mean SFT training loss (second "
                    "half of the horizon; control − candidate)")
        else:
            diffs = [a - b for a, b in zip(cand_tb, ctrl_tb)]
            test = f"{tie} on the target metric → one-sided paired t-test on mean training pass rate (second half of the horizon)"
        if target_effect < 0:
            note = (note + "; " if note else "") + f"target metric slightly lower for the candidate ({target_effect:+.4f})"
    effect = sum(diffs) / len(diffs)
    p = paired_one_sided_p(diffs)
    passed = effect > 0 and p <= alpha
    if not passed and effect >= 0:
        # the target did not move significantly (common early in a run, before the policy can
        # score): accept a fix whose symptom — held-out answers truncated or malformed — is
        # significantly reduced, provided the target is not worse on any seed
        ff = [b - a for a, b in zip(cand_ff, ctrl_ff)]
        p_ff = paired_one_sided_p(ff)
        if min(diffs) >= 0 and sum(ff) / len(ff) > 0 and p_ff <= alpha:
            passed = True
            note = (note + "; " if note else "") + (
                f"target not significantly better (p={p:.3f}); validated on the held-out format-failure rate "
                f"(truncated + malformed) {sum(ctrl_ff) / len(ctrl_ff):.3f} → {sum(cand_ff) / len(cand_ff):.3f}, "
                f"one-sided paired t-test p={p_ff:.3f}, target no worse on any seed")
    if not passed and losses_compare and candidate_ckpt is None and "SFT training loss" not in test:
        # the target did not move significantly in the horizon (e.g. a policy that barely scores
        # yet); arms that train SFT on the same targets from the same checkpoint also compare on
        # their loss: a fix that lowers it significantly, while the target is no worse on any seed
        # by more than one held-out example, is validated
        ld = [b - a for a, b in zip(cand_loss, ctrl_loss)]
        p_loss = paired_one_sided_p(ld)
        if min(target_diffs) >= -one_example and sum(ld) / len(ld) > 0 and p_loss <= alpha:
            passed = True
            note = (note + "; " if note else "") + (
                f"target not significantly better (p={p:.3f}); validated on the mean SFT training loss (second half "
                f"of the horizon) {sum(ctrl_loss) / len(ctrl_loss):.3f} → {sum(cand_loss) / len(cand_loss):.3f}, "
                f"one-sided paired t-test p={p_loss:.3f}, target no worse than one held-out example on any seed")
    return BacktestResult(metric=target.metric, candidate=cand, control=ctrl, effect=effect, p_value=p, test=test,
                          horizon_steps=horizon, seeds=list(seeds), passed=passed, note=note)
