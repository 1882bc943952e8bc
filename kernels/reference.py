"""Pure-torch references for every kernel in `kernels.ops`: the ground truth of the tests and the
`backend="torch"` path of the dispatcher (CPU training, or a GPU without Triton).

They are written for clarity and materialise the full (tokens x vocab) logits; autograd supplies
their gradients. Arithmetic is in float32 whatever the input dtype; logp, entropy and the loss
are float32.
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (..., V), targets (...) -> (logp (...), entropy (...)), float32.

    logp = log_softmax(logits)[target]; entropy = -sum_j p_j log p_j.
    """
    logp_all = logits.float().log_softmax(-1)  # (..., V)
    logp = logp_all.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    p = logp_all.exp()
    entropy = -(p * torch.where(p > 0, logp_all, 0.0)).sum(-1)
    return logp, entropy


def fused_linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor,
                          targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden (..., H), weight (V, H), targets (...) -> (logp, entropy): the eager LM head."""
    return token_logprobs(hidden @ weight.t(), targets)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float | tuple[float, float],
              kl_coef: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-mean clipped GRPO surrogate with the k3 KL term, from per-token log-probs.

        r        = exp(logp - old_logp)                 (old_logp None -> logp.detach(), r == 1)
        per_tok  = -min(r*A, clip(r, 1-eps_low, 1+eps_high)*A)
                   + kl_coef * (exp(ref - logp) - (ref - logp) - 1)
        loss     = sum(per_tok * mask) / max(sum(mask), 1)

    Masked tokens are selected out (not multiplied by 0), so nan/inf in their inputs cannot leak
    into the loss. Returns (loss, {"clip_frac", "kl"}) with both stats token means over the mask.
    """
    eps_low, eps_high = _clip_pair(clip_eps)
    valid = mask.bool()
    n = mask.float().sum().clamp(min=1.0)
    old = logp.detach() if old_logp is None else old_logp.detach().float()
    adv = advantages.detach().float()
    ratio = torch.exp(logp - old)
    s1 = ratio * adv
    s2 = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_tok = -torch.minimum(s1, s2)
    if ref_logp is not None:
        d = ref_logp.detach().float() - logp
        kl = torch.exp(d) - d - 1.0
        per_tok = per_tok + kl_coef * kl
        kl_mean = torch.where(valid, kl.detach(), 0.0).sum() / n
    else:
        kl_mean = torch.zeros((), device=logp.device)
    loss = torch.where(valid, per_tok, 0.0).sum() / n
    clipped = (s2 < s1).detach() & valid
    return loss, {"clip_frac": clipped.float().sum() / n, "kl": kl_mean}


def fused_linear_grpo_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                           old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
                           advantages: torch.Tensor, mask: torch.Tensor,
                           clip_eps: float | tuple[float, float], kl_coef: float
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Eager LM head + `token_logprobs` + `grpo_loss`; stats also carry detached logp / entropy."""
    logp, entropy = fused_linear_logprobs(hidden, weight, targets)
    loss, stats = grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, kl_coef)
    return loss, {"logp": logp.detach(), "entropy": entropy.detach(), **stats}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight, computed in float32, returned in x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def _clip_pair(clip_eps: float | tuple[float, float]) -> tuple[float, float]:
    if isinstance(clip_eps, (tuple, list)):
        if len(clip_eps) != 2:
            raise ValueError(f"clip_eps must be a float or a (low, high) pair, got {clip_eps!r}")
        low, high = float(clip_eps[0]), float(clip_eps[1])
    else:
        low = high = float(clip_eps)
    if not (0.0 <= low < 1.0) or high < 0.0:
        raise ValueError(f"clip_eps must satisfy 0 <= low < 1 and high >= 0, got {clip_eps!r}")
    return low, high
