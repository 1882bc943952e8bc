"""Triton kernels for the trainer's hot paths, behind one dispatcher.

What: per-token log-probs (log-softmax + gather, entropy as a by-product), an LM head fused with
those log-probs and with the clipped GRPO loss (never materialising tokens x vocab logits), and
RMSNorm. Why: in GRPO the (tokens x vocab) logits dominate memory and much of the step time.
How: call the public functions below with `backend="auto"` (Triton on CUDA, the pure-torch
references in `kernels.reference` elsewhere), or force one with "torch" / "triton". The Triton
kernels and their autograd Functions live in `kernels.ops` (imported lazily, on first use);
`kernels.modules` wraps them as nn.Modules. On CPU, `backend="triton"` runs Triton's (slow)
interpreter, for tests: it needs `TRITON_INTERPRET=1` set before the process first imports
triton (Triton reads it when `@triton.jit` decorates a function, and `tl.max` / `tl.sum` are
jit functions decorated at `import triton`).

Public API (the trainer depends on these signatures):

    select_backend(requested, device) -> (backend, reason)
    token_logprobs(logits, targets, backend="auto") -> (logp, entropy)
    fused_linear_logprobs(hidden, weight, targets, backend="auto", chunk_size=None) -> (logp, entropy)
    fused_linear_grpo_loss(hidden, weight, targets, old_logp, ref_logp, advantages, mask,
                           clip_eps=0.2, kl_coef=0.0, backend="auto", chunk_size=None) -> (loss, stats)
    rms_norm(x, weight, eps=1e-6, backend="auto") -> y

Shapes: tokens may carry any leading dims, e.g. logits (B, T, V) with targets (B, T), or hidden
(N, H) with targets (N,); per-token outputs take the targets' shape. logp and entropy are float32
whatever the input dtype. Gradients: logp and entropy from `token_logprobs` and
`fused_linear_logprobs` are both differentiable; the GRPO loss is differentiable w.r.t. hidden
and weight, and its stats are detached.
"""

from __future__ import annotations

import functools
import logging
import os
import sys

import torch

from kernels import reference

__all__ = [
    "BACKENDS",
    "select_backend",
    "token_logprobs",
    "fused_linear_logprobs",
    "fused_linear_grpo_loss",
    "rms_norm",
]

BACKENDS = ("auto", "torch", "triton")
log = logging.getLogger(__name__)
_logged: set[tuple[str, str, str]] = set()


@functools.lru_cache(maxsize=1)
def _triton_import() -> tuple[bool, str]:
    try:
        import triton
    except Exception as exc:  # boundary: any import failure becomes a reason string
        return False, f"{type(exc).__name__}: {exc}"
    return True, f"triton {triton.__version__}"


def _interpret_env() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _interpreter_mismatch() -> str | None:
    """Why Triton's interpreter cannot run in this process although TRITON_INTERPRET=1, or None.

    Triton reads TRITON_INTERPRET when `@triton.jit` decorates a function: for its own library
    (`tl.max`, `tl.sum`, ... are jit functions) that is `import triton`, for ours it is the import
    of `kernels.ops`. Both must happen with the variable already set.
    """
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.max, InterpretedFunction):
        return "triton was imported before TRITON_INTERPRET=1 was set"
    mod = sys.modules.get("kernels.ops.logprob")
    if mod is not None and not isinstance(mod._logprob_fwd_kernel, InterpretedFunction):
        return "kernels.ops was imported before TRITON_INTERPRET=1 was set"
    return None


def select_backend(requested: str, device: torch.device | str) -> tuple[str, str]:
    """Resolve `requested` ("auto" | "torch" | "triton") for tensors on `device`.

    Returns ("triton" | "torch", a one-line reason for the log). "auto" takes Triton only on a
    CUDA device with an importable triton. "triton" on a non-CUDA device is allowed only under
    `TRITON_INTERPRET=1` (Triton's slow numpy interpreter) and raises ValueError otherwise.
    """
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {requested!r}")
    device = torch.device(device)
    if requested == "torch":
        return "torch", "backend='torch' requested: pure-torch reference"
    if requested == "auto" and device.type != "cuda":
        return "torch", f"auto: device is {device.type}, not cuda: pure-torch reference"
    ok, what = _triton_import()
    if requested == "auto":
        if not ok:
            return "torch", f"auto: cuda device but triton is not importable ({what}): pure-torch reference"
        return "triton", f"auto: cuda device and {what}: Triton kernels"
    if not ok:
        raise ValueError(f"backend='triton' requested but triton is not importable ({what}); "
                         "use backend='torch' or 'auto'")
    if device.type == "cuda":
        return "triton", f"backend='triton' requested on cuda with {what}"
    if not _interpret_env():
        raise ValueError(f"backend='triton' needs a cuda device, got {device.type!r}; set TRITON_INTERPRET=1 "
                         "to run the kernels in Triton's (slow) CPU interpreter, or use backend='torch'/'auto'")
    why = _interpreter_mismatch()
    if why is not None:
        raise ValueError(f"backend='triton' on {device.type}: {why}; set it in the environment before the "
                         "process imports triton (Triton reads it when decorating jit functions)")
    return "triton", f"backend='triton' requested on {device.type}: Triton interpreter (TRITON_INTERPRET=1), slow"


