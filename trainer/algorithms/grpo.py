"""GRPO step: sample a group per prompt, score with the verifier, group-normalise rewards into
advantages, and take `updates_per_batch` optimiser steps on the clipped surrogate (+ KL to the
frozen reference when `kl_coef > 0`).

Deviation from the paper: with `updates_per_batch == 1` the "old" log-probs are the detached
current ones (ratio ≡ 1, same gradient), which saves one forward pass; the harness's pass-rate
filter (`harness.filters.in_pass_band`) drops groups whose pass rate is outside the curriculum's
[min, max] from the loss (DAPO's dynamic sampling without the resampling).
"""
from __future__ import annotations

import time

import torch

from harness.filters import in_pass_band
from trainer.algorithms.core import aggregate, get_advantage, get_loss
from trainer.logprobs import batch_logprobs
from trainer.policy import build_batch
from trainer.rollout import rollout, summarize


def grpo_step(trainer, examples) -> dict[str, float]:
    r, h = trainer.recipe, trainer.harness
    G = r.group_size
    t0 = time.perf_counter()
    rolls = rollout(trainer.policy, trainer.task, h, examples, G, trainer.gen)
    t_gen = time.perf_counter() - t0
    trainer.log_samples(rolls)
    rewards = torch.tensor([x.reward for x in rolls], dtype=torch.float32).view(len(examples), G)  # (P, G)
    adv = get_advantage(r.advantage)(rewards)  # (P, G)
    passed = torch.tensor([x.result.verdict.value == "correct" for x in rolls], dtype=torch.float32).view(len(examples), G)
    rate = passed.mean(-1, keepdim=True)
    keep = in_pass_band(h.curriculum, rate).float()  # (P, 1)
    seq_adv = (adv * keep).reshape(-1)  # (P·G,)
    batch = build_batch([x.prompt_ids for x in rolls], [x.completion_ids for x in rolls], trainer.policy.tok.pad_id)
    seq_keep = keep.expand(-1, G).reshape(-1)
    stats = summarize(rolls)
    stats.update({"t_generate": t_gen, "gen_tokens": float(sum(len(x.completion_ids) for x in rolls)),
                  "kept_groups": float(keep.mean()), "tokens": float(batch.attn.sum())})
    t1 = time.perf_counter()
    ref_logp = None
    with torch.no_grad():
        if r.kl_coef > 0:
            ref_logp = trainer.ref_logprobs(batch)
        old_logp = None
        if r.updates_per_batch > 1:
            old_logp, _, _ = batch_logprobs(trainer.policy, batch, trainer.backend)
    t_lp = time.perf_counter() - t1
    loss_fn = get_loss(r.loss)
    # the global batch's loss tokens and rows (one all-reduce; the mask is the same at every
    # update): each rank's loss is normalised by them, so the ranks' averaged gradient is the
    # gradient on the global batch (trainer/distributed.py)
    W = trainer.dist.world
    tokens, rows = trainer.dist.sum([float((batch.loss_mask.sum(-1) * seq_keep).sum()), float(len(rolls))])
    dp = {"world": W, "tokens": tokens, "rows": rows} if W > 1 else {}
    out: dict[str, float] = {}
    for u in range(r.updates_per_batch):
        t2 = time.perf_counter()
        logp, ent, mask = batch_logprobs(trainer.policy, batch, trainer.backend)
        mask = mask * seq_keep[:, None]
        tok_adv = seq_adv[:, None].expand_as(logp)
        old = logp.detach() if old_logp is None else old_logp
        per_tok, lstats = loss_fn(logp, old, ref_logp, tok_adv, mask, r.clip_eps, r.kl_coef)
        loss = aggregate(per_tok, mask, r.loss_agg, **dp)
        n = mask.sum().clamp_min(1.0)
        step_stats = {**stats, "entropy": float((ent.detach() * mask).sum() / n),
                      "t_logprob": t_lp + (time.perf_counter() - t2)}
        step_stats.update({k: float(torch.as_tensor(v).detach()) for k, v in lstats.items()})
        if mask.sum() == 0:
            # every group here all-correct or all-wrong: no advantage signal on this rank; no update
            # from it (optimise still joins the data-parallel all-reduce, at every update while
            # another rank has tokens: a rank leaving the loop early would leave its peers waiting)
            out = trainer.optimise(None, step_stats)
            if tokens == 0:
                break
            continue
        out = trainer.optimise(loss, step_stats)
        t_lp = 0.0
    return out
