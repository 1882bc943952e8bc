"""The swarm controller: drives one training job toward a goal through the LangGraph in
`swarm.graph`, with operators (agents/), backtests, git PRs and human approvals.

    ctrl = Controller.create(workspace, goal)   # or Controller.open(workspace) to resume
    summary = ctrl.run()

Workspace layout: WORKSPACE/ is a git repository (goal.yaml without perturbations, recipe.yaml,
harness.yaml, skills/, reports/); WORKSPACE/.swarm/ (not in git) holds the sqlite state
(interventions, timeline, LangGraph checkpoints), the live run's files under runs/, backtests
under backtests/, and private/ (the trainer's job configs, the only place perturbations live).
Training never waits on a human: interventions that need approval wait as open PRs while the
job keeps running; `swarm approve ID` (any terminal) queues the approval, applied at the next tick.
"""
from __future__ import annotations

import json
import pathlib
import time
from typing import Any

import psutil
import yaml

from agents.base import Operator, OperatorContext, rollback_target
from agents.detection import run_detectors
from agents.domain import JOB_ACTIONS, Intervention, InterventionKind, Status
from agents.evidence import Evidence, collect
from agents.llm import LLMPolicy
from agents.operators import ClusterOps, DataCuration, Diagnostics, HarnessCritic, Lead
from agents.recall import apply_skills, episode_summaries, evidence_view, firing_skills, skill_proposed, skill_summary
from swarm.backtest import noop_harness_edit, run_backtest
from swarm.goal import Goal
from swarm.graph import SwarmState, build_graph, prune_checkpoints
from swarm.jobs import CpuMeter, Jobs, ProcessJobs, RayJobs
from swarm.knowledge import Knowledge, seed_workspace
from swarm.report import LifecycleReports, final_report, intervention_report
from swarm.retention import enforce_retention
from swarm.store import Store, acquire_lock
from swarm.workspace import Workspace
from trainer.control import send_command
from trainer.runlog import atomic_write_text, iter_jsonl, metrics_history, read_heartbeat, tail_jsonl


TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# findings whose rollback skips the backtest: the run diverged (or its reward did from the task's
# verifier), so the control arm would only continue the divergence
DIVERGENCE = frozenset({"nonfinite_loss", "loss_spike", "grad_norm_explosion", "kl_blowup", "reward_hacking"})
OPEN = (Status.PROPOSED, Status.BACKTESTING, Status.VALIDATED, Status.AWAITING_APPROVAL, Status.APPLIED, Status.EVALUATING)
RECURSION_LIMIT = 10_000_000  # a tick is ~10 supersteps; runs last days
PRUNE_EVERY_TICKS = 50        # graph.db keeps the newest KEEP_CHECKPOINTS LangGraph checkpoints
KEEP_CHECKPOINTS = 200


