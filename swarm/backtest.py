"""Backtests: the I/O behind `swarm.decisions.decide` — does an intervention beat doing nothing,
from the same checkpoint, on the same data?

    pairs, cpu_s = run_arms(iv, base_config=…, ckpt=…, step=…, horizon=…, seeds=[0, 1], …)
    decision = decide(pairs, Rule(...))          # swarm/decisions.py: Validated | Rejected | Extend

For each seed, two arms fork the live run's checkpoint with `fork_mode: state` (weights,
optimiser, data cursor, the run's current recipe and harness, and the data faults it trains
under — the trainer's fork carries them; the controller never hands any fault to an arm): the
control keeps them, the candidate applies the intervention's changes. Both train `horizon_steps`
with the same seed (hence the same data and sampling stream) and end with a held-out eval.
A rollback's candidate forks the checkpoint it rolls back to, with the fixes applied since and in
force (`carried`: its config predates them, and applying the rollback sets them again).

Also here: `check_change` (the validation the live trainer applies to a change, run before any
arm starts), `nearest_valid` (the closest change the trainer accepts), `noop_edit`.
"""
from __future__ import annotations

import json
import math
import pathlib
import shutil
import statistics
import time
from typing import Any, Callable, Iterable, Protocol

import psutil
import yaml

from agents.domain import BacktestResult, Intervention, InterventionKind, JobStatus
from harness import changes as hc
from swarm.decisions import RETRY_DOUBLINGS, ArmScore, Decision, Pair, Rejected, Rule, Validated, retry_horizon
from swarm.jobs import Jobs
from trainer.run_storage import release, sync_run
from trainer.runlog import HELDOUT_METRICS, read_heartbeat, read_jsonl


# the recipe fields an arm sets for itself (how it evaluates, that it never stops early): a live run
# that adopts an arm's state gets its own values of them back (`adoptable`)
ARM_ONLY = ("recipe.eval_interval", "recipe.eval_size", "recipe.stop_at_heldout")
ADOPTED = "adopt"    # the live run's checkpoint `adopt-<id>`: the arm state an intervention was applied by


def arm_name(iid: str, label: str, arm: str, seed: int) -> str:
    """The folder (under the backtests folder) and job name of one arm."""
    return f"bt-{iid}{label}-{arm}-s{seed}"


def arm_config(base: dict[str, Any], name: str, out_dir: str, ckpt: str, seed: int, step: int,
               horizon: int, eval_size: int, changes: dict[str, Any]) -> dict[str, Any]:
    cfg = {k: v for k, v in base.items() if k not in ("perturbations", "fork_from", "fork_mode", "fork_overrides")}
    # the arm stops after `horizon` steps (`stop_step`) on the run's own lr schedule (`recipe.steps`
    # stays the run's): a schedule over the horizon alone would anneal both arms to their minimum lr.
    # It is scored by its final evaluation alone (periodic ones would fall on steps that are multiples
    # of the interval, inside the arm or on its last step a second time)
    overrides = {**dict(zip(ARM_ONLY, (0, eval_size, None))), **changes}
    return {**cfg, "name": name, "out_dir": out_dir, "seed": seed, "fork_from": ckpt, "fork_mode": "state",
            "fork_overrides": overrides, "stop_step": step + horizon, "checkpoint": {"interval": 0, "keep_last": 1},
            "samples_per_step": 1, "perturbations": []}


def rollback_horizon(horizon: int, start: int, live: int) -> int:
    """The horizon of a backtest whose arms both start from a rollback's checkpoint at step `start`
    while the live run is at step `live`: at least the steps the rollback gives up (live − start),
    at most the longest retry horizon (`swarm.decisions.retry_horizon` after RETRY_DOUBLINGS
    doublings), never less than `horizon`. A rollback asks "had the change been made at `start`,
    would the run be better off by now?"; the live run was diagnosed over those steps, and arms that
    stop sooner replay only the stretch before the problem showed (a learning rate far too high
    drops the loss as fast as a good one over the first few dozen steps, then stalls), so they
    compare a stretch nobody found wrong."""
    if horizon < 1 or start < 0 or live < start:
        raise ValueError(f"horizon={horizon}, start={start}, live={live}: need horizon ≥ 1 and 0 ≤ start ≤ live")
    return max(horizon, min(live - start, retry_horizon(horizon, RETRY_DOUBLINGS)))


