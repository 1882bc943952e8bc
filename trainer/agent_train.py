"""Train a tool-using policy in an agent environment: an SFT warm-up on generated demonstrations,
then multi-turn GRPO over whole trajectories (`trainer.algorithms.agent_grpo`).

    .venv/bin/python -m trainer.agent_train --env lookup --out runs --name lookup-1
    .venv/bin/python -m trainer.agent_train --env calc --max-seq-len 384 --sft-steps 600
    .venv/bin/python -m trainer.agent_train --env lookup --critic --fault tool_syntax.kind=json \
        --max-seq-len 384 --max-new-tokens 64 --grpo-steps 10

Why a warm-up: an untrained policy never writes a well-formed tool call, so every trajectory of a
group earns 0 and GRPO has no signal. A few hundred SFT steps on the environment's expert
demonstrations (`env.demo`, written in the harness's call syntax and run through the real
environment, so the demonstration's observations are the tool's) give a policy that succeeds
sometimes; GRPO then raises its held-out success.

One stage at a time, top to bottom:

    warm-up:  for step in 1..sft.steps:  demos = demonstrations of the next train episodes
                                          loss  = -log p(policy tokens of each demo row)
    GRPO:     for step in 1..grpo.steps: for each of `prompts` train episodes, G sampled trajectories
                                          A     = one group-normalised advantage per trajectory
                                          loss  = per-trajectory mean of the clipped surrogate
                                                  over the policy's tokens (tool output masked)
    eval:     greedy held-out success (`heldout_acc`) before, after the warm-up, every
              `eval_every` GRPO steps and at the end

With `--critic` (`critic.enabled`) the harness co-evolves with the weights (docs/agent-training.md;
the critic rounds and distillation are `trainer.agent_coevolve`):

    critic:   for round in 1..critic.rounds:  the HarnessCritic (harness/critic.py) reads greedy
                                               train trajectories and proposes typed edits; each
                                               candidate and the current harness run the same
                                               held-out validation episodes with the same weights;
                                               the best edit with a significant paired gain is kept
    GRPO:     critic.grpo_steps more steps under the improved harness
    distill:  SFT on the improved harness's verified successes, written for the starting harness
              and verified there; held-out success under both harnesses before and after

`harness_fault` (`--fault PATH=VALUE`) edits the starting harness but not the warm-up
demonstrations' harness: a fault for the critic to find. With `harness_fault_step` (`--fault-step N`)
the run starts on the healthy harness and the fault arrives when the run reaches step N (a
`harness_change` event; the critic is not told). `critic.every` (`--critic-every N`) makes critic
rounds periodic: before every N-th GRPO step, so a fault that arrives mid-run meets a critic after it.

The run writes the trainer's run format (`trainer.runlog.RunLog`) under OUT/NAME: metrics.jsonl
(`algorithm` "eval", "sft" every `log_every` steps or "grpo" every step; held-out fields on eval
rows; `drift` = calls that could not be merged into their trajectory's row; `update_ratio`, `weight_norm`
and `weight_growth` = how far the step moved the weights relative to their size, their size, and that
size over the untrained model's, as `trainer.loop` logs them; `segment` = resumes and rollbacks so
far; a last `final` row), samples.jsonl (trajectories as text), events.jsonl (start or
resume, checkpoint, harness_change, end), heartbeat.json, config.yaml (this config, resolved, its
harness faults left out) and
harnesses/<version>.yaml (each harness the run used). Progress is printed one line per logged step.

Checkpoints, resume and fork (`trainer.agent_state`): every `checkpoint.interval` steps of the
warm-up and the GRPO stages, at the end and on a `stop`, the whole state (weights, optimiser, the
stage and the step within it, the harness as a full spec, RNGs, data cursor, the critic's verdicts)
goes into RUN_DIR/checkpoints through `trainer.checkpoint.CheckpointManager`. A fresh run (not a
resume, not a fork) with `checkpoint.interval` set also saves its untrained state, after the
untrained eval, as `init` (`trainer.runlog.INIT_CHECKPOINT`): a named checkpoint, so `keep_last`
never prunes it, and a `rollback` to it puts the weights, optimiser and position back at step 0 of
the warm-up, where a fix that starts over begins (`agents.operators.worthless_weights`). A run
started again goes on from its newest checkpoint that verifies to the same end; `fork_from` starts
a new run from another run's checkpoint, with `fork_overrides`. The control inbox
(`trainer.agent_control`, on `trainer.control.CommandInbox`) is read at the end of each of those
steps: set_recipe, set_fields, set_harness, checkpoint, rollback, pause, resume, stop.

Deviations: the learning-rate schedule is constant per stage after a linear warm-up; no
data-parallel workers; the optimiser step is its own few lines (`optimise`), not
`trainer.loop.Trainer`'s, which is tied to its data-parallel workers; the policy's calls are batched
across the episodes of a step (`trainer.agent_batching`). Critic rounds and distillation take no
checkpoint and read no command: a run stopped inside them goes on from the checkpoint before them
and runs them again.
"""
from __future__ import annotations

import argparse
import copy
import math
import pathlib
import sys
import time
from typing import Any, Callable, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.agent import AgentHarness, apply_edit, check_edit
from trainer import agent_state
from trainer.agent_batching import BatchedGenerator
from trainer.agent_coevolve import CriticStages, DemoGenerator
from trainer.agent_control import AgentControl, Rewound, StopRun
from trainer.agent_rollout import Trajectory, demonstration, run_episode, summarize
from trainer.agent_state import field_key
from trainer.algorithms.agent_grpo import (Call, Row, agent_grpo_loss, episodes_from_records, group_advantages,
                                           merge_calls, row_logprobs, sft_rows_loss, trajectory_calls)