def _resolve(requested: str, device: torch.device, op: str) -> str:
    """select_backend, logging the choice once per (op, requested, device type)."""
    name, reason = select_backend(requested, device)
    key = (op, requested, device.type)
    if key not in _logged:
        _logged.add(key)
        log.info("kernels.%s: backend %s (%s)", op, name, reason)
    return name


def _ops():
    """Import the Triton ops on first use, so that importing `kernels` never decorates kernels."""
    from kernels.ops import fused_linear, logprob, rms_norm as rms_norm_op
    return fused_linear, logprob, rms_norm_op


def _check_tokens(name: str, targets: torch.Tensor, lead_shape: torch.Size) -> None:
    if targets.dtype.is_floating_point or targets.dtype == torch.bool or targets.is_complex():
        raise TypeError(f"{name}: targets must be an integer tensor, got {targets.dtype}")
    if targets.shape != lead_shape:
        raise ValueError(f"{name}: targets shape {tuple(targets.shape)} must equal the token shape "
                         f"{tuple(lead_shape)}")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                   backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each chosen token and the entropy of each row of logits.

    logits (..., V) any float dtype; targets (...) integer ids in [0, V).
    Returns (logp, entropy), each (...) float32, both differentiable w.r.t. logits.
    """
    _check_tokens("token_logprobs", targets, logits.shape[:-1])
    name = _resolve(backend, logits.device, "token_logprobs")
    if name == "torch":
        return reference.token_logprobs(logits, targets)
    return _ops()[1].token_logprobs(logits, targets)


def _flat_tokens(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, name: str):
    if hidden.dim() < 2 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"{name}: need hidden (..., H) and weight (V, H), got {tuple(hidden.shape)} "
                         f"and {tuple(weight.shape)}")
    if hidden.dtype != weight.dtype:
        raise TypeError(f"{name}: hidden dtype {hidden.dtype} != weight dtype {weight.dtype}; pass "
                        "weight.to(hidden.dtype) (differentiable) when the master weights are float32")
    _check_tokens(name, targets, hidden.shape[:-1])
    return hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)


def _chunk(chunk_size: int | None, n: int, h: int, v: int, fused_linear) -> int:
    if chunk_size is None:
        return fused_linear.auto_chunk_size(n, h, v)
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    return int(chunk_size)


def fused_linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          backend: str = "auto", chunk_size: int | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of `hidden @ weight.T` without the full logits.

    hidden (..., H), weight (V, H) of the same dtype, targets (...) integer ids.
    Returns (logp, entropy), each of targets' shape, float32, differentiable w.r.t. hidden and
    weight. `chunk_size` tokens are processed at a time (None: Liger's rule, a chunk of logits
    about the size of `hidden`). The torch backend is the eager reference (full logits).
    """
    h2, t1 = _flat_tokens(hidden, weight, targets, "fused_linear_logprobs")
    name = _resolve(backend, hidden.device, "fused_linear_logprobs")
    if name == "torch":
        return reference.fused_linear_logprobs(hidden, weight, targets)
    fused_linear = _ops()[0]
    chunk = _chunk(chunk_size, h2.shape[0], h2.shape[1], weight.shape[0], fused_linear)
    logp, ent = fused_linear.FusedLinearLogProbsFunction.apply(h2, weight, t1.contiguous(), chunk, None)
    return logp.view(targets.shape), ent.view(targets.shape)


