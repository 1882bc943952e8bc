"""RMSNorm forward and backward.

For a row x of length H, weight w, upstream gradient g:

    rstd  = 1 / sqrt(mean_j x_j^2 + eps)
    xhat  = x * rstd
    y     = xhat * w

    dx    = rstd * (w*g - xhat * mean_j(w_j g_j xhat_j))
    dw    = sum over rows of g * xhat

All arithmetic is in float32; y and dx are cast once to x's dtype, dw to w's dtype. (HF's
Llama/Qwen RMSNorm rounds xhat to the input dtype before multiplying by w; with float32 inputs the
two agree exactly, in half precision they differ by one rounding.)

Forward: one program per row, the whole row in one block (H up to 64k), rstd saved per row.
Backward: a fixed number of persistent programs (one per SM on a GPU), each walking a contiguous
range of rows and accumulating its partial dw in float32 registers; the partials (P, H) are
summed by torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ops.utils import num_programs, warps_for

MAX_HIDDEN = 65536


@triton.jit
def _rms_norm_fwd_kernel(x_ptr, stride_x, w_ptr, y_ptr, stride_y, rstd_ptr, n_cols, eps,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(rstd_ptr + row, rstd)
    y = x * rstd * w
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd_kernel(g_ptr, stride_g, x_ptr, stride_x, w_ptr, rstd_ptr, dx_ptr, stride_dx,
                         dw_ptr, stride_dw, n_rows, n_cols, rows_per_program,
                         BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    first = pid.to(tl.int64) * rows_per_program
    n_mine = tl.minimum(rows_per_program, n_rows - first)
    for i in range(0, n_mine):
        row = first + i
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = x * rstd
        wg = w * g
        c = tl.sum(wg * xhat, axis=0) / n_cols
        dx = (wg - xhat * c) * rstd
        tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += g * xhat
    tl.store(dw_ptr + pid * stride_dw + cols, dw, mask=mask)


def _block(H: int) -> int:
    if H > MAX_HIDDEN:
        raise ValueError(f"rms_norm: hidden size {H} exceeds the one-block limit {MAX_HIDDEN}")
    return triton.next_power_of_2(H)


class RMSNormFunction(torch.autograd.Function):
    """(x (..., H), weight (H,), eps) -> y (..., H) in x's dtype; gradients for x and weight."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float):
        H = x.shape[-1]
        x2 = x.reshape(-1, H)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        n = x2.shape[0]
        y = torch.empty((n, H), dtype=x.dtype, device=x.device)
        rstd = torch.empty(n, dtype=torch.float32, device=x.device)
        blk = _block(H)
        if n:
            _rms_norm_fwd_kernel[(n,)](x2, x2.stride(0), weight, y, y.stride(0), rstd, H, float(eps),
                                       BLOCK=blk, num_warps=warps_for(blk))
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        n, H = x2.shape
        g2 = g.reshape(-1, H)
        if g2.stride(-1) != 1:
            g2 = g2.contiguous()
        dx = torch.empty((n, H), dtype=x2.dtype, device=x2.device)
        P = num_programs(n, x2.device)
        dw_partial = torch.zeros((P, H), dtype=torch.float32, device=x2.device)
        blk = _block(H)
        if n:
            _rms_norm_bwd_kernel[(P,)](g2, g2.stride(0), x2, x2.stride(0), weight, rstd,
                                       dx, dx.stride(0), dw_partial, dw_partial.stride(0),
                                       n, H, triton.cdiv(n, P), BLOCK=blk, num_warps=warps_for(blk))
        dw = dw_partial.sum(0).to(weight.dtype) if ctx.needs_input_grad[1] else None
        return dx.view(ctx.x_shape), dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Triton RMSNorm; see `RMSNormFunction`."""
    return RMSNormFunction.apply(x, weight, eps)