from trainer.checkpoint import CheckpointManager
from trainer.config import ConfigError, ModelConfig, parse_config
from trainer.envs import make_env
from trainer.envs.base import AgentEnv
from trainer.logprobs import select_backend
from trainer.loop import StepMeter
from trainer.policy import Policy
from trainer.runlog import INIT_CHECKPOINT, RunLog, atomic_write_text
from trainer.tasks.base import Example, Split


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# A compact system prompt for the small built-in model: every token of it is read on every turn.
SHORT_SYSTEM = "{tools}"


class SFTStage(_Strict):
    steps: int = Field(300, ge=0, description="SFT steps on demonstrations (0 = no warm-up)")
    batch_size: int = Field(16, ge=1, le=4096, description="demonstrations per step")
    lr: float = Field(3e-3, gt=0.0, le=10.0, description="AdamW learning rate")
    warmup_steps: int = Field(10, ge=0, description="steps of linear learning-rate warm-up")


class GRPOStage(_Strict):
    steps: int = Field(30, ge=0, description="GRPO steps (0 = none)")
    prompts: int = Field(4, ge=1, le=1024, description="train episodes per step")
    group_size: int = Field(8, ge=2, le=256, description="trajectories sampled per episode")
    lr: float = Field(5e-4, gt=0.0, le=10.0, description="AdamW learning rate")
    warmup_steps: int = Field(0, ge=0, description="steps of linear learning-rate warm-up")
    temperature: float = Field(1.0, gt=0.0, le=5.0, description="sampling temperature of training trajectories "
                               "(the harness's sampling.temperature)")
    clip_eps: float = Field(0.2, gt=0.0, le=1.0, description="importance-ratio clip")
    kl_coef: float = Field(0.0, ge=0.0, description="weight of the k3 KL to the policy the warm-up produced")
    loss: str = Field("grpo_clip", description="policy loss (trainer/algorithms/core.py LOSSES)")
    advantage: str = Field("grpo", description="advantage estimator (trainer/algorithms/core.py ADVANTAGES)")
    updates_per_batch: int = Field(1, ge=1, le=16, description="optimiser steps per batch of trajectories")


class CriticStage(_Strict):
    """The HarnessCritic between GRPO and distillation (`--critic`): see the module docstring."""

    enabled: bool = Field(False, description="run the critic, GRPO under the improved harness and distillation")
    rounds: int = Field(2, ge=1, le=16, description="critic rounds; each keeps at most one edit, and a round that "
                        "keeps none ends them")
    read: int = Field(64, ge=1, le=100_000, description="train episodes rolled out (greedy) for the critic to read "
                      "each round")
    candidates: int = Field(3, ge=1, le=16, description="the critic's first edits measured per round")
    val_size: int = Field(64, ge=8, le=100_000, description="held-out episodes each candidate is measured on "
                          "(the ones after the eval episodes: disjoint from them)")
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="one-sided level of the paired test for a round's "
                         "candidates together (each is tested at alpha / candidates)")
    grpo_steps: int = Field(10, ge=0, description="GRPO steps under the improved harness once an edit is kept")
    distill_steps: int = Field(300, ge=0, description="SFT steps of distillation (0 = none); it stops after "
                               "3 steps that gave no row (nothing the starting harness can verify)")
    distill_batch: int = Field(16, ge=1, le=4096, description="fresh train episodes sampled under the improved "
                               "harness per distillation step; their verified successes are the step's rows")
    distill_lr: float = Field(3e-3, gt=0.0, le=10.0, description="AdamW learning rate of distillation")
    distill_warmup_steps: int = Field(10, ge=0, description="steps of linear learning-rate warm-up of distillation")
    every: int = Field(0, ge=0, le=100_000, description="periodic critic: critic rounds before every N-th GRPO step "
                       "of a stage (before its steps 0, N, 2N, ...), besides the pass after GRPO; 0 = only that pass")


class CheckpointStage(_Strict):
    interval: int = Field(0, ge=0, description="save a checkpoint every N steps of the warm-up and GRPO stages, and "
                          "at the end (0 = off: only on a `checkpoint` or `stop` command)")
    keep_last: int = Field(3, ge=1, description="retention: the newest N periodic checkpoints are kept")


