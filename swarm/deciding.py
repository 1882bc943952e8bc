"""The controller's side of the decision model: gathers the inputs of `swarm.decisions`' pure
functions (the tick's findings, the change's validity and risk, the backtest's arms, the
evaluation window and its control) and acts on their results. A mixin of
`swarm.controller.Controller` (a proposal's preparation and worth, and the graph's backtest and
evaluate nodes live here); every rule is
in swarm/decisions.py, this module only does the I/O.
"""
from __future__ import annotations

import contextlib
import math
import re
import statistics
import time
from typing import Any, Iterator

import yaml

from agents.base import rollback_target
from agents.detection import THRESHOLDS
from agents.domain import DEPARTURE, JOB_ACTIONS, SLOW_WORKER, Intervention, InterventionKind, JobStatus, Status
from agents.evidence import is_eval_row
from agents.explorer import CAUSES, spent, take_fix
from agents.operators import held_at_floor, inconclusive, retries_floor, worthless_weights
from agents.progress import config_fields, eval_series, progress_since, rollback_stake
from swarm.backtest import (arm_name, check_change, heldout_comparable, nearest_valid, noop_edit, result, rollback_horizon, rule_for,
                            start_over)
from swarm.decisions import (HELDOUT_LOSS_SIGNAL, PERSIST_LOOKS, BacktestSpec, Facts, Look, Pair, Refuse, Rule, Sighting, Skip,
                             arm_step_cost, assign_risk, corroborated_by, outlook, persistence, plan, rate_var, retry_horizon,
                             run_looks, schedule, segment_steps, smaller_step, too_new, try_share, worth_verifying)
from swarm.judging import AnswerLoss, Control, Kept, Pending, RolledBack, Window, judge, restart_hold, wasted
from trainer.config import get_dotted
from trainer.runlog import INIT_CHECKPOINT, read_heartbeat

FORK_TRIES = 3   # ticks on which a backtest's fork checkpoint is asked for before the proposal is dropped


def recent_pace(rows: list[dict[str, Any]], n: int = THRESHOLDS.recent) -> float | None:
    """The median seconds per training step over the last `n` training rows (eval rows excluded);
    None without one."""
    times = [float(r["step_time"]) for r in rows if not is_eval_row(r) and isinstance(r.get("step_time"), (int, float))]
    return statistics.median(times[-n:]) if times and n > 0 else None


