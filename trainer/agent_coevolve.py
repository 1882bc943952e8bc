"""The agent trainer's critic rounds and distillation (trainer/agent_train.py `--critic`), and the
judge of distillation: the co-evolution stages that read trajectories and change the harness or
move a harness gain into the weights. `CriticStages` is a mixin of `trainer.agent_train.AgentTrainer`
(it uses the trainer's rollout, evaluation, optimiser and log); `judge_distillation` is a pure
function of per-episode outcomes. docs/agent-training.md, "Co-evolution and distillation".
"""
from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any, Callable

import torch

from harness.agent import AgentHarness, apply_edit
from harness.critic import Kept, Paired, critique, edit_record, judge_edit, paired_test
from trainer.agent_rollout import Trajectory, run_episode
from trainer.policy import Policy
from trainer.tasks.base import Example, Split
from trainer.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class DistillVerdict:
    """What distillation's judge decided, from per-episode outcomes on the same validation episodes
    before and after it, under the improved harness and under the starting one."""

    kept: bool              # the distilled weights stay (else the weights from before it are restored)
    reduced: bool           # the run goes back to the starting harness (the scaffolding is removed)
    moved: Paired           # under the starting harness: before -> after distillation
    reason: str


def _worse(before: list[bool], after: list[bool], alpha: float) -> tuple[bool, Paired]:
    """Is `after` significantly worse than `before` on the same episodes (one-sided exact McNemar
    at `alpha` on the losses)? The comparison as `before -> after`."""
    p = paired_test(before, after)
    reverse = paired_test(after, before)
    return p.losses > p.gains and reverse.p_value <= alpha, p


def judge_distillation(start_before: list[bool], start_after: list[bool], imp_before: list[bool],
                       imp_after: list[bool], alpha: float) -> DistillVerdict:
    """Distillation is an intervention on the weights and is judged like one. It is kept only when
    the gain moved into the weights: significantly more episodes solved under the starting harness
    than before it (one-sided exact McNemar at `alpha`). The run's level before it is the improved
    harness's success before it; with the distilled weights the run goes back to the starting
    harness (the scaffolding is removed) when that is not significantly worse than this level, else
    it stays on the improved harness when that is not. Otherwise (no gain moved, or the run would
    lose what it had) the weights from before distillation are restored: its compute is spent, its
    damage is not kept."""
    moved = paired_test(start_before, start_after)
    if moved.gains <= moved.losses or moved.p_value > alpha:
        return DistillVerdict(False, False, moved,
                              f"no significant gain under the starting harness at alpha={alpha:.3g}: {moved.text()}")
    start_worse, vs_start = _worse(imp_before, start_after, alpha)
    if not start_worse:
        return DistillVerdict(True, True, moved, f"the gain moved into the weights ({moved.text()}); the starting "
                              f"harness holds the run's level ({vs_start.text()}): the scaffolding is removed")
    imp_worse, vs_imp = _worse(imp_before, imp_after, alpha)
    if not imp_worse:
        return DistillVerdict(True, False, moved, f"the gain moved into the weights ({moved.text()}); the improved "
                              f"harness stays: the starting one is below the run's level ({vs_start.text()})")
    return DistillVerdict(False, False, moved, f"a significant loss of the run's level under either harness "
                          f"(starting: {vs_start.text()}; improved: {vs_imp.text()})")


class DemoGenerator:
    """A `Generator` that writes a demonstration's turns, one per call, as token ids; the rollout
    runs them through the real environment, so the demonstration's observations are the tool's."""

    def __init__(self, tok: Tokenizer, turns: list[str], max_len: int | None = None) -> None:
        self.tok, self.turns = tok, list(turns)
        if max_len is not None:   # the policy's length: the rollout keeps the demonstration within it
            self.max_len = max_len

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float, stop: list[str]) -> list[int]:
        return self.tok.encode(self.turns.pop(0))[:max_new_tokens] if self.turns else []


