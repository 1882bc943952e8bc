"""Forking a steered run: the script run again in a fresh run folder and output folder, from one of
the run's Trainer checkpoints, with changes, for a fixed number of steps. The swarm's backtest arms
for a script run are such forks (`swarm.script_backtest`).

    argv = fork_argv(script_argv, flags={"max_grad_norm": 0.5}, checkpoint="out/checkpoint-120",
                     output_dir="arm/out", seed=0)
    seed_fork(arm_run_dir, hot={"learning_rate": 5e-4})
    env = {STOP_AT_ENV: "170", "SWARMLAB_RUN_DIR": arm_run_dir}   # then run argv (the relauncher does)

How each part reaches the script, by the same conventions a live run's changes use:
- restart settings are flags (`--NAME VALUE`, the last of a repeated flag wins, as the relauncher
  appends them), then `--output_dir`, `--save_strategy no` (a fork writes no checkpoint), `--seed`
  and `--resume_from_checkpoint`;
- hot settings go in the fork's `settings.json` as `overrides`: SwarmCallback applies them when
  training begins, after the Trainer has loaded the checkpoint's optimizer and scheduler. A flag
  would not do for them: the scheduler state in the checkpoint holds the lr the run had, and
  `--learning_rate` is overwritten by it;
- the stop: `$SWARMLAB_STOP_AT_STEP` has the callback evaluate once at that step and stop. The
  script's own `--max_steps` is kept, so the lr schedule of the fork is the run's own.

The checkpoint is only read. The script must take its run folder from `$SWARMLAB_RUN_DIR` (as
`steer(trainer)` does without a `run_dir`): one that names its own folder would write the fork's
files into the live run's.
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Mapping, Sequence

from trainer.steer.relaunch import launch_argv
from trainer.steer.settings import SETTINGS_FILE

STOP_AT_ENV = "SWARMLAB_STOP_AT_STEP"


def fork_argv(argv: Sequence[str], *, flags: Mapping[str, Any], checkpoint: str | os.PathLike,
              output_dir: str | os.PathLike, seed: int) -> list[str]:
    """The script's command line for a fork: its own argv, the restart settings as flags, then the
    fork's own output folder, no checkpoints, its seed and the checkpoint it resumes from."""
    out = launch_argv(argv, flags, None)
    return out + ["--output_dir", str(output_dir), "--save_strategy", "no", "--seed", str(int(seed)),
                  "--resume_from_checkpoint", str(checkpoint)]


def seed_fork(run_dir: str | os.PathLike, hot: Mapping[str, Any]) -> None:
    """Start a fork's run folder: its `settings.json` holds the hot overrides the callback applies at
    the start and says `fork` (the callback keeps that mark when it rewrites the file, and saves no
    untrained `init` of its own: a fork resumes from the run's checkpoint)."""
    d = pathlib.Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / SETTINGS_FILE).write_text(json.dumps({"version": 1, "fork": True, "overrides": dict(hot)}, default=str))