class AgentTrainConfig(_Strict):
    name: str = Field("agent", pattern=r"^[A-Za-z0-9_.-]+$", description="the run's folder under out_dir")
    out_dir: str = Field("runs", description="the run writes to OUT_DIR/NAME")
    seed: int = Field(0, description="seed of the model init, the environment and sampling")
    env: str = Field("lookup", description="agent environment (trainer/envs): lookup, calc, code")
    env_options: dict[str, Any] = Field(default_factory=dict, description="the environment's options")
    difficulty: int = Field(1, ge=1, description="episode difficulty (train and held-out)")
    model: ModelConfig = Field(
        default_factory=lambda: ModelConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=256, learned_positions=True),
        description="the policy (built-in by default: small, with learned absolute positions, since the fixed "
                    "system prompt puts the question's key at a fixed place)")
    system_prompt: str | None = Field(SHORT_SYSTEM, description="the harness's system prompt; None = the default "
                                      "AgentHarness one")
    max_new_tokens: int | None = Field(None, ge=1, le=4096, description="tokens per policy turn; None = the "
                                       "longest expert turn over 32 train episodes + 8")
    max_turns: int | None = Field(None, ge=1, le=64, description="policy turns per episode; None = the most expert "
                                  "turns over 32 train episodes + 1")
    sft: SFTStage = Field(default_factory=SFTStage, description="the warm-up on demonstrations")
    grpo: GRPOStage = Field(default_factory=GRPOStage, description="multi-turn GRPO")
    demo_calls: Literal["named", "positional"] = Field(
        "named", description="how the warm-up demonstrations write tool calls: named (get(key=\"abc\")) or "
                             "positional (get(\"abc\")), as agent data from another harness may; positional calls "
                             "need a lenient parser, so the starting harness's parser is lenient then")
    harness_edits: dict[str, Any] = Field(default_factory=dict, description="typed harness edits (dotted path: "
                                          "value) applied to the healthy harness: the warm-up demonstrations' and "
                                          "the starting harness's (the goal's own harness settings, not a fault)")
    harness_fault: dict[str, Any] = Field(default_factory=dict, description="typed harness edits (dotted path: "
                                          "value, as `harness.agent.apply_edit`) applied to the run's starting "
                                          "harness but not to the warm-up demonstrations' (a fault for the critic)")
    harness_fault_step: int | None = Field(None, ge=0, description="None: harness_fault is in the starting harness; "
                                           "N: the run starts on the healthy harness and harness_fault is applied "
                                           "when the run reaches step N (the run's step counter, warm-up steps "
                                           "included: at least sft.steps), at the start of the GRPO step or critic "
                                           "round that begins there; the critic is never told")
    critic: CriticStage = Field(default_factory=CriticStage, description="the HarnessCritic and distillation")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, gt=0.0, description="clip the global gradient norm to this")
    eval_size: int = Field(64, ge=1, le=100_000, description="held-out episodes per eval (greedy)")
    eval_every: int = Field(10, ge=0, description="held-out eval every N GRPO steps (0 = only at stage ends)")
    log_every: int = Field(10, ge=1, description="SFT: print and write a metrics row every N steps")
    samples_per_step: int = Field(2, ge=0, le=1024, description="trajectories written to samples.jsonl per GRPO step")
    threads: int = Field(0, ge=0, le=256, description="torch intra-op threads (0 = torch default)")
    checkpoint: CheckpointStage = Field(default_factory=CheckpointStage, description="periodic checkpoints")
    fork_from: str | None = Field(None, description="start from this checkpoint file (.pt) of another agent run, "
                                  "verified by its hash (when this run has no checkpoint of its own that verifies)")
    fork_overrides: dict[str, Any] = Field(default_factory=dict, description="dotted fields set after the fork: "
                                           "harness.<path> edits and the recipe fields read at every step "
                                           "(trainer/agent_state.py RECIPE_FIELDS)")

    @model_validator(mode="after")
    def _check(self) -> "AgentTrainConfig":
        if self.model.kind == "builtin" and self.max_new_tokens is not None and \
                self.max_new_tokens >= self.model.max_seq_len:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be below model.max_seq_len="
                             f"{self.model.max_seq_len}")
        if self.harness_fault_step is not None:
            if not self.harness_fault:
                raise ValueError(f"harness_fault_step={self.harness_fault_step} needs a harness_fault to apply")
            if self.harness_fault_step < self.sft.steps:
                raise ValueError(f"harness_fault_step={self.harness_fault_step} is inside the warm-up "
                                 f"(sft.steps={self.sft.steps}): a harness change happens after it")
        bad = [why for why in map(field_key, self.fork_overrides) if why is not None]
        if bad:
            raise ValueError(f"fork_overrides: {bad[0]}")
        if self.fork_overrides and not self.fork_from:
            raise ValueError(f"fork_overrides={self.fork_overrides!r} needs fork_from")
        return self

    @property
    def run_dir(self) -> pathlib.Path:
        return pathlib.Path(self.out_dir) / self.name

    @classmethod
    def parse(cls, data: Any) -> "AgentTrainConfig":
        return parse_config(cls, data)


