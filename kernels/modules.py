"""Thin nn.Module wrappers over the dispatcher in `kernels` (the functions hold the logic).

`RMSNorm` has the same parameter (`weight`, shape (H,), ones) as `torch.nn.RMSNorm`
and HF's Llama/Qwen RMSNorm, so `load_state_dict` from either works unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

import kernels


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, dispatched by `backend` ("auto"|"torch"|"triton")."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, backend: str = "auto",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        if backend not in kernels.BACKENDS:
            raise ValueError(f"backend must be one of {kernels.BACKENDS}, got {backend!r}")
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.eps = eps
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, self.weight, self.eps, self.backend)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, backend={self.backend!r}"


class FusedLinearLogProbs(nn.Module):
    """forward(hidden, weight, targets) -> (logp, entropy) without materialising the logits."""

    def __init__(self, backend: str = "auto", chunk_size: int | None = None):
        super().__init__()
        self.backend, self.chunk_size = backend, chunk_size

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor):
        return kernels.fused_linear_logprobs(hidden, weight, targets, self.backend, self.chunk_size)


class FusedLinearGRPOLoss(nn.Module):
    """forward(hidden, weight, targets, old_logp, ref_logp, advantages, mask) -> (loss, stats)."""

    def __init__(self, clip_eps: float | tuple[float, float] = 0.2, kl_coef: float = 0.0,
                 backend: str = "auto", chunk_size: int | None = None):
        super().__init__()
        self.clip_eps, self.kl_coef = clip_eps, kl_coef
        self.backend, self.chunk_size = backend, chunk_size

    def forward(self, hidden, weight, targets, old_logp, ref_logp, advantages, mask):
        return kernels.fused_linear_grpo_loss(hidden, weight, targets, old_logp, ref_logp, advantages, mask,
                                              self.clip_eps, self.kl_coef, self.backend, self.chunk_size)