class CriticStages:
    """Critic rounds and distillation, for `AgentTrainer` (which provides cfg, env, policy, opt,
    harness, start_harness, edits, step, log, printer and the rollout, SFT and row methods)."""

    def outcomes(self, harness: AgentHarness, examples: list[Example]) -> list[bool]:
        """Greedy per-episode success under `harness` with the current weights."""
        return [t.result.verdict.value == "correct" for t in self.rollout_under(harness, examples, greedy=True)]

    def validation_episodes(self) -> list[Example]:
        """The held-out episodes the critic's candidates and distillation are judged on (after the
        eval episodes, so the reported held-out success is not the judge's)."""
        c = self.cfg.critic
        return [self.env.episode(Split.HELDOUT, self.cfg.eval_size + i, self.cfg.difficulty) for i in range(c.val_size)]

    def critic_round(self) -> dict[str, Any] | None:
        """Roll out train episodes (greedy), let the critic read them, measure its first candidate
        edits against the current harness on the same validation episodes with the same weights,
        and keep the best significant one. Returns the kept edit's record, or None."""
        c = self.cfg.critic
        self.apply_harness_change()
        t0 = time.perf_counter()
        trajs = self.rollout(self.next_train(c.read), greedy=True)
        crit = critique(trajs, self.harness, self.env.tool_specs())
        if self.log:
            self.log.event("critique", self.step, read=crit.read, failed=crit.failed, policy=crit.policy,
                           findings=[f.text() for f in crit.findings], edits=[e.text() for e in crit.edits],
                           refused=[f"{e.text()}: {why}" for e, why in crit.refused], notes=crit.notes)
        if self.printer:
            self.printer(f"[critic {self.step:4d}] {crit.failed}/{crit.read} failed; " +
                         ("; ".join(f.text() for f in crit.findings) or "no harness failure mode"))
        cands = crit.edits[: c.candidates]
        if not cands:
            return None
        val = self.validation_episodes()
        base = self.outcomes(self.harness, val)
        verdicts = []
        for e in cands:
            after = self.outcomes(apply_edit(self.harness, e.path, e.value), val)
            v = judge_edit(e, paired_test(base, after), c.alpha / len(cands))
            verdicts.append(v)
            rec = {**edit_record(v), "harness_version": self.harness.version}
            self.edits.append(rec)
            if self.log:
                self.log.event("harness_edit", self.step, **rec)
            if self.printer:
                self.printer(f"[critic {self.step:4d}] {'kept' if rec['kept'] else 'rejected'} {e.text()}: {v.reason}")
        kept = [v for v in verdicts if isinstance(v, Kept)]
        if not kept:
            self.write_row({**self.row_base("critic"), "kept": 0.0, "candidates": float(len(cands)),
                            "step_time": time.perf_counter() - t0})
            return None
        best = max(kept, key=lambda v: (v.paired.gains - v.paired.losses, -v.paired.p_value))
        self.harness = apply_edit(self.harness, best.edit.path, best.edit.value)
        self.write_row({**self.row_base("critic"), "kept": 1.0, "candidates": float(len(cands)),
                        "val_before": best.paired.before / best.paired.n, "val_after": best.paired.after / best.paired.n,
                        "p_value": best.paired.p_value, "step_time": time.perf_counter() - t0})
        return edit_record(best)

    def as_demonstration(self, t: Trajectory, harness: AgentHarness) -> list[str] | None:
        """A verified success's turns written in `harness`'s syntax: each tool call the trajectory
        made that ran without error (name and arguments as parsed), then its answer. None when
        it has no parsed answer."""
        if t.answer is None:
            return None
        turns = [harness.tool_syntax.render(s.tool, s.arguments or {}) for s in t.steps
                 if s.action == "tool_call" and s.error is None and s.tool is not None]
        return turns + [harness.answer.render(t.answer)]

    def distill(self, stop: Callable[[], bool] | None = None) -> dict[str, float]:
        """SFT of the weights on the improved harness's verified successes, written for the
        starting harness and replayed through the environment under it; `stop` (a caller's
        budget, e.g. benchmarks/coevolution.py's worker-CPU) is asked before each step and ends
        the stage when it answers True. Each step samples
        `distill_batch` fresh train episodes under the improved harness with the weights frozen at
        the start of distillation (the teacher; fresh episodes, as the warm-up's
        demonstrations are: a few hundred rows repeated for many steps are memorised, key by key,
        and the policy stops reading its observations); a replay is kept when it is verified under
        the starting harness too, with no tool error and no observation cut (a cut observation
        would teach an answer the policy was not shown).

        Then the stage is judged (`judge_distillation`) on the validation episodes under both
        harnesses, before its first update and after it: without a measured gain the weights and optimiser state from
        before it are restored; with one, the run goes back to the starting harness when that holds.
        The verdict is in the returned totals (`distill_kept`, `harness_reduced`, `distill_reason`)
        and in the `distill` event."""
        c = self.cfg.critic
        h = self.start_harness
        val = self.validation_episodes()
        before: tuple[list[bool], list[bool], dict[str, Any]] | None = None   # measured before the first update
        # the teacher: the weights as they act under the improved harness, frozen, so the rows keep
        # coming while the student's own behaviour shifts
        teacher = Policy(self.policy.cfg, self.policy.tok, copy.deepcopy(self.policy.model))
        teacher.model.requires_grad_(False)
        totals: dict[str, Any] = {"distill_episodes": 0.0, "distill_successes": 0.0, "distill_rows": 0.0,
                                  "distill_steps": 0.0}
        for i in range(c.distill_steps):
            if stop is not None and stop():
                break
            t0 = time.perf_counter()
            examples = self.next_train(c.distill_batch)
            with torch.no_grad():
                trajs = self.rollout(examples, policy=teacher)
            wins = [(ex, t) for ex, t in zip(examples, trajs) if t.result.verdict.value == "correct"]
            replays: list[Trajectory] = []
            for ex, t in wins:
                turns = self.as_demonstration(t, h)
                if turns is None:
                    continue
                r = run_episode(DemoGenerator(self.policy.tok, turns, self.policy._max_len()), self.env, ex, h)
                if r.reward == 1.0 and not r.tool_errors and not r.observations_cut:
                    replays.append(r)
            totals["distill_episodes"] += len(examples)
            totals["distill_successes"] += len(wins)
            totals["distill_rows"] += len(replays)
            if i == 2 and not totals["distill_rows"]:   # the starting harness verifies none of them: stop
                if self.printer:
                    self.printer(f"[distill {self.step:4d}] no success of the improved harness replays under the "
                                 "starting harness: nothing to distil")
                break
            lr = self._lr(c.distill_lr, c.distill_warmup_steps, i)
            if replays and before is None:
                before = (self.outcomes(h, val), self.outcomes(self.harness, val),
                          {"model": copy.deepcopy(self.policy.model.state_dict()),
                           "opt": copy.deepcopy(self.opt.state_dict())})
            out = self.sft_on(replays, lr) if replays else {"loss": 0.0, "grad_norm": 0.0, "skipped": 1.0}
            self.step += 1
            totals["distill_steps"] += 1
            if (i + 1) % self.cfg.log_every == 0 or i == c.distill_steps - 1:
                self.write_row({**self.row_base("distill"), **out, "rows": float(len(replays)), **totals,
                                "step_time": time.perf_counter() - t0})
        if before is None:   # no update: the weights are as they were
            totals.update({"distill_kept": 0.0, "harness_reduced": 0.0, "distill_reason": "no distillation row: no update"})
        else:
            start_before, imp_before, saved = before
            v = judge_distillation(start_before, self.outcomes(h, val), imp_before, self.outcomes(self.harness, val),
                                   c.alpha)
            if not v.kept:
                self.policy.model.load_state_dict(saved["model"])
                self.opt.load_state_dict(saved["opt"])
            elif v.reduced:
                self.harness = h
            totals.update({"distill_kept": float(v.kept), "harness_reduced": float(v.reduced),
                           "distill_reason": v.reason})
            if self.printer:
                self.printer(f"[distill {self.step:4d}] {'kept' if v.kept else 'rolled back'}: {v.reason}")
        if self.log:
            self.log.event("distill", self.step, **totals)
        return totals