class Controller:
    def __init__(self, workspace: str | pathlib.Path, goal: Goal, jobs: str = "ray", ray_address: str | None = None) -> None:
        self.dir = pathlib.Path(workspace).resolve()
        self.sdir = self.dir / ".swarm"
        self.sdir.mkdir(parents=True, exist_ok=True)
        self.lock = acquire_lock(self.dir)
        self.goal = goal
        self.store = Store(self.sdir / "state.db")
        self.ws = Workspace.open(self.dir)
        self.store.subscribe(LifecycleReports(self.ws, self.sdir / "runs" / "train"))   # reports follow the lifecycle
        self.private = self.sdir / "private"
        self.private.mkdir(exist_ok=True)
        self.runs = self.sdir / "runs"
        self.jobs: Jobs = ProcessJobs(self.sdir / "logs") if jobs == "process" else RayJobs(ray_address or self._saved_head())
        self.operators = [ClusterOps(), DataCuration(), Diagnostics(), HarnessCritic()]
        self.lead = Lead(avoid_after_losses=goal.memory.avoid_after_losses)
        self.llm = None
        if goal.llm.model:
            self.llm = LLMPolicy(goal.llm, spend_cap_usd=goal.budget.llm_usd, decision_log=self.sdir / "llm_decisions.jsonl")
            saved = self.sdir / "llm_state.json"
            if saved.exists():  # spend and token counts survive a controller restart
                self.llm.load_state(json.loads(saved.read_text()))
        self.meter = CpuMeter()

        self.knowledge = Knowledge(self.ws, goal.memory, task=(goal.run.get("task") or {}).get("name"), timeline=self.store.log)
        self.windows = self.sdir / "windows"     # the evidence view each intervention was proposed on
        self.windows.mkdir(exist_ok=True)
        self.graph, self._conn = build_graph(self, str(self.sdir / "graph.db"))
        self.config = {"configurable": {"thread_id": "main"}, "recursion_limit": RECURSION_LIMIT}
        self.base_cfg = goal.run_config("train", str(self.runs)).model_dump(mode="json")
        self.base_cfg["recipe"]["steps"] = goal.budget.steps
        if goal.target.op == ">=" and goal.target.metric == "heldout_acc":   # the trainer's early stop is on accuracy
            self.base_cfg["recipe"]["stop_at_heldout"] = goal.target.threshold

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def create(cls, workspace: str | pathlib.Path, goal: Goal, **kw: Any) -> "Controller":
        d = pathlib.Path(workspace)
        if (d / ".swarm" / "graph.db").exists():
            raise ValueError(f"workspace {str(d)!r} already holds a run; use `swarm resume --workspace {d}`")
        cfg = goal.run_config("train", "runs")
        Workspace.init(d, yaml.safe_dump(goal.public(), sort_keys=False), cfg.recipe.model_dump(mode="json"),
                       cfg.harness.model_dump(mode="json"))

        seed_workspace(Workspace.open(d), goal.memory)
        priv = d / ".swarm" / "private"
        priv.mkdir(parents=True, exist_ok=True)
        (priv / "goal.yaml").write_text(yaml.safe_dump(goal.model_dump(mode="json"), sort_keys=False))
        return cls(d, goal, **kw)

    @classmethod
    def open(cls, workspace: str | pathlib.Path, **kw: Any) -> "Controller":
        d = pathlib.Path(workspace)
        p = d / ".swarm" / "private" / "goal.yaml"
        if not p.is_file():
            raise ValueError(f"no swarm run in workspace {str(d)!r} (missing .swarm/private/goal.yaml)")
        return cls(d, Goal.parse(yaml.safe_load(p.read_text())), **kw)

    def _saved_head(self) -> str | None:
        p = self.sdir / "ray_head.json"
        return json.loads(p.read_text())["dashboard_url"] if p.exists() else None

    # ---- running ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run (or continue) the graph to the end; returns the summary."""
        snap = self.graph.get_state(self.config)
        # any checkpoint: continue it. `snap.next` is empty also when the controller died after a
        # node's writes were saved but before the next checkpoint, so only the store says "finished".
        inp = None if snap.values else SwarmState()
        self.state_job = (snap.values or {}).get("job")   # resuming mid-node: commands need the live job
        if snap.values and not snap.next and self.store.timeline("finished"):  # already finished
            return self.summary(SwarmState(**snap.values))
        try:
            final = self.graph.invoke(inp, self.config)
        finally:
            self._conn.close()
            self.knowledge.close()
        return self.summary(SwarmState(**final))

    @property
    def run_dir(self) -> pathlib.Path:
        return self.runs / "train"

    _tick_ev: Evidence | None = None   # this tick's evidence, read once by observe and reused

    def evidence(self, status: str) -> Evidence:
        """The run's evidence: the copy `observe` read this tick unless a command went to the
        trainer since (its files may have moved on: a rollback starts a new segment)."""
        ev = self._tick_ev
        if ev is None or ev.job_status != status:
            ev = self._tick_ev = collect(self.run_dir, status)
        return ev

    def context(self, ev: Evidence):
        cfg = self.base_cfg
        return OperatorContext(
            goal=self.goal.goal, start_harness=cfg["harness"], target=self.goal.target, recipe=self.ws.current_recipe(), harness=self.ws.current_harness(),
            eval_difficulty=cfg["harness"]["curriculum"].get("end") or cfg["harness"]["curriculum"]["start"],
            history=self.store.list(), checkpoints=self.checkpoints(), skills=self._recall[0], episodes=self._recall[1],
        )

    _recall: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])   # the last diagnose's skills, episodes

    _ckpts: tuple[int, list[dict[str, Any]]] | None = None

    def checkpoints(self) -> list[dict[str, Any]]:
        """The live run's checkpoint metadata, oldest first; re-read only when the checkpoint
        directory changed (checkpoints are written by rename, which changes its mtime; an mtime
        under a second old is not trusted, the clock behind it may be coarse)."""
        d = self.run_dir / "checkpoints"
        try:
            mtime = d.stat().st_mtime_ns
        except FileNotFoundError:
            return []
        if self._ckpts is not None and self._ckpts[0] == mtime and time.time_ns() - mtime > 1_000_000_000:
            return list(self._ckpts[1])
        out = []
        for m in sorted(d.glob("*.json")):
            try:
                out.append(json.loads(m.read_text()))
            except (OSError, json.JSONDecodeError):
                continue
        out.sort(key=lambda m: m["step"])
        self._ckpts = (mtime, out)
        return list(out)

    def command(self, cmd: str, cid: str, timeout: float = 60.0, **args: Any) -> dict[str, Any] | None:
        """Send a command with a deterministic id (re-sending after a crash is a no-op: the trainer
        acknowledges an id once) and wait for its acknowledgement while the job is alive."""
        self._tick_ev = None
        log = self.run_dir / "command_log.jsonl"
        for row in iter_jsonl(log):
            if row.get("id") == cid:
                return row
        sent = any(r.get("id") == cid for r in iter_jsonl(self.run_dir / "commands.jsonl"))
        if not sent:
            send_command(self.run_dir, cmd, id=cid, **args)
        deadline = time.time() + timeout
        while time.time() < deadline:
            for row in iter_jsonl(log):
                if row.get("id") == cid:
                    return row
            if self.job_status(self.state_job) in TERMINAL:
                return None
            time.sleep(0.2)
        return None

    state_job: str | None = None

    def job_status(self, handle: str | None) -> str:
        """The launcher's status; for a job it does not know (ProcessJobs after a controller restart:
        the trainer outlives a killed controller), judged by the run's heartbeat."""
        status = self.jobs.status(handle) if handle else "UNKNOWN"
        if status == "UNKNOWN" and handle:
            hb = read_heartbeat(self.run_dir)
            status = "RUNNING" if hb and _alive(hb.get("pid")) else ("SUCCEEDED" if hb and hb.get("state") in ("completed", "target_reached") else "FAILED")
        return status

    def stop_job(self, handle: str) -> None:
        self._tick_ev = None
        self.jobs.stop(handle)
        hb = read_heartbeat(self.run_dir)
        if isinstance(self.jobs, ProcessJobs) and self.jobs.status(handle) == "UNKNOWN" and hb and _alive(hb.get("pid")):
            # a trainer started by the previous controller: this one has no handle on it

            try:
                psutil.Process(hb["pid"]).kill()
            except psutil.Error:
                pass

    # ---- nodes --------------------------------------------------------------------------------
    def node_plan(self, s: SwarmState) -> dict[str, Any]:
        if s.plan:
            return {}
        plan = self.lead.plan(self.goal.public())
        policy = "built-in policies (no LLM configured)" if self.llm is None else f"LLM policy {self.goal.llm.model} with built-in fallback"
        self.store.log("plan", plan=plan, policy=policy)
        return {"plan": plan, "started": time.time(), "log": [f"plan: {policy}"]}

    def write_job_config(self) -> pathlib.Path:
        cfg = dict(self.base_cfg)
        cfg["perturbations"] = [p.model_dump(exclude_unset=True) for p in self.goal.perturbations]
        path = self.private / "train.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def start_job(self) -> str:
        self._tick_ev = None
        handle = self.jobs.start("train", self.write_job_config())
        if isinstance(self.jobs, RayJobs) and self.jobs.head is not None and self.jobs.head.owned:
            (self.sdir / "ray_head.json").write_text(json.dumps({"dashboard_url": self.jobs.head.dashboard_url}))
        self.store.log("job_started", handle=handle)
        return handle

    def node_launch(self, s: SwarmState) -> dict[str, Any]:
        if s.job and self.job_status(s.job) in ("RUNNING", "PENDING"):
            self.state_job = s.job
            return {}
        job = self.start_job()
        self.state_job = job
        return {"job": job, "job_status": "PENDING", "log": [f"launched {job}"]}

    def node_observe(self, s: SwarmState) -> dict[str, Any]:
        self.state_job = s.job
        if s.tick:
            time.sleep(self.goal.swarm.wait_s(s.quiet))
        status = self.job_status(s.job)
        self.meter = CpuMeter(s.cpu)
        self.meter.observe(self.run_dir)
        for arm in (self.sdir / "backtests").glob("bt-*"):
            if arm.is_dir():
                self.meter.observe(arm)
        self._tick_ev = None
        ev = self.evidence(status)
        upd: dict[str, Any] = {"tick": s.tick + 1, "job_status": status, "step": ev.step, "cpu": self.meter.state()}
        value = ev.latest_eval(self.goal.target.metric)
        if value is not None:
            upd["best"] = value if s.best is None else (max if self.goal.target.op == ">=" else min)(s.best, value)
            if not s.to_target and self.goal.target.met(value):
                upd["to_target"] = {"wall_s": time.time() - s.started, "worker_cpu_s": self.meter.total}
        b = self.goal.budget
        done = None
        if (self.sdir / "stop").exists():
            done = "stopped_by_user"
        elif status == "SUCCEEDED":
            done = "target_met" if self.goal.target.met(value) else "steps_exhausted"
        elif status == "FAILED" and s.restarts >= self.goal.swarm.max_restarts:
            done = "job_failed"   # it crashed again after max_restarts restarts
        elif time.time() - s.started > b.wall_s:
            done = "budget_wall_clock"
        elif self.meter.total > b.worker_cpu_s:
            done = "budget_worker_cpu"
        if done:
            upd["done"] = done
        return upd

    def node_diagnose(self, s: SwarmState) -> dict[str, Any]:
        ev = self.evidence(s.job_status)
        self._recall = ([], [])
        ctx = self.context(ev)
        findings = run_detectors(Operator.view(ev, ctx), known=ctx.known())   # once: the operators reuse them
        ctx.with_findings(findings)
        wrong = [d for d in findings if d.severity != "info"]
        # skills and past episodes only when something is wrong (a healthy tick costs nothing), and
        # retrieved again only when what is wrong, the library or the memory changed: a finding that
        # persists for an hour is not re-embedded and re-queried every tick
        key = (tuple(sorted({d.name for d in wrong})), self.knowledge.version)
        if key != self._recall_key:
            self._recall_key, self._program_cache = key, {}
            self._ranked = self.knowledge.retrieve(wrong) if wrong else []
            util = self.knowledge.utility() if wrong else {}
            self._recall = ([skill_summary(sk, util.get(sk.name), sc) for sk, sc in self._ranked],
                            episode_summaries(self.knowledge.relevant_episodes(wrong)) if wrong else [])
        ranked = self._ranked
        if wrong:
            ctx = ctx.model_copy(update={"skills": self._recall[0], "episodes": self._recall[1]}).with_findings(findings)
        proposals: list[Intervention] = []
        for op in self.operators:
            proposals += op.propose(ev, ctx, llm=self.llm)
        view = evidence_view(ev, findings, ctx, task=self.knowledge.task) if (proposals or ranked) else {}
        if ranked:
            fired = firing_skills([sk for sk, _ in ranked], view, self.knowledge.sandbox, self.goal.memory.program_timeout_s,
                                  cache=self._program_cache)
            now = {(sk.name, err is None) for sk, _, err in fired}
            for sk, _, err in fired:   # edge-triggered: a skill that keeps firing (or failing) is logged once
                if (sk.name, err is None) not in self._firing:
                    self.store.log("skill_fired" if err is None else "skill_failed", name=sk.name, step=ev.step,
                                   **({"error": err} if err else {}))
            self._firing = now
            proposals = apply_skills(proposals, fired, self.operators, findings, ctx)
        else:
            self._firing = set()
        self._view = view
        self._proposals = proposals
        if self.llm is not None:
            (self.sdir / "llm_state.json").write_text(json.dumps(self.llm.state(), default=str))
        # a quiet tick skips propose … mine_skills: nothing proposed, no intervention open, and no
        # timeline row (a human decision, a transition, an episode) since the last full pass
        seq = self.store.last_seq()
        quiet = (not proposals and self._full_seq is not None and seq == self._full_seq
                 and not any(iv.status in OPEN for iv in self.store.list()))
        self._pass_seq = None if quiet else seq
        return {"quiet": quiet}

    # the timeline's last seq when this process's last full pass began (rows logged during or
    # after it, a human decision included, make the next tick a full pass)
    _full_seq: int | None = None
    _pass_seq: int | None = None

    _proposals: list[Intervention] = []
    _view: dict[str, Any] = {}
    _firing: set[tuple[str, bool]] = set()
    _recall_key: tuple | None = None
    _ranked: list = []
    _program_cache: dict = {}
    _avoided: set[str] = set()

    def node_propose(self, s: SwarmState) -> dict[str, Any]:
        proposals, self._proposals = self._proposals, []
        if not proposals:
            return {}
        ev = self.evidence(s.job_status)
        ctx = self.context(ev)
        in_flight = [iv for iv in self.store.list() if iv.status in (Status.PROPOSED, Status.BACKTESTING, Status.VALIDATED,
                                                                    Status.APPLIED, Status.EVALUATING)]
        last_applied = max((iv.applied_step or 0 for iv in self.store.list() if iv.applied_step is not None), default=None)
        chosen, last_created = [], 0.0
        for iv in self.lead.arbitrate(proposals, ctx):
            urgent = iv.kind in JOB_ACTIONS
            if in_flight and not urgent:
                continue
            if (not urgent and last_applied is not None
                    and s.step - last_applied < self.goal.swarm.min_steps_between_interventions):
                continue
            if any(x.kind == iv.kind and x.status in (Status.PROPOSED, Status.BACKTESTING, Status.VALIDATED) for x in in_flight):
                continue
            (self.windows / f"{iv.id}.json").write_text(json.dumps(self._view, default=str))
            # the store lists (and backtests) oldest first: record in the lead's order, most urgent
            # first, not in the order the operators happened to build their proposals
            iv.created = max(time.time(), last_created + 1e-6)
            last_created = iv.created
            self.store.put(iv)
            chosen.append(iv.id)
            self.store.log("proposed", id=iv.id, iv_kind=iv.kind.value, operator=iv.operator, policy=iv.policy,
                           diagnosis=iv.diagnosis.name, skills=iv.skills_used)
        for iv, why in self.lead.dropped:
            if why.startswith("memory:") and iv.signature() not in self._avoided:   # once per fix, not per tick
                self._avoided = self._avoided | {iv.signature()}
                self.store.log("avoided", signature=iv.signature(), operator=iv.operator, reason=why, step=s.step)
        return {"proposed": self.pending()} if chosen else {}

    def pending(self) -> list[str]:
        """Interventions not yet decided, oldest first. The store, not the graph state, is the
        source of truth, so nothing proposed is lost when the controller dies mid-node."""
        return [iv.id for iv in self.store.list() if iv.status in (Status.PROPOSED, Status.BACKTESTING,
                                                                  Status.VALIDATED, Status.AWAITING_APPROVAL)]

    def node_backtest(self, s: SwarmState) -> dict[str, Any]:
        bt = self.goal.swarm.backtest
        for iid in self.pending():
            iv = self.store.get(iid)
            if iv.status not in (Status.PROPOSED, Status.BACKTESTING):
                continue
            if iv.kind not in JOB_ACTIONS and self.job_action_first(s.job_status):
                continue
            noop = self.noop_harness_edit(iv, s.job_status) if iv.status == Status.PROPOSED else None
            if noop:
                self.store.transition(iid, Status.REJECTED, noop)
                self.open_pr(self.store.get(iid))
                self.ws.reject(iid, note=noop)
                continue
            if iv.kind == InterventionKind.RESTART or (iv.kind == InterventionKind.ROLLBACK and iv.diagnosis.name in DIVERGENCE):
                iv.backtest_skipped = ("restart after a crash/stall: nothing to compare against" if iv.kind == InterventionKind.RESTART
                                       else "rollback of a diverged run: the control arm is the divergence")
                self.store.put(iv)
                self.store.transition(iid, Status.VALIDATED, iv.backtest_skipped)
                continue

            trust = (self.knowledge.trusted(iv.skills_used)
                     if iv.status == Status.PROPOSED and not skill_proposed(iv) else None)
            if trust is not None:
                iv.backtest_skipped = trust
                self.store.put(iv)
                self.store.transition(iid, Status.VALIDATED, trust)
                continue
            ack = self.command("checkpoint", f"{iid}-bt", name=f"bt-{iid}")
            if not ack or ack.get("status") != "applied":
                self.store.transition(iid, Status.REJECTED, "could not checkpoint the live job for a backtest")
                continue
            if iv.status == Status.PROPOSED:
                self.store.transition(iid, Status.BACKTESTING, f"forked at step {ack['step']}")
            target = self.rollback_target(iv) if iv.kind == InterventionKind.ROLLBACK else None
            cand = next((c for c in self.checkpoints() if c["name"] == target), None)
            def backtest(horizon: int, label: str = ""):
                return run_backtest(
                    iv, base_config=self.base_cfg, ckpt=str(self.run_dir / "checkpoints" / f"bt-{iid}.pt"), step=ack["step"],
                    candidate_ckpt=str(self.run_dir / "checkpoints" / f"{target}.pt") if cand else None,
                    candidate_step=cand["step"] if cand else None,
                    target=self.goal.target, horizon=horizon, seeds=bt.seeds, eval_size=bt.eval_size, alpha=bt.alpha,
                    jobs=self.jobs, workdir=self.sdir / "backtests", config_dir=self.private / "backtests", label=label,
                    private_perturbations=[p.model_dump(exclude_unset=True) | {"at_step": 0}
                                           for p in self.goal.perturbations if p.kind == "label_noise" or p.shortcut == "label_noise"],
                )

            res = backtest(bt.horizon_steps)
            if not res.passed and iv.diagnosis.severity == "critical" and bt.critical_extend > 1:
                # a critical finding's fix gets a second, longer look from the same fork before it
                # is given up: its effect may need more than the horizon to show
                first = res
                res = backtest(bt.horizon_steps * bt.critical_extend, label=f"-x{bt.critical_extend}")
                res.note = "; ".join(x for x in (
                    f"first backtest over {first.horizon_steps} steps not validated (effect {first.effect:+.3f}, "
                    f"p={first.p_value:.3f}, {first.test}); a critical finding: tested again over {res.horizon_steps} steps",
                    res.note) if x)
            iv = self.store.get(iid)
            iv.backtest = res
            self.store.put(iv)
            self.store.transition(iid, Status.VALIDATED if res.passed else Status.REJECTED,
                                  f"effect {res.effect:+.3f}, p={res.p_value:.3f}")
            if not res.passed:  # a rejected intervention is still a PR: closed, with its report
                self.open_pr(self.store.get(iid))
                self.ws.reject(iid, note=f"backtest: effect {res.effect:+.3f}, p={res.p_value:.3f}")
        return {}

    def job_action_first(self, job_status: str) -> bool:
        """Hold other backtests while a restart or rollback is validated but not yet applied (this
        tick's gate and apply do it: a backtest now would fork the run it replaces, and meanwhile
        the checkpoint it rolls back to could leave the trainer's retention window), and until the
        job it started has written its first metrics row."""
        ivs = self.store.list()
        if any(x.kind in JOB_ACTIONS and x.status == Status.VALIDATED for x in ivs):
            return True
        applied = [h["time"] for x in ivs if x.kind in JOB_ACTIONS for h in x.history if h.get("to") == "applied"]
        if not applied:
            return False
        rows = self.evidence(job_status).metrics
        return not rows or float(rows[-1].get("time", 0.0)) < max(applied)

    def noop_harness_edit(self, iv: Intervention, job_status: str) -> str | None:
        """Why a harness-only edit would change nothing (else None): see swarm.backtest.noop_harness_edit."""
        live = next((r.get("harness_version") for r in reversed(self.evidence(job_status).metrics)
                     if r.get("harness_version")), None)
        return noop_harness_edit(iv.changes, self.ws.current_harness(), live)

    _closed: set[str] = set()

    def close_rejected(self) -> None:
        """Every rejected intervention is a closed PR with its report. A controller killed between
        recording a rejection and closing its PR (or before opening one) finishes the job here."""
        for iv in self.store.list():
            if iv.status != Status.REJECTED or iv.id in self._closed:
                continue
            try:
                state = self.ws.pr_state(iv.id)
            except ValueError:
                self.open_pr(iv)
                state = "open"
            if state == "open":
                note = f"backtest: effect {iv.backtest.effect:+.3f}, p={iv.backtest.p_value:.3f}" if iv.backtest else \
                    (iv.history[-1]["note"] if iv.history else "")
                self.ws.reject(iv.id, note=note)
            self._closed = self._closed | {iv.id}

    def node_gate(self, s: SwarmState) -> dict[str, Any]:
        self.close_rejected()
        for iid in self.pending():
            iv = self.store.get(iid)
            if iv.branch is None and iv.status == Status.VALIDATED:
                self.open_pr(iv)
                iv = self.store.get(iid)
            if iv.status == Status.VALIDATED and self.goal.approval.needs_human(iv.risk):
                self.store.transition(iid, Status.AWAITING_APPROVAL, f"risk {iv.risk.value} needs a human: swarm approve {iid}")
        return {}

    def open_pr(self, iv: Intervention) -> None:
        md, pngs = intervention_report(iv, metrics_history(self.run_dir), tail_jsonl(self.run_dir / "samples.jsonl", 200))
        iv.branch = self.ws.open_pr(iv, md, pngs)
        self.store.put(iv)
        self.knowledge.record_report(iv.id, md, kind=iv.kind.value, diagnosis=iv.diagnosis.name, status=iv.status.value)

    def human_decisions(self) -> dict[str, str]:
        out = {}
        for row in self.store.timeline():
            if row.get("kind") in ("human_approve", "human_reject"):
                out.setdefault(row["id"], row["kind"])  # first decision wins
            elif row.get("kind") == "human_rollback":
                out[row["id"]] = row["kind"]   # comes after the approval it undoes
        return out

    def node_apply(self, s: SwarmState) -> dict[str, Any]:
        upd: dict[str, Any] = {}
        human = self.human_decisions()
        remaining = []
        for iid in self.pending():
            iv = self.store.get(iid)
            decision = human.get(iid)
            if iv.status == Status.AWAITING_APPROVAL and decision == "human_reject":
                if self.ws.pr_state(iid) == "open":   # git first: a crash in between is redone on resume
                    self.ws.reject(iid)
                self.store.transition(iid, Status.REJECTED, "rejected by a human")
                continue
            if iv.status == Status.VALIDATED or (iv.status == Status.AWAITING_APPROVAL and decision == "human_approve"):
                upd.update(self.apply(iv, s))
                continue
            if iv.status in (Status.PROPOSED, Status.BACKTESTING, Status.VALIDATED, Status.AWAITING_APPROVAL):
                remaining.append(iid)
        upd["proposed"] = remaining
        return upd

    def apply(self, iv: Intervention, s: SwarmState) -> dict[str, Any]:
        upd: dict[str, Any] = {}
        began, pre = time.time(), None
        if iv.kind == InterventionKind.RESTART:
            if s.job and self.job_status(s.job) not in TERMINAL:
                self.stop_job(s.job)
            job = self.start_job()
            self.state_job = job
            upd = {"job": job, "restarts": s.restarts + 1, "job_status": "PENDING"}
            step = s.step
        else:
            pre = self.command("checkpoint", f"{iv.id}-pre", name=f"pre-{iv.id}")
            changes = iv.changes
            if iv.kind == InterventionKind.ROLLBACK:
                target = self.rollback_target(iv)
                if target:
                    self.command("rollback", f"{iv.id}-rb", name=target)
                    # the checkpoint predates later fixes: its harness and recipe do not have them
                    changes = self.carry_over(iv.id, target) | changes
            if changes:
                ack = self.command("set_fields", f"{iv.id}-apply", fields=changes)
                if not ack or ack.get("status") != "applied":
                    self.store.transition(iv.id, Status.REJECTED, f"the trainer refused the change: {ack and ack.get('reason')}")
                    self.ws.reject(iv.id)
                    return {}
                step = ack["step"]
            else:
                step = pre["step"] if pre else s.step
            iv = self.store.get(iv.id)
            iv.checkpoint_before = f"pre-{iv.id}" if pre else None
        iv.applied_step = step
        ev = self.evidence(s.job_status)
        iv.outcome["baseline"] = ev.latest_eval(self.goal.target.metric)
        # rows written after this moment belong to the timeline the intervention created (the
        # trainer's acknowledgement of the checkpoint taken just before applying, else now)
        iv.outcome["since_time"] = pre["time"] if pre and "time" in pre else began
        self.store.put(iv)
        if iv.status in (Status.AWAITING_APPROVAL, Status.VALIDATED) and self.ws.pr_state(iv.id) == "open":
            self.ws.approve(iv.id)   # merged before a crash: not again
        self.store.transition(iv.id, Status.APPLIED, f"applied at step {step}")
        self.store.log("applied", id=iv.id, step=step)
        return upd

    def changes_since(self, checkpoint: str, exclude: str) -> dict[str, dict[str, Any]]:
        """Field changes of the interventions in force (applied, being judged or kept) that were
        applied after `checkpoint` was written, oldest first, by id: rolling the trainer back to it
        restores its harness and recipe, so these are set again."""
        t_ckpt = next((c.get("time", 0.0) for c in self.checkpoints() if c["name"] == checkpoint), None)
        if t_ckpt is None:
            return {}
        live = (Status.APPLIED, Status.EVALUATING, Status.KEPT)
        later = [x for x in self.store.list() if x.id != exclude and x.status in live and x.changes
                 and x.outcome.get("since_time", 0.0) > t_ckpt]
        return {x.id: dict(x.changes) for x in sorted(later, key=lambda x: x.outcome["since_time"])}

    def carry_over(self, iid: str, checkpoint: str) -> dict[str, Any]:
        """The fields to set again after intervention `iid` rolls the trainer back to `checkpoint`
        (`changes_since`, later values winning); the carried ids go into its outcome."""
        carried = self.changes_since(checkpoint, exclude=iid)
        if not carried:
            return {}
        iv = self.store.get(iid)
        iv.outcome["carried_over"] = list(carried)
        self.store.put(iv)
        return {k: v for c in carried.values() for k, v in c.items()}

    def rollback_target(self, iv: Intervention) -> str | None:
        """The checkpoint the proposal names (agents.base.rollback_target) when the run has it, else
        the newest checkpoint from before the problem's evidence window began."""
        named = rollback_target(iv)
        if named and any(c["name"] == named for c in self.checkpoints()):
            return named
        start = iv.diagnosis.evidence.get("window_start_step", iv.diagnosis.step)
        good = [c for c in self.checkpoints() if c["step"] < start and not c["name"].startswith("bt-")]
        return good[-1]["name"] if good else None

    def node_evaluate(self, s: SwarmState, final: bool = False) -> dict[str, Any]:
        """Judge applied interventions once `evaluate_window_steps` have passed (with `final`, at the
        end of the run, on whatever window there is)."""
        window = self.goal.swarm.evaluate_window_steps
        human = self.human_decisions()
        ev = None
        for iv in self.store.list():
            if iv.status == Status.APPLIED:
                self.store.transition(iv.id, Status.EVALUATING, f"judged over the next {window} steps")
                iv = self.store.get(iv.id)
            if iv.status not in (Status.EVALUATING, Status.KEPT):
                continue
            if human.get(iv.id) == "human_rollback":
                self.roll_back(iv, "rolled back by a human")
                continue
            if iv.status != Status.EVALUATING or iv.applied_step is None:
                continue
            # the live step and evals of the timeline it created: a rollback moved the step counter
            # back, so the graph state's step (from before it) and older evals say nothing about it
            ev = ev or self.evidence(s.job_status)
            if ev.step < iv.applied_step + window and not final:
                continue
            t_applied = iv.outcome.get("since_time", 0.0)
            after = [r[self.goal.target.metric] for r in ev.evals if r.get("step", 0) > iv.applied_step
                     and r.get("time", t_applied) >= t_applied and isinstance(r.get(self.goal.target.metric), (int, float))]
            if final and not after:
                continue     # nothing measured after it: stays evaluating, no episode
            base = iv.outcome.get("baseline")
            now = after[-1] if after else None
            steps = min(window, max(ev.step - iv.applied_step, 0))
            iv.outcome.update({"after": now, "window_steps": steps,
                               "rule": "kept unless the target metric after the window is worse than before applying"
                                       + (" (judged at the end of the run, before the full window)" if steps < window else "")})
            self.store.put(iv)
            worse = now is not None and base is not None and (now < base - 0.02 if self.goal.target.op == ">=" else now > base + 0.02)
            if worse:
                self.roll_back(iv, f"{self.goal.target.metric} {base} → {now} over {steps} steps")
            else:
                self.store.transition(iv.id, Status.KEPT, f"{self.goal.target.metric} {base} → {now} over {steps} steps")
        return {}

    def roll_back(self, iv: Intervention, note: str) -> None:
        # the checkpoint taken before applying holds the recipe and harness of that moment too
        if iv.checkpoint_before:
            self.command("rollback", f"{iv.id}-undo", name=iv.checkpoint_before)
            carried = self.carry_over(iv.id, iv.checkpoint_before)
            if carried:  # fixes applied after this one stay in force
                self.command("set_fields", f"{iv.id}-undo-carry", fields=carried)
        if self.ws.pr_state(iv.id) == "merged":   # reverted before a crash: not again
            self.ws.rollback(iv.id)
        self.store.transition(iv.id, Status.ROLLED_BACK, note)

    def node_mine_skills(self, s: SwarmState) -> dict[str, Any]:
        """Evaluated interventions become episodes in memory; when there are new ones, the skill
        miner distils, updates or retires skills (swarm/knowledge.py, agents/miner.py)."""
        done = {(r.get("id"), r.get("status")) for r in self.store.timeline("episode")}
        for iv in self.store.list():
            if iv.status not in (Status.KEPT, Status.ROLLED_BACK, Status.REJECTED) or (iv.id, iv.status.value) in done:
                continue
            p = self.windows / f"{iv.id}.json"
            window = json.loads(p.read_text()) if p.exists() else {}
            recorded = self.knowledge.record(iv, window)
            self.store.log("episode", id=iv.id, status=iv.status.value, recorded=recorded)
        # idempotent from the episode log: `skills_mined` names the newest episode row a finished
        # pass covered, so episodes written by a controller killed before or while mining are mined
        # on resume (the miner skips what the library already holds: nothing is added twice)
        eps, mined = self.store.timeline("episode"), self.store.timeline("skills_mined")
        newest = eps[-1]["seq"] if eps else -1
        if self.goal.memory.mine and newest > (mined[-1].get("through", -1) if mined else -1):
            self.knowledge.mine(llm=self.llm)
            self.store.log("skills_mined", through=newest)
        return {}

    _reported_seq: int = -1

    def node_report(self, s: SwarmState) -> dict[str, Any]:
        """Keep `.swarm/status.json` (the summary so far: target, steps, CPU, every intervention and
        its status) current for readers in other terminals. Per-intervention reports are written
        where decisions are made (PRs at backtest/gate); this rewrites the status file only when
        the timeline moved, so a quiet tick costs nothing."""
        if s.tick % PRUNE_EVERY_TICKS == 0:
            prune_checkpoints(self.graph.checkpointer, "main", KEEP_CHECKPOINTS)
        # backtest forks, pre-apply checkpoints, arms no one needs

        enforce_retention(self.run_dir, self.sdir / "backtests", self.private / "backtests", self.store.list(), s.cpu)
        if not s.quiet:
            self._full_seq = self._pass_seq
        rows = self.store.timeline(since=max(self._reported_seq, 0))
        seq = rows[-1]["seq"] if rows else self._reported_seq
        if seq != self._reported_seq:
            atomic_write_text(self.sdir / "status.json", json.dumps(self.summary(s), indent=1, default=str))
            self._reported_seq = seq
        return {}

    def node_finish(self, s: SwarmState) -> dict[str, Any]:
        if s.job and self.job_status(s.job) not in TERMINAL:
            self.command("stop", "controller-stop", timeout=120)
            self.stop_job(s.job)
        self.node_evaluate(s, final=True)    # what was applied is judged on the window it got,
        self.node_mine_skills(s)             # so the run's episodes and skills are not lost
        summary = self.summary(s)
        md, pngs = final_report(self.goal.public(), self.store.timeline(), self.store.list(),
                                metrics_history(self.run_dir), summary)
        path = self.ws.write_final_report(md, pngs)
        if self.knowledge.opened:   # a run that needed memory: its report joins it (a quiet run does not load it)
            self.knowledge.record_report("final", md, kind="final", reached=bool(summary["reached"]), reason=str(s.done))
        (self.sdir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        self.store.log("finished", reason=s.done, report=str(path))
        self.jobs.close()
        self.knowledge.export()
        (self.sdir / "ray_head.json").unlink(missing_ok=True)
        return {"log": [f"finished: {s.done}; report {path}"]}

    def summary(self, s: SwarmState) -> dict[str, Any]:
        ivs = self.store.list()
        rows = metrics_history(self.run_dir)   # bounded: the downsampled summary keeps every final row and each record
        final = [r for r in rows if r.get("final")]
        value = final[-1].get(self.goal.target.metric) if final else s.best
        reached = self.goal.target.met(value)
        t_target = next((r["time"] - s.started for r in rows if self.goal.target.met(r.get(self.goal.target.metric))), None)
        return {
            "reached": bool(reached), "reason": s.done, "final_metric": value, "metric": self.goal.target.metric,
            "steps": s.step, "wall_s": time.time() - s.started if s.started else 0.0,
            "worker_cpu_s": CpuMeter(s.cpu).total, "seconds_to_target": t_target,
            "worker_cpu_s_to_target": (s.to_target.get("worker_cpu_s", CpuMeter(s.cpu).total) if reached else None),
            "restarts": s.restarts,
            "report": str(self.dir / "reports" / "final" / "REPORT.md"),
            "interventions": [{"id": iv.id, "kind": iv.kind.value, "operator": iv.operator, "policy": iv.policy,
                               "diagnosis": iv.diagnosis.name, "status": iv.status.value,
                               "effect": iv.backtest.effect if iv.backtest else None,
                               "p_value": iv.backtest.p_value if iv.backtest else None,
                               "backtest_skipped": iv.backtest_skipped, "applied_step": iv.applied_step} for iv in ivs],
            "backtests": sum(1 for iv in ivs if iv.backtest is not None),
            "rejected_by_backtest": sum(1 for iv in ivs if iv.status == Status.REJECTED and iv.backtest is not None),
            "skills": self.skill_summary(),
            "llm": self.llm.summary() if self.llm is not None else {"calls": 0, "tokens": 0, "cost_usd": 0.0, "policy": "built-in"},
        }


    def skill_summary(self) -> dict[str, Any]:
        """What skills did in this run, from the timeline."""
        out: dict[str, Any] = {"library": [sk.name for sk in self.knowledge.skills if sk.active],
                               "fired": {}, "used": {}, "added": [], "updated": [], "retired": [], "refused": [], "avoided": 0}
        for r in self.store.timeline("skill_fired"):    # by kind (indexed), not the whole timeline
            out["fired"][r["name"]] = out["fired"].get(r["name"], 0) + 1
        for what in ("added", "updated", "retired", "refused"):
            out[what] = [{"name": r.get("name"), "reason": r.get("reason")} for r in self.store.timeline(f"skill_{what}")]
        out["avoided"] = len(self.store.timeline("avoided"))
        for iv in self.store.list():
            for name in iv.skills_used:
                out["used"].setdefault(name, []).append(f"{iv.id} ({iv.status.value})")
        return out


def _alive(pid: int | None) -> bool:
    try:
        return bool(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