def fused_linear_grpo_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                           old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
                           advantages: torch.Tensor, mask: torch.Tensor,
                           clip_eps: float | tuple[float, float] = 0.2, kl_coef: float = 0.0,
                           backend: str = "auto", chunk_size: int | None = None
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-mean clipped GRPO loss with the k3 KL term, straight from hidden states.

    Per token, with logp = log_softmax(hidden @ weight.T)[target] and r = exp(logp - old_logp):

        per_tok = -min(r*A, clip(r, 1-eps_low, 1+eps_high)*A)
                  + kl_coef * (exp(ref_logp - logp) - (ref_logp - logp) - 1)
        loss    = sum(per_tok * mask) / max(sum(mask), 1)

    hidden (..., H) and weight (V, H) of one dtype; targets (...) integer ids; old_logp, ref_logp,
    advantages and mask of targets' shape (advantages may also be per sequence, (B,) for (B, T)
    targets). old_logp None means one update per generation (r == 1, as `logp.detach()`);
    ref_logp None is allowed only with kl_coef == 0. clip_eps is a float or a (low, high) pair.
    Masked tokens (mask == 0) contribute nothing, whatever their inputs hold.

    Returns (loss, stats): loss a float32 scalar differentiable w.r.t. hidden and weight; stats
    holds detached "logp" and "entropy" (targets' shape) and "clip_frac" and "kl" (token means
    over the mask). The Triton path computes the gradients inside the forward (one chunk of logits
    at a time), so its loss supports a single backward. hidden and weight must share a dtype
    (under autocast with float32 master weights, pass `weight.to(hidden.dtype)`); the weight
    gradient is accumulated over chunks in that dtype, as Liger does.
    """
    h2, t1 = _flat_tokens(hidden, weight, targets, "fused_linear_grpo_loss")
    eps_low, eps_high = reference._clip_pair(clip_eps)
    if ref_logp is None and kl_coef != 0.0:
        raise ValueError(f"fused_linear_grpo_loss: kl_coef={kl_coef!r} needs ref_logp, got None")
    if advantages.dim() == 1 and targets.dim() == 2 and advantages.shape[0] == targets.shape[0] \
            and advantages.shape != targets.shape:
        advantages = advantages.unsqueeze(-1).expand_as(targets)
    for what, t in (("old_logp", old_logp), ("ref_logp", ref_logp), ("advantages", advantages), ("mask", mask)):
        if t is not None and t.shape != targets.shape:
            raise ValueError(f"fused_linear_grpo_loss: {what} shape {tuple(t.shape)} must equal targets shape "
                             f"{tuple(targets.shape)}")
    name = _resolve(backend, hidden.device, "fused_linear_grpo_loss")
    if name == "torch":
        return reference.fused_linear_grpo_loss(hidden, weight, targets, old_logp, ref_logp, advantages, mask,
                                                (eps_low, eps_high), kl_coef)
    fused_linear = _ops()[0]
    chunk = _chunk(chunk_size, h2.shape[0], h2.shape[1], weight.shape[0], fused_linear)

    def flat(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.detach().reshape(-1).float().contiguous()

    grad = torch.is_grad_enabled()
    loss, logp, ent, clipped, kl = fused_linear.FusedLinearGRPOLossFunction.apply(
        h2, weight, t1.contiguous(), flat(old_logp), flat(ref_logp), flat(advantages), flat(mask),
        eps_low, eps_high, float(kl_coef), chunk,
        grad and hidden.requires_grad, grad and weight.requires_grad, None)
    n = mask.float().sum().clamp(min=1.0)  # per-token clipped and kl are already 0 where masked
    stats = {
        "logp": logp.view(targets.shape),
        "entropy": ent.view(targets.shape),
        "clip_frac": clipped.sum() / n,
        "kl": kl.sum() / n if ref_logp is not None else torch.zeros((), device=hidden.device),
    }
    return loss, stats


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, backend: str = "auto") -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight; x (..., H), weight (H,); y in x's dtype.

    Arithmetic in float32 (see kernels.ops.rms_norm for the one-rounding difference from HF's
    Llama/Qwen RMSNorm in half precision). Differentiable w.r.t. x and weight.
    """
    if weight.dim() != 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f"rms_norm: need x (..., H) and weight (H,), got {tuple(x.shape)} and {tuple(weight.shape)}")
    name = _resolve(backend, x.device, "rms_norm")
    if name == "torch":
        return reference.rms_norm(x, weight, eps)
    return _ops()[2].rms_norm(x, weight, eps)
