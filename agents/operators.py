"""The operators' built-in policies and the lead that arbitrates between them.

    ops = default_operators()                     # ClusterOps, Diagnostics, HarnessCritic, DataCuration, Explorer
    proposals = [iv for op in ops for iv in op.propose(ev, ctx, llm)]
    chosen = Lead().arbitrate(proposals, ctx)

Each built-in policy maps its detectors' findings (agents/detectors.py) to typed interventions:

| operator      | finding                                   | intervention                                      | risk   |
|---------------|-------------------------------------------|---------------------------------------------------|--------|
| ClusterOps    | a crashed, hung, out-of-memory or input-bound job (its table: agents/cluster_ops.py) | RESTART | low / medium |
| Diagnostics   | non-finite loss, loss spike, grad explosion | ROLLBACK to the last checkpoint before the onset: the lr back to its value before a jump, kept when the harness changed just before the onset, else lowered | medium |
|               | KL blow-up                                | RECIPE_EDIT kl_coef ×2 (or lr ×0.5 once it is large) | medium |
|               | entropy collapse, low temperature         | HARNESS_EDIT sampling.temperature → 1.0           | medium |
|               | lr drift (the logged lr outside the recipe's schedule) | ROLLBACK to the last checkpoint before the change with the recipe's lr (RECIPE_EDIT without one) | medium |
|               | recipe drift (the live recipe version is not the one set; only without an lr drift) | RECIPE_EDIT every recipe field → the controller's value | medium |
|               | small updates (steps that barely move the weights, held-out at zero) | RECIPE_EDIT lr raised to a healthy step's size | medium |
|               | strong decay (the weights' norm falling as fast as the decay pulls) | RECIPE_EDIT weight_decay lowered | medium |
|               | small batch (a step's gradient mostly noise: the batch far below the noise scale) | RECIPE_EDIT batch_size raised | medium |
|               | not learning (no divergence, no lr moved for it yet) | ROLLBACK to the untrained checkpoint with lr × 0.1 (RECIPE_EDIT without it) | medium |
| HarnessCritic | truncation (sampled answers cut off, or the task's own answers longer than the limit) | HARNESS_EDIT sampling.max_new_tokens raised: 2× the cut-off length, or the task's longest answer, + 2 | medium |
|               | template mismatch                         | ROLLBACK to before the harness changed, template restored from the goal's harness (HARNESS_EDIT without such a checkpoint) | medium |
|               | reward hacking                            | ROLLBACK to before its onset with reward.verifier → task (HARNESS_EDIT without such a checkpoint) | medium |
|               | harness drift (the live harness version is not the one set; only when no finding names the field) | HARNESS_EDIT every harness field → the controller's value | medium |
| DataCuration  | data findings: the curriculum, filters, labels and the data source's revision (its table: agents/data_curation.py) | DATA_CHANGE / DISTILL / ROLLBACK | low / medium |

Values in `changes` come from the controller's context (goal, known recipe/harness, checkpoints)
and from metric numbers, never from sample text. The risk column is the operators' own view; the
controller assigns the risk that gates an intervention from the change itself
(swarm.decisions.assign_risk), and confirms each diagnosis with its own detectors before a
restart or a rollback skips its backtest (swarm.decisions.plan; docs/decisions.md).
"""
from __future__ import annotations

import math
import pathlib
import string
from typing import Any

import yaml

from agents.base import FAILED, IN_EFFECT, PENDING, Operator, OperatorContext, finite as _f, rollback_target
from agents.cluster_ops import ClusterOps
from agents.data_curation import DataCuration
from agents.domain import (DEPARTURE, JOB_ACTIONS, JOB_FINDINGS, SEVERITY_RANK, Diagnosis, Intervention, InterventionKind as K,
                           Risk, Status, cannot_wait)
from agents.evidence import Evidence
from agents.progress import config_fields, departure_harmed, eval_series, rollback_stake
from agents.recall import avoid_reason
from agents.step_detectors import weights_grown
from trainer.runlog import INIT_CHECKPOINT

# act on the job first, then on the data, then on the harness, then on the recipe
KIND_RANK = {K.RESTART: 0, K.ROLLBACK: 1, K.DATA_CHANGE: 2, K.DISTILL: 3, K.HARNESS_EDIT: 4, K.RECIPE_EDIT: 5}

LR_FACTOR = 0.1                 # a diverged run restarts with lr × this (unless the lr itself jumped)
LR_JUMP = 3.0                   # lr at the onset ≥ this × the lr before it: the lr jumped
HARNESS_ONSET_STEPS = 5         # a harness change this close before a divergence's onset is its cause
KL_COEF_FACTOR = 2.0
KL_COEF_MIN = 0.02
KL_COEF_MAX = 0.5               # above this, lower the lr instead
TEMPERATURE = 1.0
MAX_NEW_TOKENS_CAP = 4096
TOKENS_SLACK = 2
RECENT_HISTORY = 20             # interventions looked back at when arbitrating


