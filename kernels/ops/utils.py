"""Launch helpers shared by the Triton ops: block sizes, warp counts, program counts.

No autotuning anywhere: `@triton.autotune` with several configs fails under `TRITON_INTERPRET=1`
("0 active drivers", the mode the CPU tests run in), so block sizes and warp counts are chosen here by plain rules,
the same ones Liger-Kernel uses on H100-class GPUs.
"""

from __future__ import annotations

import torch
import triton

# Largest vocabulary block one program loads at a time on a GPU (as Liger's cross-entropy).
MAX_FUSED_SIZE = 32768
# Interpreter programs run one after another in numpy: fewer, larger programs are faster there.
INTERPRETER_MAX_PROGRAMS = 4


def vocab_block(n_cols: int, block: int | None = None) -> int:
    """Block width for a loop over `n_cols` (a power of two); `block` overrides (tests use it)."""
    if block is not None:
        if block <= 0 or block & (block - 1):
            raise ValueError(f"block must be a positive power of two, got {block}")
        return block
    return min(MAX_FUSED_SIZE, triton.next_power_of_2(n_cols))


def warps_for(block: int) -> int:
    """Warp count for a one-row-per-program kernel whose row block is `block` wide."""
    if block >= 32768:
        return 32
    if block >= 8192:
        return 16
    if block >= 2048:
        return 8
    return 4


def num_programs(n_rows: int, device: torch.device) -> int:
    """How many persistent programs a reduction over rows (RMSNorm's dw) should launch."""
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(n_rows, sms))
    return max(1, min(n_rows, INTERPRETER_MAX_PROGRAMS))


def as_3d(x: torch.Tensor) -> torch.Tensor:
    """`x` (..., T, V) as (B, T, V) with a unit last stride, a view whenever possible.

    Kernels address row `r` as `b * stride_b + t * stride_t` with `b, t = divmod(r, T)`, so a
    sliced tensor such as `logits[:, :-1]` (not flattenable without a copy) is read in place.
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 1:
        raise ValueError(f"expected at least 2 dims (..., V), got shape {tuple(x.shape)}")
    if x.dim() == 2:
        return x.unsqueeze(0)
    if x.dim() == 3:
        return x
    return x.reshape(-1, x.shape[-2], x.shape[-1])
