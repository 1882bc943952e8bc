"""Per-token log-probs of a batch under the policy, through the fused Triton kernels on CUDA or
their torch references elsewhere (`kernels`; chosen once per run, logged in the start event)."""
from __future__ import annotations

import torch

import kernels
from trainer.policy import Batch, Policy

select_backend = kernels.select_backend


def batch_logprobs(policy: Policy, batch: Batch, backend: str = "torch",
                   chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T-1) log-prob of each next token, its distribution's entropy, and the completion mask.
    The Triton path goes from hidden states to log-probs in token chunks, never holding the
    (tokens × vocab) logits."""
    h, targets, mask = policy.score_inputs(batch)  # (B, T-1, D), (B, T-1), (B, T-1)
    W = policy.lm_head_weight()
    logp, ent = kernels.fused_linear_logprobs(h, W.to(h.dtype), targets, backend=backend, chunk_size=chunk_size)
    return logp, ent, mask
