"""SFT: maximise the log-likelihood of the reference solution (or, for distill, of the policy's own
verified successes), token-mean over completion tokens."""
from __future__ import annotations

import math
import time

import torch

from harness.filters import labels_verify
from harness.render import sft_target
from trainer.logprobs import batch_logprobs
from trainer.policy import build_batch


def sft_loss(trainer, prompts: list[list[int]], targets: list[list[int]],
             tokens: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean negative log-likelihood of `targets`. Data-parallel, the mean is over the global
    batch's `tokens` (every rank's target tokens; all-reduced here when not given, so then every
    rank must call this): the ranks' averaged gradient is then the global batch's."""
    t0 = time.perf_counter()
    W = trainer.dist.world
    if W > 1 and tokens is None:
        tokens = trainer.dist.sum([float(sum(len(t) for t in targets))])[0]
    batch = build_batch(prompts, targets, trainer.policy.tok.pad_id)
    logp, ent, mask = batch_logprobs(trainer.policy, batch, trainer.backend)
    n = mask.sum().clamp_min(1.0)
    loss = -(logp * mask).sum() / (n if W == 1 else max(tokens, 1.0) / W)
    stats = {
        "entropy": float((ent.detach() * mask).sum() / n),
        "t_logprob": time.perf_counter() - t0,
        "tokens": float(batch.attn.sum()),
    }
    return loss, stats


@torch.no_grad()
def answer_losses(trainer, examples) -> list[float]:
    """The negative log-likelihood (token-mean) of the task's own answer to each of `examples`,
    rendered as an SFT target. Unlike an exact match it moves with every step that makes the right
    answer likelier: a backtest of an SFT run can read a held-out gain long before accuracy leaves zero."""
    h = trainer.harness
    prompts = [trainer.prompt_ids(ex) for ex in examples]
    targets = [trainer.target_ids(sft_target(h, ex.solution or ex.answer)) for ex in examples]
    per: list[float] = []
    for i in range(0, len(examples), 256):
        batch = build_batch(prompts[i : i + 256], targets[i : i + 256], trainer.policy.tok.pad_id)
        logp, _, mask = batch_logprobs(trainer.policy, batch, trainer.backend)
        per += (-(logp * mask).sum(1) / mask.sum(1).clamp_min(1.0)).tolist()
    return per


def answer_loss_row(n: float, total: float, squares: float) -> dict[str, float]:
    """`heldout_loss` (the mean of n per-question losses) and `heldout_loss_se` (its standard error)
    from their count, sum and sum of squares: every rank's, summed, so a data-parallel eval gives
    the global values (NaN where too few questions were scored)."""
    nan = float("nan")
    if n < 1:
        return {"heldout_loss": nan, "heldout_loss_se": nan}
    mean = total / n
    var = max(0.0, (squares - n * mean * mean) / (n - 1)) if n > 1 else nan
    return {"heldout_loss": mean, "heldout_loss_se": math.sqrt(var / n) if n > 1 else nan}


# one SFT step in this many takes its gradient as two half-batch backward passes, which measures
# the gradient's noise (Trainer.backward_halves; the step it takes is the same)
NOISE_EVERY = 20


def sft_step(trainer, examples) -> dict[str, float]:
    """One SFT step on `examples` (targets rendered by the harness's answer format). The labels are
    checked against the answer the task works out from each question (`harness.filters.labels_verify`):
    the share that pass is logged (`label_ok`), and with `filters.check_labels` the others are not
    trained on."""
    h = trainer.harness
    fraction, how = trainer.perturber.label_noise(h.filters.as_of_step)
    labels = []
    for ex in examples:
        label = ex.solution or ex.answer
        if fraction > 0:
            from trainer.perturb import noisy_label

            label = noisy_label(label, ex.uid, fraction, how)
        labels.append(label)
    ok = labels_verify(trainer.task, h, examples, labels)
    seen = [k for k in ok or [] if k is not None]
    # every rank logs the same keys (mean_dict): NaN where none of its labels could be checked
    checked = {"label_ok": sum(seen) / len(seen) if seen else float("nan")} if ok is not None else {}
    if ok is not None and h.filters.check_labels:   # an example whose answer cannot be worked out stays
        keep = [k is not False for k in ok]
        examples, labels = [ex for ex, k in zip(examples, keep) if k], [lb for lb, k in zip(labels, keep) if k]
    prompts = [trainer.prompt_ids(ex) for ex in examples]
    targets = [trainer.target_ids(sft_target(h, label)) for label in labels]
    W = trainer.dist.world
    # data-parallel, every rank joins the token count and the gradient all-reduce, with or without labels left
    tokens = trainer.dist.sum([float(sum(len(t) for t in targets))])[0] if W > 1 else None
    if not targets:
        return trainer.optimise(None, {"entropy": 0.0, "t_logprob": 0.0, "tokens": 0.0, **checked})
    if W == 1 and len(targets) >= 2 and trainer.step % NOISE_EVERY == 0:
        # the same step's gradient from its two halves, which measures how much of it is noise
        k = len(targets) // 2
        (la, sa), (lb, sb) = sft_loss(trainer, prompts[:k], targets[:k]), sft_loss(trainer, prompts[k:], targets[k:])
        ta, tb = float(sum(len(t) for t in targets[:k])), float(sum(len(t) for t in targets[k:]))
        wa, wb = ta / max(ta + tb, 1.0), tb / max(ta + tb, 1.0)
        noise = trainer.backward_halves(la, lb, wa, wb, k, len(targets) - k)
        stats = {"entropy": wa * sa["entropy"] + wb * sb["entropy"], "t_logprob": sa["t_logprob"] + sb["t_logprob"],
                 "tokens": sa["tokens"] + sb["tokens"]}
        return trainer.optimise((la * wa + lb * wb).detach(), {**stats, **checked, **noise}, backward_done=True)
    loss, stats = sft_loss(trainer, prompts, targets, tokens)
    return trainer.optimise(loss, {**stats, **checked})
