"""Backtests for a goal that drives the agent trainer (`run.agent`): does a change of the agent
harness (or of a recipe field the trainer reads every step) beat doing nothing, from the same
checkpoint of the live run, on the same episodes?

    pairs, cpu_s = run_agent_arms(iv, live=job_config, checkpoint=".../checkpoints/bt-<id>.pt",
                                  stage="grpo", stage_step=12, horizon=4, seeds=[0], eval_size=64, jobs=…, workdir=…)
    decision = decide(pairs, agent_rule(alpha=0.2, eval_size=64, looks=1, look=1))   # swarm/decisions.py

Per seed, two arms run `python -m trainer.agent_train` on a config of their own (`arm_config`): the
live run's job config with `fork_from` the checkpoint the live trainer saved on the backtest's
`checkpoint` command (the whole state: weights, optimiser, stage and step in it, harness, data
cursor, sampling stream); a rollback's candidate forks the checkpoint it rolls back to instead
(`candidate_from`), as `swarm.backtest`'s does. The candidate sets the intervention's changes as
`fork_overrides` (the dotted `harness.*` / recipe fields the inbox's set_fields takes, validated by
the trainer as a command would be); the control has none. The seed is the environment's (`AgentTrainConfig.seed`
seeds the episodes; the weights and the sampling stream come from the checkpoint), so a second seed
is a second draw of episodes for both arms. Each arm trains `horizon` steps of the stage it forked in
(`grpo.steps` — or `sft.steps` in the warm-up — set to the fork's step in the stage + horizon), then
evaluates greedy held-out success on `eval_size` episodes (the stage's last step always evaluates)
and ends. No arm takes checkpoints. Scores are `swarm.backtest.arm_score` (the agent trainer logs no
held-out format-failure rate, so that signal is left unmeasured) and the decision is the same
`swarm.decisions.decide` as every backtest's.
"""
from __future__ import annotations

import copy
import dataclasses
import pathlib
from typing import Any, Mapping, Sequence

from agents.domain import Intervention
from swarm.backtest import arm_score, start_arm, wait_arms
from swarm.decisions import ArmScore, Pair, Rule
from trainer.runlog import HELDOUT_METRICS, read_heartbeat, read_jsonl

METRIC = "heldout_acc"


def fork_position(run_dir: pathlib.Path, checkpoint: str) -> tuple[str, int]:
    """(stage, step in the stage) of the live run's checkpoint `checkpoint`, from the `checkpoint`
    event the trainer logged when it saved it. A ValueError when the run logged none."""
    for e in reversed(read_jsonl(run_dir / "events.jsonl")):
        if e.get("event") == "checkpoint" and e.get("name") == checkpoint:
            return str(e["stage"]), int(e["stage_step"])
    raise ValueError(f"checkpoint {checkpoint!r}: the live run logged no such checkpoint event")


def arm_config(live: Mapping[str, Any], *, name: str, out_dir: str, checkpoint: str, stage: str, stage_step: int,
               horizon: int, seed: int, eval_size: int, changes: Mapping[str, Any]) -> dict[str, Any]:
    """One arm's AgentTrainConfig (a dict): the live job's config forked from `checkpoint`, training
    `horizon` steps of `stage` past `stage_step`, with `changes` as fork_overrides."""
    if horizon < 1:
        raise ValueError(f"horizon={horizon}: an arm trains at least one step")
    cfg = copy.deepcopy(dict(live))
    cfg.update(name=name, out_dir=out_dir, seed=seed, fork_from=str(checkpoint), fork_overrides=dict(changes),
               eval_size=eval_size, eval_every=0, checkpoint={"interval": 0, "keep_last": 1})
    sft, grpo = dict(cfg.get("sft") or {}), dict(cfg.get("grpo") or {})
    if stage == "warmup":
        sft["steps"], grpo["steps"] = stage_step + horizon, 0
    elif stage == "grpo":
        grpo["steps"] = stage_step + horizon
    else:
        raise ValueError(f"the live run is in stage {stage!r}: arms fork from its warm-up or GRPO stage only")
    cfg["sft"], cfg["grpo"] = sft, grpo
    if cfg.get("harness_fault_step") is not None and cfg["harness_fault_step"] < sft["steps"]:
        cfg["harness_fault_step"] = sft["steps"]    # a pending mid-run fault stays after the (shorter) warm-up
    return cfg


def score(run_dir: pathlib.Path) -> ArmScore:
    """The arm's held-out success at its end (no format-failure rate: the agent trainer logs none)."""
    return dataclasses.replace(arm_score(run_dir, METRIC), format_fail=None)


def run_agent_arms(iv: Intervention, *, live: Mapping[str, Any], checkpoint: str, stage: str, stage_step: int,
                   horizon: int, seeds: Sequence[int], eval_size: int, jobs: Any, workdir: pathlib.Path,
                   config_dir: pathlib.Path, candidate_from: tuple[str, str, int] | None = None,
                   timeout_s: float = 1800.0, label: str = "") -> tuple[list[Pair], float]:
    """A candidate and a control arm per seed (all at once, as jobs of `jobs`); their scores and the
    arms' worker CPU seconds (their heartbeats'). `candidate_from` (checkpoint, stage, stage_step):
    where the candidate forks instead (a rollback's checkpoint). An arm that does not end within
    `timeout_s` is stopped and scores what it wrote."""
    forks = {"control": (checkpoint, stage, stage_step), "candidate": candidate_from or (checkpoint, stage, stage_step)}
    for path, _, _ in forks.values():
        if not pathlib.Path(path).is_file():
            raise FileNotFoundError(f"{path}: the live run's checkpoint is not there")
    workdir.mkdir(parents=True, exist_ok=True)
    config_dir.mkdir(parents=True, exist_ok=True)
    handles: dict[tuple[str, int], tuple[Any, pathlib.Path]] = {}   # a job handle, or a leftover arm
    for seed in seeds:
        for arm, changes in (("candidate", iv.changes), ("control", {})):
            name = f"bt-{iv.id}{label}-{arm}-s{seed}"
            path, at_stage, at = forks[arm]
            cfg = arm_config(live, name=name, out_dir=str(workdir), checkpoint=path, stage=at_stage, stage_step=at,
                             horizon=horizon, seed=seed, eval_size=eval_size, changes=changes)
            handles[(arm, seed)] = (start_arm(jobs, name, cfg, workdir, config_dir), workdir / name)
    wait_arms(jobs, handles.values(), timeout_s)
    cpu = sum(float((read_heartbeat(d) or {}).get("cpu_s") or 0.0) for _, d in handles.values())
    pairs = [Pair(seed, score(handles[("candidate", seed)][1]), score(handles[("control", seed)][1])) for seed in seeds]
    return pairs, cpu


def agent_rule(*, alpha: float, eval_size: int, looks: int, look: int, share: float = 1.0) -> Rule:
    """The decision rule for agent arms: held-out success only (a harness change alters what the
    trajectories are, so the arms' training statistics do not compare)."""
    return Rule(alpha=alpha, higher_is_better=True, eval_size=eval_size, target_is_rate=METRIC in HELDOUT_METRICS,
                losses_compare=False, same_data=False, looks=looks, look=look, share=share)