def worthless_weights(ev: Evidence, checkpoints: list[dict[str, Any]], heldout_max: float) -> str | None:
    """Why the weights of this run are worth nothing to carry on from, so a fix may start over from
    its untrained checkpoint (when it is among `checkpoints`): it never learnt (held-out never above
    `heldout_max`), or the latest segment's last two evals are at that level and the weights have grown far past their
    untrained size (`weights_grown`: an lr far too high inflated them, and a lower lr from there
    trains weights that size). None otherwise."""
    if not any(c.get("name") == INIT_CHECKPOINT for c in checkpoints):
        return None
    held = [v for v in (_f(r.get("heldout_acc")) for r in ev.evals) if v is not None]
    if not held:
        return None
    if max(held) <= heldout_max:
        return f"it never learnt (best held-out {max(held):.3g})"
    # the latest segment's last two evals at the not-learning level: one low eval, or a drop just
    # after a rollback or a change of harness, is not a run that stopped learning
    seg = ev.metrics[-1].get("segment", 0) if ev.metrics else None
    now = [v for v in (_f(r.get("heldout_acc")) for r in ev.evals if r.get("segment", 0) == seg) if v is not None]
    grown = weights_grown(ev)
    if grown is not None and len(now) >= 2 and max(now[-2:]) <= heldout_max:
        return f"its weights grew to {grown:.3g}× their untrained size (held-out {now[-1]:.3g} now)"
    return None