class Deciding:
    """Backtest and evaluate nodes, and the inputs of plan / decide / judge."""

    # ---- inputs ---------------------------------------------------------------------------------
    def values_in_force(self, keys: list[str]) -> dict[str, Any]:
        """The dotted fields' values in force: what the live run reports (its metrics' `lr`), else
        the recipe and harness the controller last set."""
        known = {"recipe": self.ws.current_recipe(), "harness": self.ws.current_harness()}
        out = {k: get_dotted(known, k)[1] for k in keys}
        rows = self.tick.evidence.metrics if self.tick.evidence is not None else []
        live_lr = next((r.get("lr") for r in reversed(rows) if isinstance(r.get("lr"), (int, float))), None)
        if "recipe.lr" in out and live_lr and live_lr > 0:
            # a schedule's warm-up or decay moves the lr; compare with the larger of the two
            out["recipe.lr"] = max(float(live_lr), float(out["recipe.lr"] or 0.0))
        return out

    def published_values(self, keys: list[str]) -> dict[str, Any]:
        """The dotted fields' values the live run publishes, for the record of what a change replaced
        (`outcome.before`, which the skill miner keys skills by): the harness the trainer stored
        under the live harness version its metrics report (`harnesses/<version>.yaml`: every harness
        a command set is stored), the recipe's logged lr, else the controller's record. A change
        nobody commanded is not published, so which field it moved stays unknown: the record
        stands in for it. The controller never opens the trainer's checkpoints for this."""
        out = self.values_in_force(keys)
        rows = self.tick.evidence.metrics if self.tick.evidence is not None else []
        hv = next((str(r["harness_version"]) for r in reversed(rows) if r.get("harness_version")), None)
        if not hv or not re.fullmatch(r"[0-9a-f]{4,64}", hv) or not any(k.startswith("harness.") for k in keys):
            return out
        p = self.run_dir / "harnesses" / f"{hv}.yaml"
        try:
            live = yaml.safe_load(p.read_text()) if p.is_file() else None
        except (OSError, yaml.YAMLError):
            live = None
        if isinstance(live, dict):
            for k in keys:
                found, v = get_dotted({"harness": live}, k) if k.startswith("harness.") else (False, None)
                if found:
                    out[k] = v
        return out

    def start_values(self, keys: list[str]) -> dict[str, Any]:
        cfg = self.goal.run_config("start", "/tmp").model_dump(mode="json")
        return {k: get_dotted(cfg, k)[1] for k in keys}

    def set_values(self) -> dict[str, Any]:
        """Every recipe and harness field the controller set (its record on main, defaults filled
        in), dotted: what a departure finding says the live run left."""
        return {**config_fields("recipe", self.ws.current_recipe()), **config_fields("harness", self.ws.current_harness())}

    def last_step(self) -> int:
        """The step the live run ends at: the budget's (the controller trains `recipe.steps` =
        `budget.steps`)."""
        return self.goal.budget.steps

    def verify_steps(self) -> int:
        """Live training steps a backtest's arms cost: a candidate and a control per seed over the
        horizon, each arm-step at what this run's finished backtests measured it to cost in steps of
        the live job's current process (swarm.decisions.arm_step_cost: an arm's start, fork and
        evaluation included; the heartbeat's CPU over the steps since the process started)."""
        bt = self.goal.swarm.backtest
        hb = read_heartbeat(self.run_dir) or {}
        cost = arm_step_cost([iv.backtest for iv in self.store.list()], float(hb.get("cpu_s") or 0.0), segment_steps(hb))
        return round(2 * len(bt.seeds) * bt.horizon_steps * cost)

    def too_far_back(self, iv: Intervention, target: str | None, pre: dict[str, Any] | None) -> str | None:
        """Why a departure's rollback goes only as far as its edit now (None: it rolls back): the
        run moved on since it was proposed, and going back would now throw away a stake
        (agents.progress.rollback_stake, the rule its proposer read)."""
        if target is None or not pre or iv.diagnosis.name not in DEPARTURE:
            return None
        ckpt = next((c for c in self.checkpoints() if c["name"] == target), None)
        if ckpt is None:
            return None
        why = rollback_stake(eval_series(self.evidence(JobStatus.RUNNING), self.goal.target.metric), int(ckpt["step"]),
                             int(pre.get("step", 0)), self.verify_steps(), THRESHOLDS.departure_harm,
                             self.goal.target.op == ">=")
        return None if why is None else f"checkpoint {target} lies {why}: the fields are set again without going back"

    def nothing_staked(self, ckpt_step: int) -> bool:
        """The steps since the checkpoint at `ckpt_step` moved the target by no more than
        `departure_harm` (agents.progress.progress_since; False when no eval follows it)."""
        gained = progress_since(eval_series(self.evidence(JobStatus.RUNNING), self.goal.target.metric), ckpt_step,
                                self.goal.target.op == ">=")
        return gained is not None and gained <= THRESHOLDS.departure_harm

    def rollback_target(self, iv: Intervention) -> str | None:
        """The checkpoint the proposal names (agents.base.rollback_target) when the run has it, else
        the newest checkpoint from before the problem's evidence window began."""
        named = rollback_target(iv)
        if named and any(c["name"] == named for c in self.checkpoints()):
            return named
        start = iv.diagnosis.evidence.get("window_start_step", iv.diagnosis.step)
        good = [c for c in self.checkpoints() if c["step"] < start and not c["name"].startswith("bt-")]
        return good[-1]["name"] if good else None

    def settled_since(self) -> float:
        """When the controller last changed the live run (applied, undid or restarted; 0 before its
        first change): rows written before it predate the recipe and harness it believes in force."""
        ivs = self.store.list()
        times = [float(iv.outcome.since_time) for iv in ivs if iv.outcome.since_time is not None]
        times += [float(h["time"]) for iv in ivs if iv.outcome.undone for h in iv.history if h.get("to") == "rolled_back"]
        return max(times, default=0.0)

    def assess(self, iv: Intervention) -> Intervention:
        """The intervention with the controller's risk (the proposer's is kept in its outcome), and no
        skipped backtest yet: whether it skips one is plan's decision, not the proposer's."""
        keys = list(iv.changes)
        call = assign_risk(iv, self.values_in_force(keys), self.start_values(keys),
                           algorithm=self.ws.current_recipe().get("algorithm"))
        return iv.model_copy(update={"risk": call.risk, "backtest_skipped": None,
                                     "outcome": iv.outcome.model_copy(update={"proposed_risk": iv.risk.value, "risk_reason": call.why,
                                                                                      "risk_cause": call.cause})})

    def reassess(self, iv: Intervention) -> Intervention:
        """A validated intervention's risk with what its backtest measured (assign_risk's
        `validated_on`): a large move whose gain was measured on held-out behaviour is no longer
        high for its size. Recorded when it changes."""
        if iv.backtest is None or not iv.backtest.passed or iv.backtest_skipped:
            return iv
        keys = list(iv.changes)
        call = assign_risk(iv, self.values_in_force(keys), self.start_values(keys), validated_on=iv.backtest.signal,
                           algorithm=self.ws.current_recipe().get("algorithm"))
        if call.risk == iv.risk:
            return iv
        self.store.log("risk_reassessed", id=iv.id, before=iv.risk.value, after=call.risk.value, reason=call.why)
        iv = iv.model_copy(update={"risk": call.risk, "outcome": iv.outcome.model_copy(update={"risk_reason": call.why,
                                                                   "risk_cause": call.cause,
                                                                   "risk_before_backtest": iv.risk.value})})
        self.store.put(iv)
        return iv

    def smaller_alternative(self, iv: Intervention) -> Intervention | None:
        """While `iv` waits for a human because it moves a field too far (risk cause "size"), the
        same change cut to the largest step not rated high (swarm.decisions.smaller_step), recorded
        as a new proposal of the lead's that goes through plan, backtest and gate like any other;
        None when there is no such step or it would wait for a human too."""
        if iv.outcome.risk_cause != "size" or iv.outcome.alternative:
            return None
        keys = list(iv.changes)
        step = smaller_step(iv.changes, self.values_in_force(keys))
        if step is None:
            return None
        moved = ", ".join(f"{k} {iv.changes[k]!r} → {step[k]!r}" for k in step if step[k] != iv.changes[k])
        alt = self.assess(Intervention(
            kind=iv.kind, changes=step, diagnosis=iv.diagnosis, operator="lead", policy=iv.policy, risk=iv.risk,
            rationale=f"A smaller step of {iv.id}, which waits for a human ({iv.outcome.risk_reason or 'high risk'}): "
                      f"{moved}, the largest move not rated high for its size; the run goes on with it meanwhile. "
                      f"{iv.rationale}",
            expected_effect=iv.expected_effect, outcome={"smaller_step_of": iv.id}))
        if self.goal.approval.needs_human(alt.risk):
            return None
        self.store.put(alt)
        self.store.log("proposed", id=alt.id, iv_kind=alt.kind.value, operator=alt.operator, policy=alt.policy,
                       diagnosis=alt.diagnosis.name, skills=[], risk=alt.risk.value, alternative_to=iv.id)
        iv = self.store.get(iv.id)
        iv.outcome.alternative = alt.id
        self.store.put(iv)
        return alt

    def validity(self, iv: Intervention) -> str | None:
        if not iv.changes:
            return None
        return check_change(self.base_cfg, self.ws.current_recipe(), self.ws.current_harness(), iv.changes)

    def facts(self, iv: Intervention, job_status: str) -> Facts:
        from agents.recall import skill_proposed

        bt = self.goal.swarm.backtest
        trusted = self.knowledge.trusted(iv.skills_used) if iv.skills_used and not skill_proposed(iv) else None
        start = self.start_values(list(iv.changes))
        set_ = self.set_values()
        return Facts(restores=all(start.get(k) == v for k, v in iv.changes.items()),
                     reverts=all(k in set_ and set_[k] == v for k, v in iv.changes.items()), findings=frozenset(d.name for d in self.tick.findings),
                     risk=iv.risk, spec=BacktestSpec(bt.horizon_steps, tuple(bt.seeds)), invalid=self.validity(iv),
                     noop=self.noop_edit(iv, job_status), trusted=trusted,
                     tries_without_gain=self.tries_without_gain(iv))

    def tries_without_gain(self, iv: Intervention) -> int:
        """Earlier backtests of the same fix (signature) in this run that ended with a positive
        effect too small to tell."""
        return sum(1 for x in self.store.list() if x.id != iv.id and x.signature() == iv.signature() and inconclusive(x))

    # ---- before a proposal is recorded ---------------------------------------------------------
    def prepare(self, iv: Intervention, s: Any) -> Intervention | None:
        """A proposal as the controller will record it: the nearest change the live trainer accepts
        (curriculum difficulties clamped to the task's range) and the controller's risk; None for
        a restart held by the cap or the backoff (swarm.judging.restart_hold)."""
        if iv.kind == InterventionKind.RESTART:
            why = restart_hold(s.restarts, self.goal.swarm.max_restarts,
                               (time.time() - s.launched) if s.launched else None, self.goal.swarm.stale_heartbeat_s)
            if why is not None:
                if s.launched not in self.memo.held:     # once per launch
                    self.memo.held.add(s.launched)
                    self.store.log("restart_held", operator=iv.operator, diagnosis=iv.diagnosis.name, reason=why, step=s.step)
                return None
        if iv.changes and self.validity(iv) is not None:
            variant = nearest_valid(iv.changes, *self.task_range)
            if variant != iv.changes and self.validity(iv.model_copy(update={"changes": variant})) is None:
                iv = iv.model_copy(update={"changes": variant, "rationale": iv.rationale + (
                    f" (difficulties clamped to the task's range {self.task_range[0]}-{self.task_range[1]}: the trainer "
                    "refuses a curriculum outside it)")})
        return self.assess(self.from_the_start(self.carrying(iv)))

    def carrying(self, iv: Intervention) -> Intervention:
        """`iv` carrying the fixes of the other causes named now whose backtests measured nothing
        (`agents.operators.held_at_floor`: every arm at the same bound of the target), where their
        fields differ from its own and from each other's and at most one checkpoint is rolled back
        to. Arms that cannot leave the floor with a fix show that something else holds the run there
        too: two faults that each hold it there are each measured at nothing alone, and fixed only
        together. The causes carried are the change's to answer (`answers`); a carried rollback
        makes the change one, to the same checkpoint. A restart, or a change that carries them
        already, is kept as it is."""
        if not iv.changes or iv.kind == InterventionKind.RESTART:
            return iv
        answered = {iv.diagnosis.name, *(iv.diagnosis.evidence.get("answers") or ())}
        named = {d.name for d in self.tick.findings if d.severity != "info"}
        history = self.store.list()
        extra: dict[str, Any] = {}
        held: set[str] = set()
        to = {rollback_target(iv)} if iv.kind == InterventionKind.ROLLBACK else set()
        for name in sorted(named & CAUSES - answered):
            fix = held_at_floor(history, name)
            if fix is not None and fix.changes:
                take_fix(fix, extra, held, to, taken=set(iv.changes))    # a fix that clashes stays out
        if not extra:
            return iv
        evidence = {**iv.diagnosis.evidence, "answers": sorted(answered - {iv.diagnosis.name} | held)}
        update: dict[str, Any] = {"changes": {**extra, **iv.changes}, "rationale": iv.rationale + (
            f" The fix for {', '.join(sorted(held))} ({', '.join(f'{k}={v!r}' for k, v in extra.items())}) measured "
            "nothing: every arm of its backtest stayed at the same bound, so something else held the run there too. "
            "This change carries it.")}
        if to and iv.kind != InterventionKind.ROLLBACK:
            (target,) = to
            evidence["rollback_to"] = target
            update["kind"] = InterventionKind.ROLLBACK
        update["diagnosis"] = iv.diagnosis.model_copy(update={"evidence": evidence})
        return iv.model_copy(update=update)

    def from_the_start(self, iv: Intervention) -> Intervention:
        """The fix as a rollback to the untrained checkpoint carrying its change, when
        `swarm.backtest.start_over` says so; else the fix as proposed."""
        tries = self.tries_without_gain(iv)
        if not tries:
            return iv
        spoilt = worthless_weights(self.evidence(JobStatus.RUNNING), self.checkpoints(), THRESHOLDS.not_learning_heldout_max)
        if not start_over(iv.kind.value, iv.changes, tries, spoilt is not None):
            return iv
        d = iv.diagnosis.model_copy(update={"evidence": {**iv.diagnosis.evidence, "rollback_to": INIT_CHECKPOINT}})
        return iv.model_copy(update={"kind": InterventionKind.ROLLBACK, "diagnosis": d, "rationale": iv.rationale + (
            f" Backtested {tries} time(s) from the live weights with a gain too small to tell, where {spoilt}: "
            f"tried again from the untrained checkpoint {INIT_CHECKPOINT!r}, "
            "its weights being worth nothing and perhaps what keeps the change from showing.")})

    def worth_it(self, proposals: list[Intervention], s: Any) -> list[Intervention]:
        """The proposals worth verifying now (swarm.decisions.worth_verifying on the outlook of the
        current timeline: the evals since the latest applied intervention); the others wait, logged
        once per fix and eval."""
        if not proposals:
            return proposals
        ev = self.evidence(s.job_status)
        metric = self.goal.target.metric
        since = max([float(iv.outcome.since_time or 0.0) for iv in self.store.list() if iv.applied_step is not None],
                    default=0.0)
        pts = [(int(r["step"]), float(r[metric])) for r in ev.evals
               if isinstance(r.get(metric), (int, float)) and float(r.get("time", 0.0)) >= since]
        view = outlook(pts, self.goal.target.threshold, self.goal.target.op == ">=")
        verify = self.verify_steps()
        interval = int(self.ws.current_recipe().get("eval_interval") or 0)    # the trainer evals at its multiples
        next_eval_in = interval - ev.step % interval if interval > 0 else None
        findings = frozenset(d.name for d in self.tick.findings)
        now = Sighting(self.memo.looks, ev.step, time.time())
        b = self.goal.budget
        per_step = self.meter.total / ev.step if ev.step > 0 else 0.0     # worker CPU per step so far, arms included
        steps_left = max(0, self.last_step() - ev.step)
        if per_step > 0:
            steps_left = min(steps_left, max(0, int((b.worker_cpu_s - self.meter.total) / per_step)))
        keep, newer = [], set()
        for iv in proposals:
            # a change plan lets skip its backtest trains no arms: its window is the live run's own steps
            cost = 0 if isinstance(plan(iv, self.facts(iv, s.job_status)), Skip) else verify
            held = (persistence([Sighting(*x) for x in self.store.sightings(iv.diagnosis.name)], now, since)
                    if iv.diagnosis.name in findings else None)
            corroborated = corroborated_by(iv.diagnosis, self.tick.findings, iv.changes)
            why = worth_verifying(iv, findings, view, cost, next_eval_in, held, corroborated, steps_left,
                                  measured=ev.latest_eval(metric) is not None)
            if why is None:
                keep.append(iv)
                continue
            if too_new(held, corroborated) and worth_verifying(iv, findings, view, cost, next_eval_in, None, corroborated,
                                                              steps_left, measured=ev.latest_eval(metric) is not None) is None:
                newer.add(iv.diagnosis.name)     # waiting for nothing but a second look
            self.defer(iv, why, len(pts), ev.step)
        # a retry of a fix that measured nothing waits for a cause named too recently to act on: its
        # fix, carrying the first (`carrying`), tests both where the retry would test the first alone
        # (the lead's order, agents.operators.Lead.arbitrate); a look or two, until it is seen again
        history = self.store.list()
        retries = [iv for iv in keep if retries_floor(history, iv)]
        untried = sorted(n for n in newer - {iv.diagnosis.name for iv in retries}
                         if held_at_floor(history, n) is None and not spent(history, n))
        if retries and untried:
            for iv in retries:
                keep.remove(iv)
                self.defer(iv, f"its last fix measured nothing, and {', '.join(untried)} was named too recently to act on: "
                               "that cause's fix, carrying this one, goes first", len(pts), ev.step, "floor")
        return keep

    def defer(self, iv: Intervention, why: str, evals: int, step: int, tag: str = "") -> None:
        """Log that `iv` waits (`why`), once per fix, count of evals and kind of wait (`tag`)."""
        if (iv.signature(), evals, tag) not in self.memo.deferred:
            self.memo.deferred.add((iv.signature(), evals, tag))
            self.store.log("deferred", operator=iv.operator, iv_kind=iv.kind.value, diagnosis=iv.diagnosis.name,
                           reason=why, step=step)

    # ---- backtest -------------------------------------------------------------------------------
    def node_backtest(self, s: Any) -> dict[str, Any]:
        self.resume_paused()
        for iid in self.pending():
            iv = self.store.get(iid)
            if iv.status not in Status.to_backtest():
                continue
            if iv.kind not in JOB_ACTIONS and self.job_action_first(s.job_status):
                continue
            if iv.status == Status.PROPOSED:
                p = plan(iv, self.facts(iv, s.job_status))
                if isinstance(p, Refuse):
                    if p.reason.startswith("the live trainer would refuse"):
                        iv.outcome.refused = p.reason          # a loss in memory: never retried
                        self.store.put(iv)
                    elif p.exhausted:
                        iv.outcome.exhausted = p.reason        # a loss in memory too
                        self.store.put(iv)
                    self.store.transition(iid, Status.REJECTED, p.reason)
                    continue
                if isinstance(p, Skip):
                    iv.backtest_skipped = p.reason
                    self.store.put(iv)
                    self.store.transition(iid, Status.VALIDATED, p.reason)
                    continue
            self.backtest(iv)
        return {}

    def backtest(self, iv: Intervention) -> None:
        iid = iv.id
        ack = self.command("checkpoint", f"{iid}-bt", name=f"bt-{iid}")
        if not ack or ack.get("status") != "applied":
            # says nothing about the change (the job may be restarting): tried again on later ticks
            tries = int(iv.outcome.fork_tries or 0) + 1
            if tries < FORK_TRIES and not (ack and ack.get("status") == "rejected"):
                iv.outcome.fork_tries = tries
                self.store.put(iv)
                return
            self.store.transition(iid, Status.REJECTED, f"could not checkpoint the live job for a backtest "
                                                        f"({tries} tries{': ' + str(ack.get('reason')) if ack else ''})")
            return
        if iv.status == Status.PROPOSED:
            self.store.transition(iid, Status.BACKTESTING, f"forked at step {ack['step']}")
        # the live job waits at the fork while the arms run: its steps meanwhile would train the
        # state the arms measure (a rollback discards them, a validated change is applied to it),
        # and the arms get its cores; it goes on when the arms are done (resume_paused, also after
        # a controller crash) — a validated change's only once it is applied, on this tick (gate and
        # apply follow), or sent to a human: steps at the old config in between would be discarded
        # by taking on its arm's state, or make the change start later than its arms measured
        iv = self.store.get(iid)
        iv.outcome.paused_for_backtest = True
        self.store.put(iv)
        self.command("pause", f"{iid}-bt-pause")
        try:
            self._backtest_arms(iv, ack)
        finally:
            if self.store.get(iid).status != Status.VALIDATED:
                self.resume_paused(iid)     # else apply or the gate resumes it, or the next tick's sweep

    def resume_paused(self, only: str | None = None) -> None:
        """Resume the live job wherever a backtest paused it and is no longer running (`only`: that
        intervention's, now)."""
        for iv in self.store.list():
            if not iv.outcome.paused_for_backtest:
                continue
            if (iv.id != only) if only is not None else (iv.status == Status.BACKTESTING):
                continue      # another's, or (a sweep) a backtest that will resume it itself
            self.command("resume", f"{iv.id}-bt-resume", timeout=10.0)
            iv = self.store.get(iv.id)
            iv.outcome.paused_for_backtest = False
            self.store.put(iv)

    def _backtest_arms(self, iv: Intervention, ack: dict[str, Any]) -> None:
        """The arms of `schedule`'s looks, each look adding its new seeds' pairs, until `decide` is
        conclusive or the looks run out."""
        bt = self.goal.swarm.backtest
        iid = iv.id
        target = self.rollback_target(iv) if iv.kind == InterventionKind.ROLLBACK else None
        cand = next((c for c in self.checkpoints() if c["name"] == target), None)
        # the control carries on from the live state, unless the steps since the rollback's
        # checkpoint gained nothing measurable (a run a wrong setting kept at 0): then carrying on
        # is worth nothing and both arms start from the checkpoint, so the backtest compares the
        # configs from the same weights and data (an arm from an untrained start against one
        # hundreds of steps on scores its head start, not the change)
        common = cand is not None and self.nothing_staked(int(cand["step"]))
        fork = (str(self.run_dir / "checkpoints" / f"{target}.pt"), int(cand["step"])) if common else None
        # the checkpoint's harness and recipe predate the fixes applied since: arms that fork it carry
        # those in force, as applying the rollback sets them again (Controller.carry_over)
        since = self.changes_since(target, exclude=iid) if cand is not None else {}
        carried = {k: v for c in since.values() for k, v in c.items()}
        looks = schedule(bt.seeds, iv.diagnosis.severity == "critical", bt.critical_extend)
        before = self.tries_without_gain(iv)
        retry = retry_horizon(bt.horizon_steps, before)
        base = rollback_horizon(retry, int(cand["step"]), max(int(ack["step"]), int(cand["step"]))) if common else retry
        cpu = 0.0
        notes = [f"{before} earlier backtest(s) of this fix gained too little to tell: horizon {retry} steps"] if retry > bt.horizon_steps else []
        if carried:
            notes.append(f"the arms from checkpoint {target} carry the fixes applied since and in force "
                         f"({', '.join(since)}): {', '.join(sorted(carried))}")
        if common:
            notes.append(f"both arms from checkpoint {target} (step {cand['step']}): the steps since gained nothing measurable"
                         + (f"; they train {base} steps (the rollback gives up {int(ack['step']) - int(cand['step'])})"
                            if base > retry else ""))

        def measure(look: Look, seeds: list[int]) -> list[Pair]:
            nonlocal cpu
            ps, c = self.backtest_runner(
                iv, base_config=self.base_cfg, ckpt=fork[0] if fork else str(self.run_dir / "checkpoints" / f"bt-{iid}.pt"),
                step=fork[1] if fork else ack["step"],
                candidate_ckpt=str(self.run_dir / "checkpoints" / f"{target}.pt") if cand else None,
                candidate_step=cand["step"] if cand else None, metric=self.goal.target.metric,
                horizon=base * look.horizon_factor, seeds=seeds, eval_size=bt.eval_size, jobs=self.jobs,
                workdir=self.sdir / "backtests", config_dir=self.private / "backtests",
                label=f"-x{look.horizon_factor}" if look.horizon_factor > 1 else "",   # arm_name's label
                carried=carried)
            cpu += c
            return ps

        in_force = self.ws.current_recipe()     # the lr the arms go on from (`anneals`), read once

        def rule_at(n: int) -> Rule:
            return rule_for(iv, self.base_cfg, alpha=bt.alpha, share=try_share(before), higher_is_better=self.goal.target.op == ">=",
                            metric=self.goal.target.metric, eval_size=bt.eval_size, looks=len(looks), look=n,
                            recipe=in_force, shared=cand is None or (common and target != INIT_CHECKPOINT))

        d, pairs, look, extended = run_looks(looks, measure, rule_at)
        label = f"-x{look.horizon_factor}" if look.horizon_factor > 1 else ""
        self.record_backtest(iid, d, pairs, looks, look, extended, base, notes, cpu,
                             fork_step=fork[1] if fork else int(ack["step"]),
                             candidate_arms=[arm_name(iid, label, "candidate", p.seed) for p in pairs])

    def record_backtest(self, iid: str, d: Any, pairs: list[Pair], looks: list[Look], look: Look,
                        extended: list[tuple[Look, Any]], base: int, notes: list[str], cpu: float,
                        after: tuple[str, ...] = (), fork_step: int | None = None,
                        candidate_arms: list[str] | None = None) -> None:
        """Store a finished backtest's result on its intervention (each look that was extended, and
        why, in its note, then `after`) and validate or reject it by the result."""
        notes = list(notes)
        for i, (lk, dec) in enumerate(extended):
            nxt = looks[i + 1]
            more = (f"a critical finding: looked again over {base * nxt.horizon_factor} steps"
                    if nxt.horizon_factor != lk.horizon_factor else f"added seed(s) {', '.join(map(str, nxt.seeds[len(lk.seeds):]))}")
            notes.append(f"look {i + 1} over {base * lk.horizon_factor} steps, seed(s) {', '.join(map(str, lk.seeds))}: {dec.reason}; {more}")
        notes += list(after)
        horizon = base * look.horizon_factor
        # a script's arms are scored on its own eval set, whose size the goal does not state
        size = None if self.goal.entrypoint is not None else self.goal.swarm.backtest.eval_size
        res = result(d, pairs, metric=self.goal.target.metric, horizon=horizon, seeds=look.seeds, cpu_s=cpu,
                     note="; ".join(notes), eval_size=size, fork_step=fork_step, candidate_arms=candidate_arms)
        iv = self.store.get(iid)
        iv.backtest = res
        iv.outcome.backtest_cpu_s = round(cpu, 3)
        self.store.put(iv)
        self.store.transition(iid, Status.VALIDATED if res.passed else Status.REJECTED,
                              f"{res.signal}: effect {res.effect:+.3f}, P(no gain)={res.p_value:.3f}")

    def job_action_first(self, job_status: str) -> bool:
        """Hold other backtests while a restart or rollback is validated but not yet applied (this
        tick's gate and apply do it: a backtest now would fork the run it replaces, and meanwhile
        the checkpoint it rolls back to could leave the trainer's retention window), and until the
        job it started has written its first metrics row. And while the live job is not running:
        it cannot be forked, which says nothing about the change."""
        if job_status not in JobStatus.alive():
            return True
        ivs = self.store.list()
        if any(x.kind in JOB_ACTIONS and x.status == Status.VALIDATED for x in ivs):
            return True
        applied = [h["time"] for x in ivs if x.kind in JOB_ACTIONS for h in x.history if h.get("to") == "applied"]
        if not applied:
            return False
        rows = self.evidence(job_status).metrics
        return not rows or float(rows[-1].get("time", 0.0)) < max(applied)

    def noop_edit(self, iv: Intervention, job_status: str) -> str | None:
        """Why an edit would change nothing (else None): see swarm.backtest.noop_edit."""
        live: dict[str, str | None] = {"recipe_version": None, "harness_version": None}
        for r in reversed(self.evidence(job_status).metrics):
            for k in live:
                live[k] = live[k] or (r.get(k) if isinstance(r.get(k), str) else None)
            if all(live.values()):
                break
        return noop_edit(iv.changes, self.ws.current_recipe(), self.ws.current_harness(), live)

    # ---- evaluate -------------------------------------------------------------------------------
    def held_out_size(self) -> int:
        """Examples in one held-out eval of the live run: the recipe's `eval_size`, or for a script
        run what its eval rows say (`eval_examples`, written by SwarmCallback); 200 when neither says."""
        n = self.base_cfg["recipe"].get("eval_size")
        if not n and self.script:
            ev = self.tick.evidence
            sizes = [r.get("eval_examples") for r in (ev.evals if ev is not None else [])]
            n = next((x for x in reversed(sizes) if isinstance(x, int) and not isinstance(x, bool) and x > 0), None)
        return int(n or 200)

    def control_for(self, iv: Intervention) -> Control:
        """For an adopted change, the candidate arms' scores (mean, binomial standard error), else the
        backtest's control arms (the same), else the value measured just before applying (with its
        own measurement noise)."""
        rate = self.goal.target.metric in ("heldout_acc", "heldout_malformed", "heldout_truncated")
        bt = iv.backtest
        arm = (iv.outcome.adopted or "").split(" at step ")[0]
        if bt is not None and arm in bt.candidate_arms and len(bt.candidate) == len(bt.candidate_arms):
            # the live run took on one candidate arm's state: where a run with the change stands just
            # before applying (the control arms stopped where the window starts, and would put the
            # window's own training on the change's side). Not the adopted arm's own score: it was
            # chosen as the best of the candidates' noisy evals, which biases it up, and the window's
            # evals would then read as harm
            n = self.goal.swarm.backtest.eval_size
            m = sum(bt.candidate) / len(bt.candidate)
            se = math.sqrt(sum(rate_var(c, n) for c in bt.candidate)) / len(bt.candidate) if rate else None
            return Control(m, se, f"the candidate arms after {bt.horizon_steps} steps, one of them adopted")
        if bt is not None and bt.control:
            n = self.held_out_size() if self.script else self.goal.swarm.backtest.eval_size   # a script's arms eval its set
            m = sum(bt.control) / len(bt.control)
            se = math.sqrt(sum(rate_var(c, n) for c in bt.control)) / len(bt.control) if rate else None
            return Control(m, se, f"the backtest's control arms after {bt.horizon_steps} steps")
        base = iv.outcome.baseline
        n = self.held_out_size()
        se = math.sqrt(rate_var(base, n)) if rate and isinstance(base, (int, float)) else None
        return Control(base if isinstance(base, (int, float)) else None, se, "the value before applying")

    def live_cpu(self) -> float:
        prefix = f"{self.run_dir}:"
        return sum(v for k, v in self.meter.state().items() if k.startswith(prefix))

    def node_evaluate(self, s: Any, final: bool = False) -> dict[str, Any]:
        """Judge applied interventions after each `evaluate_window_steps` window until the judgement is
        conclusive (with `final`, at the end of the run, on whatever window there is):
        swarm.judging.judge against the control."""
        window = self.goal.swarm.evaluate_window_steps
        human = self.human_decisions()
        ev = None
        for iv in self.store.list():
            if iv.status == Status.APPLIED:
                self.store.transition(iv.id, Status.EVALUATING, f"judged over the next {window} steps")
                iv = self.store.get(iv.id)
            if iv.status not in Status.judging():
                continue
            if human.get(iv.id) == "human_rollback":
                self.roll_back(iv, "rolled back by a human")
                continue
            if iv.status != Status.EVALUATING or iv.applied_step is None:
                continue
            # the live step and evals of the timeline it created: a rollback moved the step counter
            # back, so the graph state's step (from before it) and older evals say nothing about it
            ev = ev or self.evidence(s.job_status)
            looks = int(iv.outcome.looks or 0)
            # a rollback sets the step counter back: its window starts where the run left off, so
            # that it is compared with the value before applying after as many steps, not fewer
            start = max(iv.applied_step, int(iv.outcome.step_left or 0)) if iv.kind == InterventionKind.ROLLBACK \
                else iv.applied_step
            if ev.step < start + window * (looks + 1) and not final:
                continue
            t_applied = (iv.outcome.since_time or 0.0)
            metric = self.goal.target.metric
            evals = [r for r in ev.evals if r.get("time", t_applied) >= t_applied and isinstance(r.get(metric), (int, float))]
            after = [r[metric] for r in evals if r.get("step", 0) > start]
            if final and not after:   # the run ended before it caught up: what it measured since applying
                after, start = [r[metric] for r in evals if r.get("step", 0) > iv.applied_step], iv.applied_step
            steps = max(ev.step - start, 0)
            if final and not after and iv.kind != InterventionKind.RESTART:
                continue     # nothing measured after it: stays evaluating, no episode
            control = self.control_for(iv)
            w = Window(iv.kind, after[-1] if after else None, steps, window if not final else min(window, max(steps, 1)),
                       eval_size=self.held_out_size(),
                       target_is_rate=control.se is not None, higher_is_better=self.goal.target.op == ">=",
                       look=looks + 1, last_look=final, loss=self.answer_loss(iv, evals),
                       confounded=self.confounders(iv), fell=bool(iv.outcome.fell),
                       **self.pace(iv, ev, start, t_applied))
            verdict = judge(w, control, alpha=self.goal.swarm.backtest.alpha)
            iv.outcome.looks = looks + 1
            if final and steps < window and isinstance(verdict, RolledBack) and not verdict.undo:
                # the run ended inside the window: no gain measured over part of it is no evidence
                # that the change does nothing (a fix that acts through learning shows later), so it
                # is neither a win nor a loss in memory; it stays evaluating, with no episode
                verdict = Pending(f"{verdict.reason}; not judged: the run ended {steps} steps into the {window}-step window")
            if isinstance(verdict, Pending):
                iv.outcome.pending, iv.outcome.fell = verdict.reason, verdict.fell or None
                self.store.put(iv)
                continue
            iv.outcome = iv.outcome.model_copy(update={
                               "after": w.after, "window_steps": steps, "control": control.value, "control_source": control.source,
                               "pending": None, "fell": None,
                               "window_cpu_s": round(max(self.live_cpu() - float(iv.outcome.cpu_at_apply or 0.0), 0.0), 3),
                               "rule": "swarm.judging.judge: kept only on a measured gain over the control"
                                       + (" (judged at the end of the run, before the full window)" if steps < window else "")})
            if isinstance(verdict, Kept):
                iv.outcome.gain = True
                self.store.put(iv)
                self.store.transition(iv.id, Status.KEPT, verdict.reason)
            elif verdict.undo:
                iv.outcome.gain, iv.outcome.undone = False, True
                self.store.put(iv)
                self.roll_back(iv, verdict.reason)
            else:
                # no measured gain: a loss in memory, never a win or a skill; left in force (the state
                # before it was no better, and undoing costs the window's training)
                iv.outcome.gain, iv.outcome.undone = False, False
                self.store.put(iv)
                self.store.transition(iv.id, Status.ROLLED_BACK, f"{verdict.reason}; counted as a loss, left in force")
        return {}

    def with_onsets(self, findings: list[Any]) -> list[Any]:
        """`findings` with the step each names as the first whose data changed (`good_before_step`)
        kept from the looks that named it, for as long as it holds (Store.onsets). A detector reads a
        window of the newest rows and samples: a look that comes after the window moved past the
        change sees the fault and no longer where it began, and where it began is what undoes it.
        A finding reported (info) only for want of such a step (`info_without_onset`) is a warning with it."""
        def named(d: Any) -> int | None:
            step = d.evidence.get("good_before_step")
            return step if isinstance(step, int) and not isinstance(step, bool) else None

        kept = self.store.onsets({d.name: named(d) for d in findings})
        # a finding reported only for want of a step to go back to is a fault to answer with one
        return [d.model_copy(update={"evidence": {**{k: v for k, v in d.evidence.items() if k != "info_without_onset"},
                                                  "good_before_step": kept[d.name]},
                                     "severity": "warning" if d.evidence.get("info_without_onset") else d.severity})
                if d.name in kept and named(d) != kept[d.name] else d for d in findings]

    def faults_besides(self, iv: Intervention) -> list[str]:
        """The causes the detectors name now, seen on at least PERSIST_LOOKS looks (a one-look false
        alarm is not a fault the run is under), other than those `iv` answers (its diagnosis, and the
        parts of a joint change: `answers`). None for a change whose diagnosis is no current finding:
        what a proposer names is not the controller's to trust."""
        now = {d.name for d in self.tick.findings if d.severity != "info"}
        if iv.diagnosis.name not in {d.name for d in self.tick.findings}:
            return []
        answered = {iv.diagnosis.name, *(iv.diagnosis.evidence.get("answers") or [])}
        return sorted(n for n in now & CAUSES - answered if len(self.store.sightings(n)) >= PERSIST_LOOKS)

    def confounders(self, iv: Intervention) -> tuple[str, ...]:
        """The faults the run was under when `iv` was applied (`faults_at_apply`) that the detectors
        still name — on this tick, or, on a tick that ran none (the end of the run), on the newest
        look, when it is this controller's latest — and whose own fixes are not spent
        (agents.explorer.spent): their fixes go on."""
        if self.tick.diagnosed:
            named = {d.name for d in self.tick.findings if d.severity != "info"}
        else:
            newest = self.store.newest_look()
            named = set(newest[1]) if newest and newest[0] == self.memo.looks else set()
        history = self.store.list()
        return tuple(f for f in iv.outcome.faults_at_apply or () if f in named and not spent(history, f))

    def answer_loss(self, iv: Intervention, evals: list[dict[str, Any]]) -> AnswerLoss | None:
        """The live run's held-out answer loss against the backtest's control arms', for a change its
        backtest validated on that loss (`HELDOUT_LOSS_SIGNAL`), applied to the live state the arms
        forked (not a rollback: the live run then restarts elsewhere; not an adopted arm: the live run
        then starts where the arms stopped) whose fork step is recorded:
        the newest of `evals` (the timeline since applying) at most the backtest's horizon past the
        fork. The live run went on a few steps at the old config before the change was applied, so
        at that eval it has trained at most as many steps since the fork as the control arms, fewer
        of them with the change: a comparison that can only understate the change's effect. None
        where no such eval is there, or either side did not measure the loss."""
        bt = iv.backtest
        if (bt is None or not bt.passed or bt.signal != HELDOUT_LOSS_SIGNAL or iv.kind == InterventionKind.ROLLBACK
                or iv.outcome.adopted or bt.fork_step is None or bt.control_heldout_loss is None or bt.control_heldout_loss_se is None
                or not heldout_comparable(self.base_cfg, iv.changes)):
            return None

        def num(v: Any) -> float | None:
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None

        at = bt.fork_step + bt.horizon_steps
        row = next((r for r in reversed(evals) if isinstance(r.get("step"), int) and r["step"] <= at), None)
        if row is None or num(row.get("heldout_loss")) is None or num(row.get("heldout_loss_se")) is None:
            return None
        return AnswerLoss(float(row["heldout_loss"]), float(row["heldout_loss_se"]),
                          bt.control_heldout_loss, bt.control_heldout_loss_se, arms=max(len(bt.control), 1))

    @staticmethod
    def pace(iv: Intervention, ev: Any, start: int, since: float) -> dict[str, float | None]:
        """For a restart of a job that was alive but slow (its diagnosis a SLOW_WORKER finding, which
        `plan` confirmed): the median seconds per training step the controller read before it
        (`outcome.pace_before`) and over the steps trained since; {} for anything else."""
        if iv.kind != InterventionKind.RESTART or iv.diagnosis.name not in SLOW_WORKER or iv.outcome.pace_before is None:
            return {}
        after = [r for r in ev.metrics if r.get("step", 0) > start and r.get("time", since) >= since]
        return {"pace_before": iv.outcome.pace_before, "pace_after": recent_pace(after, len(after))}

    @contextlib.contextmanager
    def one_safe_point(self, key: str) -> Iterator[None]:
        """The live job paused for the block: the commands sent inside it (a rollback, then the
        changes it comes with) land at one safe point, with no training step between them. The
        trainer reads its inbox between steps, so a rollback acknowledged alone is followed by steps
        of the checkpoint's own config (its learning rate, its template) until the change arrives;
        from an untrained checkpoint a few such steps at the learning rate being fixed can wreck the
        fresh weights. Command ids are fixed by `key`: a controller that crashes in the block and
        re-runs it sends nothing twice and resumes the job."""
        self.command("pause", f"{key}-hold")
        try:
            yield
        finally:
            self.command("resume", f"{key}-hold-resume", timeout=10.0)

    def roll_back(self, iv: Intervention, note: str) -> None:
        # the checkpoint taken before applying holds the recipe and harness of that moment too
        iv = self.store.get(iv.id)
        iv.outcome.undone = True
        self.store.put(iv)
        if iv.checkpoint_before:
            with self.one_safe_point(f"{iv.id}-undo"):
                self.command("rollback", f"{iv.id}-undo", name=iv.checkpoint_before)
                carried = self.carry_over(iv.id, iv.checkpoint_before)
                if carried:  # fixes applied after this one stay in force
                    self.command("set_fields", f"{iv.id}-undo-carry", fields=carried)
        if self.ws.pr_state(iv.id) == "merged":   # reverted before a crash: not again
            self.ws.rollback(iv.id)
        self.store.transition(iv.id, Status.ROLLED_BACK, note)

    def wasted_cpu(self) -> dict[str, Any]:
        """Worker CPU spent without a measured gain, per intervention and in total."""
        per = {}
        for iv in self.store.list():
            w = wasted(iv.status.value, iv.outcome)
            if w.total:
                per[iv.id] = {"cpu_s": round(w.total, 3), "why": list(w.reasons)}
        return {"total_cpu_s": round(sum(v["cpu_s"] for v in per.values()), 3), "by_intervention": per}


def in_force(iv: Intervention) -> bool:
    """Applied and not undone (an intervention with no measured gain that was left in force counts)."""
    return iv.status in Status.in_force() or (iv.status == Status.ROLLED_BACK and iv.outcome.undone is False)

