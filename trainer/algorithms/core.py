"""Advantage estimators, policy losses and loss aggregation, in registries so new ones plug in.

    @register_advantage("my_adv")
    def my_adv(rewards: Tensor (P, G)) -> Tensor (P, G): ...

    @register_loss("my_loss")
    def my_loss(logp, old_logp, ref_logp, adv, mask, recipe) -> (per_token_loss (B, T), stats)

GRPO (Shao et al., 2024): for each prompt, G completions are sampled; a completion's advantage is
its reward minus the group mean, divided by the group std (+eps). The surrogate per token is the
PPO clipped objective with ratio r = exp(logp - old_logp):
    L_t = -min(r·A, clip(r, 1-ε, 1+ε)·A) + β·KL_t,   KL_t = exp(ref-logp) - (ref-logp) - 1  (k3)
aggregated over completion tokens ("token_mean": sum over all tokens / number of tokens, as in
DAPO/Dr.GRPO; "seq_mean_token_mean": the original per-sequence mean).
"""
from __future__ import annotations

from typing import Callable

import torch

from kernels.reference import token_logprobs as token_logprobs_torch  # noqa: F401  (the torch log-prob reference)

ADVANTAGES: dict[str, Callable] = {}
LOSSES: dict[str, Callable] = {}


def register_advantage(name: str):
    def deco(fn):
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} registered twice")
        ADVANTAGES[name] = fn
        return fn
    return deco


def register_loss(name: str):
    def deco(fn):
        if name in LOSSES:
            raise ValueError(f"loss {name!r} registered twice")
        LOSSES[name] = fn
        return fn
    return deco


def get_advantage(name: str) -> Callable:
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {', '.join(sorted(ADVANTAGES))}")
    return ADVANTAGES[name]


def get_loss(name: str) -> Callable:
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; known: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


@register_advantage("grpo")
def grpo_advantage(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(P, G) rewards → (P, G) group-normalised advantages (unbiased std, as in GRPO)."""
    mean = rewards.mean(-1, keepdim=True)
    std = rewards.std(-1, keepdim=True, unbiased=True) if rewards.shape[-1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + eps)


@register_advantage("dr_grpo")
def dr_grpo_advantage(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO: centre by the group mean, no std scaling (removes the difficulty bias)."""
    return rewards - rewards.mean(-1, keepdim=True)


@register_advantage("rloo")
def rloo_advantage(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: reward minus the mean of the other G-1 rewards."""
    G = rewards.shape[-1]
    if G < 2:
        return torch.zeros_like(rewards)
    return (rewards - (rewards.sum(-1, keepdim=True) - rewards) / (G - 1))


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, world: int = 1,
              tokens: float | None = None, rows: float | None = None) -> torch.Tensor:
    """(B, T) per-token loss and mask → scalar.

    Data-parallel (`world` ranks whose gradients are averaged): `tokens` and `rows` are the global
    batch's masked tokens and rows, and each rank's sum is scaled by `world` / the global count, so
    the mean over ranks is the aggregate over the global batch (normalising by the rank's own count
    weighs the tokens of a short shard more, and a "token_sum" would come out `world` times small)."""
    if mode == "token_mean":
        n = mask.sum() if tokens is None else torch.tensor(tokens / world)
        return (per_token * mask).sum() / n.clamp_min(1.0 / world)
    if mode == "token_sum":
        return (per_token * mask).sum() * world
    if mode == "seq_mean_token_mean":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
        return per_seq.mean() if rows is None else per_seq.sum() * world / max(rows, 1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}")


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π || π_ref): exp(ref-logp) - (ref-logp) - 1 ≥ 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


@register_loss("grpo_clip")
def grpo_clip_loss(logp, old_logp, ref_logp, adv, mask, clip_eps: float, kl_coef: float):
    """Per-token clipped surrogate (+ β·k3 KL). `adv` is per token (B, T)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    stats = {"clip_frac": (((ratio - 1.0).abs() > clip_eps).float() * mask).sum() / mask.sum().clamp_min(1.0)}
    if ref_logp is not None and kl_coef > 0:
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + kl_coef * kl
        stats["kl"] = (kl * mask).sum() / mask.sum().clamp_min(1.0)
    return per_token, stats


@register_loss("reinforce")
def reinforce_loss(logp, old_logp, ref_logp, adv, mask, clip_eps: float, kl_coef: float):
    """Plain policy gradient: -A·logp (+ β·k3 KL); ignores the clip."""
    per_token = -adv * logp
    stats = {}
    if ref_logp is not None and kl_coef > 0:
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + kl_coef * kl
        stats["kl"] = (kl * mask).sum() / mask.sum().clamp_min(1.0)
    return per_token, stats