class Diagnostics(Operator):
    name = "diagnostics"
    role = ("Diagnostics: reads the metric streams for optimisation failures — non-finite loss, loss spikes, "
            "grad-norm explosions, KL blow-up, entropy collapse, near-greedy sampling, plateaus. A diverged run is "
            "rolled back to the last checkpoint before the problem, with the recipe's learning rate where the one "
            "in force left it, else a lower one; a KL blow-up gets a "
            "stronger KL penalty; lost exploration gets the sampling temperature back to 1.0; steps that barely "
            "move the weights get a higher learning rate; weights the decay pulls in get a lower weight decay; "
            "a gradient that is mostly noise gets a larger batch.")
    tools = frozenset({K.ROLLBACK, K.RECIPE_EDIT, K.HARNESS_EDIT})
    detectors = ("nonfinite_loss", "loss_spike", "grad_norm_explosion", "kl_blowup", "entropy_collapse",
                 "low_temperature", "plateau", "not_learning", "inflated_weights", "small_updates", "strong_decay",
                 "small_batch", "lr_drift", "recipe_drift")

    def builtin(self, ev: Evidence, ctx: OperatorContext) -> list[Intervention]:
        found = {d.name: d for d in self.diagnose(ev, ctx)}
        out: list[Intervention] = []
        diverged = [found[n] for n in ("nonfinite_loss", "loss_spike", "grad_norm_explosion") if n in found]
        if diverged:
            out.append(self._rollback(diverged, ctx, harness_changed_at(ev, min(
                int(d.evidence.get("onset_step", d.step)) for d in diverged)), found.get("lr_drift")))
        elif "lr_drift" in found:
            # the lr in force is not the one set: put it back before judging the one set (a lower lr
            # for a run that does not learn assumes the set lr is what it trains with)
            d = found["lr_drift"]
            lr = _f(ctx.get("recipe.lr"))
            since = d.evidence.get("since_step")
            ckpt = ctx.checkpoint_before(int(since) - 1) if isinstance(since, (int, float)) and since > 0 else None
            why = f"{d.summary}. The run trains at a learning rate nobody chose; the recipe's lr {lr:.3g} is set again"
            if lr and ckpt is not None:
                # the steps trained at the wrong lr go too: at a far higher one they can wreck the weights
                out.append(self.intervention(
                    K.ROLLBACK, d, {"recipe.lr": lr}, risk=Risk.MEDIUM, rollback_to=str(ckpt["name"]),
                    rationale=f"{why}, from checkpoint {ckpt['name']} (step {ckpt['step']}, before the lr changed "
                              f"at step {since}); the backtest compares that with carrying on.",
                    expected_effect="the logged lr back within the recipe's schedule at once; the loss falling "
                                    "from the checkpoint's level as it did before the change"))
            elif lr:
                out.append(self.intervention(
                    K.RECIPE_EDIT, d, {"recipe.lr": lr}, risk=Risk.MEDIUM,
                    rationale=f"{why} (no checkpoint predates the change; the backtest decides whether that helps).",
                    expected_effect="the logged lr back within the recipe's schedule at once; the loss curve "
                                    "back to its slope before the change"))
        elif "recipe_drift" in found and ctx.recipe:
            # a field other than the lr changed with no command: every recipe field goes back to the
            # controller's value before anything is judged on a recipe nobody chose
            out.append(departure_fix(self, found["recipe_drift"], "recipe", K.RECIPE_EDIT, ev, ctx,
                                     "whatever the unrequested change slowed or broke (batch size, weight decay, "
                                     "schedule) recovering"))
        elif "small_updates" in found and _f(found["small_updates"].evidence.get("lr_suggested")):
            # the weights barely move: the lr goes up to where a healthy run's steps move them, from
            # the live weights (a tiny lr left them close to where they were: nothing to undo)
            d = found["small_updates"]
            lr, new_lr = _f(d.evidence.get("lr")), _f(d.evidence.get("lr_suggested"))
            new_wd = _f(d.evidence.get("weight_decay_suggested"))
            changes = {"recipe.lr": new_lr, **({"recipe.weight_decay": new_wd} if new_wd is not None else {})}
            decay = (f" The weight decay {d.evidence.get('weight_decay'):g} → {new_wd:g} with it, so that at the raised lr "
                     "it does not pull the weights in faster than the steps move them." if new_wd is not None else "")
            out.append(self.intervention(
                K.RECIPE_EDIT, d, changes, risk=Risk.MEDIUM,
                rationale=f"{d.summary}. A step moves the weights about as the learning rate to the power "
                          f"{self.thresholds.small_updates_exponent:g}, so lr {lr:.3g} → {new_lr:.3g} brings a step "
                          "to the share a healthy run's first steps move "
                          f"(the backtest compares that with carrying on).{decay}",
                expected_effect="each step moving the weights several times more; the loss falling faster and "
                                "held-out accuracy leaving its level within a few evals"))
        elif "strong_decay" in found:
            # the decay, not the data or the lr, shrinks what the steps learn: lower it and go on from
            # the live weights (smaller weights are not broken weights: the updates grow them back)
            d = found["strong_decay"]
            wd, new_wd = _f(d.evidence.get("weight_decay")), _f(d.evidence.get("weight_decay_suggested"))
            out.append(self.intervention(
                K.RECIPE_EDIT, d, {"recipe.weight_decay": new_wd}, risk=Risk.MEDIUM,
                rationale=f"{d.summary}. Weight decay {wd:g} → {new_wd:g}: at the recipe's lr it then pulls the "
                          "weights in no faster than a healthy run's steps keep their size (the backtest compares "
                          "that with carrying on).",
                expected_effect="the weights' norm levelling off or growing again; the loss falling faster and "
                                "held-out rising within a few evals"))
        elif "small_batch" in found:
            # the gradient's noise scale names the batch: average enough examples per step for the
            # signal to stand above the noise, from the live weights
            d = found["small_batch"]
            b, new_b = d.evidence.get("batch_size"), d.evidence.get("batch_suggested")
            out.append(self.intervention(
                K.RECIPE_EDIT, d, {"recipe.batch_size": int(new_b)}, risk=Risk.MEDIUM,
                rationale=f"{d.summary}. Batch {b:g} → {new_b}: about {self.thresholds.batch_aim:g}× the noise scale's "
                          "lower bound, so a step's gradient is mostly signal (the backtest compares that with carrying "
                          "on; a raise this large is rated high until it is validated on held-out).",
                expected_effect="the loss falling faster and more steadily; held-out rising within a few evals"))
        elif "inflated_weights" in found or ("not_learning" in found and not any(
                iv.status in IN_EFFECT and iv.diagnosis.name in ("not_learning", "small_updates") and "recipe.lr" in iv.changes
                for iv in ctx.history)):
            # a learning rate moved for not_learning (or raised for small steps) that left the run not
            # learning is no cure to move again by rule: the search (agents/explorer.py) goes on from
            # there, bracketed by the old lr. Weights inflated again name their cause again: the lr
            # in force is still far too high, and comes down again from the untrained start
            d = found.get("inflated_weights") or found["not_learning"]
            # the larger of the schedule's peak and the lr logged now: during a warm-up the logged lr
            # is a small share of the peak the run will train at
            lr = max((x for x in (_f(ctx.get("recipe.lr")), _f(d.evidence.get("lr_now"))) if x), default=None)
            # Adam above ~1e-2 almost never trains a transformer: go at least to 1e-3 there
            new_lr = float(f"{min(lr * LR_FACTOR, 1e-3) if lr > 1e-2 else lr * LR_FACTOR:.6g}") if lr else None
            why = worthless_weights(ev, ctx.checkpoints, self.thresholds.not_learning_heldout_max)
            if why is None and d.name == "inflated_weights" and any(c.get("name") == INIT_CHECKPOINT
                                                                     for c in ctx.checkpoints):
                why = f"its weights grew to {d.evidence['weight_growth']:.3g}× their untrained size"
            if new_lr and why is not None:
                # the weights trained at this lr are no better than the start (often worse: saturated
                # units, inflated weights, Adam moments sized for the wrong lr), so start over
                out.append(self.intervention(
                    K.ROLLBACK, d, {"recipe.lr": new_lr}, risk=Risk.MEDIUM, rollback_to=INIT_CHECKPOINT,
                    rationale=f"{d.summary}. {why[0].upper()}{why[1:]} and no spike marks a "
                              f"divergence: a learning rate of {lr:.3g} is the likeliest cause. The weights trained "
                              f"at it are no better than the start, so the run restarts from its untrained "
                              f"checkpoint {INIT_CHECKPOINT!r} at lr {new_lr:.3g} (the backtest compares that with "
                              "carrying on).",
                    expected_effect="loss falling within ~40 steps of the restart and held-out accuracy leaving "
                                    "zero within a few hundred"))
            elif new_lr:
                out.append(self.intervention(
                    K.RECIPE_EDIT, d, {"recipe.lr": new_lr}, risk=Risk.MEDIUM,
                    rationale=f"{d.summary}. No spike marks a divergence to roll back from; a learning rate of "
                              f"{lr:.3g} that never let the loss fall is the likeliest cause, so it is lowered "
                              f"to {new_lr:.3g} (the backtest decides whether that helps).",
                    expected_effect="loss falling within ~50 steps and held-out accuracy leaving zero"))
        if "kl_blowup" in found:
            out.append(self._kl(found["kl_blowup"], ctx))
        for n in ("low_temperature", "entropy_collapse"):
            if n in found:
                d = found[n]
                temp = max(TEMPERATURE, _f(ctx.get("harness.sampling.temperature")) or 0.0)
                out.append(self.intervention(
                    K.HARNESS_EDIT, d, {"harness.sampling.temperature": temp}, risk=Risk.MEDIUM,
                    rationale=f"{d.summary}. Without sampling diversity a GRPO group has no reward variance and "
                              f"so no advantage; sampling at temperature {temp} restores exploration.",
                    expected_effect="distinct completions within a group, reward_std > 0 and entropy back up "
                                    "within ~20 steps; held-out accuracy rising again"))
                break
        return out

    def _rollback(self, diverged: list[Diagnosis], ctx: OperatorContext, harness_step: int | None = None,
                  drift: Diagnosis | None = None) -> Intervention:
        main = diverged[0]
        onset = min(int(d.evidence.get("onset_step", d.step)) for d in diverged)
        # the row at step s reports a loss measured on the weights after s-1 updates: the last
        # weights untouched by the bad update at `onset - 1` are those of step `onset - 2`
        ckpt = ctx.checkpoint_before(onset - 2)
        lr_before = next((_f(d.evidence.get("lr_before")) for d in diverged if _f(d.evidence.get("lr_before"))), None)
        lr_now = next((_f(d.evidence.get("lr_now")) for d in diverged if _f(d.evidence.get("lr_now"))), None)
        known_lr = _f(ctx.get("recipe.lr"))
        since = drift.evidence.get("since_step") if drift is not None else None
        if known_lr and isinstance(since, (int, float)):
            # the detectors find the lr in force is not the one set (lr_drift): that names the cause,
            # so the lr goes back to the recipe's, and the steps trained at the wrong lr go too where
            # a checkpoint predates them (as the lr_drift fix does without a divergence)
            new_lr = known_lr
            ckpt = ctx.checkpoint_before(min(onset - 2, int(since) - 1)) or ckpt
            why_lr = (f"the live learning rate is {_f(drift.evidence.get('lr_live')) or 0:.3g} since step {int(since)}, "
                      f"not the recipe's {known_lr:.3g} (lr_drift); it goes back to {known_lr:.3g}")
            main = main.model_copy(update={"evidence": {**main.evidence, "lr_drift_since_step": int(since)}})
        elif lr_before and lr_now and lr_now >= LR_JUMP * lr_before:
            new_lr = lr_before  # the lr itself jumped right before the spike: go back to the lr that trained stably
            why_lr = f"the learning rate jumped from {lr_before:.3g} to {lr_now:.3g} just before; it goes back to {lr_before:.3g}"
        elif harness_step is not None:
            # the harness changed right before the divergence with the lr unchanged: the change is the
            # cause, and the checkpoint from before it holds the harness that trained stably
            new_lr = None
            why_lr = (f"the harness changed at step {harness_step}, just before, with the learning rate unchanged: the "
                      "checkpoint's harness and learning rate are kept")
        else:
            known_lrs = [x for x in (lr_before, lr_now, known_lr) if x]
            new_lr = min(known_lrs) * LR_FACTOR if known_lrs else None
            why_lr = f"the learning rate is lowered ×{LR_FACTOR} to {new_lr:.3g}" if new_lr else "no learning rate is known"
        changes = {"recipe.lr": float(f"{new_lr:.6g}")} if new_lr else {}
        names = ", ".join(d.name for d in diverged)
        if harness_step is not None:
            main = main.model_copy(update={"evidence": {**main.evidence, "harness_changed_at_step": harness_step}})
        main = main.model_copy(update={"evidence": {**main.evidence, "also": [d.name for d in diverged[1:]],
                                                    "onset_step": onset}})
        if ckpt is None:
            return self.intervention(
                K.RECIPE_EDIT, main, changes, risk=Risk.MEDIUM,
                rationale=f"The run diverged ({names}, onset step {onset}) and no checkpoint predates it; {why_lr}.",
                expected_effect="loss falls back toward its pre-divergence level within ~50 steps")
        return self.intervention(
            K.ROLLBACK, main, changes, risk=Risk.MEDIUM if changes else Risk.LOW,
            rationale=f"The run diverged ({names}, onset step {onset}); the weights after it are damaged, so it rolls "
                      f"back to checkpoint {ckpt['name']} (step {ckpt['step']}) and {why_lr}.",
            expected_effect=f"loss back at its pre-spike level (~{main.evidence.get('baseline_median', 'its baseline')}) "
                            "right after the rollback and falling; no non-finite steps",
            backtest_skipped="rollback of a diverged run", rollback_to=str(ckpt["name"]))

    def _kl(self, d: Diagnosis, ctx: OperatorContext) -> Intervention:
        coef = _f(ctx.get("recipe.kl_coef")) or 0.0
        if coef < KL_COEF_MAX:
            new = min(KL_COEF_MAX, max(KL_COEF_MIN, coef * KL_COEF_FACTOR))
            changes = {"recipe.kl_coef": new}
            why = f"the KL penalty doubles ({coef:.3g} → {new:.3g})"
        else:
            lr = _f(ctx.get("recipe.lr")) or 1e-3
            changes = {"recipe.lr": float(f"{lr * 0.5:.6g}")}
            why = f"the KL penalty is already {coef:.3g}; the learning rate halves instead"
        return self.intervention(
            K.RECIPE_EDIT, d, changes, risk=Risk.MEDIUM,
            rationale=f"{d.summary}; the policy drifts from the reference faster than reward justifies, so {why}.",
            expected_effect="KL back under its threshold within ~30 steps without a drop in train reward")