def start_over(kind: str, changes: dict[str, Any], tries_without_gain: int, worthless: bool) -> bool:
    """Is a fix tried again from the run's untrained checkpoint (a rollback carrying its change)?
    Yes for a change of the config (harness, recipe, data) already backtested from the live
    weights with a gain too small to tell, in a run whose weights are worth nothing and whose
    untrained checkpoint is kept (`worthless`: agents.operators.worthless_weights — it never learnt,
    or its weights grew far past their untrained size). The weights of such a run may be what keeps
    the change from showing (a policy whose sampling collapsed, saturated units, inflated weights,
    Adam moments sized for a wrong lr): the same change from the live weights again only repeats
    the first look. Both arms then start at that checkpoint (nothing was staked since) and train the
    steps the rollback gives up (`rollback_horizon`)."""
    return (kind in ("harness_edit", "recipe_edit", "data_change") and bool(changes) and tries_without_gain > 0
            and worthless)


def _mean_se(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs or not all(math.isfinite(x) for x in xs):
        return None, None
    m = sum(xs) / len(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None
    return m, se


def arm_score(run_dir: pathlib.Path, metric: str) -> ArmScore:
    """One arm's measurements: the target metric at the end, the held-out format-failure rate
    (truncated + malformed) and answer loss there, and the means (with standard errors) of the training loss and
    pass rate over the second half of its steps. A non-finite loss there leaves the loss unmeasured."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    final = [r for r in rows if metric in r and isinstance(r[metric], (int, float))]
    train = [r for r in rows if "loss" in r]
    half = train[len(train) // 2 :]
    losses = [float(r["loss"]) for r in half if isinstance(r.get("loss"), (int, float)) or r.get("loss") in ("nan", "inf")]
    passes = [float(r["pass_rate"]) for r in half if isinstance(r.get("pass_rate"), (int, float))]
    loss, loss_se = _mean_se(losses)
    pr, pr_se = _mean_se(passes)
    ff = (float(final[-1].get("heldout_truncated", 0.0)) + float(final[-1].get("heldout_malformed", 0.0))) if final else None
    hl = [final[-1].get(k) if final else None for k in ("heldout_loss", "heldout_loss_se")]
    hl = [float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None for x in hl]
    return ArmScore(target=float(final[-1][metric]) if final else None, format_fail=ff, loss=loss, loss_se=loss_se,
                    pass_rate=pr, pass_se=pr_se, heldout_loss=hl[0], heldout_loss_se=hl[1])


def sft_comparable(base: dict[str, Any], changes: dict[str, Any]) -> bool:
    """Both arms train SFT on the same targets, so their training losses compare (the negative
    log-likelihood of the same answers): the run's algorithm is sft and the intervention changes
    neither the algorithm nor the targets and examples the loss is computed on."""
    algo = ((base.get("recipe") or {}).get("algorithm") or "sft")
    return algo == "sft" and not any(k == "recipe.algorithm" or (k.startswith(hc.PREFIX) and not hc.keeps_sft_targets(k))
                                     for k in changes)


def heldout_comparable(base: dict[str, Any], changes: dict[str, Any]) -> bool:
    """Both arms score the likelihood of the same held-out answers in the same way, so their
    held-out answer losses compare: the run learns SFT targets and the intervention changes neither
    the algorithm nor how a question and its answer are rendered (the template, the answer format).
    Training data may differ (a curriculum, a filter, the batch): the held-out set does not. Only
    evals of SFT steps write the loss; a pair of arms without it on both sides is not read."""
    return not any(k == "recipe.algorithm" or k == f"{hc.PREFIX}template" or k.startswith(f"{hc.PREFIX}answer")
                   for k in changes)


def anneals(iv: Intervention, recipe: dict[str, Any], shared: bool | None = None) -> bool:
    """The change lowers the lr in force (`recipe`'s) and both arms go on from one trained state
    (`shared`; by default, unless the change is a rollback: its candidate starts from its own
    checkpoint). Within a backtest's horizon a lower lr lowers the loss whatever it does to the run
    (the noise the larger steps kept in the trained weights settles: the short-horizon bias of lr
    decay), so its arms' losses, training or held-out, say nothing about the run's outcome; the
    target and the format failures still do. From an untrained start no such noise is there to settle."""
    shared = iv.kind != InterventionKind.ROLLBACK if shared is None else shared
    try:
        lr, now = float(iv.changes.get("recipe.lr")), float(recipe.get("lr"))   # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return shared and lr < now


def same_data(changes: dict[str, Any]) -> bool:
    """Both arms train on the same examples (their training pass rates compare)."""
    return not any(hc.changes_data(k) or k == "recipe.batch_size" for k in changes)


def check_change(base: dict[str, Any], recipe: dict[str, Any], harness: dict[str, Any], changes: dict[str, Any]) -> str | None:
    """Why the live trainer would refuse `changes` on a run with this recipe and harness, else None:
    its own check (`trainer.loop` `apply_overrides`): recipe fields re-validated on the whole run
    config, harness fields by `harness.changes`, then the curriculum's start difficulty within the
    task's range."""
    from trainer.config import ConfigError, RunConfig, set_dotted
    from trainer.tasks import make_task

    try:
        cfg = RunConfig.parse({**{k: v for k, v in base.items() if k != "perturbations"}, "recipe": recipe, "harness": harness})
        for k, v in changes.items():
            if k.startswith("recipe."):
                cfg = set_dotted(cfg, k, v)
            elif not k.startswith(hc.PREFIX):
                return f"can only change recipe.* or harness.* fields, not {k!r}"
        task = make_task(cfg.task.name, seed=cfg.seed, **cfg.task.options)
    except (ConfigError, ValueError, TypeError) as e:
        return str(e).replace("invalid config: ", "")
    return hc.check_change(cfg.harness, {k: v for k, v in changes.items() if k.startswith(hc.PREFIX)},
                           task.check_difficulty)


def task_range(base: dict[str, Any]) -> tuple[int, int]:
    """The task's (lowest, highest) difficulty."""
    from trainer.tasks import make_task

    task = base.get("task") or {}
    t = make_task(task.get("name"), seed=int(base.get("seed", 0)), **(task.get("options") or {}))
    return int(t.min_difficulty), int(t.max_difficulty)


def _per_difficulty(base: dict[str, Any], split: str, probes: int, read: Any, task: Any = None) -> dict[int, Any]:
    """`read(examples)` of `probes` generated examples of `split` at each of the task's difficulties
    (at most 16 of them, from the lowest); a difficulty with no question in the split is left out."""
    from trainer.tasks import Split, make_task

    spec = base.get("task") or {}
    t = task or make_task(spec.get("name"), seed=int(base.get("seed", 0)), **(spec.get("options") or {}))
    out: dict[int, Any] = {}
    for d in range(int(t.min_difficulty), min(int(t.max_difficulty), int(t.min_difficulty) + 15) + 1):
        try:
            out[d] = read([t.example(Split(split), i, d) for i in range(probes)])
        except ValueError:    # no question of this split at this difficulty
            continue
    return out


def question_chars(base: dict[str, Any], probes: int = 24) -> dict[int, float]:
    """The task's median training-question length in characters at each of its difficulties."""
    import statistics

    return _per_difficulty(base, "train", probes, lambda exs: float(statistics.median(len(e.question) for e in exs)))


def _alphabet(base: dict[str, Any], probes: int, text: Any) -> str:
    """Every character `text(example)` uses over `probes` training examples at each of the task's
    difficulties (sorted)."""
    return "".join(sorted(set().union(*_per_difficulty(base, "train", probes,
                                                       lambda exs: set("".join(text(e) for e in exs))).values())))


def question_alphabet(base: dict[str, Any], probes: int = 64) -> str:
    """Every character the task's own training questions use, at any of its difficulties (sorted)."""
    return _alphabet(base, probes, lambda e: e.question)


def answer_alphabet(base: dict[str, Any], probes: int = 64) -> str:
    """Every character the task's own training answers (or solutions, where the SFT label is one)
    use, at any of its difficulties (sorted), where the run's model is the built-in one, which
    writes only what it learnt; empty for another model (a pretrained one writes any text)."""
    if (base.get("model") or {}).get("kind", "builtin") != "builtin":
        return ""
    return _alphabet(base, probes, lambda e: e.solution or e.answer)


def answer_chars(base: dict[str, Any]) -> dict[int, dict[int, int]]:
    """How many answers of the held-out set the trainer evaluates (its first `recipe.eval_size`
    held-out examples, at each of the task's difficulties) have each length, where their lengths are
    what a right answer takes: the built-in model writes a token a character, and the task's
    verifier accepts no shorter answer (`Task.answer_is_shortest`). Empty otherwise."""
    import collections

    from trainer.config import Recipe

    from trainer.tasks import make_task

    spec = base.get("task") or {}
    if (base.get("model") or {}).get("kind", "builtin") != "builtin":
        return {}
    t = make_task(spec.get("name"), seed=int(base.get("seed", 0)), **(spec.get("options") or {}))
    if not t.answer_is_shortest:
        return {}
    n = int((base.get("recipe") or {}).get("eval_size") or Recipe.model_fields["eval_size"].default)
    return _per_difficulty(base, "heldout", n, lambda exs: dict(sorted(collections.Counter(len(e.answer) for e in exs).items())),
                           task=t)


def task_facts(base: dict[str, Any], eval_difficulty: int | None) -> dict[str, Any]:
    """The task's own facts the detectors hold a run against (`OperatorContext` fields): its question
    lengths and alphabet, and the lengths of the held-out answers at the difficulty the target is
    scored at (where those are what a right answer takes)."""
    answers = answer_chars(base)
    return {"question_chars": question_chars(base), "question_alphabet": question_alphabet(base),
            "answer_alphabet": answer_alphabet(base),
            "answer_chars": {eval_difficulty: answers[eval_difficulty]} if eval_difficulty in answers else {}}


def nearest_valid(changes: dict[str, Any], lo: int, hi: int) -> dict[str, Any]:
    """The change with its curriculum difficulties clamped to the task's range [lo, hi]."""
    out = dict(changes)
    for k in ("harness.curriculum.start", "harness.curriculum.end"):
        v = out.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            out[k] = min(max(v, lo), hi)
    return out


def noop_edit(changes: dict[str, Any], recipe: dict[str, Any], harness: dict[str, Any],
              live: dict[str, str | None]) -> str | None:
    """Why an edit needs no backtest (the reason, else None): applied to `recipe` and `harness`
    (what the controller knows) it gives the recipe and harness versions the live run already
    reports (`live`: its newest metrics row's `recipe_version` and `harness_version`), in every
    section it touches — e.g. a rollback applied after the edit was proposed restored what it
    wanted. An edit of a section whose live version is unknown is never a no-op."""
    sections = {k.partition(".")[0] for k in changes}
    if not changes or not sections <= {"recipe", "harness"}:
        return None
    from harness.spec import HarnessSpec
    from trainer.config import Recipe, apply_changes

    try:
        new_recipe, new_harness = apply_changes(recipe, harness, changes)
        want = {"recipe_version": Recipe.model_validate(new_recipe).version,
                "harness_version": HarnessSpec.model_validate(new_harness).version}
    except ValueError:
        return None
    keys = [f"{s}_version" for s in sorted(sections)]
    if all(live.get(k) == want[k] for k in keys):
        return "no backtest: the live run already is what this edit makes (" + ", ".join(
            f"{k.replace('_', ' ')} {want[k]}" for k in keys) + ")"
    return None


def leftover_arm(run_dir: pathlib.Path, cfg_path: pathlib.Path) -> psutil.Process | bool | None:
    """An arm a previous controller started (arms outlive a killed controller): its process while
    it still runs here, False when it finished (its files hold the result), None otherwise."""
    for p in psutil.process_iter(["cmdline"]):
        if str(cfg_path) in (p.info.get("cmdline") or []) and arm_running(p):
            return p
    return False if (read_heartbeat(run_dir) or {}).get("state") == "completed" else None


def start_arm(jobs: Jobs, name: str, cfg: dict[str, Any], workdir: pathlib.Path, config_dir: pathlib.Path) -> Any:
    """The arm `name` with job config `cfg`: a leftover a killed controller started (reused, never
    run twice), else a new job; its handle (a job id, a process, or False for a finished leftover)."""
    path = config_dir / f"{name}.yaml"
    left = leftover_arm(workdir / name, path)
    if left is None:
        shutil.rmtree(workdir / name, ignore_errors=True)   # a partial arm's files would mix in
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        left = jobs.start(name, path)
    return left


def wait_arms(jobs: Jobs, handles: Iterable[tuple[Any, pathlib.Path]], timeout_s: float,
              sync: Callable[[pathlib.Path], Any] | None = None) -> None:
    """Until every arm (`start_arm`'s handle, its run folder) ended, `sync` called on each folder per
    pass; those still running after `timeout_s` are stopped."""
    handles = list(handles)

    def done(h: Any) -> bool:
        return jobs.status(h) in JobStatus.terminal() if isinstance(h, str) else not (h and arm_running(h))

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for _, d in handles:
            if sync is not None:
                sync(d)
        if all(done(h) for h, _ in handles):
            return
        time.sleep(0.5)
    for h, _ in handles:
        if isinstance(h, str):
            jobs.stop(h)
        elif h:
            h.kill()


def arm_running(p: psutil.Process) -> bool:
    """Whether an arm's process (a leftover of a killed controller) still runs."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class BacktestRunner(Protocol):
    """What runs a backtest's arms: `run_arms` (the controller's), or a scripted one in tests."""

    def __call__(self, iv: Intervention, *, base_config: dict[str, Any], ckpt: str, step: int, metric: str,
                 horizon: int, seeds: list[int] | tuple[int, ...], eval_size: int, jobs: Jobs, workdir: pathlib.Path,
                 config_dir: pathlib.Path | None = None, candidate_ckpt: str | None = None,
                 candidate_step: int | None = None, label: str = "",
                 carried: dict[str, Any] | None = None) -> tuple[list[Pair], float]: ...


def run_arms(iv: Intervention, *, base_config: dict[str, Any], ckpt: str, step: int, metric: str,
             horizon: int, seeds: list[int] | tuple[int, ...], eval_size: int, jobs: Jobs, workdir: pathlib.Path,
             config_dir: pathlib.Path | None = None, timeout_s: float = 1800.0,
             candidate_ckpt: str | None = None, candidate_step: int | None = None,
             label: str = "", carried: dict[str, Any] | None = None) -> tuple[list[Pair], float]:
    """Run a candidate and a control arm per seed; returns their scores and the arms' worker CPU
    seconds. `config_dir` holds the arms' job configs; the arms' run files go to `workdir`.
    `label` tells the arms of a second look at the same intervention from the first's. `carried`:
    fields applied to the live run since `candidate_ckpt` (a rollback's checkpoint) was written and
    in force now, set in every arm that forks that checkpoint (the candidate; the control too when
    both start there), as applying the rollback sets them again: its config predates them."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_dir = config_dir or workdir
    config_dir.mkdir(parents=True, exist_ok=True)
    handles: dict[tuple[str, int], tuple[Any, pathlib.Path]] = {}   # a job handle, or a leftover arm
    for seed in seeds:
        for arm, changes in (("candidate", iv.changes), ("control", {})):
            name = arm_name(iv.id, label, arm, seed)
            fork, at = (candidate_ckpt, candidate_step) if arm == "candidate" and candidate_ckpt else (ckpt, step)
            if carried and candidate_ckpt and fork == candidate_ckpt:
                changes = {**carried, **changes}
            cfg = arm_config(base_config, name, str(workdir), fork, seed, at or 0, horizon, eval_size, changes)
            handles[(arm, seed)] = (start_arm(jobs, name, cfg, workdir, config_dir), workdir / name)
    wait_arms(jobs, handles.values(), timeout_s, sync=sync_run)
    cpu = sum(float((read_heartbeat(d) or {}).get("cpu_s") or 0.0) for _, d in handles.values())
    pairs = [Pair(seed, arm_score(handles[("candidate", seed)][1], metric), arm_score(handles[("control", seed)][1], metric))
             for seed in seeds]
    for _, d in handles.values():
        release(d)
    return pairs, cpu


def adoptable(res: BacktestResult | None, backtests_dir: pathlib.Path, resume_step: int,
              higher_is_better: bool) -> tuple[pathlib.Path, int] | str:
    """The final checkpoint of the candidate arm a validated change is applied by, and its step
    (else why none): population-based training's exploit. The candidate arm is the run as it
    would have been had the change been made at the arm's fork, trained `horizon` steps further and
    validated against a control that trained the same steps without it; applying the change to the
    live run instead trains those steps again. Adopted only when the arm ended past
    `resume_step`, the step the change would otherwise start from (the live step; a rollback's
    checkpoint step): the live steps the adoption discards are fewer than the arm's, and were
    trained without the change. Of the candidate arms that completed with a checkpoint, the one
    with the best target (the lowest seed on a tie)."""
    if res is None or not res.passed:
        return "not validated by a backtest"
    if not res.candidate_arms:
        return "its backtest recorded no candidate arm to adopt"
    sign = 1.0 if higher_is_better else -1.0
    order = sorted(range(len(res.candidate_arms)), key=lambda i: (-sign * res.candidate[i], i))
    why = []
    for i in order:
        d = backtests_dir / res.candidate_arms[i]
        if (read_heartbeat(d) or {}).get("state") != "completed":
            why.append(f"{d.name} did not complete")
            continue
        best = None
        for m in sorted((d / "checkpoints").glob("*.json")):
            try:
                man = json.loads(m.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if m.with_suffix(".pt").is_file() and isinstance(man.get("step"), int) and (best is None or man["step"] > best[1]):
                best = (m.with_suffix(".pt"), int(man["step"]))
        if best is None:
            why.append(f"{d.name} kept no checkpoint here")
        elif best[1] <= resume_step:
            why.append(f"{d.name} ended at step {best[1]}, not past step {resume_step} where the change would start")
        else:
            return best
    return "; ".join(why) or "no candidate arm"


def rule_for(iv: Intervention, base: dict[str, Any], *, alpha: float, higher_is_better: bool, metric: str,
             eval_size: int, looks: int, look: int, share: float = 1.0, recipe: dict[str, Any] | None = None,
             shared: bool | None = None) -> Rule:
    """The decision rule's settings for this intervention's arms. `recipe`: the recipe in force
    (default the base config's); `shared`: whether both arms go on from one trained state (see
    `anneals`, which judges a change that lowers the lr without the losses)."""
    losses = not anneals(iv, recipe if recipe is not None else (base.get("recipe") or {}), shared)
    return Rule(alpha=alpha, higher_is_better=higher_is_better, eval_size=eval_size,
                target_is_rate=metric in HELDOUT_METRICS,
                losses_compare=losses and sft_comparable(base, iv.changes),
                heldout_compares=losses and heldout_comparable(base, iv.changes),
                same_data=same_data(iv.changes),
                looks=looks, look=look, share=share)


def result(decision: Decision, pairs: list[Pair], *, metric: str, horizon: int, seeds: list[int] | tuple[int, ...],
           cpu_s: float, note: str = "", eval_size: int | None = None, fork_step: int | None = None,
           candidate_arms: list[str] | None = None) -> BacktestResult:
    """The recorded result of a backtest's decision, with the control arms' answer loss where each
    measured it (the post-apply judge compares the live run's with it: `swarm.judging.AnswerLoss`)."""
    worst = 0.0
    sig = decision.signal if isinstance(decision, Validated) else (decision.signals[0] if decision.signals else None)
    missing = [f"{a} seed {p.seed}" for p in pairs for a, s in (("candidate", p.candidate), ("control", p.control))
               if s.target is None]
    notes = [n for n in (note, "; ".join(f"{m} produced no eval" for m in missing), decision.reason) if n]
    level = getattr(decision, "level", 0.0)
    ctl = [(p.control.heldout_loss, p.control.heldout_loss_se) for p in pairs]
    ctl_loss = ctl_se = None          # the control arms' mean answer loss, where every one measured it
    if ctl and all(x is not None and se is not None for x, se in ctl):
        ctl_loss = sum(float(x) for x, _ in ctl) / len(ctl)                      # type: ignore[arg-type]
        ctl_se = math.sqrt(sum(float(se) ** 2 for _, se in ctl)) / len(ctl)      # type: ignore[arg-type]
    return BacktestResult(
        metric=metric, candidate=[p.candidate.target if p.candidate.target is not None else worst for p in pairs],
        control=[p.control.target if p.control.target is not None else worst for p in pairs],
        effect=sig.effect if sig else 0.0, p_value=(1.0 - sig.p_gain) if sig else 1.0,
        test=(f"posterior P(gain > minimum effect) ≥ {level:.3f} on the first conclusive of: "
              + ", ".join(s.name for s in decision.signals) + " (swarm.decisions.decide)") if decision.signals else "no signal",
        horizon_steps=horizon, seeds=list(seeds), passed=isinstance(decision, Validated), note="; ".join(notes),
        signal=sig.name if sig else "none", cpu_s=cpu_s, eval_size=eval_size if metric in HELDOUT_METRICS else None,
        harmed=isinstance(decision, Rejected) and decision.harmed,
        control_heldout_loss=ctl_loss, control_heldout_loss_se=ctl_se,
        fork_step=fork_step, candidate_arms=list(candidate_arms or []))


