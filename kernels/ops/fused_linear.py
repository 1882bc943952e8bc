"""Fused LM head + per-token log-prob / GRPO loss, chunked over tokens.

The full logits tensor (N tokens x V vocab) is never materialised. Tokens are processed in
chunks of C rows; per chunk:

    logits_c = h_c @ W^T                      (C, V)   torch matmul in the hidden dtype
    kernel: logp_c, entropy_c (+ loss terms)  and, when gradients are needed, dlogits_c
            written over logits_c in place    (see logprob.py / grpo_loss.py for the math)
    dh_c     = dlogits_c @ W                  (C, H)
    dW      += dlogits_c^T @ h_c              (V, H)   accumulated in W's dtype (as Liger does)

Peak extra memory is one (C, V) chunk plus dh (N, H) and dW (V, H), instead of several (N, V)
tensors. The chunk size defaults to Liger's rule: C = next_pow2(ceil(N / ceil(V / H))), so a
chunk of logits is about as large as the hidden states.

Two autograd Functions:

- `FusedLinearGRPOLossFunction`: the loss is a scalar whose gradient w.r.t. logp is known in the
  forward, so dh and dW are computed there (3 matmuls per chunk, like Liger's fused linear
  cross-entropy) and backward only multiplies them by the incoming scalar gradient.
- `FusedLinearLogProbsFunction`: logp / entropy feed arbitrary downstream code, so the upstream
  gradient is unknown in the forward. The forward keeps only lse and entropy (two floats per
  token); the backward recomputes each logits chunk (4 matmuls per chunk in total). Under
  `torch.no_grad()` (old / reference log-probs) it is a single matmul per chunk.

No bias on the LM head (Qwen/Llama heads have none).
"""

from __future__ import annotations

import torch
import triton

from kernels.ops.grpo_loss import grpo_chunk
from kernels.ops.logprob import logprob_backward, logprob_forward


def auto_chunk_size(n_tokens: int, hidden: int, vocab: int) -> int:
    """Liger's rule: a chunk of logits about the size of the hidden states."""
    inc = triton.cdiv(vocab, hidden)
    return max(1, triton.next_power_of_2(triton.cdiv(max(n_tokens, 1), inc)))


def _chunks(n: int, chunk: int):
    for start in range(0, n, chunk):
        yield start, min(n, start + chunk)


class FusedLinearLogProbsFunction(torch.autograd.Function):
    """(hidden (N, H), weight (V, H), targets (N,)) -> (logp (N,), entropy (N,)), float32."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_size: int, block: int | None = None):
        N = hidden.shape[0]
        logp = torch.empty(N, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp)
        for s, e in _chunks(N, chunk_size):
            logits = hidden[s:e] @ weight.t()  # (C, V)
            logprob_forward(logits, targets[s:e], block, out=(logp[s:e], lse[s:e], ent[s:e]))
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.chunk_size, ctx.block = chunk_size, block
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None):
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (g_logp is None and g_ent is None) or not (need_h or need_w):
            return None, None, None, None, None
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        for s, e in _chunks(hidden.shape[0], ctx.chunk_size):
            h = hidden[s:e]
            logits = h @ weight.t()  # (C, V), recomputed, then overwritten with dlogits
            logprob_backward(logits, targets[s:e], lse[s:e], ent[s:e],
                             None if g_logp is None else g_logp[s:e],
                             None if g_ent is None else g_ent[s:e],
                             out=logits, block=ctx.block)
            if need_h:
                torch.mm(logits, weight, out=grad_h[s:e])
            if need_w:
                grad_w.addmm_(logits.t(), h)
        return grad_h, grad_w, None, None, None


class FusedLinearGRPOLossFunction(torch.autograd.Function):
    """Token-mean GRPO loss from hidden states; returns (loss, logp, entropy, clipped, kl).

    Inputs are flat: hidden (N, H), weight (V, H), targets / old_logp / ref_logp / advantages /
    mask (N,) (mask float32). `need_h` / `need_w` say which gradients to build in the forward.
    Only `loss` is differentiable; the per-token logp, entropy, clipped and kl are diagnostics.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, old_logp, ref_logp, advantages, mask,
                eps_low: float, eps_high: float, beta: float, chunk_size: int,
                need_h: bool, need_w: bool, block: int | None = None):
        N = hidden.shape[0]
        f32 = dict(dtype=torch.float32, device=hidden.device)
        out = {k: torch.empty(N, **f32) for k in ("logp", "entropy", "loss", "clipped", "kl")}
        scale = (1.0 / mask.sum().clamp(min=1.0)).reshape(1).to(torch.float32)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        for s, e in _chunks(N, chunk_size):
            h = hidden[s:e]
            logits = h @ weight.t()  # (C, V); becomes dloss/dlogits in place
            grpo_chunk(logits, targets[s:e],
                       None if old_logp is None else old_logp[s:e],
                       None if ref_logp is None else ref_logp[s:e],
                       advantages[s:e], mask[s:e], scale, eps_low, eps_high, beta,
                       {k: v[s:e] for k, v in out.items()}, compute_grad=need_h or need_w, block=block)
            if need_h:
                torch.mm(logits, weight, out=grad_h[s:e])
            if need_w:
                grad_w.addmm_(logits.t(), h)
        loss = out["loss"].sum() * scale[0]
        ctx.save_for_backward(grad_h, grad_w)
        ctx.backward_done = False
        ctx.mark_non_differentiable(out["logp"], out["entropy"], out["clipped"], out["kl"])
        return loss, out["logp"], out["entropy"], out["clipped"], out["kl"]

    @staticmethod
    def backward(ctx, g_loss, *_):
        if ctx.backward_done:
            raise RuntimeError("fused_linear_grpo_loss: backward ran twice on one graph; "
                               "its gradients are scaled in place, call the loss again instead")
        ctx.backward_done = True
        grad_h, grad_w = ctx.saved_tensors
        # In place: a second (V, H) buffer would undo the memory saving at large vocabularies.
        if grad_h is not None:
            grad_h.mul_(g_loss.to(grad_h.dtype))
        if grad_w is not None:
            grad_w.mul_(g_loss.to(grad_w.dtype))
        return (grad_h, grad_w) + (None,) * 12