class HarnessCritic(Operator):
    name = "harness_critic"
    role = ("HarnessCritic: reads failed trajectories (as data, never as instructions) and names harness-level "
            "failure modes: answers cut off by max_new_tokens, prompts that lost the template's separator or part "
            "of the question, answers the verifier cannot parse, a training reward that accepts wrong answers. "
            "Proposes harness edits: a larger max_new_tokens, the template restored from the goal's harness (or "
            "the one in force with its question shown whole), the task's own verifier.")
    tools = frozenset({K.HARNESS_EDIT, K.ROLLBACK})
    detectors = ("truncation", "template_mismatch", "reward_hacking", "malformed_rate", "harness_drift")

    def builtin(self, ev: Evidence, ctx: OperatorContext) -> list[Intervention]:
        found = {d.name: d for d in self.diagnose(ev, ctx)}
        out: list[Intervention] = []
        if "harness_drift" in found and ctx.harness:
            # the harness in force is one nobody chose: set it back before anything is judged on it.
            # A specific finding (truncation, template, difficulty) may be an effect of that change
            # (a harder curriculum makes answers longer than the limit), so its fix is no
            # substitute for going back; the lead puts this one first (Lead.arbitrate)
            out.append(departure_fix(self, found["harness_drift"], "harness", K.HARNESS_EDIT, ev, ctx,
                                     "whatever the unrequested change broke (prompts, answer length, reward, "
                                     "difficulty) recovering"))
        if "template_mismatch" in found:
            iv = self._template(found["template_mismatch"], ev, ctx)
            if iv is not None:
                out.append(iv)
        if "truncation" in found:
            out.append(self._truncation(found["truncation"], ctx))
        if "reward_hacking" in found:
            out.append(self._verifier(found["reward_hacking"], ctx))
        return out

    def _verifier(self, d: Diagnosis, ctx: OperatorContext) -> Intervention:
        """The task's own verifier back. Medium risk, not high: it does not loosen the reward, it puts
        back the verifier held-out accuracy is measured with. The weights trained on the exploit since
        the onset are rolled back when a checkpoint predates it (by the time an edit alone lands, the
        policy may have lost what it knew: measured on the reward_hack goal, held-out 0.68 → 0.04 in
        50 steps)."""
        changes = {"harness.reward.verifier": "task"}
        why = (f"{d.summary}. Held-out accuracy uses the task's verifier; training on a reward that disagrees "
               "with it teaches the policy to exploit the difference")
        onset = d.evidence.get("onset_step")
        ckpt = ctx.checkpoint_before(int(onset)) if isinstance(onset, (int, float)) else None
        if ckpt is None:
            return self.intervention(
                K.HARNESS_EDIT, d, changes, risk=Risk.MEDIUM, rationale=why + ".",
                expected_effect="train pass rate drops to meet held-out accuracy at first, then both rise together")
        return self.intervention(
            K.ROLLBACK, d, changes, risk=Risk.MEDIUM, rollback_to=str(ckpt["name"]),
            rationale=f"{why}; the run rolls back to checkpoint {ckpt['name']} (step {ckpt['step']}, before the "
                      f"divergence at step {onset}) and trains on with the task's verifier.",
            expected_effect="train pass rate and held-out accuracy rising together from the checkpoint's level; "
                            "no samples scored correct that the task calls wrong")

    def _truncation(self, d: Diagnosis, ctx: OperatorContext) -> Intervention:
        # sized from metrics only (response_len is what the trainer counted), never from sample text
        cut = math.ceil(_f(d.evidence.get("response_len_max")) or 0.0)   # tokens generated when cut off
        cands = [2 * cut + TOKENS_SLACK]
        need = _f(d.evidence.get("written_max"))     # the task's own longest answer, where its facts are known
        if need:
            cands.append(int(need) + TOKENS_SLACK)
        known = _f(ctx.get("harness.sampling.max_new_tokens"))
        drifted = any(f.name == "harness_drift" for f in ctx.findings or [])
        if known and known > cut and drifted and not need:
            cands = [int(known)]    # the harness in force is not the one set, and the set limit is above the cut: set it again
        elif known and known > cut:
            cands.append(int(known))                         # the controller's value is not what runs
        new = int(min(MAX_NEW_TOKENS_CAP, max(cands)))
        return self.intervention(
            K.HARNESS_EDIT, d, {"harness.sampling.max_new_tokens": new}, risk=Risk.MEDIUM,
            rationale=f"{d.summary}. "
                      + (f"Completions stop at ~{cut:.0f} tokens without the stop text, so answers are cut off; " if cut
                         else "The task's answers do not fit the limit; ")
                      + f"max_new_tokens goes to {new} "
                      + (f"(the controller's limit: the live harness is not the one it set, harness_drift)." if new == known and drifted
                         else f"(the task's longest answer + {TOKENS_SLACK})." if need and new == int(need) + TOKENS_SLACK
                         else f"(2× the cut-off length + {TOKENS_SLACK}, at least the intended limit)."),
            expected_effect="truncation_rate near 0 and malformed/truncated verdicts turning into scored answers "
                            "within a few steps")

    def _template(self, d: Diagnosis, ev: Evidence, ctx: OperatorContext) -> Intervention | None:
        """The template restored. When the prompts broke mid-run (the live harness changed at a step
        the metrics show, and a checkpoint of this run predates it), the run also rolls back to that checkpoint: the
        steps trained on broken prompts can undo what the policy had learnt (measured on the
        broken_template goal: held-out 0.64 → 0.03 within 50 steps of the break), and the
        controller may see the break hundreds of steps late on a fast run."""
        source, template = restore_template(ev, ctx)
        if template is None:
            return None
        bad = d.evidence.get("harness_changed_at_step")
        ckpt = ctx.checkpoint_before(int(bad) - 1) if isinstance(bad, (int, float)) and bad > 0 else None
        if ckpt is not None and ckpt.get("step", 0) > 0:
            return self.intervention(
                K.ROLLBACK, d, {"harness.template": template}, risk=Risk.MEDIUM, rollback_to=str(ckpt["name"]),
                rationale=f"{d.summary}. The harness changed at step {bad}; the run rolls back "
                          f"to checkpoint {ckpt['name']} (step {ckpt['step']}, before that) and trains on with the "
                          f"template from {source}.",
                expected_effect="held-out accuracy back to the checkpoint's level at once and rising from there; "
                                "prompts carry the template again")
        why = ("the policy cannot answer a question it is not shown whole" if d.evidence.get("mode") == "question_lost"
               else "the prompts no longer match the template the policy learned, so its answers start in the wrong place")
        return self.intervention(
            K.HARNESS_EDIT, d, {"harness.template": template}, risk=Risk.MEDIUM,
            rationale=f"{d.summary}. {why[0].upper() + why[1:]}; the template comes from {source}.",
            expected_effect="prompts carry the template's text again; malformed rate back to its earlier level "
                            "and pass rate recovering within ~20 steps")


