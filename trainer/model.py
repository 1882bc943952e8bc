"""The built-in policy: a small decoder-only transformer trained from scratch.

Pre-norm blocks with RMSNorm, rotary position embeddings and a SwiGLU MLP — the ops the kernels
package fuses — plus a KV cache for generation. `forward(ids)` returns final hidden states
(B, T, D); `lm_head` maps them to logits, so the trainer can compute token log-probs either from
full logits (torch) or chunked from hidden states (fused kernels) without materialising
(tokens × vocab).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    backend = "torch"  # set by TinyLM.use_kernels: "triton" on CUDA, "cpu" (the fused C kernel) on CPU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "triton":
            import kernels

            return kernels.rms_norm(x, self.weight, self.eps, backend="triton")
        if self.backend == "cpu":
            import kernels.cpu

            if kernels.cpu.usable(x, self.weight):
                return kernels.cpu.rms_norm(x, self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(head_dim: int, max_len: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    t = torch.arange(max_len, dtype=torch.float32)
    freqs = torch.outer(t, inv)  # (T, hd/2)
    return freqs.cos(), freqs.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each interleaved pair (x[2i], x[2i+1]) by the angle whose cos/sin are given.
    x: (..., T, hd); cos/sin broadcast to (..., T, hd/2)."""
    return rotate(x, torch.complex(cos.float(), sin.float()))


