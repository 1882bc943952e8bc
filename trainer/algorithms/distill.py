"""Distill (rejection-sampling fine-tuning): sample a group per prompt, keep the completions the
task's verifier accepts (deduplicated per prompt), and take an SFT step on them. A step with no
success makes no update (it is logged with `skipped`)."""
from __future__ import annotations

import time

from trainer.algorithms.sft import sft_loss
from trainer.rollout import rollout, summarize


def distill_step(trainer, examples) -> dict[str, float]:
    r = trainer.recipe
    t0 = time.perf_counter()
    rolls = rollout(trainer.policy, trainer.task, trainer.harness, examples, r.group_size, trainer.gen)
    t_gen = time.perf_counter() - t0
    trainer.log_samples(rolls)
    stats = summarize(rolls)
    stats.update({"t_generate": t_gen, "gen_tokens": float(sum(len(x.completion_ids) for x in rolls))})
    seen, prompts, targets = set(), [], []
    for x in rolls:
        key = (x.example.uid, tuple(x.completion_ids))
        if x.result.verdict.value == "correct" and key not in seen:
            seen.add(key)
            prompts.append(x.prompt_ids)
            targets.append(x.completion_ids)
    stats["distill_kept"] = float(len(prompts))
    # every rank joins this all-reduce, those with nothing kept too (sft_loss below runs on some only)
    tokens = trainer.dist.sum([float(sum(len(t) for t in targets))])[0] if trainer.dist.world > 1 else None
    if not prompts:  # nothing verified on this rank: no update from it (still joins the all-reduce)
        return trainer.optimise(None, {**stats, "entropy": 0.0, "t_logprob": 0.0, "tokens": 0.0})
    loss, lstats = sft_loss(trainer, prompts, targets, tokens)
    return trainer.optimise(loss, {**stats, **lstats})