def departure_fix(op: Operator, d: Diagnosis, section: str, edit: K, ev: Evidence, ctx: OperatorContext,
                  recovers: str) -> Intervention:
    """The fix of a departure finding (harness_drift, recipe_drift: the live `section` reports a
    version the controller did not set, since `since_step`): every field of the section set again
    to the controller's value; and the run rolled back to the newest checkpoint before the
    departure when the target measured since is worse than at that checkpoint by more than
    `departure_harm` (`departure_harmed`) and going back throws away no stake (`rollback_stake`,
    the rule the controller reads again when it applies the rollback). Which field changed the version
    does not say whether the steps since harmed the weights (a broken template can take held-out
    from 0.64 to 0.03 within 50 steps, while a lower answer limit leaves SFT's weights as they
    were and a run restarted from its first checkpoint may spend a thousand steps on a plateau
    the original had half crossed), so going back needs measured harm. `edit` is the kind
    otherwise."""
    data = ctx.harness if section == "harness" else ctx.recipe
    changes = config_fields(section, data or {})
    since = d.evidence.get("since_step")
    ckpt = ctx.checkpoint_before(int(since) - 1) if isinstance(since, (int, float)) and since > 0 else None
    if ckpt is not None and rollback_stake(eval_series(ev, ctx.target.metric), int(ckpt["step"]), ev.step, ctx.verify_steps,
                                           op.thresholds.departure_harm, ctx.target.op == ">="):
        ckpt = None
    harm = departure_harmed(ev, ctx, int(ckpt["step"]), int(since), op.thresholds.departure_harm) if ckpt else None
    if harm is None:
        ckpt = None
    why = f"{d.summary}. Which field changed the version does not say, so every {section} field is set again to the controller's value"
    effect = f"the live {section} version back to the controller's at once; {recovers}"
    if ckpt is not None and K.ROLLBACK in op.tools:
        return op.intervention(
            K.ROLLBACK, d, changes, risk=Risk.MEDIUM, rollback_to=str(ckpt["name"]),
            rationale=f"{why}, from checkpoint {ckpt['name']} (step {ckpt['step']}, the newest before the change at "
                      f"step {since}): the steps since trained on a config nobody chose, and {harm}.",
            expected_effect=effect + " from the checkpoint's level")
    return op.intervention(edit, d, changes, risk=Risk.MEDIUM, rationale=why + " (no checkpoint predates the change).",
                           expected_effect=effect)