def rotate(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """(x1 + i·x2)·rot for each interleaved pair (x[2i], x[2i+1]) as one complex multiply, forward
    and backward (measured 2.3× faster than slicing the pairs and stacking them back). `rot`:
    complex64 cos + i·sin broadcasting to (..., T, hd/2), built once per forward."""
    dt = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32  # no complex bf16
    xc = torch.view_as_complex(x.to(dt).reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * (rot if dt == torch.float32 else rot.to(torch.complex128))).flatten(-2).to(x.dtype)


def right_padded(attention_mask: torch.Tensor) -> bool:
    """True when every row of the (B, T) 0/1 mask is real tokens then padding (no left padding,
    no holes)."""
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


class KVCache:
    """Per-layer key/value buffers for incremental decoding; `pos` is the filled length."""

    def __init__(self, n_layers: int, batch: int, n_heads: int, max_len: int, head_dim: int, device, dtype) -> None:
        shape = (batch, n_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.pos = 0

    @classmethod
    def from_layers(cls, k: list[torch.Tensor], v: list[torch.Tensor], pos: int) -> "KVCache":
        """A cache over given per-layer (B, H, max_len, hd) buffers, the first `pos` positions
        filled (e.g. a shared prompt's keys/values repeated to the rows of its group)."""
        cache = cls.__new__(cls)
        cache.k, cache.v, cache.pos = list(k), list(v), pos
        return cache


class Attention(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads, self.hd = n_heads, d // n_heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x, rot, attn_mask, cache: KVCache | None, layer: int, causal: bool = True) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, self.hd).permute(2, 0, 3, 1, 4)  # 3×(B, H, T, hd)
        q, k = rotate(q, rot), rotate(k, rot)   # (one rotation of both broadcasts over a leading 2: measured slower)
        if cache is not None:
            p = cache.pos
            cache.k[layer][:, :, p : p + T] = k
            cache.v[layer][:, :, p : p + T] = v
            k, v = cache.k[layer][:, :, : p + T], cache.v[layer][:, :, : p + T]
        # attn_mask None: plain causal over a square block (SDPA's fused causal path), or with
        # causal=False, one new token that attends to every position before it
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None and causal)  # (B, H, T, hd)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int, ff: int) -> None:
        super().__init__()
        self.n1, self.attn = RMSNorm(d), Attention(d, n_heads)
        self.n2, self.mlp = RMSNorm(d), SwiGLU(d, ff)

    def forward(self, x, rot, attn_mask, cache, layer, causal=True):
        x = x + self.attn(self.n1(x), rot, attn_mask, cache, layer, causal)
        return x + self.mlp(self.n2(x))


class TinyLM(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        d = cfg.d_model
        ff = cfg.d_ff or int(math.ceil(8 * d / 3 / 8) * 8)
        self.cfg, self.vocab_size = cfg, vocab_size
        self.embed = nn.Embedding(vocab_size, d)
        # optional absolute positions on top of rotary: fixed-width formats (digit i of each operand
        # at a fixed place) are then a lookup instead of something inferred from relative offsets
        self.pos_embed = nn.Embedding(cfg.max_seq_len, d) if cfg.learned_positions else None
        self.blocks = nn.ModuleList(Block(d, cfg.n_heads, ff) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab_size, bias=False)
        cos, sin = rotary_tables(d // cfg.n_heads, cfg.max_seq_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        # PyTorch's default init (embeddings N(0, 1), linears Kaiming-uniform) learns the arithmetic
        # tasks markedly faster at this size than GPT-2's N(0, 0.02) (measured: loss 0.62 vs 0.98
        # after 500 steps of 3-digit addition). "scaled_residual" also shrinks the residual output
        # projections (GPT-2's std 0.02/sqrt(2L)), which on 3-digit addition cost 1.2-2.8x the steps
        # to 95% and stalled one seed in five (benchmarks/results/time_to_accuracy.md).
        if cfg.init == "scaled_residual":
            for b in self.blocks:
                nn.init.normal_(b.attn.proj.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))
                nn.init.normal_(b.mlp.down.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))

    def use_kernels(self, backend: str) -> None:
        """Route every RMSNorm through the Triton kernel ("triton"), the fused C kernel on CPU
        ("cpu", kernels/cpu.py) or the torch expression ("torch")."""
        for m in self.modules():
            if isinstance(m, RMSNorm):
                m.backend = backend

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        c = self.cfg
        p = next(self.parameters())
        return KVCache(c.n_layers, batch, c.n_heads, max_len or c.max_seq_len, c.d_model // c.n_heads, p.device, p.dtype)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: KVCache | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states (B, T, D) after the final norm.

        `attention_mask` (B, T_total) marks real tokens (1) vs padding (0); `positions` (B, T)
        are rotary positions (left-padded rows start at 0 on their first real token)."""
        B, T = ids.shape
        start = cache.pos if cache is not None else 0
        total = start + T
        if total > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {total} exceeds model.max_seq_len={self.cfg.max_seq_len}")
        if positions is None:
            positions = torch.arange(start, total, device=ids.device).expand(B, T)
        # (B, 1, T, hd/2) complex64, once for all layers (float32 tables: a bf16 model has no complex type)
        rot = torch.complex(self.cos[positions].float(), self.sin[positions].float()).unsqueeze(1)
        x = self.embed(ids)
        if self.pos_embed is not None:
            x = x + self.pos_embed(positions)
        mask, causal = None, True  # plain causal over a square block: exact for every real token when
        # padding only follows them (what pad positions compute is never read)
        if start > 0 or (attention_mask is not None and not right_padded(attention_mask[:, :total])):
            if T == 1 and (attention_mask is None or bool(attention_mask[:, :total].all())):
                causal = False   # one new token, every earlier position real: it attends to all of them
            else:
                mask = torch.ones(T, total, dtype=torch.bool, device=ids.device).tril(diagonal=start)[None, None]
                if attention_mask is not None:  # (1, 1, T, total) -> (B, 1, T, total)
                    mask = mask & attention_mask[:, None, None, :total].bool()
                    # a fully padded query row would give NaNs; let it attend to itself
                    diag = torch.zeros(T, total, dtype=torch.bool, device=ids.device)
                    r = torch.arange(T, device=ids.device)
                    diag[r, start + r] = True
                    mask = mask | diag
        for i, blk in enumerate(self.blocks):
            x = blk(x, rot, mask, cache, i, causal)
        if cache is not None:
            cache.pos = total
        return self.norm(x)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
