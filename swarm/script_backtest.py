"""Backtests for a goal that runs the user's own script (`run.entrypoint`): does a change beat doing
nothing, from the same checkpoint of the script's run, on the same data?

    pairs, cpu_s, eval_n = run_script_arms(iv, argv=ep.argv(), cwd=ep.cwd, live_run_dir=…, checkpoint=…,
                                           step=120, metric="heldout_acc", horizon=60, seeds=[0, 1], workdir=…)
    decision = decide(pairs, script_rule(iv, "sft", eval_size=eval_n or 200, …))   # swarm/decisions.py

The arms are forks of the script (`trainer.steer.fork`), each run by the steering relauncher
(`python -m trainer.steer.relaunch --max-crashes 0`) in a run folder of its own
(`.swarm/backtests/bt-<id>-<arm>-s<seed>`, where the controller's CPU meter reads its heartbeat) with
an output folder inside it. They resume from a copy of the live checkpoint, so the live run's files
are only read, and a checkpoint the live Trainer rotates away meanwhile is still there. Per seed:

- the control keeps what the live run has: the script's arguments, every restart change
  acknowledged so far (as flags, as the relauncher passes them) and the hot settings in force
  (`settings.json` overrides, applied again by the callback);
- the candidate adds the intervention's change: its restart settings as flags, its hot settings as
  overrides (a flag would not reach the lr: the scheduler state in the checkpoint overwrites it).

A rollback's candidate starts from the checkpoint it rolls back to (`candidate_checkpoint`, e.g. the
untrained `init`), the control from the live one; when the steps since that checkpoint gained
nothing, the controller passes it as both (`swarm.script_run`), so the arms compare the settings
from the same weights instead of a fresh start against a run hundreds of steps on; they then train
at least the steps the rollback gives up (`swarm.backtest.rollback_horizon`).
Both arms keep the script's `--max_steps` (so the lr schedule is the run's own), train `horizon` steps
past the step they start at, with the seed as `--seed` (the same data order for both), then evaluate
once and stop (`$SWARMLAB_STOP_AT_STEP`). Each arm is scored by `swarm.backtest.arm_score` and the pairs are
compared by `swarm.decisions.decide`, as the built-in backtest does; the rule's noise model takes
the script's own held-out size (`eval_examples` on its eval rows).
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

from agents.domain import Intervention
from swarm.backtest import arm_running, arm_score, heldout_comparable, leftover_arm
from swarm.decisions import ArmScore, Pair, Rule
from trainer.runlog import HELDOUT_METRICS, iter_jsonl, read_heartbeat, read_jsonl
from trainer.steer.fork import STOP_AT_ENV, fork_argv, seed_fork
from trainer.steer.relaunch import restart_changes
from trainer.steer.settings import as_settings, read_declared

# declared settings that change the examples or the targets each step trains on: with one of them
# in the change, the arms' training losses (SFT) and pass rates do not compare, only the target does
CHANGES_DATA = ("per_device_train_batch_size", "gradient_accumulation_steps", "seed", "max_length",
                "max_prompt_length", "num_generations")
PREFIX = "recipe."


def split_change(declared: Mapping[str, Any], fields: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hot, restart): a change as the run declares its settings. An undeclared name raises
    ValueError (the caller checked the change first)."""
    known = as_settings(declared.get("settings", [])) if declared else {}
    hot: dict[str, Any] = {}
    restart: dict[str, Any] = {}
    for k, v in fields.items():
        if k not in known:
            raise ValueError(f"{k}: the script run declares no such setting")
        (hot if known[k].apply == "hot" else restart)[k] = v
    return hot, restart


def fork_checkpoint(checkpoint: str | os.PathLike, into: pathlib.Path) -> pathlib.Path:
    """A copy of the live Trainer checkpoint folder under `into` (made once), for the arms to read."""
    src = pathlib.Path(checkpoint)
    dst = into / src.name
    if not (dst / "trainer_state.json").is_file():
        if not (src / "trainer_state.json").is_file():
            raise FileNotFoundError(f"{src}: not a Trainer checkpoint (no trainer_state.json)")
        shutil.rmtree(dst, ignore_errors=True)
        tmp = into / f".{src.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        tmp.rename(dst)
    return dst


def score(run_dir: pathlib.Path, metric: str) -> ArmScore:
    """`swarm.backtest.arm_score` of an arm, with no held-out format-failure rate when the script
    logs neither truncated nor malformed answers (a plain Trainer's eval has neither: 0 would be a
    measurement it never made)."""
    s = arm_score(run_dir, metric)
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if metric in r]
    if rows and not {"heldout_truncated", "heldout_malformed"} & set(rows[-1]):
        s = dataclasses.replace(s, format_fail=None)
    return s