def harness_changed_at(ev: Evidence, onset: int, within: int = HARNESS_ONSET_STEPS) -> int | None:
    """The step at which the run's harness version changed within `within` steps before (or at)
    `onset`, from the metrics rows' harness_version; None when it did not."""
    rows = [r for r in ev.metrics if isinstance(r.get("harness_version"), str) and isinstance(r.get("step"), int)]
    prev = None
    for r in rows:
        if prev is not None and r["harness_version"] != prev and onset - within <= r["step"] <= onset:
            return int(r["step"])
        prev = r["harness_version"]
    return None


# a question no template text could contain by accident: a template carries the question whole
# when it renders this one intact
_PROBE = "1234567890+abcdefghij?"


def carries_question(t: Any) -> bool:
    """Does template `t` put the whole question in the prompt (and nothing but fixed text around it)?"""
    if not isinstance(t, str):
        return False
    try:
        out = t.format(question=_PROBE)
    except (KeyError, IndexError, ValueError):
        return False
    return _PROBE in out and out != _PROBE


def whole_question(t: Any) -> str | None:
    """Template `t` with each of its `{question...}` fields rendered whole (its format spec and
    conversion dropped: `{question:.3}=` → `{question}=`), or None when that does not give a
    template that carries the question (no question field, other fields)."""
    if not isinstance(t, str):
        return None
    try:
        parts = list(string.Formatter().parse(t))
    except ValueError:
        return None
    out = []
    for literal, field, _spec, _conv in parts:
        out.append(literal.replace("{", "{{").replace("}", "}}"))
        if field is not None:
            if field != "question":
                return None
            out.append("{question}")
    fixed = "".join(out)
    return fixed if fixed != t and carries_question(fixed) else None


def restore_template(ev: Evidence, ctx: OperatorContext) -> tuple[str, str | None]:
    """The template to restore and where it came from: the goal's starting harness, the harness the
    controller knows, or the earliest harness the run stored, the first of them that carries the
    question whole; else the template in force with its question field rendered whole (a starting
    template that cuts the question has nothing to go back to). Never text from trajectories."""
    for source, h in (("the goal's starting harness", ctx.start_harness), ("the controller's harness", ctx.harness)):
        t = (h or {}).get("template")
        if carries_question(t):
            return source, t
    stored = sorted(pathlib.Path(ev.run_dir, "harnesses").glob("*.yaml"), key=lambda p: p.stat().st_mtime)
    for p in stored:
        try:
            t = (yaml.safe_load(p.read_text()) or {}).get("template")
        except (OSError, yaml.YAMLError):
            continue
        if carries_question(t):
            return f"the earliest stored harness ({p.stem})", t
    live = ctx.get("harness.template")
    fixed = whole_question(live)
    if fixed is not None:
        return f"the template in force ({live!r}) with its question field rendered whole", fixed
    return "nowhere", None


