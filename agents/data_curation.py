"""DataCuration: what the run trains on — the curriculum, the data filters, the labels, and which
revision of the data source it reads.

| finding                                             | intervention                                                  | risk   |
|-----------------------------------------------------|---------------------------------------------------------------|--------|
| a data change with an onset (labels that went wrong, harder problems, questions in another format, a stream that began to repeat a pool): the config unchanged | the source pinned to its revision before the onset (`harness.filters.as_of_step`); ROLLBACK to the newest checkpoint before it where the weights learnt wrong labels since | low / medium |
| too-hard curriculum                                 | DATA_CHANGE curriculum back to the eval difficulty            | low    |
| harder problems than the curriculum asks for        | DATA_CHANGE curriculum lowered by the levels they rose        | low    |
| a stream repeating a small pool (after the pin, or with no onset) | DATA_CHANGE filters.dedupe on                   | low    |
| SFT labels the task's verifier rejects (some pass)  | DATA_CHANGE filters.check_labels on                           | low    |
| SFT labels the task's verifier rejects (none passes) | ROLLBACK to before the onset with DISTILL's change (DISTILL without such a checkpoint) | medium |
| label noise                                         | DISTILL (SFT on the policy's verified successes)              | medium |
| two or more of these at once, each with a DATA_CHANGE | first one DATA_CHANGE making the first of each together (fields disjoint) | low |

A pin reads the source as it was: it undoes a change made to the data (a new export, a resampled
source, relabelled rows), not a fault of the reader, and it leaves the run on the data of that
revision until someone unpins it — the rationale tells the user the source changed and when.
"""
from __future__ import annotations

from typing import Any

from agents.base import Operator, OperatorContext, finite as _f
from agents.domain import SEVERITY_RANK, Diagnosis, Intervention, InterventionKind as K, Risk
from agents.evidence import Evidence
from harness.changes import SOURCE_REVISION

CURRICULUM_RAMP_STEPS = 100     # steps over which a lowered curriculum climbs back to the eval difficulty
PIN = SOURCE_REVISION
# the findings that name where the data changed, and whether the steps since learnt something wrong
# (wrong labels: roll back to before the change) or only learnt less (harder problems, another
# format, a repeating pool: pin from here)
DATA_ONSET = {"labels_fail_check": True, "label_noise": True, "answer_format": True, "harder_data": False,
              "question_format": False, "repeated_examples": False}


