"""Rollouts: turn examples into prompts, sample completions, score them with the verifier.

Shared by every algorithm and by held-out evaluation. The harness does the writing and the judging
(`harness.render`: prompts and stop tokens; `harness.reward`: the verifier choice and the reward);
this module runs the policy between the two and summarises the batch. The verifier used for training
rewards is the harness's (`reward.verifier`); held-out evaluation always uses the task's own
verifier, so an exploitable training reward shows up as a gap between the two.
"""
from __future__ import annotations

import dataclasses

import torch

from harness import render
from harness.reward import score, shape_reward, verify_all
from harness.spec import HarnessSpec
from trainer.policy import Policy
from trainer.tasks.base import Example, Task, Verdict, VerifyResult

__all__ = ["Rollout", "prompt_ids", "rollout", "stop_ids", "summarize", "target_ids"]


@dataclasses.dataclass
class Rollout:
    example: Example
    prompt: str
    prompt_ids: list[int]
    completion: str
    completion_ids: list[int]
    truncated: bool
    result: VerifyResult
    reward: float


def prompt_ids(policy: Policy, harness: HarnessSpec, ex: Example) -> tuple[str, list[int]]:
    """(prompt text, token ids) of `ex` under the harness, in the policy's tokens."""
    return render.prompt(policy.tok, harness, ex.question)


def stop_ids(policy: Policy, harness: HarnessSpec) -> set[int]:
    return render.stop_ids(policy.tok, harness)


def target_ids(policy: Policy, harness: HarnessSpec, completion_text: str) -> list[int]:
    return render.target_ids(policy.tok, harness, completion_text)


def rollout(policy: Policy, task: Task, harness: HarnessSpec, examples: list[Example], group: int,
            generator: torch.Generator | None, greedy: bool = False, for_training: bool = True) -> list[Rollout]:
    """Sample `group` completions per example (examples in order, each repeated `group` times)."""
    prompts = [prompt_ids(policy, harness, ex) for ex in examples for _ in range(group)]
    s = harness.sampling
    comps, trunc = policy.generate([p for _, p in prompts], s.max_new_tokens,
                                   temperature=0.0 if greedy else s.temperature, top_p=s.top_p,
                                   stop_ids=stop_ids(policy, harness), generator=generator)
    exs = [examples[k // group] for k in range(len(prompts))]
    texts = [policy.tok.decode(c) for c in comps]
    results = verify_all(task, harness, exs, texts, trunc)
    out = []
    for (ptxt, pids), cids, tr, ex, text, res in zip(prompts, comps, trunc, exs, texts, results):
        res, reward = shape_reward(task, harness, ex, res, text, for_training)
        out.append(Rollout(ex, ptxt, pids, text, cids, tr, res, reward))
    return out


def summarize(rollouts: list[Rollout]) -> dict[str, float]:
    n = max(1, len(rollouts))
    rewards = torch.tensor([r.reward for r in rollouts] or [0.0])
    return {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()) if len(rollouts) > 1 else 0.0,
        "pass_rate": sum(r.result.verdict == Verdict.CORRECT for r in rollouts) / n,
        "malformed_rate": sum(r.result.verdict == Verdict.MALFORMED for r in rollouts) / n,
        "truncation_rate": sum(r.truncated for r in rollouts) / n,
        "response_len": sum(len(r.completion_ids) for r in rollouts) / n,
    }