def default_operators() -> list[Operator]:
    from agents.explorer import Explorer   # it reads the others' detectors: imported here, not at the top

    return [ClusterOps(), Diagnostics(), HarnessCritic(), DataCuration(), Explorer()]


# ---- the lead -----------------------------------------------------------------------------------


def _same(a: Intervention, b: Intervention) -> bool:
    return a.kind == b.kind and a.changes == b.changes and rollback_target(a) == rollback_target(b)


def inconclusive(iv: Intervention) -> bool:
    """Rejected after a backtest that measured a gain too small to tell, found no credible harm
    (`BacktestResult.harmed`: a loss too small to tell is no evidence against the fix either), or
    measured nothing at all (every arm at, or within 3 held-out examples of, the same bound of a
    rate: `BacktestResult.measured_nothing`) — not a loss: the decision model backtests the same fix
    again over a doubled horizon (swarm.decisions.retry_horizon) until it runs out of them (then it
    is refused as `exhausted`, a loss)."""
    b = iv.backtest
    # no harm found, where the result says so and a control arm measured something (a backtest
    # whose arms produced no eval says nothing, and a longer one would not either)
    unharmed = b is not None and b.harmed is False and b.signal != "none"
    return (iv.status == Status.REJECTED and b is not None and not b.passed    # passed: a human said no
            and (b.effect > 0 or unharmed or b.measured_nothing())
            and not iv.outcome.refused and not iv.outcome.exhausted)


def settled_fix(history: list[Intervention], finding: str) -> Intervention | None:
    """The newest fix proposed in this run (`history`) for `finding`, when it failed (rejected or
    rolled back) and none of its fixes is pending or in effect."""
    fixes = [iv for iv in history if iv.diagnosis.name == finding]
    if not fixes or fixes[-1].status not in FAILED or any(iv.status in PENDING or iv.status in IN_EFFECT for iv in fixes):
        return None
    return fixes[-1]


def held_at_floor(history: list[Intervention], finding: str) -> Intervention | None:
    """The newest fix for `finding` (`settled_fix`), when its backtest measured nothing (every arm at
    the same bound of the target: `BacktestResult.measured_nothing`). Arms that cannot leave the
    floor with the fix show that something else holds the run there too: the fix may be right and
    wait for the other fault's."""
    last = settled_fix(history, finding)
    return last if last is not None and last.backtest is not None and last.backtest.measured_nothing() else None


def retries_floor(history: list[Intervention], iv: Intervention) -> bool:
    """Whether `iv` tries again the last fix for its finding whose backtest measured nothing
    (`held_at_floor`): its changes include that fix's (from the live weights again, over a longer
    horizon, or from another checkpoint). Another change for the same finding (the search's next
    candidate) is no retry."""
    fix = held_at_floor(history, iv.diagnosis.name)
    return fix is not None and bool(fix.changes) and all(k in iv.changes and iv.changes[k] == v for k, v in fix.changes.items())