class AgentTrainer(CriticStages):
    def __init__(self, cfg: AgentTrainConfig, printer: Callable[[str], None] | None = print) -> None:
        self.cfg, self.printer = cfg, printer
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        try:
            self.env: AgentEnv = make_env(cfg.env, seed=cfg.seed, **cfg.env_options)
            self.env.check_difficulty(cfg.difficulty)
            self.policy = Policy.build(cfg.model, seed=cfg.seed)
            fields: dict[str, Any] = {"max_turns": cfg.max_turns or 64,
                                      "sampling": {"temperature": cfg.grpo.temperature, "top_p": 1.0,
                                                   "max_new_tokens": cfg.max_new_tokens or 1}}
            if cfg.system_prompt is not None:
                fields["system_prompt"] = cfg.system_prompt
            if cfg.demo_calls == "positional":
                fields["tool_syntax"] = {"lenient": True}
            self.harness: AgentHarness = self.env.default_harness(**fields)
            if cfg.max_new_tokens is None or cfg.max_turns is None:   # what the expert needs, and a little more
                exs = [self.env.episode(Split.TRAIN, i, cfg.difficulty) for i in range(32)]
                turns = [self.demo_turns(ex, self.harness) for ex in exs]
                if cfg.max_new_tokens is None:
                    longest = max(len(self.policy.tok.encode(x)) for t in turns for x in t)
                    fields["sampling"]["max_new_tokens"] = longest + 8
                if cfg.max_turns is None:
                    fields["max_turns"] = max(len(t) for t in turns) + 1
                self.harness = self.env.default_harness(**fields)
        except (ValueError, TypeError) as e:
            raise ConfigError(str(e)) from None
        for path, value in cfg.harness_edits.items():
            why = check_edit(self.harness, path, value)
            if why is not None:
                raise ConfigError(f"harness_edits: {why}")
            self.harness = apply_edit(self.harness, path, value)
        self.demo_harness = self.harness          # the warm-up demonstrations' harness: without the fault
        faulty = self.harness
        for path, value in cfg.harness_fault.items():
            why = check_edit(faulty, path, value)
            if why is not None:
                raise ConfigError(f"harness_fault: {why}")
            faulty = apply_edit(faulty, path, value)
        self.change_pending = cfg.harness_fault_step is not None   # the fault comes at a step, not at the start
        if not self.change_pending:
            self.harness = faulty
        self.start_harness = self.harness         # the run's starting harness, fault included (a change replaces it)
        self.edits: list[dict[str, Any]] = []     # the critic's verdicts, kept and rejected
        device = next(self.policy.model.parameters()).device
        self.backend, _ = select_backend("torch" if cfg.model.kernels == "auto" and device.type == "cpu"
                                         else cfg.model.kernels, device)
        self.params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.meter = StepMeter(self.params)   # built before any checkpoint loads (its start is the untrained size)
        self.opt = torch.optim.AdamW(self.params, lr=cfg.sft.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
        self.rng = torch.Generator().manual_seed(cfg.seed * 1000 + 29)
        self.step = 0
        self.cursor = 0
        self.stage, self.stage_step, self.segment = "warmup", 0, 0   # where the run is (a checkpoint holds it)
        self.progress: dict[str, Any] = {}        # the co-evolution's numbers so far
        self.heldout_start = 0.0
        self.ref_policy: Policy | None = None
        self.log: RunLog | None = None
        self.ckpt: CheckpointManager | None = None
        self.control: AgentControl | None = None
        self.until: int | None = None             # tests: end as if killed at this step (`run(until=…)`)
        self.history: list[dict[str, Any]] = []
        self._check_demonstrations()

    def _check_demonstrations(self, n: int = 32) -> None:
        """The expert must succeed under the harness (else the warm-up teaches failures): a turn
        cut by max_new_tokens or a prompt past the context budget is a config error."""
        for t in self.demonstrations([self.env.episode(Split.TRAIN, i, self.cfg.difficulty) for i in range(n)]):
            if t.reward == 1.0 and not t.tool_errors:
                continue
            why = f"the {self.cfg.env!r} expert fails under this harness (episode {t.uid}: {t.end.value})"
            if t.end.value == "context_full":
                raise ConfigError(f"{why}: its transcript does not fit the policy's {self.policy._max_len()} tokens "
                                  f"with max_new_tokens={self.demo_harness.sampling.max_new_tokens}; raise "
                                  "model.max_seq_len or shorten system_prompt")
            if t.end.value == "max_turns":
                raise ConfigError(f"{why}: raise max_turns={self.demo_harness.max_turns}")
            longest = max((len(s.completion_ids) for s in t.steps), default=0)
            raise ConfigError(f"{why}, {t.tool_errors} tool errors: its turns are cut at max_new_tokens="
                              f"{self.demo_harness.sampling.max_new_tokens} (they take up to {longest} tokens); raise it")

    # ---- data ---------------------------------------------------------------------------
    def next_train(self, n: int) -> list[Example]:
        out = [self.env.episode(Split.TRAIN, self.cursor + i, self.cfg.difficulty) for i in range(n)]
        self.cursor += n
        return out

    def demonstrations(self, examples: list[Example]) -> list[Trajectory]:
        """Expert trajectories with the policy's tokenizer, run through the environment under the
        demonstrations' harness (the starting harness without `harness_fault`)."""
        h = self.demo_harness
        return [run_episode(DemoGenerator(self.policy.tok, self.demo_turns(ex, h), self.policy._max_len()),
                            self.env, ex, h) for ex in examples]

    def demo_turns(self, example: Example, harness: AgentHarness) -> list[str]:
        """The expert's turns for `example`, its calls written as `demo_calls` says."""
        if self.cfg.demo_calls == "named":
            return demonstration(self.env, example, harness)
        calls, answer = self.env.demo(example)
        return [harness.tool_syntax.render(n, a, positional=True) for n, a in calls] + [harness.answer.render(answer)]

    # ---- optimisation -------------------------------------------------------------------
    def optimise(self, loss: torch.Tensor, lr: float) -> dict[str, float]:
        """Backward, clip, step; a non-finite loss or gradient norm skips the step."""
        self.opt.zero_grad(set_to_none=False)
        v = float(loss.detach())
        if not math.isfinite(v):
            return {"loss": v, "grad_norm": float("nan"), "skipped": 1.0}
        loss.backward()
        gn = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip))
        if not math.isfinite(gn):
            self.opt.zero_grad(set_to_none=False)
            return {"loss": v, "grad_norm": gn, "skipped": 1.0}
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.meter.before()
        self.opt.step()
        return {"loss": v, "grad_norm": gn, "skipped": 0.0, **self.meter.after()}

    @staticmethod
    def _lr(base: float, warmup: int, i: int) -> float:
        return base * min(1.0, (i + 1) / warmup) if warmup else base

    def sft_step(self, i: int) -> dict[str, float]:
        demos = self.demonstrations(self.next_train(self.cfg.sft.batch_size))
        # a demonstration that does not fit the harness (a longer episode than the start-up check saw) is left out
        trajs = [t for t in demos if t.reward == 1.0 and not t.tool_errors]
        if not trajs:
            return {"loss": 0.0, "grad_norm": 0.0, "skipped": 1.0, "demo_kept": 0.0}
        out = self.sft_on(trajs, self._lr(self.cfg.sft.lr, self.cfg.sft.warmup_steps, i))
        return {**out, "demo_kept": len(trajs) / len(demos)}

    def sft_on(self, trajs: list[Trajectory], lr: float) -> dict[str, float]:
        """One SFT step on the policy tokens of `trajs` (their exact ids, merged per trajectory)."""
        rows: list[Row] = []
        drift = 0
        for k, t in enumerate(trajs):
            r, d = merge_calls(trajectory_calls(t), k)
            rows += r
            drift += d
        loss, stats = sft_rows_loss(self.policy, rows, self.backend)
        return {**stats, **self.optimise(loss, lr), "drift": float(drift)}

    def apply_harness_change(self) -> bool:
        """A mid-run fault (`harness_fault_step`): once the run has reached that step, apply
        `harness_fault` to the current harness (edits the critic kept stay, a fault edit that changes
        nothing there is skipped) and to the starting harness, which the changed one replaces. An
        `harness_change` event records it; the metrics rows' `harness_version` shows it. Returns
        whether the harness changed now."""
        cfg = self.cfg
        if not self.change_pending or cfg.harness_fault_step is None or self.step < cfg.harness_fault_step:
            return False
        self.change_pending = False
        before = self.harness.version
        for path, value in cfg.harness_fault.items():
            if check_edit(self.harness, path, value) is None:
                self.harness = apply_edit(self.harness, path, value)
            if check_edit(self.start_harness, path, value) is None:
                self.start_harness = apply_edit(self.start_harness, path, value)
        # what a live config change leaves to see: the harness before and after (stored under
        # harnesses/), never the fault it came from (a controller's operators read the events)
        if self.log:
            agent_state.store_harness(self)
            self.log.event("harness_change", self.step, harness_before=before, harness_version=self.harness.version)
        if self.printer:
            self.printer(f"[harness {self.step:4d}] changed {before} -> {self.harness.version}")
        return self.harness.version != before

    def grpo_step(self, i: int) -> dict[str, float]:
        """Sample a group of trajectories for each of the next train episodes, then `update`
        (a harness change due at this step is applied first)."""
        self.apply_harness_change()
        g = self.cfg.grpo
        t0 = time.perf_counter()
        examples = self.next_train(g.prompts)
        trajs = self.rollout([ex for ex in examples for _ in range(g.group_size)])
        t_gen = time.perf_counter() - t0
        self._samples(trajs)
        groups = [[(trajectory_calls(t), t.reward) for t in trajs[k * g.group_size:(k + 1) * g.group_size]]
                  for k in range(len(examples))]
        stats = {**summarize(trajs), "t_generate": t_gen,
                 "success": sum(t.result.verdict.value == "correct" for t in trajs) / len(trajs)}
        return {**stats, **self.update(groups, i)}

    def update(self, groups: list[list[tuple[list[Call], float]]], i: int = 0) -> dict[str, float]:
        """One GRPO update from groups of trajectories, each trajectory its policy calls (exact ids)
        and its reward; the trajectories of a group share their episode prompt."""
        g = self.cfg.grpo
        flat = [t for grp in groups for t in grp]
        adv = [a for grp in group_advantages([[r for _, r in grp] for grp in groups], g.advantage) for a in grp]
        rows: list[Row] = []
        drift = 0
        for k, (calls, _) in enumerate(flat):
            r, d = merge_calls(calls, k)
            rows += r
            drift += d
        stats = {"drift": float(drift), "trajectories": float(len(flat)),
                 "informative_groups": sum(len({r for _, r in grp}) > 1 for grp in groups) / max(1, len(groups))}
        if not any(a != 0 for a in adv):   # every group all-right or all-wrong: nothing to learn from
            return {**stats, "loss": 0.0, "grad_norm": 0.0, "skipped": 1.0}
        turns = [len(calls) for calls, _ in flat]
        # the behaviour policy's log-probs, before this batch's first update (one update: ratio 1)
        old = row_logprobs(self.policy, rows, self.backend) if g.updates_per_batch > 1 else None
        out: dict[str, float] = {}
        for _ in range(g.updates_per_batch):
            loss, lstats = agent_grpo_loss(
                self.policy, rows, adv, turns, loss=g.loss, clip_eps=g.clip_eps, kl_coef=g.kl_coef,
                turn_discount=self.harness.turn_discount, ref_policy=self.ref_policy, old_logp=old,
                backend=self.backend)
            out = {**stats, **lstats, **self.optimise(loss, self._lr(g.lr, g.warmup_steps, i))}
        return out

    def update_from_records(self, records: list[dict[str, Any]], i: int = 0) -> dict[str, float]:
        """One GRPO update from a policy endpoint's log records (`trainer.endpoint.read_log`): the
        episodes that have a reward, grouped by their first prompt's ids (one episode prompt each)."""
        eps = [e for e in episodes_from_records(records).values() if e["reward"] is not None]
        by_prompt: dict[tuple[int, ...], list[tuple[list[Call], float]]] = {}
        for e in eps:
            by_prompt.setdefault(e["prompt"], []).append((e["calls"], e["reward"]))
        groups = [grp for grp in by_prompt.values() if len(grp) > 1]
        stats = {"episodes": float(len(eps)), "groups": float(len(groups)),
                 "reward_mean": sum(e["reward"] for e in eps) / max(1, len(eps))}
        if not groups:
            return {**stats, "loss": 0.0, "grad_norm": 0.0, "skipped": 1.0}
        return {**stats, **self.update(groups, i)}

    def rollout(self, examples: list[Example], greedy: bool = False, policy: Policy | None = None) -> list[Trajectory]:
        """Episodes of `examples` under the current harness, the calls of the policy (or of
        `policy`, e.g. distillation's teacher) batched across them (`trainer.agent_batching`)."""
        return BatchedGenerator(policy or self.policy, generator=self.rng).run(self.env, examples, self.harness,
                                                                              greedy=greedy)

    def _samples(self, trajs: list[Trajectory]) -> None:
        if not self.log:
            return
        tok = self.policy.tok
        tools = [spec.model_dump(mode="json") for spec in self.env.tool_specs()]   # the environment's own specs
        for t in trajs[: self.cfg.samples_per_step]:
            self.log.samples.write({"step": self.step, "transcript": tok.decode(t.ids), **t.record(), "env_tools": tools,
                                    "policy_text": tok.decode([x for x, m in zip(t.ids, t.mask) if m]),
                                    "turns": len(t.steps)})

    # ---- evaluation ---------------------------------------------------------------------
    def rollout_under(self, harness: AgentHarness, examples: list[Example], greedy: bool = False) -> list[Trajectory]:
        """`rollout` under another harness (the current one is restored after)."""
        current, self.harness = self.harness, harness
        try:
            return self.rollout(examples, greedy=greedy)
        finally:
            self.harness = current

    @torch.no_grad()
    def evaluate(self, n: int | None = None, harness: AgentHarness | None = None) -> dict[str, float]:
        """Greedy held-out success and the rollout summary, as `heldout_*` fields (under `harness`,
        by default the current one), and `eval_cpu_s`: this process's CPU seconds spent on it (what
        a cost accounting that leaves evaluations out subtracts)."""
        c0 = time.process_time()
        n = n or self.cfg.eval_size
        exs = [self.env.episode(Split.HELDOUT, i, self.cfg.difficulty) for i in range(n)]
        trajs = self.rollout_under(harness or self.harness, exs, greedy=True)
        s = summarize(trajs)
        acc = sum(t.result.verdict.value == "correct" for t in trajs) / len(trajs)
        return {"heldout_acc": acc, "heldout_tool_calls": s["tool_calls_mean"], "heldout_turns": s["turns_mean"],
                "heldout_answered": s["end_answered"], "eval_cpu_s": round(time.process_time() - c0, 4)}

    # ---- the run ------------------------------------------------------------------------
    def write_row(self, row: dict[str, Any]) -> None:
        """A metrics row: kept in `history`, written to metrics.jsonl with a heartbeat, printed."""
        self.history.append(row)
        if self.log:
            self.log.metrics.write(row)
            self.log.heartbeat(self.step, "running")
        if self.printer:
            keys = ("loss", "success", "reward_mean", "turns_mean", "tool_calls_mean", "drift", "heldout_acc", "kept",
                    "val_before", "val_after", "distill_rows")
            shown = " ".join(f"{k}={row[k]:.3g}" for k in keys if k in row)
            self.printer(f"[{row['algorithm']} {self.step:4d}] {shown} ({row['step_time']:.2f}s)")

    def start(self) -> None:
        """Open the run's log, checkpoints and control inbox, write the resolved config, and start:
        from the run's newest checkpoint that verifies, else from `fork_from`, else from scratch
        with the untrained policy's held-out eval (`trainer.agent_state.begin`), then, with
        periodic checkpoints on, the untrained state as the `init` checkpoint."""
        cfg = self.cfg
        self.t_start = time.time()
        self.log = RunLog(cfg.run_dir)
        self.ckpt = CheckpointManager(cfg.run_dir / "checkpoints", cfg.checkpoint.keep_last)
        self.control = AgentControl(self)
        how = agent_state.begin(self)
        # what trains: a resume or a fork takes the recipe fields of its checkpoint (and overrides)
        shown = self.cfg.model_dump(mode="json", exclude={"harness_fault", "harness_fault_step"})   # faults: never shown
        atomic_write_text(cfg.run_dir / "config.yaml", yaml.safe_dump(shown, sort_keys=False))
        agent_state.store_harness(self)
        if how == "resume":
            return
        self.log.event("start", self.step, params=sum(p.numel() for p in self.params), env=cfg.env,
                       harness_version=self.harness.version, kernels=self.backend,
                       **({"fork_from": cfg.fork_from, "stage": self.stage} if how == "fork" else {}))
        if how == "start":
            ev = self.evaluate()
            self.heldout_start = ev["heldout_acc"]
            self.write_row({**self.row_base("eval"), "step_time": 0.0, **ev})
            if cfg.checkpoint.interval:   # the untrained start: a fix that starts over rolls back to it
                agent_state.save(self, INIT_CHECKPOINT)

    def enter(self, stage: str) -> int:
        """Begin `stage`, or go on in it (a resume, a rollback): the index of its next step."""
        if self.stage != stage:
            self.stage, self.stage_step = stage, 0
        return self.stage_step

    def step_end(self, done: int) -> None:
        """After an optimiser step (`done` steps of the stage done): a checkpoint when due and the
        control inbox (`trainer.agent_control`)."""
        self.stage_step = done
        if self.control:
            self.control.step_end()

    def row_base(self, algorithm: str) -> dict[str, Any]:
        """The fields every metrics row starts with (`segment` counts resumes and rollbacks)."""
        return {"step": self.step, "segment": self.segment, "time": time.time(), "algorithm": algorithm,
                "harness_version": self.harness.version, "difficulty": self.cfg.difficulty}

    def warm_up(self) -> float:
        """The SFT stage; returns held-out success after it."""
        steps = self.cfg.sft.steps
        for i in range(self.enter("warmup"), steps):
            t0 = time.perf_counter()
            stats = self.sft_step(i)
            self.step += 1
            last = i == steps - 1
            if (i + 1) % self.cfg.log_every == 0 or last:
                row = {**self.row_base("sft"), **stats, "lr": self._lr(self.cfg.sft.lr, self.cfg.sft.warmup_steps, i)}
                if last:
                    row.update(self.evaluate())
                row["step_time"] = time.perf_counter() - t0
                self.write_row(row)
            self.step_end(i + 1)
        self.heldout_warm = self.last_heldout()
        return self.heldout_warm

    @staticmethod
    def critic_due(i: int, every: int) -> bool:
        """The periodic critic's schedule: rounds before GRPO steps 0, every, 2*every, ... of a
        stage; never when `every` is 0."""
        return every > 0 and i % every == 0

    def critic_rounds(self) -> int:
        """Up to `critic.rounds` critic rounds; a round that keeps nothing ends them. Returns the
        number of edits kept."""
        kept = 0
        for _ in range(self.cfg.critic.rounds):
            if self.critic_round() is None:
                break
            kept += 1
        return kept

    def reinforce(self, steps: int | None = None, periodic: bool = False, stage: str = "grpo") -> float:
        """The GRPO stage (`grpo.steps`, or `steps`); with `periodic` and `critic.every`, critic
        rounds before every `critic.every`-th step. Returns held-out success after it."""
        steps = self.cfg.grpo.steps if steps is None else steps
        first = self.enter(stage)
        if self.cfg.grpo.kl_coef > 0 and (first == 0 or self.ref_policy is None):
            # the KL reference is the policy the warm-up produced (a resume restores it)
            self.ref_policy = Policy(self.policy.cfg, self.policy.tok, copy.deepcopy(self.policy.model))
            self.ref_policy.model.requires_grad_(False)
        for g in self.opt.param_groups:
            g["lr"] = self.cfg.grpo.lr
        for i in range(first, steps):
            if periodic and self.critic_due(i, self.cfg.critic.every):
                self.critic_rounds()
            t0 = time.perf_counter()
            stats = self.grpo_step(i)
            self.step += 1
            row = {**self.row_base("grpo"), **stats, "lr": self._lr(self.cfg.grpo.lr, self.cfg.grpo.warmup_steps, i)}
            if (self.cfg.eval_every and (i + 1) % self.cfg.eval_every == 0) or i == steps - 1:
                row.update(self.evaluate())
            row["step_time"] = time.perf_counter() - t0
            self.write_row(row)
            self.step_end(i + 1)
        return self.last_heldout()

    def coevolve(self) -> dict[str, Any]:
        """Warm-up and GRPO under the starting harness; critic rounds; GRPO under the improved
        harness; distillation; held-out success under both harnesses at each point. Goes on from
        the stage the run is in (`stage`: a resume or a rollback)."""
        c = self.cfg.critic
        out = self.progress
        if self.stage == "warmup":
            self.warm_up()
        if self.stage in ("warmup", "grpo"):
            out["heldout_acc_before_critic"] = self.reinforce(periodic=True)
            self.critic_rounds()
            out.update({"edits_kept": [e for e in self.edits if e["kept"]],
                        "edits_rejected": [e for e in self.edits if not e["kept"]],
                        "start_harness": self.start_harness.version, "harness": self.harness.version})
            if self.harness.version == self.start_harness.version:
                self.stage = "done"
                return out
            ev = self.evaluate()
            self.write_row({**self.row_base("eval"), "step_time": 0.0, **ev})
            out["heldout_acc_after_edit"] = ev["heldout_acc"]
            self.stage, self.stage_step = "grpo_critic", 0
        if self.stage == "grpo_critic":
            out["heldout_acc_after_grpo"] = (self.reinforce(c.grpo_steps, periodic=True, stage="grpo_critic")
                                             if c.grpo_steps else out["heldout_acc_after_edit"])
            self.stage = "done"
            if c.distill_steps:
                out["start_harness_acc_before_distill"] = self.evaluate(harness=self.start_harness)["heldout_acc"]
                out.update(self.distill())
                out["start_harness_acc_after_distill"] = self.evaluate(harness=self.start_harness)["heldout_acc"]
                ev = self.evaluate()
                out["heldout_acc_after_distill"] = ev["heldout_acc"]
                self.write_row({**self.row_base("eval"), "step_time": 0.0, **ev,
                                "start_harness_acc": out["start_harness_acc_after_distill"]})
        return out

    def last_heldout(self) -> float:
        return next((r["heldout_acc"] for r in reversed(self.history) if "heldout_acc" in r), 0.0)

    def finish(self, extra: dict[str, Any] | None = None, status: str = "completed") -> dict[str, Any]:
        """Close the run; the summary (with `extra`, the co-evolution's numbers) is the `end` event."""
        assert self.log is not None, "start() opens the log"
        final = self.last_heldout()
        summary = {"status": status, "steps": self.step, "run_dir": str(self.cfg.run_dir),
                   "heldout_acc_start": self.heldout_start, "heldout_acc_warm": getattr(self, "heldout_warm", final),
                   "heldout_acc": final, "wall_s": time.time() - self.t_start, **(extra or {})}
        self.log.metrics.write({**self.row_base("eval"), "final": True, "heldout_acc": final})
        self.log.event("end", self.step, **{k: v for k, v in summary.items() if k != "steps"})
        self.log.heartbeat(self.step, status)
        self.close()
        return summary

    def close(self) -> None:
        if self.control:
            self.control.close()
        if self.log:
            self.log.close()

    def train(self) -> dict[str, Any]:
        """Warm-up and GRPO, from the stage the run is in."""
        if self.stage == "warmup":
            self.warm_up()
        if self.stage in ("warmup", "grpo"):
            self.reinforce()
        self.stage = "done"
        return {}

    def run(self, until: int | None = None) -> dict[str, Any]:
        """Untrained eval, warm-up, GRPO (and with `critic.enabled` the critic, GRPO under the
        improved harness and distillation); returns held-out success at each point and the wall
        time. Starts where `start` says (a resume goes on to the same end); a `stop` command ends
        it early with a checkpoint. `until` (tests) ends it at that step as if the process were
        killed there: no checkpoint, no `end` event."""
        self.until = until
        self.start()
        status = "completed"
        while True:
            try:
                extra = self.coevolve() if self.cfg.critic.enabled else self.train()
                break
            except Rewound:
                continue
            except StopRun as e:
                if e.status == "interrupted":
                    self.close()
                    return {"status": e.status, "steps": self.step, "run_dir": str(self.cfg.run_dir)}
                status, extra = e.status, dict(self.progress)
                break
        if self.cfg.checkpoint.interval or status != "completed":
            agent_state.save(self)
        return self.finish(extra, status)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.agent_train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="YAML of AgentTrainConfig fields (flags below override it)")
    ap.add_argument("--env", help="lookup, calc or code")
    ap.add_argument("--difficulty", type=int)
    ap.add_argument("--sft-steps", type=int)
    ap.add_argument("--grpo-steps", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--max-seq-len", type=int, help="the built-in model's longest prompt + completion")
    ap.add_argument("--max-new-tokens", type=int, help="tokens per policy turn")
    ap.add_argument("--demo-calls", choices=["named", "positional"], help="how the warm-up demonstrations write calls")
    ap.add_argument("--out", dest="out_dir")
    ap.add_argument("--name")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--critic", action="store_true", help="after GRPO: the HarnessCritic, GRPO under the improved "
                    "harness, distillation (critic.* in the config)")
    ap.add_argument("--fault", action="append", default=[], metavar="PATH=VALUE",
                    help="a harness fault in the starting harness, e.g. tool_syntax.kind=json (VALUE is YAML; repeatable)")
    ap.add_argument("--fault-step", type=int, help="apply the --fault edits when the run reaches this step "
                    "(warm-up steps included) instead of in the starting harness")
    ap.add_argument("--critic-every", type=int, help="critic rounds before every N-th GRPO step (critic.every)")
    a = ap.parse_args(argv)
    try:
        data: dict[str, Any] = {}
        if a.config:
            from trainer.config import load_yaml

            data = load_yaml(a.config, "config file") or {}
        for k in ("env", "difficulty", "seed", "out_dir", "name", "threads", "max_new_tokens", "demo_calls"):
            if getattr(a, k) is not None:
                data[k] = getattr(a, k)
        if a.sft_steps is not None:
            data.setdefault("sft", {})["steps"] = a.sft_steps
        if a.grpo_steps is not None:
            data.setdefault("grpo", {})["steps"] = a.grpo_steps
        if a.max_seq_len is not None:
            data["model"] = {**AgentTrainConfig.model_fields["model"].default_factory().model_dump(),
                             **data.get("model", {}), "max_seq_len": a.max_seq_len}
        if a.critic:
            data.setdefault("critic", {})["enabled"] = True
        if a.critic_every is not None:
            data.setdefault("critic", {})["every"] = a.critic_every
        if a.fault_step is not None:
            data["harness_fault_step"] = a.fault_step
        for f in a.fault:
            path, eq, value = f.partition("=")
            if not eq or not path:
                raise ConfigError(f"--fault {f!r}: write PATH=VALUE, e.g. max_turns=2")
            data.setdefault("harness_fault", {})[path.strip()] = yaml.safe_load(value)
        cfg = AgentTrainConfig.parse(data)
        summary = AgentTrainer(cfg).run()
    except (ConfigError, yaml.YAMLError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if not cfg.critic.enabled:
        print(f"held-out success: {summary['heldout_acc_start']:.3f} untrained, {summary['heldout_acc_warm']:.3f} "
              f"after the warm-up, {summary['heldout_acc']:.3f} after GRPO ({summary['wall_s']:.0f} s); "
              f"{summary['run_dir']}")
        return 0
    print(f"held-out success under the starting harness: {summary['heldout_acc_start']:.3f} untrained, "
          f"{summary['heldout_acc_warm']:.3f} after the warm-up, {summary['heldout_acc_before_critic']:.3f} after GRPO")
    for e in summary["edits_kept"] + summary["edits_rejected"]:
        print(f"  {'kept' if e['kept'] else 'rejected'} {e['path']}={e['value']!r}: {e['verdict']}")
    if "heldout_acc_after_edit" not in summary:
        print(f"no harness edit kept ({summary['wall_s']:.0f} s); {summary['run_dir']}")
        return 0
    line = (f"under the improved harness: {summary['heldout_acc_after_edit']:.3f} after the edit, "
            f"{summary['heldout_acc_after_grpo']:.3f} after GRPO")
    if "start_harness_acc_after_distill" in summary:
        line += (f", {summary['heldout_acc_after_distill']:.3f} after distillation; under the starting harness: "
                 f"{summary['start_harness_acc_before_distill']:.3f} before distillation, "
                 f"{summary['start_harness_acc_after_distill']:.3f} after ({int(summary['distill_rows'])} rows)")
    print(f"{line} ({summary['wall_s']:.0f} s); {summary['run_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
