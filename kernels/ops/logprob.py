"""Per-token log-probability of the chosen token, with entropy, in one pass over the vocabulary.

Math, for one row of logits x (length V) and chosen token y:

    m    = max_j x_j                                   (running max, updated block by block)
    s    = sum_j exp(x_j - m)                          (rescaled by exp(m_old - m_new) on update)
    t    = sum_j exp(x_j - m) * (x_j - m)              (t_new = a * (t + s * (m_old - m_new)), a = exp(m_old - m_new))
    lse  = m + log s
    logp = x_y - lse                                   (log-softmax gathered at y)
    H    = -sum_j p_j log p_j = log s - t / s          (entropy, p_j = exp(x_j - lse))

Backward, with upstream gradients g (for logp) and h (for H):

    dlogp/dx_j = [j == y] - p_j
    dH/dx_j    = -p_j * (log p_j + H)
    dx_j       = g * ([j == y] - p_j) - h * p_j * (log p_j + H)

Forward reads the row once (vocab in blocks of BLOCK, online max / log-sum-exp, so any V fits);
backward reads it once more and writes dx. Only lse and H (two floats per token) are kept between
them. Accumulation is in float32 whatever the logits dtype; logp and H are float32; dx has the
logits' dtype. Targets must lie in [0, V): the kernel does not check them (the torch reference
raises on an out-of-range index).

`_online_lse_entropy` and `_logprob_grad_row` are shared with the fused GRPO kernel
(`grpo_loss.py`), which overwrites its logits chunk with dx in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops.utils import as_3d, vocab_block, warps_for


@triton.jit
def _online_lse_entropy(row_ptr, n_cols, BLOCK: tl.constexpr):
    """(lse, entropy) of one row of `n_cols` logits at `row_ptr`, in float32."""
    offs = tl.arange(0, BLOCK)
    # A finite start keeps `s * (m - m_new)` at 0 (not 0 * -inf) on the first block.
    m = tl.full((), -1e30, tl.float32)
    s = tl.full((), 0.0, tl.float32)
    t = tl.full((), 0.0, tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        alpha = tl.exp(m - m_new)
        e = tl.exp(x - m_new)
        # exp(-inf) * (-inf) would be nan: padded and -inf columns contribute exactly 0.
        xm = tl.where(e > 0, x - m_new, 0.0)
        t = alpha * (t + s * (m - m_new)) + tl.sum(e * xm, axis=0)
        s = alpha * s + tl.sum(e, axis=0)
        m = m_new
    log_s = tl.log(s)
    return m + log_s, log_s - t / s


@triton.jit
def _logprob_grad_row(x_row_ptr, dx_row_ptr, target, lse, ent, g_logp, g_ent, n_cols,
                      HAS_G_ENT: tl.constexpr, BLOCK: tl.constexpr):
    """Write dx for one row (see module docstring); `dx_row_ptr` may equal `x_row_ptr`."""
    offs = tl.arange(0, BLOCK)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(x_row_ptr + cols, mask=mask, other=-float("inf")).to(tl.float32)
        logp_j = x - lse
        p = tl.exp(logp_j)
        dx = tl.where(cols == target, g_logp, 0.0) - g_logp * p
        if HAS_G_ENT:
            dx -= g_ent * p * (tl.where(p > 0, logp_j, 0.0) + ent)
        tl.store(dx_row_ptr + cols, dx.to(dx_row_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _logprob_fwd_kernel(x_ptr, stride_xb, stride_xt, T, tgt_ptr, logp_ptr, lse_ptr, ent_ptr,
                        n_cols, BLOCK: tl.constexpr):
    """One program per token: logp, lse and entropy of row `pid` of a (B, T, V) logits tensor."""
    row = tl.program_id(0).to(tl.int64)
    x_row_ptr = x_ptr + (row // T) * stride_xb + (row % T) * stride_xt
    lse, ent = _online_lse_entropy(x_row_ptr, n_cols, BLOCK)
    target = tl.load(tgt_ptr + row)
    x_y = tl.load(x_row_ptr + target).to(tl.float32)
    tl.store(logp_ptr + row, x_y - lse)
    tl.store(lse_ptr + row, lse)
    tl.store(ent_ptr + row, ent)


@triton.jit
def _logprob_bwd_kernel(x_ptr, stride_xb, stride_xt, T, dx_ptr, stride_dxb, stride_dxt,
                        tgt_ptr, lse_ptr, ent_ptr, g_logp_ptr, g_ent_ptr, n_cols,
                        HAS_G_LOGP: tl.constexpr, HAS_G_ENT: tl.constexpr, BLOCK: tl.constexpr):
    """One program per token: dx of row `pid`; dx may alias x (same strides) for in-place use."""
    row = tl.program_id(0).to(tl.int64)
    b = row // T
    t = row % T
    target = tl.load(tgt_ptr + row)
    lse = tl.load(lse_ptr + row)
    ent = tl.load(ent_ptr + row)
    g_logp = 0.0
    if HAS_G_LOGP:
        g_logp = tl.load(g_logp_ptr + row).to(tl.float32)
    g_ent = 0.0
    if HAS_G_ENT:
        g_ent = tl.load(g_ent_ptr + row).to(tl.float32)
    _logprob_grad_row(x_ptr + b * stride_xb + t * stride_xt, dx_ptr + b * stride_dxb + t * stride_dxt,
                      target, lse, ent, g_logp, g_ent, n_cols, HAS_G_ENT, BLOCK)


def logprob_forward(logits: torch.Tensor, targets: torch.Tensor, block: int | None = None,
                    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None):
    """Launch the forward kernel. logits (..., V), targets (...) -> flat (N,) logp, lse, entropy
    (float32, written into `out` when given: three contiguous (N,) float32 tensors)."""
    x = as_3d(logits)  # (B, T, V)
    B, T, V = x.shape
    n = B * T
    tgt = targets.reshape(-1).contiguous()
    if out is None:
        out = tuple(torch.empty(n, dtype=torch.float32, device=logits.device) for _ in range(3))
    logp, lse, ent = out
    if n:
        blk = vocab_block(V, block)
        _logprob_fwd_kernel[(n,)](x, x.stride(0), x.stride(1), T, tgt, logp, lse, ent, V,
                                  BLOCK=blk, num_warps=warps_for(blk))
    return logp, lse, ent


def logprob_backward(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, ent: torch.Tensor,
                     g_logp: torch.Tensor | None, g_ent: torch.Tensor | None,
                     out: torch.Tensor | None = None, block: int | None = None) -> torch.Tensor:
    """Launch the backward kernel; writes into `out` (which may be `logits` itself) or a new tensor."""
    x = as_3d(logits)
    B, T, V = x.shape
    n = B * T
    if out is None:
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    dx = as_3d(out)
    assert dx.shape == x.shape, f"out shape {tuple(dx.shape)} != logits shape {tuple(x.shape)}"
    if n:
        tgt = targets.reshape(-1).contiguous()
        gl = g_logp.reshape(-1).contiguous() if g_logp is not None else lse
        ge = g_ent.reshape(-1).contiguous() if g_ent is not None else lse
        blk = vocab_block(V, block)
        _logprob_bwd_kernel[(n,)](x, x.stride(0), x.stride(1), T, dx, dx.stride(0), dx.stride(1),
                                  tgt, lse, ent, gl, ge, V,
                                  HAS_G_LOGP=g_logp is not None, HAS_G_ENT=g_ent is not None,
                                  BLOCK=blk, num_warps=warps_for(blk))
    return out


class TokenLogProbsFunction(torch.autograd.Function):
    """(logits (..., V), targets (...)) -> (logp (...), entropy (...)), both float32.

    Gradients flow to the logits from both outputs; `block` (vocab block width, a power of two)
    is for tests that need several blocks on small vocabularies.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, block: int | None = None):
        logp, lse, ent = logprob_forward(logits, targets, block)
        ctx.save_for_backward(logits, targets, lse, ent)
        ctx.block = block
        ctx.set_materialize_grads(False)
        return logp.view(targets.shape), ent.view(targets.shape)

    @staticmethod
    def backward(ctx, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None):
        logits, targets, lse, ent = ctx.saved_tensors
        if g_logp is None and g_ent is None:
            return None, None, None
        dlogits = logprob_backward(logits, targets, lse, ent, g_logp, g_ent, block=ctx.block)
        return dlogits, None, None


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, block: int | None = None):
    """Triton per-token log-prob and entropy; see `TokenLogProbsFunction`."""
    return TokenLogProbsFunction.apply(logits, targets, block)