class Lead:
    """Turns the goal into a plan and arbitrates between the operators' proposals."""

    name = "lead"
    role = ("The lead: turns the goal into a plan, arbitrates between the operators' proposals (one intervention "
            "per kind at a time, no two conflicting edits of one field, nothing that was already rejected or "
            "rolled back), and writes the reports.")

    def __init__(self, recent: int = RECENT_HISTORY, avoid_after_losses: int = 0) -> None:
        self.recent = recent
        self.avoid_after_losses = avoid_after_losses     # memory: see agents.recall.avoid_reason
        self.dropped: list[tuple[Intervention, str]] = []   # last arbitration's rejects and why

    def arbitrate(self, proposals: list[Intervention], ctx: OperatorContext) -> list[Intervention]:
        """The proposals to go ahead with, most urgent first:
        - a job action on a critical finding (a crashed or stalled job restarted, a divergence rolled
          back) first, unless it retries a fix that measured nothing (`retries_floor`) and can wait
          (`cannot_wait`); then a departure's fix (DEPARTURE: the live config left what was set)
          before the others, whose evidence comes from a config nobody chose, whatever their
          severity; then a retry of a fix
          that measured nothing after the fixes of other causes: something else holds the run at the
          floor too, and the other cause's fix, carrying the first (swarm.deciding `carrying`), tests
          both where a retry of the first alone would not; then the most severe diagnosis first; then
          job actions, data, harness, recipe;
        - one per signature (diagnosis|kind|fields), one per kind, one job action (restart or rollback);
        - none identical to a recent rejected or rolled-back one (unless its backtest was only
          inconclusive: the longer retry is the decision model's), to one still pending however old,
          or to one in effect (a restart may repeat: a job can crash twice);
        - none touching a field that a chosen or pending intervention sets to another value;
        - with a rollback chosen, no non-critical edit ranked after it (its evidence comes from the
          damaged run), and no non-critical rollback ranked after a non-critical edit (the edit goes
          first);
        - none whose fix lost in past episodes (ctx.episodes) `avoid_after_losses` times and never won;
        - among equals, one for a named cause before one for the bare symptom of a dead or hung job
          (JOB_FINDINGS: a restart for `out_of_memory` before a restart for `crashed_job`), then a
          proposal a skill backs.
        `self.dropped` says why each other proposal was left out."""
        self.dropped = []
        recent = ctx.history[-self.recent :]
        pending_fields: dict[str, Any] = {}
        for h in ctx.history:             # pending however old: one waiting for a human may be far back
            if h.status in PENDING:
                pending_fields.update(h.changes)
        floor = {i for i, iv in enumerate(proposals) if retries_floor(ctx.history, iv)}
        order = sorted(enumerate(proposals), key=lambda p: (not (p[1].kind in JOB_ACTIONS and p[1].diagnosis.severity == "critical"
                                                                  and (cannot_wait(p[1]) or p[0] not in floor)),
                                                             p[1].diagnosis.name not in DEPARTURE,
                                                             p[0] in floor,
                                                             SEVERITY_RANK.get(p[1].diagnosis.severity, 3),
                                                             KIND_RANK.get(p[1].kind, 9), p[1].diagnosis.name in JOB_FINDINGS,
                                                             not p[1].skills_used, p[0]))
        chosen: list[Intervention] = []
        sigs: set[str] = set()
        fields: dict[str, Any] = {}

        def drop(iv: Intervention, why: str) -> None:
            self.dropped.append((iv, why))

        for _, iv in order:
            if iv.signature() in sigs:
                drop(iv, "duplicate signature")
                continue
            why = avoid_reason(iv, ctx, self.avoid_after_losses)
            if why is not None:
                drop(iv, why)
                continue
            prior = next((h for h in reversed(ctx.history) if h.status in PENDING and _same(h, iv)), None) \
                or next((h for h in reversed(recent) if _same(h, iv)), None)
            if prior is not None and prior.status in FAILED and iv.kind != K.RESTART and not inconclusive(prior):
                drop(iv, f"identical to {prior.id}, {prior.status.value}")
                continue
            if prior is not None and prior.status in PENDING:
                drop(iv, f"identical to {prior.id}, still {prior.status.value}")
                continue
            if prior is not None and prior.status in IN_EFFECT and iv.kind != K.RESTART:
                drop(iv, f"identical to {prior.id}, already {prior.status.value}")
                continue
            if any(c.kind == iv.kind for c in chosen):
                drop(iv, f"another {iv.kind.value} goes first")
                continue
            if iv.kind in JOB_ACTIONS and any(c.kind in JOB_ACTIONS for c in chosen):
                drop(iv, "another restart/rollback goes first")
                continue
            if (iv.kind == K.ROLLBACK and iv.diagnosis.severity != "critical"
                    and any(c.kind != K.ROLLBACK and c.diagnosis.severity != "critical" for c in chosen)):
                drop(iv, "deferred: a fix ranked ahead of it changes the run it would roll back")
                continue
            clash = next((k for k, v in iv.changes.items()
                          if (k in fields and fields[k] != v) or (k in pending_fields and pending_fields[k] != v)), None)
            if clash is not None:
                drop(iv, f"conflicting edit of {clash}")
                continue
            chosen.append(iv)
            sigs.add(iv.signature())
            fields.update(iv.changes)
        first = next((i for i, c in enumerate(chosen) if c.kind == K.ROLLBACK), None)
        if first is not None:
            # what the damaged weights show after the onset is no evidence for the rolled-back run
            for c in [c for c in chosen[first + 1:] if c.kind != K.ROLLBACK and c.diagnosis.severity != "critical"]:
                chosen.remove(c)
                drop(c, "deferred: its evidence comes from the run being rolled back")
        return chosen

    def plan(self, goal: Any) -> str:
        """A short text plan for a Goal (swarm.goal.Goal or its public dict)."""
        g = goal.public() if hasattr(goal, "public") else dict(goal)
        g.pop("perturbations", None)
        t = g.get("target") or {}
        run = g.get("run") or {}
        rec, har = run.get("recipe") or {}, run.get("harness") or {}
        task = (run.get("task") or {}).get("name", "?")
        cur = har.get("curriculum") or {}
        budget = g.get("budget") or {}
        auto = [str(getattr(r, "value", r)) for r in (g.get("approval") or {}).get("auto", ["low", "medium"])]
        lines = [
            f"Goal: {g.get('goal', '').strip()}",
            f"1. Train {task} with {rec.get('algorithm', 'sft')} (lr {rec.get('lr', '?')}, batch {rec.get('batch_size', '?')}) "
            f"at difficulty {cur.get('start', '?')}{'→' + str(cur['end']) if cur.get('end') else ''}; "
            f"target {t.get('metric', 'heldout_acc')} {t.get('op', '>=')} {t.get('threshold', '?')} on the held-out split.",
            "2. Watch every observation: cluster ops (job, heartbeat, throughput), diagnostics (loss, grad norm, KL, "
            "entropy, plateaus), HarnessCritic (truncation, template, malformed answers, reward vs held-out), "
            "data curation (curriculum difficulty, label noise).",
            "3. Each proposal is checked as the trainer would check it, then backtested against a control from the "
            "current checkpoint (a restart or a divergence rollback skips it only when the controller's own detectors "
            f"confirm the crash or the divergence); the controller assigns the risk: {', '.join(auto) or 'none'} "
            "applies automatically, the rest waits for approval while training goes on.",
            "4. After applying, compare each window with the backtest's control arms (or the value before applying): "
            "keep on a measured gain, roll back if worse.",
            f"5. Stop at the target (confirmed on held-out) or at the budget: {budget.get('wall_s', '?')} s wall, "
            f"{budget.get('steps', '?')} steps, {budget.get('worker_cpu_s', '?')} worker CPU s.",
        ]
        return "\n".join(lines)