class DataCuration(Operator):
    name = "data_curation"
    role = ("Data curation: watches per-step pass rates, the training difficulty against the eval difficulty, "
            "the SFT loss floor and whether the stream repeats itself, got harder or writes its questions, or its labels "
            "(as the policy writes them back), in another format than the task's own. A curriculum nothing can be "
            "learnt from goes back to the eval difficulty (one lower first, ramping up); SFT on noisy labels "
            "switches to distillation on the policy's own verified successes; a stream that repeats a small pool "
            "of questions gets the dedupe filter; a stream that draws harder problems than the curriculum asks "
            "for gets a curriculum lowered by as many levels as its questions' lengths say it rose; SFT labels the "
            "task's own verifier rejects get the label check filter, which trains only on those it accepts, or, when none "
            "passes, distillation, which reads no label. Where the data changed at a step the evidence names, the data "
            "source is first read as it was before that step (harness.filters.as_of_step), and the fixes of faults of "
            "the data that come together are tried together.")
    tools = frozenset({K.DATA_CHANGE, K.DISTILL, K.ROLLBACK})
    detectors = ("too_hard_curriculum", "label_noise", "labels_fail_check", "repeated_examples", "harder_data",
                 "question_format", "answer_format")

    def builtin(self, ev: Evidence, ctx: OperatorContext) -> list[Intervention]:
        found = {d.name: d for d in self.diagnose(ev, ctx)}
        out: list[Intervention] = []
        pin = self._pin(found, ev, ctx)
        if pin is not None:
            out.append(pin)
        if "too_hard_curriculum" in found:
            out.append(self._curriculum(found["too_hard_curriculum"], ev, ctx))
        if "harder_data" in found:
            iv = self._lower(found["harder_data"], ctx)
            if iv is not None:
                out.append(iv)
        if "repeated_examples" in found:
            out.append(self._filter(
                found["repeated_examples"], "dedupe",
                "A policy trained on a few questions over and over memorises them instead of the task; the dedupe "
                "filter skips every question the run has already trained on, so each step sees new problems again.",
                "sampled questions distinct again at once; held-out accuracy rising where it had stalled"))
        d = found.get("labels_fail_check")
        passing = (_f(d.evidence.get("label_ok_mean")) or 0.0) if d is not None else None
        if d is not None and not d.evidence.get("filter_on") and passing > 0:
            out.append(self._filter(
                d, "check_labels",
                "A label the task itself calls wrong teaches a wrong answer; the label check filter trains only on "
                "the labels the task's verifier accepts (what it rejects is counted, never read).",
                "the SFT loss on the labels kept falling again; held-out accuracy rising where it had stalled or fallen"))
        elif d is not None and passing == 0 and max((_f(r.get("heldout_acc")) or 0.0 for r in ev.evals), default=0.0) > 0:
            # no label passes: a filter would leave nothing to train on, so train without the labels,
            # on what the policy answers right (it did on the held-out split)
            # from before the onset only when a passing stretch was seen before it: a window that fails
            # throughout shows no onset (its first row is not where the labels went wrong)
            before = d.evidence.get("onset_step") if d.evidence.get("label_ok_before") is not None else None
            out.append(self._distill(d, ctx, "None of the recent labels passes the task's own check, so a filter would "
                                     "leave nothing to train on. ", ctx.answering_before(before, ev.evals)))
        if "label_noise" in found and not any(iv.changes.get("recipe.algorithm") == "distill" for iv in out):
            out.append(self._distill(found["label_noise"], ctx))
        joint = self._together(out)
        return [joint, *out] if joint is not None else out

    def _together(self, out: list[Intervention]) -> Intervention | None:
        """One data change made of the first data change proposed for each finding, where two or more
        findings each have one and their fields do not overlap. Faults of the data come together (a
        stream that repeats a pool and got harder): each fix alone leaves the other fault holding the
        run, so a backtest of either alone measures no gain, and both are rejected. Proposed first;
        the single fixes follow if it is rejected. Its diagnosis is the most severe part's. A finding
        whose data changed at or after a proposed pin's step has no part: the pin undoes it."""
        pinned = next((iv.changes[PIN] for iv in out if PIN in iv.changes), None)
        firsts: dict[str, Intervention] = {}
        for iv in out:
            began = iv.diagnosis.evidence.get("good_before_step")
            if PIN not in iv.changes and pinned is not None and isinstance(began, int) and began >= pinned:
                continue     # a fault the pin reads from before already: its own fix would correct it twice
            if iv.kind == K.DATA_CHANGE:
                firsts.setdefault(iv.diagnosis.name, iv)
        parts = sorted(firsts.values(), key=lambda iv: SEVERITY_RANK.get(iv.diagnosis.severity, 3))
        changes: dict[str, Any] = {}
        for iv in parts:
            if set(iv.changes) & set(changes):
                return None
            changes.update(iv.changes)
        if len(parts) < 2:
            return None
        risk = max((iv.risk for iv in parts), key=[Risk.LOW, Risk.MEDIUM, Risk.HIGH].index)
        lead = parts[0].diagnosis
        answers = {"answers": sorted({iv.diagnosis.name for iv in parts})}
        return self.intervention(
            K.DATA_CHANGE, lead.model_copy(update={"evidence": {**lead.evidence, **answers}}), changes, risk=risk,
            rationale=" ".join(iv.rationale for iv in parts) + f" The {len(parts)} findings name different faults of "
                      "the data; their fixes are made together, since either alone leaves the other in force.",
            expected_effect="; ".join(iv.expected_effect for iv in parts))

    def _pin(self, found: dict[str, Diagnosis], ev: Evidence, ctx: OperatorContext) -> Intervention | None:
        """The data source read as it was before the earliest step a finding names as the first whose
        data changed (`good_before_step`, DATA_ONSET), from the newest checkpoint before it when the
        steps since learnt wrong labels (the untrained one too). None where no
        finding names such a step, or the source is read from that revision or an earlier one already."""
        named = [(d.evidence["good_before_step"], d) for n, d in found.items()
                 if n in DATA_ONSET and isinstance(d.evidence.get("good_before_step"), int)
                 and d.evidence["good_before_step"] >= 1]
        if not named:
            return None
        step, d = min(named, key=lambda x: x[0])
        now = ctx.get(PIN)
        if isinstance(now, int) and now <= step:
            return None
        why = (f"{d.summary}. The data changed from step {step} on, the config did not: the data source is read as it "
               f"was before step {step} (its revision then), so the run trains on data like what it learnt from before. "
               "The source itself needs fixing; the run stays on that revision until someone unpins it")
        effect = "the training signal back to its level before the change within ~20 steps; held-out accuracy rising again"
        # wrong labels were learnt unless the label check filter kept them out
        learnt = DATA_ONSET[d.name] and not d.evidence.get("filter_on")
        # any checkpoint from before the change: its weights learnt nothing of it (whether they
        # answered anything yet does not matter: the pinned data is right)
        ckpt = ctx.checkpoint_before(step) if learnt else None
        return self._from(ckpt, K.DATA_CHANGE, d, {PIN: step}, Risk.LOW, why, effect,
                          "), since the steps after it learnt from the changed data")

    def _distill(self, d: Diagnosis, ctx: OperatorContext, lead: str = "",
                 ckpt: dict[str, Any] | None = None) -> Intervention:
        """The recipe switched to distillation for finding `d`: the policy's own answers the task's
        verifier accepts as targets, no label read (medium risk: the objective changes); from
        checkpoint `ckpt` when the weights since it learnt from what the finding names."""
        changes: dict[str, Any] = {"recipe.algorithm": "distill"}
        if (_f(ctx.get("recipe.group_size")) or 8) < 2:
            changes["recipe.group_size"] = 4
        why = (f"{d.summary}. {lead}Distillation trains only on the policy's own answers that the task's verifier "
               "accepts, so wrong labels stop pulling it away from right answers")
        effect = "held-out accuracy rises past its SFT plateau within ~100 steps"
        return self._from(ckpt, K.DISTILL, d, changes, Risk.MEDIUM, why, effect,
                          ", before the labels went wrong), since the steps after it learnt them")

    def _from(self, ckpt: dict[str, Any] | None, kind: K, d: Diagnosis, changes: dict[str, Any], risk: Risk,
              why: str, effect: str, since: str) -> Intervention:
        """`changes` as a `kind` change from where the run is, or, from checkpoint `ckpt`, as a
        rollback (medium risk) whose rationale ends with why the steps `since` it are given up."""
        if ckpt is None:
            return self.intervention(kind, d, changes, risk=risk, rationale=why + ".", expected_effect=effect)
        return self.intervention(
            K.ROLLBACK, d, changes, risk=Risk.MEDIUM, rollback_to=str(ckpt["name"]),
            rationale=f"{why}; the run rolls back to checkpoint {ckpt['name']} (step {ckpt['step']}{since}.",
            expected_effect=effect)

    def _filter(self, d: Diagnosis, name: str, why: str, effect: str) -> Intervention:
        """The data filter `harness.filters.NAME` turned on for finding `d` (low risk: it only skips data)."""
        return self.intervention(K.DATA_CHANGE, d, {f"harness.filters.{name}": True}, risk=Risk.LOW,
                                 rationale=f"{d.summary}. {why}", expected_effect=effect)

    def _lower(self, d: Diagnosis, ctx: OperatorContext) -> Intervention | None:
        """The curriculum lowered by the levels the stream rose: the difficulty whose questions are
        as long as the stream's now (the task's own lengths, `ctx.question_chars`) minus the one the
        curriculum asks for. None when the lengths do not say (or the curriculum is at its floor)."""
        e, lens = d.evidence, ctx.question_chars
        asked, now = e.get("difficulty"), _f(e.get("question_chars_now"))
        if not isinstance(asked, int) or asked not in lens or now is None:
            return None
        drawn = min(lens, key=lambda x: (abs(lens[x] - now), x))
        levels = drawn - asked
        start = ctx.get("harness.curriculum.start")
        if levels < 1 or not isinstance(start, int):
            return None
        changes: dict[str, Any] = {"harness.curriculum.start": max(ctx.min_difficulty, start - levels)}
        end = ctx.get("harness.curriculum.end")
        if isinstance(end, int):
            changes["harness.curriculum.end"] = max(ctx.min_difficulty, end - levels)
        if all(ctx.get(k) == v for k, v in changes.items()):
            return None
        return self.intervention(
            K.DATA_CHANGE, d, changes, risk=Risk.LOW,
            rationale=f"{d.summary}. Questions of {now:.3g} characters are the task's difficulty {drawn} (its own "
                      f"lengths), {levels} above the {asked} the curriculum asks for; the curriculum goes {levels} "
                      "lower so that what the stream hands over is what was asked for again.",
            expected_effect="train pass rate back near its level before the shift within ~20 steps; held-out "
                            "accuracy rising again")

    def _curriculum(self, d: Diagnosis, ev: Evidence, ctx: OperatorContext) -> Intervention:
        e = d.evidence
        target = e.get("eval_difficulty")
        if not isinstance(target, int):
            target = int(e.get("window_min_difficulty") or ctx.min_difficulty or 1)
        start = max(ctx.min_difficulty, target - 1)
        changes: dict[str, Any] = {"harness.curriculum.start": start, "harness.curriculum.end": target,
                                   # the schedule counts from step 0: the ramp ends CURRICULUM_RAMP_STEPS from now
                                   "harness.curriculum.ramp_steps": (ev.step + CURRICULUM_RAMP_STEPS) if start != target else 0}
        return self.intervention(
            K.DATA_CHANGE, d, changes, risk=Risk.LOW,
            rationale=f"{d.summary}. Nothing is solved at difficulty {e.get('train_difficulty')}, so there is no "
                      f"learning signal; training moves to difficulty {start} and ramps to the eval difficulty {target}.",
            expected_effect=f"train pass rate above 0 within ~20 steps at difficulty {start}; held-out accuracy "
                            "rising as the ramp reaches the eval difficulty")


