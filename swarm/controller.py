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

import contextlib
import dataclasses
import json
import pathlib
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from agents.agent_critic import AgentHarnessCritic
from agents.base import Operator, OperatorContext
from agents.detection import run_detectors
from agents.detectors import TRAINER_NOTICES
from agents.domain import JOB_ACTIONS, SLOW_WORKER, Intervention, InterventionKind, JobStatus, Status, cannot_wait
from agents.evidence import Evidence, collect
from agents.explorer import Explorer
from agents.llm import LLMPolicy
from agents.operators import ClusterOps, DataCuration, Diagnostics, HarnessCritic, Lead
from agents.recall import apply_skills, episode_summaries, evidence_view, firing_skills, skill_summary
from sandboxes.private import private_dir, write_private
from swarm.agent_run import AgentSteering, agent_jobs, job_config
from swarm.agent_run import task_name as agent_task
from swarm.backtest import ADOPTED, ARM_ONLY, BacktestRunner, adoptable, run_arms, task_facts, task_range
from swarm.deciding import Deciding, in_force, recent_pace
from swarm.decisions import PERSIST_WITHIN
from swarm.goal import Goal
from swarm.graph import SwarmState, build_graph, prune_checkpoints
from swarm.job_control import JobControl
from swarm.jobs import CpuMeter, Jobs, ProcessJobs, RayJobs, run_key
from swarm.knowledge import Knowledge, seed_workspace
from swarm.pilot import adopt_recorded, pilot_cpu, plan_run, prediction_vs_outcome, read_record, steps_to_target
from swarm.plan_memory import recall_plan, remember_plan
from swarm.plan_pr import open_plan_pr
from swarm.report import LifecycleReports, final_report, intervention_report, skills_in_run, summary_row
from swarm.retention import enforce_retention, fold_cpu
from swarm.script_run import ScriptSteering, accepted, pr_view, resolved, script_jobs, task_name
from swarm.store import Store, acquire_lock
from swarm.workspace import Workspace
from trainer.run_storage import sync_run
from trainer.runlog import atomic_write_text, iter_jsonl, metrics_history, tail_jsonl

RECURSION_LIMIT = 10_000_000  # a tick is ~10 supersteps; runs last days
STATUS_EVERY_S = 10.0         # status.json (steps, budget spent) is rewritten at least this often while the timeline is quiet
RUN_ID = "main"               # the controller run of a workspace (its LangGraph thread too)
PRUNE_EVERY_TICKS = 50        # graph.db keeps the newest KEEP_CHECKPOINTS LangGraph checkpoints
KEEP_CHECKPOINTS = 200


@dataclass
class Tick:
    """What this tick's nodes computed and later nodes of the same tick reuse (never checkpointed:
    a resumed tick computes it again)."""
    evidence: Evidence | None = None               # read once by observe; dropped after a command
    findings: list[Any] = field(default_factory=list)       # every detector's, on the controller's own run
    diagnosed: bool = False                        # the detectors ran on this tick
    proposals: list[Intervention] = field(default_factory=list)
    view: dict[str, Any] = field(default_factory=dict)      # the evidence view the proposals were made on
    recall: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])   # skills, episodes


@dataclass
class Memo:
    """What this controller process remembers between ticks to avoid redoing work (rebuilt after a
    restart of the controller: everything that decides is in the store)."""
    recall_key: tuple | None = None                # findings + library version of the last retrieval
    ranked: list[Any] = field(default_factory=list)
    program_cache: dict[str, Any] = field(default_factory=dict)
    firing: set[tuple[str, bool]] = field(default_factory=set)   # skills logged as firing (edge-triggered)
    findings: set[tuple[str, str]] = field(default_factory=set)  # findings logged to the timeline
    avoided: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    held: set[float] = field(default_factory=set)  # launches whose restart hold was logged
    deferred: set[tuple[str, int, str]] = field(default_factory=set)  # (fix, evals seen, kind of wait) whose deferral was logged
    looks: int = 0                                  # the controller's looks so far (the store keeps those that saw a finding)
    # the timeline's last seq when this process's last full pass began (rows logged during or
    # after it, a human decision included, make the next tick a full pass)
    full_seq: int | None = None
    pass_seq: int | None = None
    reported_seq: int = -1
    reported_at: float = float("-inf")   # when status.json was last written (wall clock)
    ckpts: tuple[int, list[dict[str, Any]]] | None = None
    recall: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
    task_facts: dict[str, Any] | None = None   # the task's own (swarm.backtest.task_facts), measured once


