"""Clipped GRPO surrogate with the k3 KL term, fused with log-softmax and its gradient.

One program per token of a logits chunk (C, V). For token i with chosen token y, advantage A,
behaviour log-prob o (old_logp), reference log-prob q (ref_logp) and mask w in {0, 1}:

    logp = x_y - lse(x)                                   (one online pass, `_online_lse_entropy`)
    r    = exp(logp - o)
    s1   = r * A,   s2 = clip(r, 1 - eps_low, 1 + eps_high) * A
    kl   = exp(q - logp) - (q - logp) - 1                 (k3 estimator, >= 0)
    loss_i = -min(s1, s2) + beta * kl

    dloss_i/dlogp = -A * r * [s1 <= s2] + beta * (1 - exp(q - logp))
    dloss_i/dx_j  = dloss_i/dlogp * ([j == y] - p_j)      (second pass, written over x in place)

The `[s1 <= s2]` rule equals autograd through `torch.minimum` and `torch.clamp`: inside the clip
range s1 == s2 and both halves of minimum's split gradient add up to -A * r; outside it the
clipped branch is constant. A token is counted as clipped when s2 < s1 strictly.

The kernel multiplies dloss/dlogp by `scale` (a one-element device tensor, 1 / sum(mask)), so
the written gradient is already that of the token-mean loss and no host sync is needed. Masked
tokens (w == 0) get loss 0, kl 0, clipped 0 and a zero gradient row, whatever their inputs hold.
Without `old_logp` (HAS_OLD=False) o = logp, i.e. r == 1 (one policy update per generation).
Without `ref_logp` (HAS_REF=False) the KL term is dropped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops.logprob import _logprob_grad_row, _online_lse_entropy
from kernels.ops.utils import vocab_block, warps_for


@triton.jit
def _grpo_chunk_kernel(
    x_ptr, stride_x,
    tgt_ptr, old_ptr, ref_ptr, adv_ptr, mask_ptr, scale_ptr,
    logp_ptr, ent_ptr, loss_ptr, clip_ptr, kl_ptr,
    n_cols, eps_low, eps_high, beta,
    HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, COMPUTE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row_ptr = x_ptr + row * stride_x
    lse, ent = _online_lse_entropy(x_row_ptr, n_cols, BLOCK)
    target = tl.load(tgt_ptr + row)
    logp = tl.load(x_row_ptr + target).to(tl.float32) - lse
    valid = tl.load(mask_ptr + row) != 0
    adv = tl.load(adv_ptr + row).to(tl.float32)

    old = logp
    if HAS_OLD:
        old = tl.load(old_ptr + row).to(tl.float32)
    ratio = tl.exp(logp - old)
    s1 = ratio * adv
    s2 = tl.minimum(tl.maximum(ratio, 1.0 - eps_low), 1.0 + eps_high) * adv
    loss = -tl.minimum(s1, s2)
    dlogp = tl.where(s1 <= s2, -adv * ratio, 0.0)
    clipped = tl.where(s2 < s1, 1.0, 0.0)
    kl = 0.0
    if HAS_REF:
        ref = tl.load(ref_ptr + row).to(tl.float32)
        d = ref - logp
        e = tl.exp(d)
        kl = e - d - 1.0
        loss += beta * kl
        dlogp += beta * (1.0 - e)

    scale = tl.load(scale_ptr)
    tl.store(logp_ptr + row, logp)
    tl.store(ent_ptr + row, ent)
    tl.store(loss_ptr + row, tl.where(valid, loss, 0.0))
    tl.store(clip_ptr + row, tl.where(valid, clipped, 0.0))
    tl.store(kl_ptr + row, tl.where(valid, kl, 0.0))
    if COMPUTE_GRAD:
        g = tl.where(valid, dlogp * scale, 0.0)
        _logprob_grad_row(x_row_ptr, x_row_ptr, target, lse, ent, g, 0.0, n_cols, False, BLOCK)


def grpo_chunk(logits: torch.Tensor, targets: torch.Tensor, old_logp: torch.Tensor | None,
               ref_logp: torch.Tensor | None, advantages: torch.Tensor, mask: torch.Tensor,
               scale: torch.Tensor, eps_low: float, eps_high: float, beta: float,
               out: dict[str, torch.Tensor], compute_grad: bool, block: int | None = None) -> None:
    """Run the kernel on one chunk. logits (C, V) contiguous rows, overwritten with dloss/dlogits
    when `compute_grad`; per-token inputs (C,); `out` holds (C,) float32 slices for
    logp / entropy / loss / clipped / kl."""
    C, V = logits.shape
    if C == 0:
        return
    assert logits.stride(1) == 1, "logits chunk must have unit stride along the vocabulary"
    blk = vocab_block(V, block)
    dummy = mask  # never read when the matching HAS_* flag is off
    _grpo_chunk_kernel[(C,)](
        logits, logits.stride(0),
        targets, old_logp if old_logp is not None else dummy, ref_logp if ref_logp is not None else dummy,
        advantages, mask, scale,
        out["logp"], out["entropy"], out["loss"], out["clipped"], out["kl"],
        V, float(eps_low), float(eps_high), float(beta),
        HAS_OLD=old_logp is not None, HAS_REF=ref_logp is not None, COMPUTE_GRAD=compute_grad,
        BLOCK=blk, num_warps=warps_for(blk),
    )
