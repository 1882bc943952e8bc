"""Per-token log-probs of a batch under the policy, through the torch reference or the fused
Triton kernels (chosen once per run by `select_backend`; the choice is logged as an event)."""
from __future__ import annotations

import torch

from trainer.algorithms.core import token_logprobs_torch
from trainer.policy import Batch, Policy


def select_backend(requested: str, device: torch.device) -> tuple[str, str]:
    """("torch" | "triton", reason)."""
    try:
        import kernels

        if hasattr(kernels, "select_backend"):
            return kernels.select_backend(requested, device)
    except ImportError:
        pass
    if requested == "triton":
        raise ValueError("model.kernels='triton' but the kernels package is unavailable")
    return "torch", "kernels package has no dispatcher; using the torch reference"


def batch_logprobs(policy: Policy, batch: Batch, backend: str = "torch",
                   chunk_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T-1) log-prob of each next token, its distribution's entropy, and the completion mask."""
    h, targets, mask = policy.score_inputs(batch)  # (B, T-1, D), (B, T-1), (B, T-1)
    W = policy.lm_head_weight()
    if backend == "triton":
        import kernels

        B, T, D = h.shape
        logp, ent = kernels.fused_linear_logprobs(h.reshape(B * T, D), W, targets.reshape(-1),
                                                  backend="triton", chunk_size=chunk_size)
        return logp.view(B, T), ent.view(B, T), mask
    logits = h @ W.t()
    logp, ent = token_logprobs_torch(logits, targets)
    return logp, ent, mask