class Controller(AgentSteering, JobControl, ScriptSteering, Deciding):
    def __init__(self, workspace: str | pathlib.Path, goal: Goal, jobs: str | None = "ray", ray_address: str | None = None,
                 backtest_runner: BacktestRunner = run_arms) -> None:
        self.dir = pathlib.Path(workspace).resolve()
        self.sdir = self.dir / ".swarm"
        self.sdir.mkdir(parents=True, exist_ok=True)
        self.lock = acquire_lock(self.dir)
        self.goal = goal
        self._observed = False   # this process has not looked at the run yet: its first tick does not wait
        self.store = Store(self.sdir / "state.db")
        self.ws = Workspace.open(self.dir)
        self.store.subscribe(LifecycleReports(self.ws, self.sdir / "runs" / "train"))   # reports follow the lifecycle
        self.private = self.sdir / "private"
        private_dir(self.private)
        self.runs = self.sdir / "runs"
        self.script = goal.entrypoint    # the user's own script (swarm/script_run.py), else None
        self.agent = goal.agent          # the agent trainer's config (swarm/agent_run.py), else None
        # not chosen: the kind the run was started with (a resume), else an agent run's jobs are local
        # processes and every other run's Ray jobs
        kind = self.private / "jobs_kind"
        recorded = kind.read_text().strip() if kind.is_file() else None
        if jobs is None and recorded not in (None, "", "ray", "process"):
            raise ValueError(f"{kind}: {recorded!r} is not a jobs kind (ray or process); pass --jobs")
        jobs = jobs or recorded or ("process" if self.agent else "ray")
        reserve = dict(job_cpus=goal.swarm.job_cpus, job_resources=goal.swarm.job_resources,
                       run_key=run_key(self.private)) if jobs == "ray" else {}
        self.jobs: Jobs = (agent_jobs(self.sdir / "logs", jobs, ray_address, self._saved_head, self._save_head,
                                      **reserve) if self.agent else
                           script_jobs(self.script, self.sdir / "logs", jobs, ray_address, self._saved_head, self._save_head,
                                       **reserve) if self.script else
                           ProcessJobs(self.sdir / "logs") if jobs == "process" else
                           RayJobs(ray_address, saved=None if ray_address else self._saved_head(), on_head=self._save_head,
                                   storage=goal.swarm.storage, **reserve))
        if jobs in ("ray", "process") and jobs != recorded:   # once the launcher is made: what a resume uses
            write_private(kind, jobs)
        self.operators = ([ClusterOps(), AgentHarnessCritic()] if self.agent else
                          [ClusterOps(), DataCuration(), Diagnostics(), HarnessCritic(), Explorer()])
        self.lead = Lead(avoid_after_losses=goal.memory.avoid_after_losses)
        self.llm = None
        if goal.llm.model:
            self.llm = LLMPolicy(goal.llm, spend_cap_usd=goal.budget.llm_usd, decision_log=self.sdir / "llm_decisions.jsonl")
            saved = self.sdir / "llm_state.json"
            if saved.exists():  # spend and token counts survive a controller restart
                self.llm.load_state(json.loads(saved.read_text()))
        self.meter = CpuMeter()
        self.backtest_runner = backtest_runner   # runs a backtest's arms (swarm.backtest.run_arms; tests script them)
        self.tick, self.memo = Tick(), Memo(looks=self.store.last_look())
        self.state_job: str | None = None       # the live job's handle (commands wait on it)

        if not self.script and not self.agent:
            adopt_recorded(goal, self.sdir)   # a restarted run trains the plan it recorded (the pilot's winner)
        task = (task_name(self.script) if self.script else agent_task(goal) if self.agent else
                goal.run_config("train", "runs").task.name)
        self.knowledge = Knowledge(self.ws, goal.memory, task=task, timeline=self.store.log)
        self.windows = self.sdir / "windows"     # the evidence view each intervention was proposed on
        private_dir(self.windows)
        self.graph, self._conn = build_graph(self, str(self.sdir / "graph.db"))
        self.config = {"configurable": {"thread_id": RUN_ID}, "recursion_limit": RECURSION_LIMIT}
        if self.script:   # no task, recipe or harness of ours: the run declares its settings
            self.base_cfg, self.task_range = {"recipe": {}, "harness": {}}, (0, 0)
            return
        if self.agent:    # the agent trainer's job config; its harness and recipe live in the run
            job = job_config(goal, self.runs)
            self.base_cfg, self.task_range = {"recipe": {"eval_size": job["eval_size"]}, "harness": {}, "job": job}, (0, 0)
            return
        self.base_cfg = self.start_config()
        self.task_range = task_range(self.base_cfg)   # the task's difficulties: what a curriculum may ask for

    def start_config(self) -> dict[str, Any]:
        """The live job's config: the goal's run with its plan, the budget's steps, the target's early stop."""
        cfg = self.goal.run_config("train", str(self.runs)).model_dump(mode="json")
        cfg["recipe"]["steps"] = self.goal.budget.steps
        if self.goal.target.stop and self.goal.target.op == ">=" and self.goal.target.metric == "heldout_acc":
            # the trainer's early stop is on accuracy
            cfg["recipe"]["stop_at_heldout"] = self.goal.target.threshold
        return cfg

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def create(cls, workspace: str | pathlib.Path, goal: Goal, **kw: Any) -> "Controller":
        d = pathlib.Path(workspace)
        if (d / ".swarm" / "graph.db").exists():
            raise ValueError(f"workspace {str(d)!r} already holds a run; use `swarm resume --workspace {d}`")
        goal = resolved(goal, pathlib.Path.cwd()) if goal.entrypoint else goal   # a resume runs it from anywhere
        cfg = None if goal.entrypoint or goal.agent else goal.run_config("train", "runs")   # their files stay empty
        Workspace.init(d, yaml.safe_dump(goal.public(), sort_keys=False), cfg.recipe.model_dump(mode="json") if cfg else {},
                       cfg.harness.model_dump(mode="json") if cfg else {})

        seed_workspace(Workspace.open(d), goal.memory)
        priv = d / ".swarm" / "private"
        private_dir(priv)

        write_private(priv / "goal.yaml", yaml.safe_dump(goal.model_dump(mode="json"), sort_keys=False))  # 0600
        return cls(d, goal, **kw)

    @classmethod
    def open(cls, workspace: str | pathlib.Path, **kw: Any) -> "Controller":
        d = pathlib.Path(workspace)
        p = d / ".swarm" / "private" / "goal.yaml"
        if not p.is_file():
            raise ValueError(f"no swarm run in workspace {str(d)!r} (missing .swarm/private/goal.yaml)")
        return cls(d, Goal.parse(yaml.safe_load(p.read_text())), **kw)

    # ---- running ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run (or continue) the graph to the end; returns the summary."""
        snap = self.graph.get_state(self.config)
        # any checkpoint: continue it. `snap.next` is empty also when the controller died after a
        # node's writes were saved but before the next checkpoint, so only the store says "finished".
        inp = None if snap.values else SwarmState()
        self.state_job = (snap.values or {}).get("job")   # resuming mid-node: commands need the live job
        if snap.values and not snap.next and self.store.timeline("finished"):  # already finished
            self.jobs.close()   # killed after finishing, before stopping its head: stop it now
            (self.sdir / "ray_head.json").unlink(missing_ok=True)
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

    def evidence(self, status: str) -> Evidence:
        """The run's evidence: the copy `observe` read this tick unless a command went to the
        trainer since (its files may have moved on: a rollback starts a new segment)."""
        ev = self.tick.evidence
        if ev is None or ev.job_status != status:
            ev = self.tick.evidence = collect(self.run_dir, status)
        return ev

    def context(self, ev: Evidence):
        cfg = self.base_cfg
        if self.script:
            return self.script_context()
        if self.agent:
            return self.agent_context()
        return OperatorContext(
            goal=self.goal.goal, start_harness=cfg["harness"], target=self.goal.target, recipe=self.ws.current_recipe(), harness=self.ws.current_harness(),
            eval_difficulty=cfg["harness"]["curriculum"].get("end") or cfg["harness"]["curriculum"]["start"],
            history=self.store.list(), checkpoints=self.checkpoints(), skills=self.tick.recall[0], episodes=self.tick.recall[1],
            min_difficulty=self.task_range[0], settled_since=self.settled_since(), verify_steps=self.verify_steps(),
        )

    # ---- nodes --------------------------------------------------------------------------------
    def node_plan(self, s: SwarmState) -> dict[str, Any]:
        self.store.start_run(RUN_ID, self.goal.goal)   # idempotent: a resumed run keeps its start time
        if s.plan:
            return {}
        t0 = time.time()
        rec = None if self.script or self.agent else plan_run(self.goal, self.sdir, self.store.log,   # memory, else the pilot
                                                 recall=lambda g: recall_plan(self.knowledge, g))
        if rec is not None and rec["plan"]["applied"]:   # the plan fills fields: it is the run's first PR
            self.base_cfg = self.start_config()
            self.store.log("plan_pr", branch=open_plan_pr(self.ws, rec, self.goal.target), report="reports/plan/REPORT.md")
        plan = self.lead.plan(self.goal.public())
        policy = "built-in policies (no LLM configured)" if self.llm is None else f"LLM policy {self.goal.llm.model} with built-in fallback"
        self.store.log("plan", plan=plan, policy=policy)
        return {"plan": plan, "started": t0, "cpu": {**s.cpu, **pilot_cpu(rec)}}

    def node_launch(self, s: SwarmState) -> dict[str, Any]:
        if s.job and self.job_status(s.job) in JobStatus.alive():
            self.state_job = s.job
            return {}
        job = self.start_job(s.restarts)
        self.state_job = job
        return {"job": job, "job_status": JobStatus.PENDING, "launched": time.time()}

    def node_observe(self, s: SwarmState) -> dict[str, Any]:
        self.state_job = s.job
        if s.tick and self._observed:   # a resumed controller looks at once
            time.sleep(self.goal.swarm.wait_s(s.quiet))
        self._observed = True
        self.tick = Tick()
        status = self.job_status(s.job)
        relaunch = self.after_head_replaced(s)
        status = relaunch.get("job_status", status)
        self.meter = CpuMeter(s.cpu)
        sync_run(self.run_dir)   # a run on storage: its replica here is brought up to date (else nothing)
        self.meter.observe(self.run_dir)
        for arm in (self.sdir / "backtests").glob("bt-*"):
            if arm.is_dir():
                self.meter.observe(arm)
        ev = self.evidence(status)
        upd: dict[str, Any] = {**relaunch, "tick": s.tick + 1, "job_status": status, "step": ev.step, "cpu": self.meter.state()}
        value = ev.latest_eval(self.goal.target.metric)
        if value is not None:
            upd["best"] = value if s.best is None else (max if self.goal.target.op == ">=" else min)(s.best, value)
            if not s.to_target and self.goal.target.met(value):
                upd["to_target"] = {"wall_s": time.time() - s.started, "worker_cpu_s": self.meter.total}
        b = self.goal.budget
        done = None
        if (self.sdir / "stop").exists():
            done = "stopped_by_user"
        elif status == JobStatus.SUCCEEDED:
            done = "target_met" if self.goal.target.met(value) else "steps_exhausted"
        elif (self.script or self.agent) and self.goal.target.stop and self.goal.target.met(value):
            # this project's trainer stops itself at the target (`stop_at_heldout`); a user's script
            # does not know it, so the controller ends the run there (`node_finish` stops the job)
            done = "target_met"
        elif status == JobStatus.FAILED and s.restarts >= self.goal.swarm.max_restarts:
            done = "job_failed"   # it died again after max_restarts restarts (all of them, whatever the cause)
        elif time.time() - s.started > b.wall_s:
            done = "budget_wall_clock"
        elif self.meter.total > b.worker_cpu_s:
            done = "budget_worker_cpu"
        if done:
            upd["done"] = done
        return upd

    def known(self, ctx: Any, s: SwarmState) -> Any:
        """What the detectors are told beyond the run's files: the context's, the goal's stale
        heartbeat threshold and how long ago the live job was launched (its grace)."""
        return dataclasses.replace(ctx.known(), stale_heartbeat_s=self.goal.swarm.stale_heartbeat_s,
                                   since_launch_s=(time.time() - s.launched) if s.launched else None)

    def node_diagnose(self, s: SwarmState) -> dict[str, Any]:
        ev = self.evidence(s.job_status)
        ctx = self.context(ev)
        if not self.script and not self.agent:     # the task's own facts: measured once
            if self.memo.task_facts is None:
                self.memo.task_facts = task_facts(self.base_cfg, ctx.eval_difficulty)
            ctx = ctx.model_copy(update=self.memo.task_facts)
        findings = (self.agent_findings(ev, self.known(ctx, s)) if self.agent else
                    run_detectors(Operator.view(ev, ctx), known=self.known(ctx, s)))   # once: the operators reuse them
        findings = self.with_onsets(findings)      # where a data change began, once named, stays named
        self.tick.findings, self.tick.diagnosed = findings, True
        ctx.with_findings(findings)
        self.log_findings(findings)
        self.memo.looks += 1      # the looks each finding was seen on are kept in the store
        self.store.record_look(self.memo.looks, ev.step, [d.name for d in findings], keep=PERSIST_WITHIN)
        wrong = [d for d in findings if d.severity != "info"]
        # skills and past episodes only when something is wrong (a healthy tick costs nothing), and
        # retrieved again only when what is wrong, the library or the memory changed: a finding that
        # persists for an hour is not re-embedded and re-queried every tick
        m = self.memo
        key = (tuple(sorted({d.name for d in wrong})), self.knowledge.version)
        if key != m.recall_key:
            m.recall_key, m.program_cache = key, {}
            m.ranked = self.knowledge.retrieve(wrong) if wrong else []
            util = self.knowledge.utility() if wrong else {}
            m.recall = ([skill_summary(sk, util.get(sk.name), sc) for sk, sc in m.ranked],
                        episode_summaries(self.knowledge.relevant_episodes(wrong)) if wrong else [])
        self.tick.recall = m.recall if wrong else ([], [])
        ranked = m.ranked
        if wrong:
            ctx = ctx.model_copy(update={"skills": m.recall[0], "episodes": m.recall[1]}).with_findings(findings)
        proposals: list[Intervention] = []
        for op in self.operators:
            proposals += op.propose(ev, ctx.with_proposed(proposals), llm=self.llm)
        ctx.with_proposed(None)      # a per-loop view: nothing after the operators reads a stale one
        view = evidence_view(ev, findings, ctx, task=self.knowledge.task) if (proposals or ranked) else {}
        if ranked:
            fired = firing_skills([sk for sk, _ in ranked], view, self.knowledge.sandbox, self.goal.memory.program_timeout_s,
                                  cache=m.program_cache)
            now = {(sk.name, err is None) for sk, _, err in fired}
            for sk, _, err in fired:   # edge-triggered: a skill that keeps firing (or failing) is logged once
                if (sk.name, err is None) not in m.firing:
                    self.store.log("skill_fired" if err is None else "skill_failed", name=sk.name, step=ev.step,
                                   **({"error": err} if err else {}))
            m.firing = now
            proposals = apply_skills(proposals, fired, self.operators, findings, ctx)
        else:
            m.firing = set()
        self.tick.view, self.tick.proposals = view, proposals
        if self.llm is not None:
            write_private(self.sdir / "llm_state.json", json.dumps(self.llm.state(), default=str))
        # a quiet tick skips propose … mine_skills: nothing proposed, no intervention open, and no
        # timeline row (a human decision, a transition, an episode) since the last full pass
        seq = self.store.last_seq()
        quiet = (not proposals and m.full_seq is not None and seq == m.full_seq
                 and not any(iv.status in Status.open() for iv in self.store.list()))
        m.pass_seq = None if quiet else seq
        return {"quiet": quiet}

    def log_findings(self, findings: list[Any]) -> None:
        """Findings about what the trainer itself noticed (a corrupt checkpoint it fell back from, a
        refused command, skipped steps, a resume) go into the timeline once each, so the reports
        show them; the other findings show through the interventions they lead to. A notice that
        persists (steps skipped tick after tick, each summary naming newer steps) is logged once
        per `evaluate_window_steps` window of steps, not once per tick."""
        window = max(1, self.goal.swarm.evaluate_window_steps)

        def keys(name: Any, step: Any, summary: Any) -> set[tuple[Any, str]]:
            return {(name, f"w{int(step or 0) // window}"), (name, str(summary))}

        notices = [d for d in findings if d.name in TRAINER_NOTICES]
        if notices and not self.memo.findings:     # a restarted controller: what the timeline already has
            for r in self.store.timeline("finding"):
                self.memo.findings |= keys(r.get("name"), r.get("step"), r.get("summary"))
        for d in notices:
            k = keys(d.name, d.step, d.summary)
            if not k & self.memo.findings:
                self.store.log("finding", name=d.name, severity=d.severity, summary=d.summary, step=d.step)
            self.memo.findings |= k

    def node_propose(self, s: SwarmState) -> dict[str, Any]:
        proposals, self.tick.proposals = self.tick.proposals, []
        proposals = [x for x in (self.prepare(iv, s) for iv in proposals) if x is not None]
        proposals = self.worth_it(proposals, s)
        if not proposals:
            return {}
        ev = self.evidence(s.job_status)
        ctx = self.context(ev)
        # one intervention at a time, until its first window is judged (one still inconclusive after
        # it is looked at again later, but no longer holds the others back) — also among this tick's
        # proposals: a second fix waits for evidence from the run with the first one in force (its
        # symptom may be the first one's fault's, e.g. truncation from a too-hard curriculum)
        in_flight = [iv for iv in self.store.list() if iv.status in Status.in_flight()
                     and not (iv.status == Status.EVALUATING and iv.outcome.looks)]
        last_applied = max((iv.applied_step or 0 for iv in self.store.list() if iv.applied_step is not None), default=None)
        last_created = 0.0
        for iv in self.lead.arbitrate(proposals, ctx):
            urgent = cannot_wait(iv)
            if in_flight and not urgent:
                continue
            if (not urgent and last_applied is not None
                    and s.step - last_applied < self.goal.swarm.min_steps_between_interventions):
                continue
            if any(x.kind == iv.kind and x.status in Status.before_gate() for x in in_flight):
                continue
            write_private(self.windows / f"{iv.id}.json", json.dumps(self.tick.view, default=str))
            # the store lists (and backtests) oldest first: record in the lead's order, most urgent
            # first, not in the order the operators happened to build their proposals
            iv.created = max(time.time(), last_created + 1e-6)
            last_created = iv.created
            self.store.put(iv)
            self.store.log("proposed", id=iv.id, iv_kind=iv.kind.value, operator=iv.operator, policy=iv.policy,
                           diagnosis=iv.diagnosis.name, skills=iv.skills_used, risk=iv.risk.value)
            in_flight.append(iv)
        for iv, why in self.lead.dropped:
            if why.startswith("memory:") and iv.signature() not in self.memo.avoided:   # once per fix, not per tick
                self.memo.avoided.add(iv.signature())
                self.store.log("avoided", signature=iv.signature(), operator=iv.operator, reason=why, step=s.step)
        return {}

    def pending(self) -> list[str]:
        """Interventions not yet decided, oldest first. The store, not the graph state, is the
        source of truth, so nothing proposed is lost when the controller dies mid-node."""
        return [iv.id for iv in self.store.list() if iv.status in Status.undecided()]

    def close_rejected(self) -> None:
        """Every rejected intervention is a closed PR with its report. A controller killed between
        recording a rejection and closing its PR (or before opening one) finishes the job here."""
        for iv in self.store.list():
            if iv.status != Status.REJECTED or iv.id in self.memo.closed:
                continue
            try:
                state = self.ws.pr_state(iv.id)
            except ValueError:
                self.open_pr(iv)
                state = "open"
            if state == "open":
                note = f"backtest: {iv.backtest.signal} effect {iv.backtest.effect:+.3f}, P(no gain)={iv.backtest.p_value:.3f}" if iv.backtest else \
                    (iv.history[-1]["note"] if iv.history else "")
                self.ws.reject(iv.id, note=note)
            self.memo.closed.add(iv.id)

    def node_gate(self, s: SwarmState) -> dict[str, Any]:
        self.close_rejected()
        for iid in self.pending():
            iv = self.store.get(iid)
            if iv.branch is None and iv.status == Status.VALIDATED:
                self.open_pr(iv)
                iv = self.store.get(iid)
            if iv.status == Status.VALIDATED:
                iv = self.reassess(iv)
            if iv.status == Status.VALIDATED and self.goal.approval.needs_human(iv.risk):
                self.store.transition(iid, Status.AWAITING_APPROVAL, f"risk {iv.risk.value} needs a human: swarm approve {iid}")
                self.resume_paused(iid)   # held at its fork since its backtest: the run goes on meanwhile
                # the run does not idle while a human decides: the largest step not rated high goes on
                self.smaller_alternative(self.store.get(iid))
        return {}

    def open_pr(self, iv: Intervention) -> None:
        md, pngs = intervention_report(iv, metrics_history(self.run_dir), tail_jsonl(self.run_dir / "samples.jsonl", 200))
        iv.branch = self.ws.open_pr(pr_view(iv) if self.script or self.agent else iv, md, pngs)
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
        for iid in self.pending():
            iv = self.store.get(iid)
            decision = human.get(iid)
            if iv.status == Status.AWAITING_APPROVAL and decision == "human_reject":
                if self.ws.pr_state(iid) == "open":   # git first: a crash in between is redone on resume
                    self.ws.reject(iid)
                self.store.transition(iid, Status.REJECTED, "rejected by a human")
                continue
            if iv.status == Status.VALIDATED or (iv.status == Status.AWAITING_APPROVAL and decision == "human_approve"):
                if iv.kind not in JOB_ACTIONS and self.job_unwell(s.job_status):
                    continue      # a dead or hung job first: a change sent to it now would not be read
                upd.update(self.apply(iv, s))
        return upd

    def apply(self, iv: Intervention, s: SwarmState) -> dict[str, Any]:
        upd: dict[str, Any] = {}
        began, pre = time.time(), None
        if iv.kind == InterventionKind.RESTART:
            if s.restarts >= self.goal.swarm.max_restarts:   # the cap, whatever validated the restart
                self.store.transition(iv.id, Status.REJECTED, f"max_restarts={self.goal.swarm.max_restarts} reached")
                return {}
            if s.job and self.job_status(s.job) not in JobStatus.terminal():
                if iv.diagnosis.name in SLOW_WORKER:   # alive, only slow: its steps since the newest checkpoint are kept
                    iv = self.store.get(iv.id)
                    iv.outcome.pace_before = recent_pace(self.evidence(s.job_status).metrics)
                    self.store.put(iv)
                    self.command("checkpoint", f"{iv.id}-pre", name=f"pre-{iv.id}")
                self.stop_job(s.job)
            if iv.changes:   # in the inbox before the job starts: the new worker reads it before its first step
                self.send("set_fields", f"{iv.id}-apply", fields=self.trainer_fields(iv.changes))
            if self.store.get(iv.id).outcome.paused_for_backtest:   # the job it paused is gone: nothing to resume
                iv = self.store.get(iv.id)
                iv.outcome.paused_for_backtest = False
                self.store.put(iv)
            job = self.start_job(s.restarts + 1)
            self.state_job = job
            upd = {"job": job, "restarts": s.restarts + 1, "job_status": JobStatus.PENDING, "launched": time.time()}
            step = s.step
            if iv.changes:
                ack = self.command("set_fields", f"{iv.id}-apply", fields=self.trainer_fields(iv.changes))
                if ack and not accepted(ack):
                    self.refused(iv, f"the trainer refused the change it was restarted with: {ack.get('reason')}")
                    return upd
                iv = self.store.get(iv.id)
                if iv.outcome.before is None:
                    iv.outcome.before = self.published_values(list(iv.changes))
        else:
            pre = self.command("checkpoint", f"{iv.id}-pre", name=f"pre-{iv.id}")
            changes = iv.changes
            target = self.rollback_target(iv) if iv.kind == InterventionKind.ROLLBACK else None
            arm_from = target      # where a rollback's candidate arm started (a change's forked the live state)
            far = self.too_far_back(iv, target, pre) if target else None
            if far:
                iv = self.store.get(iv.id)
                iv.outcome.rollback_skipped = far
                self.store.put(iv)
                self.store.log("rollback_skipped", id=iv.id, reason=far)
                target = None
            adopted = self.adoption(iv, target, pre)
            # a rollback and its changes land at one safe point (Deciding.one_safe_point)
            with self.one_safe_point(iv.id) if target or adopted else contextlib.nullcontext():
                if adopted:
                    ack = self.command("rollback", f"{iv.id}-adopt", name=adopted)
                    if ack is None:
                        # no answer says nothing (the job may be busy loading it, or have died): the
                        # command stays in the inbox, and the next tick's apply reads its answer
                        self.store.log("apply_deferred", id=iv.id, reason="no answer to the adoption yet", step=s.step)
                        return {}
                    if not accepted(ack):
                        iv = self.store.get(iv.id)
                        iv.outcome.adopted, iv.outcome.not_adopted = None, f"the trainer refused it: {ack.get('reason')}"
                        self.store.put(iv)
                        self.drop_adopted(iv.id)
                        adopted = None
                if adopted:
                    at = int(ack["step"])
                    # the arm's state predates what was applied since it started: that is set again
                    changes = (self.carry_over(iv.id, arm_from) if arm_from else
                               self.carry_over(iv.id, since=self.forked_at(iv))) | changes
                elif target:
                    self.command("rollback", f"{iv.id}-rb", name=target)
                    # the checkpoint predates later fixes: its harness and recipe do not have them
                    changes = self.carry_over(iv.id, target) | changes
                if changes:
                    ack = self.command("set_fields", f"{iv.id}-apply", fields=self.trainer_fields(changes))
                    if not ack and self.job_unwell(self.job_status(s.job)):
                        # no answer from a job that died or hung meanwhile says nothing about the change:
                        # it stays validated and is applied to the job that replaces it
                        self.store.log("apply_deferred", id=iv.id, reason="the job stopped answering", step=s.step)
                        return {}
                    if not accepted(ack):   # `restart` too: the relauncher relaunches with the change
                        if adopted:   # the arm's state holds the change: back to the live one
                            undo = self.command("rollback", f"{iv.id}-unadopt", name=f"pre-{iv.id}")
                            if not accepted(undo):
                                self.store.log("unadopt_failed", id=iv.id, reason=str(undo and undo.get("reason")))
                            self.drop_adopted(iv.id)
                        self.refused(iv, f"the trainer refused the change: {ack and ack.get('reason')}")
                        return {}
                    step = ack["step"]
                else:
                    step = at if adopted else pre["step"] if pre else s.step
            self.resume_paused(iv.id)   # held at its fork since its backtest validated it
            iv = self.store.get(iv.id)
            iv.checkpoint_before = f"pre-{iv.id}" if pre else None
            if iv.changes and iv.outcome.before is None:   # what the change replaced, as the run publishes it (agents/miner.py)
                iv.outcome.before = self.published_values(list(iv.changes))
        iv.applied_step = step
        if pre and "step" in pre:
            iv.outcome.step_left = int(pre["step"])   # where the run was: a rollback's window starts there
        ev = self.evidence(s.job_status)
        iv.outcome.baseline = ev.latest_eval(self.goal.target.metric)
        # rows written after this moment belong to the timeline the intervention created (the
        # trainer's acknowledgement of the checkpoint taken just before applying, else now)
        iv.outcome.since_time = pre["time"] if pre and "time" in pre else began
        if iv.outcome.cpu_at_apply is None:   # the evaluation window's CPU counts from here
            iv.outcome.cpu_at_apply = round(self.live_cpu(), 3)
            iv.outcome.faults_at_apply = self.faults_besides(iv)
        self.store.put(iv)
        if iv.status in Status.passed() and self.ws.pr_state(iv.id) == "open":
            self.ws.approve(iv.id)   # merged before a crash: not again
        # logged before the transition, once: a kill between the two re-runs apply on resume
        if not any(r.get("id") == iv.id for r in self.store.timeline("applied")):
            self.store.log("applied", id=iv.id, step=step)
        self.store.transition(iv.id, Status.APPLIED, f"applied at step {step}")
        return upd

    def refused(self, iv: Intervention, why: str) -> None:
        iv = self.store.get(iv.id)
        iv.outcome.refused = why      # a loss in memory: never retried
        self.store.put(iv)
        self.store.transition(iv.id, Status.REJECTED, why)
        self.ws.reject(iv.id)

    def adoption(self, iv: Intervention, target: str | None, pre: dict[str, Any] | None) -> str | None:
        """The live run's checkpoint `adopt-<id>`, written now, holding the state of the backtest arm
        `iv` is applied by (`swarm.backtest.adoptable`: the arm trained the change's first steps
        already), with the live run's own values of the fields an arm sets for itself (how it
        evaluates, its early stop); None where the change is applied to the live state (why, in
        `outcome.not_adopted`). The built-in trainer's runs whose checkpoints are on this disk: a
        stored run's replica holds no weights, and a script's or the agent trainer's arms keep none."""
        if self.script or self.agent or iv.kind == InterventionKind.RESTART or iv.backtest is None:
            return None
        from trainer.checkpoint import CheckpointError, CheckpointManager
        from trainer.run_storage import bound_uri

        name = f"{ADOPTED}-{iv.id}"
        if any(r.get("id") == f"{iv.id}-adopt" for r in iter_jsonl(self.run_dir / "command_log.jsonl")):
            return name          # sent before a crash and answered: the answer decides, nothing is copied again
        src: tuple[pathlib.Path, int] | str
        start = next((int(c["step"]) for c in self.checkpoints() if c["name"] == target), None) if target else None
        if bound_uri(self.run_dir) is not None:
            src = "the run is on storage, where the arms' weights are"
        elif not pre or pre.get("status") != "applied" or not isinstance(pre.get("step"), int):
            src = "no checkpoint of the live state to undo it to"
        elif iv.kind != InterventionKind.ROLLBACK and self.settled_since() >= self.forked_at(iv):
            src = ("the live run was changed since its arms forked it (a fix applied, undone or restarted): the "
                   "arm's state would bring back what is no longer in force, or drop what is")
        else:
            src = adoptable(iv.backtest, self.sdir / "backtests", start if start is not None else int(pre["step"]),
                            self.goal.target.op == ">=")
        if not isinstance(src, str):
            try:
                st = CheckpointManager(src[0].parent).load(src[0].stem)
                st["recipe"] = {**st["recipe"], **{k.removeprefix("recipe."): self.base_cfg["recipe"].get(k.removeprefix("recipe."))
                                                   for k in ARM_ONLY}}
                CheckpointManager(self.run_dir / "checkpoints").save(st, int(st["step"]), name)
            except (CheckpointError, OSError, KeyError, RuntimeError, ValueError) as e:
                src = f"its state did not load: {e}"
        iv = self.store.get(iv.id)
        if isinstance(src, str):
            iv.outcome.not_adopted = src
        else:
            iv.outcome.adopted = f"{src[0].parent.parent.name} at step {src[1]}"
        self.store.put(iv)
        return None if isinstance(src, str) else name

    def drop_adopted(self, iid: str) -> None:
        """Delete the live run's copy of an arm's state that was not, or no longer, taken on: as the
        newest checkpoint written, a restart would resume from it."""
        for suffix in (".json", ".pt"):   # the manifest first: a checkpoint without one is incomplete
            (self.run_dir / "checkpoints" / f"{ADOPTED}-{iid}{suffix}").unlink(missing_ok=True)

    def forked_at(self, iv: Intervention) -> float:
        """When its (last) backtest forked the live run."""
        return max((float(h["time"]) for h in iv.history if h.get("to") == Status.BACKTESTING.value), default=0.0)

    def changes_since(self, checkpoint: str | None, exclude: str, since: float | None = None) -> dict[str, dict[str, Any]]:
        """Field changes of the interventions in force (applied, being judged or kept) that were
        applied after `checkpoint` was written (or after the time `since`), oldest first, by id:
        rolling the trainer back to it restores its harness and recipe, so these are set again."""
        t_ckpt = since if since is not None else next((c.get("time", 0.0) for c in self.checkpoints() if c["name"] == checkpoint), None)
        if t_ckpt is None:
            return {}
        later = [x for x in self.store.list() if x.id != exclude and in_force(x) and x.changes
                 and (x.outcome.since_time or 0.0) > t_ckpt]
        return {x.id: dict(x.changes) for x in sorted(later, key=lambda x: x.outcome.since_time)}

    def carry_over(self, iid: str, checkpoint: str | None = None, since: float | None = None) -> dict[str, Any]:
        """The fields to set again after intervention `iid` rolls the trainer back to `checkpoint`
        (or to a state from the time `since`): `changes_since`, later values winning; the carried ids
        go into its outcome."""
        carried = self.changes_since(checkpoint, exclude=iid, since=since)
        if not carried:
            return {}
        iv = self.store.get(iid)
        iv.outcome.carried_over = list(carried)
        self.store.put(iv)
        return {k: v for c in carried.values() for k, v in c.items()}

    def node_mine_skills(self, s: SwarmState) -> dict[str, Any]:
        """Evaluated interventions become episodes in memory; when there are new ones, the skill
        miner distils, updates or retires skills (swarm/knowledge.py, agents/miner.py)."""
        done = {(r.get("id"), r.get("status")) for r in self.store.timeline("episode")}
        for iv in self.store.list():
            if iv.status not in Status.judged() or (iv.id, iv.status.value) in done:
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

    def node_report(self, s: SwarmState) -> dict[str, Any]:
        """Keep `.swarm/status.json` (the summary so far: target, steps, CPU, every intervention and
        its status) current for readers in other terminals. Per-intervention reports are written
        where decisions are made (PRs at backtest/gate); this rewrites the status file when the
        timeline moved, and at least every STATUS_EVERY_S so the budget spent that the live view
        and the cockpit show keeps up on a quiet run (a quiet tick in between costs nothing)."""
        if s.tick % PRUNE_EVERY_TICKS == 0:
            prune_checkpoints(self.graph.checkpointer, "main", KEEP_CHECKPOINTS)
        # backtest forks, pre-apply checkpoints, arms no one needs

        gone = enforce_retention(self.run_dir, self.sdir / "backtests", self.private / "backtests", self.store.list(), s.cpu)
        m = self.memo
        if not s.quiet:
            m.full_seq = m.pass_seq
        rows = self.store.timeline(since=max(m.reported_seq, 0))
        seq = rows[-1]["seq"] if rows else m.reported_seq
        if seq != m.reported_seq or time.time() - m.reported_at >= STATUS_EVERY_S:
            atomic_write_text(self.sdir / "status.json", json.dumps(self.summary(s), indent=1, default=str))
            m.reported_seq, m.reported_at = seq, time.time()
        # deleted arms' CPU readings fold into one entry: the checkpointed state stays the same size
        return {"cpu": fold_cpu(s.cpu, self.sdir / "backtests", gone.arms)} if gone.arms else {}

    def node_finish(self, s: SwarmState) -> dict[str, Any]:
        if s.job and self.job_status(s.job) not in JobStatus.terminal():
            self.command("stop", "controller-stop", timeout=120)
            self.stop_job(s.job)
        self.node_evaluate(s, final=True)    # what was applied is judged on the window it got,
        self.node_mine_skills(s)             # so the run's episodes and skills are not lost
        summary = self.summary(s)
        rows = metrics_history(self.run_dir)
        md, pngs = final_report(self.goal.public(), self.store.timeline(), self.store.list(), rows, summary)
        path = self.ws.write_final_report(md, pngs)
        if self.knowledge.opened:   # a run that needed memory: its report joins it (a quiet run does not load it)
            self.knowledge.record_report("final", md, kind="final", reached=bool(summary["reached"]), reason=str(s.done))
        remember_plan(self.knowledge, read_record(self.sdir), summary, steps_to_target(rows, self.goal.target))
        write_private(self.sdir / "summary.json", json.dumps(summary, indent=1, default=str))
        self.store.log("finished", reason=s.done, report=str(path))
        self.store.end_run(RUN_ID, str(s.done))
        self.jobs.close()
        self.knowledge.export()
        (self.sdir / "ray_head.json").unlink(missing_ok=True)
        return {}

    def summary(self, s: SwarmState) -> dict[str, Any]:
        ivs = self.store.list()
        rows = metrics_history(self.run_dir)   # bounded: the downsampled summary keeps every final row and each record
        final = [r for r in rows if r.get("final")]
        value = final[-1].get(self.goal.target.metric) if final else s.best
        reached = self.goal.target.met(value)
        t_target = next((r["time"] - s.started for r in rows if self.goal.target.met(r.get(self.goal.target.metric))), None)
        waste = self.wasted_cpu()
        wasted = waste["by_intervention"]
        return {
            "reached": bool(reached), "reason": s.done, "final_metric": value, "metric": self.goal.target.metric,
            "steps": s.step, "wall_s": time.time() - s.started if s.started else 0.0,
            "worker_cpu_s": CpuMeter(s.cpu).total, "seconds_to_target": t_target,
            "worker_cpu_s_to_target": (s.to_target.get("worker_cpu_s", CpuMeter(s.cpu).total) if reached else None),
            "restarts": s.restarts,
            "report": str(self.dir / "reports" / "final" / "REPORT.md"),
            "interventions": [summary_row(iv, wasted[iv.id]["cpu_s"] if iv.id in wasted else 0.0) for iv in ivs],
            "backtests": sum(1 for iv in ivs if iv.backtest is not None),
            "wasted_cpu_s": waste["total_cpu_s"],
            "trainer_notices": [{"name": r.get("name"), "summary": r.get("summary"), "step": r.get("step")}
                                for r in self.store.timeline("finding")],
            "rejected_by_backtest": sum(1 for iv in ivs if iv.status == Status.REJECTED and iv.backtest is not None),
            "skills": skills_in_run(self.store, self.knowledge),
            "llm": self.llm.summary() if self.llm is not None else {"calls": 0, "tokens": 0, "cost_usd": 0.0, "policy": "built-in"},
            "plan_prediction": prediction_vs_outcome(read_record(self.sdir), rows, self.goal.target, s.to_target.get("worker_cpu_s"),
                                                     self.live_cpu() / s.step if s.step else None),
        }