def _final_eval_size(run_dir: pathlib.Path, metric: str) -> int | None:
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if metric in r]
    n = rows[-1].get("eval_examples") if rows else None
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def run_script_arms(iv: Intervention, *, argv: Sequence[str], cwd: str | os.PathLike | None, live_run_dir: pathlib.Path,
                    checkpoint: str | os.PathLike, step: int, metric: str, horizon: int, seeds: Sequence[int],
                    workdir: pathlib.Path, log_dir: pathlib.Path | None = None, timeout_s: float = 1800.0,
                    label: str = "", candidate_checkpoint: str | os.PathLike | None = None,
                    candidate_step: int | None = None) -> tuple[list[Pair], float, int | None]:
    """Run a candidate and a control arm per seed from `checkpoint` (the live run's, at `step`; the
    candidate from `candidate_checkpoint` at `candidate_step` when given: a rollback's); returns
    their scores, the arms' worker CPU seconds and the smallest held-out size they report
    (None: none reported). `argv` is the script's command line (`Entrypoint.argv()`), run in `cwd`.
    An arm already finished or still running for the same intervention (a controller restarted)
    is reused, not run again."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_dir = log_dir or workdir
    log_dir.mkdir(parents=True, exist_ok=True)
    live = read_declared(live_run_dir) or {}
    live_hot = dict(live.get("overrides") or {})
    live_restart = restart_changes(iter_jsonl(live_run_dir / "command_log.jsonl"))
    hot, restart = split_change(live, {k.removeprefix(PREFIX): v for k, v in iv.changes.items()})
    if (candidate_checkpoint is None) != (candidate_step is None):
        raise ValueError(f"candidate_checkpoint={candidate_checkpoint!r} and candidate_step={candidate_step!r}: give both or neither")
    fork = fork_checkpoint(checkpoint, workdir / f"fork-{iv.id}")
    starts = {"control": (fork, int(step)),
              "candidate": (fork_checkpoint(candidate_checkpoint, workdir / f"fork-{iv.id}"), int(candidate_step))
              if candidate_checkpoint is not None else (fork, int(step))}
    procs: dict[tuple[str, int], tuple[Any, pathlib.Path]] = {}
    for seed in seeds:
        for arm, (h, r) in (("candidate", (hot, restart)), ("control", ({}, {}))):
            src, at = starts[arm]
            name = f"bt-{iv.id}{label}-{arm}-s{seed}"
            arm_dir = (workdir / name).resolve()
            left = leftover_arm(arm_dir, arm_dir)   # the relauncher's --run-dir names the arm's folder
            if left is None:
                shutil.rmtree(arm_dir, ignore_errors=True)   # a partial arm's files would mix in
                seed_fork(arm_dir, {**live_hot, **h})
                cmd = fork_argv(argv, flags={**live_restart, **r}, checkpoint=src.resolve(),
                                output_dir=arm_dir / "out", seed=seed)
                env = {**os.environ, STOP_AT_ENV: str(at + int(horizon))}
                with open(log_dir / f"{name}.log", "ab") as log:
                    left = subprocess.Popen([sys.executable, "-m", "trainer.steer.relaunch", "--run-dir", str(arm_dir),
                                             "--max-crashes", "0", "--", *cmd], cwd=cwd, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
            procs[(arm, seed)] = (left, arm_dir)

    def alive(p: Any) -> bool:
        if isinstance(p, subprocess.Popen):
            return p.poll() is None
        return bool(p) and arm_running(p)

    deadline = time.time() + timeout_s
    while any(alive(p) for p, _ in procs.values()):
        if time.time() > deadline:
            for p, _ in procs.values():
                if alive(p):
                    p.terminate()       # the relauncher passes it on to the script
            for p, _ in procs.values():
                if isinstance(p, subprocess.Popen):
                    try:
                        p.wait(10)
                    except subprocess.TimeoutExpired:
                        p.kill()
            break
        time.sleep(0.5)
    cpu = sum(float((read_heartbeat(d) or {}).get("cpu_s") or 0.0) for _, d in procs.values())
    pairs = [Pair(seed, score(procs[("candidate", seed)][1], metric), score(procs[("control", seed)][1], metric))
             for seed in seeds]
    sizes = [n for _, d in procs.values() if (n := _final_eval_size(d, metric)) is not None]
    return pairs, cpu, min(sizes) if sizes else None


def script_rule(iv: Intervention, algorithm: str | None, *, alpha: float, higher_is_better: bool, metric: str,
                eval_size: int, looks: int, look: int, share: float = 1.0) -> Rule:
    """The decision rule for a script run's arms (`swarm.backtest.rule_for` for this project's
    trainer): the arms' training losses compare when the run is SFT (its metrics rows say
    `algorithm: sft`) and the change moves neither the data nor the targets."""
    names = {k.removeprefix(PREFIX) for k in iv.changes}
    same_data = not names & set(CHANGES_DATA)
    return Rule(alpha=alpha, higher_is_better=higher_is_better, eval_size=eval_size,
                target_is_rate=metric in HELDOUT_METRICS,
                losses_compare=algorithm == "sft" and same_data,
                heldout_compares=algorithm in ("sft", "distill") and heldout_comparable({}, iv.changes),
                same_data=same_data, looks=looks, look=look, share=share)
