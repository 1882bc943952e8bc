"""Per-token log-probs of a batch under the policy, through the fused Triton kernels on CUDA or
their torch references elsewhere (`kernels`; chosen once per run, logged in the start event)."""
from __future__ import annotations

import torch

import kernels
from trainer.policy import Batch, Policy

select_backend = kernels.select_backend


def batch_logprobs(policy: Policy, batch: Batch, backend: str = "torch",
                   chunk_size: int | None = None, shared: bool | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, C) log-prob of each completion-block token (positions P .. T-1 of the batch), its
    distribution's entropy, and the completion mask. The Triton path goes from hidden states to
    log-probs in token chunks, never holding the (tokens × vocab) logits. How the hidden states are
    produced (each distinct prompt once, or every row in full) is `Policy.score_inputs`'s choice
    unless `shared` forces it."""
    h, targets, mask = policy.score_inputs(batch, shared)  # (B, C, D), (B, C), (B, C)
    W = policy.lm_head_weight()
    logp, ent = kernels.fused_linear_logprobs(h, W.to(h.dtype), targets, backend=backend, chunk_size=chunk_size)
    return logp, ent, mask
