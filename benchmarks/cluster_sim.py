"""What the controller's scheduling does past one machine, on paper: a discrete-event simulation of
N nodes, R swarm runs (one controller each), their live jobs, backtest arms, restarts and the run
storage's latency, driven by the controller's own rules and by measured costs.

    python benchmarks/cluster_sim.py --out benchmarks/results/cluster_sim    # .json, .md, .svg; seconds

Why: issue 33 asks where scale-out stops before the storage-backed, multi-node code exists. The
simulation answers which resource saturates first as nodes grow, for the controller as it is.

How. Every rule below is the code's, with the function it comes from:
- one controller drives one run (`swarm.controller.Controller`: one live job "train", one LangGraph
  thread `RUN_ID`); R runs are R controller processes sharing the cluster's head and the machine
  that hosts them. Several runs under one controller are not supported, so not simulated.
- a controller is one synchronous loop (`swarm.graph.build_graph`): observe → diagnose → … →
  report, then it sleeps `SwarmSettings.wait_s` (2 s). Each tick asks the Jobs API for the live
  job's status (`Controller.job_status` → `RayJobs.status`), reads the run folder
  (`agents.evidence.collect`, `CpuMeter.observe`, `Controller.checkpoints`) and spends the tick's CPU.
- a backtest blocks the loop (`Deciding.backtest` → `_backtest_arms` → `swarm.backtest.run_arms`):
  checkpoint and pause the live job (commands acknowledged between steps, polled every 0.2 s by
  `Controller.command`), submit the arms one by one (`RayJobs.start`), poll their status every
  0.5 s until all end or 1800 s pass, read their results, resume the live job. The looks follow
  `swarm.decisions.schedule`/`run_looks`: one seed's pair, then the next seed's pair, then (a
  critical finding) every seed over `critical_extend` × the horizon, each only while the previous
  look was inconclusive.
- one intervention in flight per run until its first window (100 steps) is judged, and 50 steps
  between applied ones (`Controller.node_propose`); a fix needs its finding on two looks at least
  5 steps apart (`decisions.persistence` via `Deciding.worth_it`); restarts are urgent, skip the
  backtest (`decisions.plan`), wait `stale_heartbeat_s × 2^restarts` from launch and stop at
  `max_restarts` (`decisions.restart_hold`); other backtests wait until a restarted job has
  written its first metrics row (`Deciding.job_action_first`).
- placement: the controller submits without entrypoint resources (`RayJobs.start` →
  `trainer.launch.submit_job`), and Ray then runs every job's driver — here the trainer itself — on
  the head node (`ray.dashboard.modules.job.job_manager.JobManager._get_label_selector`). That is
  `placement="head"`, the product as it is: every trainer shares the head node's cores.
  `placement="pinned"` is the planned fix (each job reserves one slot, issue 33): jobs queue in Ray
  until a slot is free, and a paused live job keeps its slot.

Costs (benchmarks/results): the tick's CPU (controller_overhead.json), the Jobs API's status and
submit round trips and head CPU, a job's start to its first metrics row, and the file-system
operations per tick and per command poll (cluster_costs.json, `benchmarks/cluster_costs.py`), the
trainer's step time (time_per_step.json). Assumed, and marked so in the results: fault rates, the
decision outcomes' odds, the held-out eval's time, the controller host's cores and memory, the
operations per checkpoint. Storage latency is swept (storage-backed runs are not built).

Model simplifications, stated: a node's cores are shared equally by the jobs computing on it
(processor sharing); the Jobs API is one FIFO server (the dashboard's one process), charged the
head's whole CPU per request (an upper bound); the controllers' host is a FIFO multi-core server;
storage latency is a delay per operation, without a throughput limit.
"""
from __future__ import annotations

import argparse
import heapq
import json
import math
import pathlib
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def _measured() -> dict[str, float]:
    """The measured inputs, read from the committed results they come from."""
    ov, cc, ts = _load("controller_overhead.json"), _load("cluster_costs.json"), _load("time_per_step.json")
    later = [j for j in cc["ray"]["jobs"] if j["job"] > 0]   # job 0 uploads the packages once per cluster
    return {
        "tick_cpu_s": ov["mean_tick_ms"] / 1000,
        "ctrl_start_cpu_s": ov["startup_cpu_s"],
        "observe_ops": cc["storage"]["observe_0_arms"]["total"],
        "cmd_poll_ops": cc["storage"]["command_wait_poll"]["total"],
        "status_rtt_s": cc["ray"]["status"]["median_ms"] / 1000,
        "status_head_cpu_s": cc["ray"]["status"]["head_cpu_ms_per_call"] / 1000,
        "submit_rtt_s": statistics.median(j["submit_s"] for j in later),
        "submit_head_cpu_s": statistics.median(j["head_cpu_submit_s"] for j in later),
        "job_start_s": statistics.median(j["to_first_row_s"] for j in later),
        "step_s": ts["median"]["trainer"],
    }


MEASURED = _measured()
SOURCES = {
    "tick_cpu_s": "measured: benchmarks/results/controller_overhead.json mean_tick_ms (healthy example, Ray jobs)",
    "ctrl_start_cpu_s": "measured: controller_overhead.json startup_cpu_s",
    "observe_ops": "measured (counted): cluster_costs.json storage.observe_0_arms",
    "cmd_poll_ops": "measured (counted): cluster_costs.json storage.command_wait_poll; also charged per arm read-out",
    "status_rtt_s": "measured: cluster_costs.json ray.status.median_ms (loaded 2-core machine)",
    "status_head_cpu_s": "measured: cluster_costs.json ray.status.head_cpu_ms_per_call",
    "submit_rtt_s": "measured: cluster_costs.json, median submit round trip of jobs 1-3",
    "submit_head_cpu_s": "measured: cluster_costs.json, median head CPU during submit of jobs 1-3 (whole head: upper bound)",
    "job_start_s": "measured: cluster_costs.json, median submit → first metrics row of jobs 1-3 (tiny model)",
    "step_s": "measured: benchmarks/results/time_per_step.json trainer median s/step (3-digit addition SFT)",
    "eval_s": "assumed: an arm's held-out eval of 200 examples",
    "ckpt_ops": "assumed: file-system operations to write or read one checkpoint",
    "crash_per_h": "assumed: worker crashes per live-job hour",
    "fault_per_h": "assumed: faults needing a fix per live-job hour",
    "p_extend": "assumed: chance a look is inconclusive (Extend)",
    "p_critical": "assumed: share of fixes for a critical finding (an extra look over 4x the horizon)",
    "p_valid": "assumed: chance a backtest validates the fix",
    "max_fix_tries": "assumed: backtests spent on one fault before it is left alone",
    "controller_cores": "assumed: cores of the one machine that runs every run's controller",
    "controller_mem_gb": "assumed: memory of that machine",
    "controller_rss_gb": "measured: benchmarks/results/soak.md controller RSS 448 MB",
    "slots_per_node": "assumed: a job is a node's worth of work",
}
POLICY = {
    "tick_s": "swarm/goal.py SwarmSettings.observe_every_s default (observe_quiet_s None: the same)",
    "min_steps_between": "SwarmSettings.min_steps_between_interventions",
    "window_steps": "SwarmSettings.evaluate_window_steps",
    "stale_heartbeat_s": "SwarmSettings.stale_heartbeat_s (restart backoff base, decisions.restart_hold)",
    "max_restarts": "SwarmSettings.max_restarts",
    "horizon_steps": "BacktestSettings.horizon_steps", "seeds": "len(BacktestSettings.seeds)",
    "critical_extend": "BacktestSettings.critical_extend",
    "arm_timeout_s": "swarm.backtest.run_arms timeout_s", "arm_poll_s": "run_arms' poll sleep",
    "cmd_poll_s": "Controller.command's poll sleep", "persist_steps": "decisions.persistence: two looks >= 5 steps apart",
}


@dataclass
class Params:
    nodes: int = 8
    runs: int = 8
    placement: str = "head"          # "head": as shipped (no entrypoint resources); "pinned": one slot per job
    storage_s: float = 0.020         # latency per file-system operation on the run storage (swept)
    hours: float = 2.0
    seed: int = 0
    slots_per_node: int = 1
    # the controller's policy (POLICY names where each comes from)
    tick_s: float = 2.0
    min_steps_between: int = 50
    window_steps: int = 100
    stale_heartbeat_s: float = 20.0
    max_restarts: int = 5
    horizon_steps: int = 60
    seeds: int = 2
    critical_extend: int = 4
    arm_timeout_s: float = 1800.0
    arm_poll_s: float = 0.5
    cmd_poll_s: float = 0.2
    persist_steps: int = 5
    # measured (MEASURED, SOURCES)
    tick_cpu_s: float = MEASURED["tick_cpu_s"]
    ctrl_start_cpu_s: float = MEASURED["ctrl_start_cpu_s"]
    observe_ops: int = int(MEASURED["observe_ops"])
    cmd_poll_ops: int = int(MEASURED["cmd_poll_ops"])
    status_rtt_s: float = MEASURED["status_rtt_s"]
    status_head_cpu_s: float = MEASURED["status_head_cpu_s"]
    submit_rtt_s: float = MEASURED["submit_rtt_s"]
    submit_head_cpu_s: float = MEASURED["submit_head_cpu_s"]
    job_start_s: float = MEASURED["job_start_s"]
    step_s: float = MEASURED["step_s"]
    controller_rss_gb: float = 0.448
    # assumed (SOURCES)
    eval_s: float = 5.0
    ckpt_ops: int = 4
    crash_per_h: float = 0.5
    fault_per_h: float = 1.0
    p_extend: float = 0.5
    p_critical: float = 0.3
    p_valid: float = 0.5
    max_fix_tries: int = 3
    controller_cores: int = 16
    controller_mem_gb: float = 64.0

    def __post_init__(self) -> None:
        if self.placement not in ("head", "pinned"):
            raise ValueError(f"placement={self.placement!r} must be 'head' or 'pinned'")
        for k in ("nodes", "runs", "slots_per_node", "controller_cores", "seeds"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k}={getattr(self, k)} must be >= 1")
        if self.hours <= 0 or self.storage_s < 0 or self.tick_cpu_s < 0:
            raise ValueError(f"hours={self.hours}, storage_s={self.storage_s}, tick_cpu_s={self.tick_cpu_s}: "
                             "hours must be > 0, the others >= 0")


# ---- a small event engine: processes are generators yielding a delay (float) or an Event ----------
class Event:
    __slots__ = ("sim", "waiters", "fired", "value")

    def __init__(self, sim: "Sim") -> None:
        self.sim, self.waiters, self.fired, self.value = sim, [], False, None

    def succeed(self, value: Any = None) -> None:
        if self.fired:
            return
        self.fired, self.value = True, value
        for w in self.waiters:
            self.sim.at(self.sim.now, w, value)
        self.waiters = []

    def on(self, fn: Callable[[Any], None]) -> None:
        if self.fired:
            self.sim.at(self.sim.now, fn, self.value)
        else:
            self.waiters.append(fn)


class Sim:
    def __init__(self) -> None:
        self.now = 0.0
        self._q: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._n = 0

    def at(self, t: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        self._n += 1      # ties run in the order they were scheduled: deterministic
        heapq.heappush(self._q, (t, self._n, fn, arg))

    def spawn(self, gen: Iterator[Any]) -> None:
        self.at(self.now, lambda _: self._step(gen, None))

    def _step(self, gen: Iterator[Any], value: Any) -> None:
        try:
            y = gen.send(value)
        except StopIteration:
            return
        if isinstance(y, Event):
            y.on(lambda v: self._step(gen, v))
        else:
            self.at(self.now + y, self._resume, gen)

    def _resume(self, gen: Iterator[Any]) -> None:
        self._step(gen, None)

    def run(self, until: float) -> None:
        q = self._q
        while q and q[0][0] <= until:
            t, _, fn, arg = heapq.heappop(q)
            self.now = t
            fn(arg)
        self.now = until


class Server:
    """A FIFO queue in front of `c` identical servers. `use` books a request arriving now and
    returns the delay until it is done (queueing + service + `extra` latency). Busy time is counted
    inside [0, horizon] only, so utilisation never exceeds 1."""

    def __init__(self, sim: Sim, c: int, horizon: float) -> None:
        self.sim, self.c, self.horizon = sim, c, horizon
        self.free = [0.0] * c
        self.busy = self.waited = 0.0
        self.n = 0

    def use(self, service: float, extra: float = 0.0, count: int = 1) -> float:
        """`count` requests one after another (each starts when the previous one has returned)."""
        t = self.sim.now
        for _ in range(count):
            f = heapq.heappop(self.free)
            start = max(t, f)
            end = start + service
            heapq.heappush(self.free, end)
            self.busy += max(0.0, min(end, self.horizon) - min(start, self.horizon))
            self.waited += start - t
            self.n += 1
            t = end + extra
        return t - self.sim.now

    def utilisation(self) -> float:
        return self.busy / (self.c * self.horizon)


# ---- nodes and jobs: processor sharing per node ------------------------------------------------------
class Job:
    __slots__ = ("kind", "work", "done", "node", "active", "targets", "submitted", "placed_at", "placed", "ended")

    def __init__(self, sim: Sim, kind: str, work: float = math.inf) -> None:
        self.kind, self.work, self.done = kind, work, 0.0
        self.node: Node | None = None
        self.active = True
        self.targets: list[tuple[float, int, Event]] = []
        self.submitted = sim.now
        self.placed_at: float | None = None
        self.placed, self.ended = Event(sim), False


class Node:
    def __init__(self, sim: Sim, idx: int, slots: int) -> None:
        self.sim, self.idx, self.slots = sim, idx, slots
        self.jobs: list[Job] = []
        self.last = 0.0
        self.busy = 0.0          # core-seconds computing
        self.held = 0.0          # slot-seconds held by placed jobs (pinned placement)
        self.demand = 0.0        # job-seconds of jobs computing here (over slots: more than 1 is oversubscribed)
        self.placed = 0.0        # job-seconds of jobs placed here, computing or paused
        self.gen = 0

    def computing(self) -> list[Job]:
        return [j for j in self.jobs if j.active]

    def speed(self) -> float:
        n = len(self.computing())
        return min(1.0, self.slots / n) if n else 1.0

    def settle(self) -> None:
        dt = self.sim.now - self.last
        if dt > 0:
            act = self.computing()
            sp = min(1.0, self.slots / len(act)) if act else 1.0
            for j in act:
                j.done += dt * sp
            self.busy += dt * min(len(act), self.slots)
            self.held += dt * min(len(self.jobs), self.slots)
            self.demand += dt * len(act)
            self.placed += dt * len(self.jobs)
        self.last = self.sim.now

    def reschedule(self) -> None:
        self.gen += 1
        sp = self.speed()
        for j in self.computing():
            if j.targets:
                self.sim.at(self.sim.now + max(0.0, j.targets[0][0] - j.done) / sp, self._check, (self.gen, j))

    def _check(self, arg: tuple[int, Job]) -> None:
        gen, j = arg
        if gen != self.gen or j.node is not self:
            return
        self.settle()
        while j.targets and j.targets[0][0] <= j.done + 1e-9:
            heapq.heappop(j.targets)[2].succeed()
        if j.targets and j.active:
            self.sim.at(self.sim.now + max(0.0, j.targets[0][0] - j.done) / self.speed(), self._check, (self.gen, j))


class Cluster:
    """Where jobs run. `head`: every job on node 0, its cores shared (no reservation: Ray runs a
    driver submitted without resources on the head node); `pinned`: one slot per job, FIFO queue."""

    def __init__(self, sim: Sim, p: Params) -> None:
        self.sim, self.p = sim, p
        self.nodes = [Node(sim, i, p.slots_per_node) for i in range(p.nodes)]
        self.queue: list[Job] = []
        self._n = 0
        self.queued = 0.0        # job-seconds waiting for a slot
        self._qlast = 0.0

    def _qsettle(self) -> None:
        self.queued += (self.sim.now - self._qlast) * len(self.queue)
        self._qlast = self.sim.now

    def submit(self, job: Job) -> None:
        self._qsettle()
        self.queue.append(job)
        self._place()

    def _place(self) -> None:
        self._qsettle()
        while self.queue:
            if self.p.placement == "head":
                node = self.nodes[0]
            else:
                node = next((n for n in self.nodes if len(n.jobs) < n.slots), None)
                if node is None:
                    return
            job = self.queue.pop(0)
            node.settle()
            node.jobs.append(job)
            job.node, job.placed_at = node, self.sim.now
            node.reschedule()
            job.placed.succeed()

    def remove(self, job: Job) -> None:
        job.ended = True
        if job in self.queue:
            self._qsettle()
            self.queue.remove(job)
            return
        node = job.node
        if node is None:
            return
        node.settle()
        node.jobs.remove(job)
        job.node = None
        node.reschedule()
        self._place()

    def set_active(self, job: Job, active: bool) -> None:
        if job.active == active:
            return
        if job.node is not None:
            job.node.settle()
        job.active = active
        if job.node is not None:
            job.node.reschedule()

    def at_work(self, job: Job, level: float) -> Event:
        """An event when `job` has computed `level` seconds of work (at full speed)."""
        ev = Event(self.sim)
        self._n += 1
        if job.node is not None:
            job.node.settle()
        heapq.heappush(job.targets, (level, self._n, ev))
        if job.node is not None:
            job.node.reschedule()
        return ev

    def progress(self, job: Job) -> float:
        if job.node is not None:
            job.node.settle()
        return job.done

    def speed(self, job: Job) -> float:
        return job.node.speed() if job.node is not None else 1.0

    def finish(self) -> None:
        self._qsettle()
        for n in self.nodes:
            n.settle()


# ---- one swarm run: its controller's loop ----------------------------------------------------------
@dataclass
class Fault:
    onset: float
    critical: bool
    seen_step: float | None = None
    tries: int = 0


@dataclass
class Run:
    idx: int
    live: Job | None = None
    lives: list[Job] = field(default_factory=list)
    restarts: int = 0
    launched: float = 0.0
    crashed_at: float | None = None
    fault: Fault | None = None
    in_flight_until: float | None = None     # live steps at which the in-flight intervention's first window is judged
    last_applied: float | None = None        # live steps when the last intervention was applied
    busy: float = 0.0
    ended: bool = False


class Model:
    def __init__(self, p: Params) -> None:
        self.p = p
        self.T = p.hours * 3600.0
        self.sim = Sim()
        self.cluster = Cluster(self.sim, p)
        self.api = Server(self.sim, 1, self.T)                    # the head's Jobs API: the dashboard's one process
        self.host = Server(self.sim, p.controller_cores, self.T)  # the machine that runs every controller
        self.rng = random.Random(p.seed)
        self.stats: dict[str, list[float]] = {k: [] for k in (
            "restart_wait", "restart_queue", "restart_to_train", "detect_to_backtest", "pause", "arm_queue",
            "backtest_wall", "tick_wall")}
        self.count = {"arms": 0, "arms_done": 0, "arms_timed_out": 0, "backtests": 0, "validated": 0,
                      "restarts": 0, "runs_replaced": 0, "faults": 0, "crashes": 0, "faults_left": 0, "ticks": 0}
        self.runs: list[Run] = []

    # -- helpers: the requests a controller makes ------------------------------------------------
    def status_call(self, count: int = 1) -> float:
        p = self.p
        return self.api.use(p.status_head_cpu_s, max(0.0, p.status_rtt_s - p.status_head_cpu_s), count)

    def submit_call(self) -> float:
        p = self.p
        return self.api.use(p.submit_head_cpu_s, max(0.0, p.submit_rtt_s - p.submit_head_cpu_s))

    def steps(self, job: Job | None) -> float:
        if job is None:
            return 0.0
        return max(0.0, self.cluster.progress(job) - self.start_work()) / self.p.step_s

    def start_work(self) -> float:
        # process start and imports (measured), and reading the checkpoint it starts from off the storage
        return self.p.job_start_s + self.p.ckpt_ops * self.p.storage_s

    # -- processes ----------------------------------------------------------------------------------
    def start(self) -> None:
        for i in range(self.p.runs):
            self.new_run(i)
        self.sim.run(self.T)
        self.cluster.finish()

    def new_run(self, idx: int) -> None:
        run = Run(idx)
        self.runs.append(run)
        self.sim.spawn(self.controller(run))
        self.sim.spawn(self.faults(run, random.Random(f"{self.p.seed}-{idx}-{len(self.runs)}")))

    def faults(self, run: Run, rng: random.Random) -> Iterator[Any]:
        """Crashes hit a computing live job; faults needing a fix arrive while none is open."""
        p = self.p
        rate = (p.crash_per_h + p.fault_per_h) / 3600.0
        while not run.ended and rate > 0:
            yield rng.expovariate(rate)
            if run.ended:
                return
            live = run.live
            if rng.random() < p.crash_per_h / (p.crash_per_h + p.fault_per_h):
                if live is not None and live.node is not None and live.active and not live.ended:
                    self.count["crashes"] += 1
                    run.crashed_at = self.sim.now
                    self.cluster.remove(live)
            elif run.fault is None and live is not None:
                self.count["faults"] += 1
                run.fault = Fault(self.sim.now, rng.random() < p.p_critical)

    def launch(self, run: Run) -> Iterator[Any]:
        """Controller.start_job → RayJobs.start → trainer.launch.submit_job (one request, blocking)."""
        yield self.submit_call()
        job = Job(self.sim, "live")
        run.live, run.launched = job, self.sim.now
        run.lives.append(job)
        self.cluster.submit(job)

    def controller(self, run: Run) -> Iterator[Any]:
        p, sim = self.p, self.sim
        yield self.host.use(p.ctrl_start_cpu_s)       # imports, workspace, sqlite, LangGraph (measured)
        yield from self.launch(run)                    # node_launch
        first = True
        while True:
            if not first:
                yield p.tick_s                          # node_observe's sleep: SwarmSettings.wait_s
            first = False
            t0 = sim.now
            self.count["ticks"] += 1
            # node_observe: the live job's status, the run folder, then the tick's CPU (observe … report)
            yield self.status_call()
            yield self.host.use(p.tick_cpu_s, p.observe_ops * p.storage_s)
            live = run.live
            if live is not None and live.ended:         # FAILED
                if run.restarts >= p.max_restarts:      # node_observe: done = "job_failed"; the user starts the next run
                    run.ended = True
                    run.busy += sim.now - t0
                    self.count["runs_replaced"] += 1
                    self.new_run(run.idx)
                    return
                since = sim.now - run.launched
                if since >= p.stale_heartbeat_s * 2 ** run.restarts:   # decisions.restart_hold's backoff
                    # propose → plan (Skip: the job finding confirms it) → gate → apply: Controller.apply RESTART
                    self.stats["restart_wait"].append(sim.now - (run.crashed_at or sim.now))
                    yield from self.launch(run)
                    run.restarts += 1
                    self.count["restarts"] += 1
                    job = run.live
                    crashed = run.crashed_at or sim.now
                    job.placed.on(lambda _, j=job: self.stats["restart_queue"].append(sim.now - j.submitted))
                    self.cluster.at_work(job, self.start_work()).on(
                        lambda _, c=crashed: self.stats["restart_to_train"].append(sim.now - c))
                    # an applied intervention at the new job's first step, judged after a full window of it
                    run.last_applied, run.in_flight_until = 0.0, float(p.window_steps)
            elif live is not None and run.fault is not None:
                yield from self.maybe_backtest(run)
            run.busy += sim.now - t0
            self.stats["tick_wall"].append(sim.now - t0)

    def maybe_backtest(self, run: Run) -> Iterator[Any]:
        p, f, live = self.p, run.fault, run.live
        assert f is not None and live is not None, "maybe_backtest needs an open fault and a live job"
        step = self.steps(live)
        if live.node is None or step <= 0:      # Deciding.job_action_first: a job not yet training is not forked
            return
        if f.seen_step is None or step < f.seen_step:
            f.seen_step = step                   # the first look that sees it
            return
        if step - f.seen_step < p.persist_steps:                      # decisions.persistence
            return
        if run.in_flight_until is not None and step < run.in_flight_until:   # node_propose: one in flight
            return
        if run.last_applied is not None and step - run.last_applied < p.min_steps_between:
            return
        run.in_flight_until = None
        self.stats["detect_to_backtest"].append(self.sim.now - f.onset)
        yield from self.backtest(run, f)

    def command(self, run: Run, ckpt: bool = False) -> Iterator[Any]:
        """Controller.command: the inbox row, then polls of the command log (and the heartbeat, the
        job's status) every 0.2 s until the trainer acknowledges it between two steps."""
        p, live = self.p, run.live
        assert live is not None, "a command needs a live job"
        yield (p.cmd_poll_ops + 1) * p.storage_s          # Controller.send: reads the inbox, appends
        # a trainer reads its inbox between steps, a paused one every 0.2 s (trainer.loop.Trainer.train)
        step_time = p.step_s / self.cluster.speed(live) if live.active else 0.2
        ack = self.sim.now + step_time + p.cmd_poll_ops * p.storage_s + (p.ckpt_ops * p.storage_s if ckpt else 0.0)
        while True:
            yield p.cmd_poll_ops * p.storage_s + self.status_call()
            if self.sim.now >= ack:
                return
            yield p.cmd_poll_s

    def backtest(self, run: Run, f: Fault) -> Iterator[Any]:
        """Deciding.backtest: fork checkpoint, pause, the looks of decisions.schedule, resume; then
        gate and apply (Controller.apply: a checkpoint and the change, each a command)."""
        p, sim, live = self.p, self.sim, run.live
        assert live is not None, "a backtest forks a live job"
        t0 = sim.now
        self.count["backtests"] += 1
        yield from self.command(run, ckpt=True)     # checkpoint bt-<id>
        yield from self.command(run)                 # pause
        paused = sim.now
        self.cluster.set_active(live, False)
        looks = [(1, 1)] + [(1, 1)] * (p.seeds - 1) + ([(p.critical_extend, p.seeds)] if f.critical and p.critical_extend > 1 else [])
        timed_out = False
        for n, (factor, pairs) in enumerate(looks):
            work = self.start_work() + factor * p.horizon_steps * p.step_s + p.eval_s
            arms = []
            for _ in range(2 * pairs):               # run_arms: candidate and control per seed, submitted in turn
                yield self.submit_call()
                arm = Job(sim, "arm", work)
                arm.placed.on(lambda _, a=arm: self.stats["arm_queue"].append(sim.now - a.submitted))
                done = self.cluster.at_work(arm, work)
                done.on(lambda _, a=arm: self.cluster.remove(a))
                self.cluster.submit(arm)
                arms.append(arm)
                self.count["arms"] += 1
            deadline = sim.now + p.arm_timeout_s
            while True:                               # run_arms' poll: every arm's status, then 0.5 s
                yield self.status_call(len(arms))
                if all(a.ended for a in arms):
                    break
                if sim.now >= deadline:
                    for a in arms:
                        if not a.ended:
                            yield self.api.use(p.status_head_cpu_s, max(0.0, p.status_rtt_s - p.status_head_cpu_s))  # jobs.stop
                            self.cluster.remove(a)
                            self.count["arms_timed_out"] += 1
                    timed_out = True
                    break
                yield p.arm_poll_s
            self.count["arms_done"] += sum(1 for a in arms if a.done >= a.work - 1e-9)
            yield len(arms) * p.cmd_poll_ops * p.storage_s   # arm_score + read_heartbeat per arm
            if timed_out or n == len(looks) - 1 or self.rng.random() >= p.p_extend:
                break                                  # decide: conclusive, or the looks ran out
        yield from self.command(run)                   # resume (Deciding.resume_paused)
        self.cluster.set_active(live, True)
        self.stats["pause"].append(sim.now - paused)
        self.stats["backtest_wall"].append(sim.now - t0)
        f.tries += 1
        if not timed_out and self.rng.random() < p.p_valid:
            self.count["validated"] += 1
            yield from self.command(run, ckpt=True)    # apply: pre-<id> checkpoint
            yield from self.command(run)               # set_fields
            step = self.steps(live)
            run.last_applied, run.in_flight_until = step, step + p.window_steps
            run.fault = None
        elif f.tries >= p.max_fix_tries:
            self.count["faults_left"] += 1
            run.fault = None

    # -- results ------------------------------------------------------------------------------------
    def results(self) -> dict[str, Any]:
        p, T = self.p, self.T
        nodes = self.cluster.nodes
        live_train = sum(max(0.0, j.done - self.start_work()) for r in self.runs for j in r.lives)
        busy = [min(r.busy, T) / T for r in self.runs if not r.ended] or [0.0]

        def mean(xs: list[float]) -> float | None:
            return round(statistics.fmean(xs), 3) if xs else None

        util = {
            "nodes": sum(n.busy for n in nodes) / (p.nodes * p.slots_per_node * T),
            "head_node": nodes[0].busy / (p.slots_per_node * T),
            "slots_held": sum(n.held for n in nodes) / (p.nodes * p.slots_per_node * T),
            "jobs_api": self.api.utilisation(),
            "controller_host_cpu": self.host.utilisation(),
            "controller_host_mem": p.runs * p.controller_rss_gb / p.controller_mem_gb,
            "controller_loop": statistics.fmean(busy),
        }
        cap = p.nodes * p.slots_per_node * T
        # offered load: more than 1 means jobs wait for a slot or share cores
        load = {"head_node": nodes[0].demand / (p.slots_per_node * T), "nodes": sum(n.demand for n in nodes) / cap,
                "slots_held": (sum(n.placed for n in nodes) + self.cluster.queued) / cap}
        return {
            "nodes": p.nodes, "runs": p.runs, "placement": p.placement, "storage_ms": round(p.storage_s * 1000, 3),
            "slots_per_node": p.slots_per_node,
            "hours": p.hours, "seed": p.seed,
            "utilisation": {k: round(v, 4) for k, v in util.items()},
            "load": {k: round(v, 4) for k, v in load.items()},
            "controller_busy_max": round(max(busy), 4),
            "live_training_share": round(live_train / (p.runs * T), 4),
            "arms_per_hour": round(self.count["arms_done"] / p.hours, 2),
            "backtests_per_hour": round(self.count["backtests"] / p.hours, 2),
            "waits_s": {k: mean(v) for k, v in self.stats.items()},
            "waits_max_s": {k: (round(max(v), 3) if v else None) for k, v in self.stats.items()},
            "api_wait_ms": round(1000 * self.api.waited / max(self.api.n, 1), 3),
            "host_wait_ms": round(1000 * self.host.waited / max(self.host.n, 1), 3),
            "storage_per_tick_ms": round(1000 * p.observe_ops * p.storage_s, 3),
            "counts": dict(self.count),
        }


def simulate(p: Params) -> dict[str, Any]:
    """One scenario; deterministic given `p` (its seed included)."""
    m = Model(p)
    m.start()
    return m.results()


# ---- scenarios, the bottleneck, the outputs ---------------------------------------------------------
RESOURCES = ("head_node", "nodes", "slots_held", "jobs_api", "controller_host_cpu", "controller_host_mem", "controller_loop")
LABELS = {"head_node": "head node's cores", "nodes": "all nodes' cores", "slots_held": "node slots held",
          "jobs_api": "Jobs API (head's dashboard)", "controller_host_cpu": "controllers' host CPU",
          "controller_host_mem": "controllers' host memory", "controller_loop": "a controller's loop"}
SATURATED = 0.9


def pressure(row: dict[str, Any], resource: str) -> float:
    """How close a resource is to its limit: the offered load for node cores and slots (above 1:
    jobs share cores or wait for a slot), the busy share for the servers, the mean busy share of
    the controllers' loops, the memory share of the controllers' host."""
    return row["load"][resource] if resource in row["load"] else row["utilisation"][resource]


def saturation(points: list[tuple[int, float]], level: float = SATURATED) -> float | None:
    """The node count at which a resource's pressure reaches `level`: the first simulated point at
    or above it, else a straight line through the last two points extended (None: it does not grow)."""
    pts = sorted(points)
    for n, u in pts:
        if u >= level:
            return float(n)
    if len(pts) < 2:
        return None
    (n0, u0), (n1, u1) = pts[-2], pts[-1]
    if u1 <= u0 + 1e-9:
        return None
    return n1 + (level - u1) * (n1 - n0) / (u1 - u0)


def bottleneck(rows: list[dict[str, Any]], resources: tuple[str, ...] = RESOURCES) -> tuple[str | None, dict[str, float | None]]:
    """The resource whose pressure reaches saturation at the fewest nodes as nodes grow, over rows
    of one family (same placement, storage, runs per node) that differ in nodes. One node is left
    out: there the node itself is the limit whatever the policy (arms share it or queue for it)."""
    grown = [row for row in rows if row["nodes"] > 1] or rows
    sat = {r: saturation([(row["nodes"], pressure(row, r)) for row in grown]) for r in resources}
    hits = {r: s for r, s in sat.items() if s is not None}
    if not hits:
        return None, sat
    return min(hits, key=lambda r: (hits[r], -max(pressure(row, r) for row in grown))), sat


FAMILIES = [  # (placement, runs per node, storage ms, job slots per node)
    ("head", 1.0, 20.0, 1),
    ("pinned", 1.0, 20.0, 1),
    ("pinned", 0.5, 1.0, 1),
    ("pinned", 0.5, 20.0, 1),
    ("pinned", 0.5, 80.0, 1),
    ("pinned", 2.0, 20.0, 4),    # small jobs: a quarter of a node each, half the slots used by live jobs
]
NODES = (1, 8, 64)


def scenarios(hours: float, seed: int) -> list[Params]:
    out = []
    for placement, per_node, ms, slots in FAMILIES:
        for n in NODES:
            out.append(Params(nodes=n, runs=max(1, int(n * per_node)), placement=placement, storage_s=ms / 1000,
                              slots_per_node=slots, hours=hours, seed=seed))
    return out


def svg(rows: list[dict[str, Any]]) -> str:
    """Each resource's pressure against nodes, one panel per family (1 = saturated; clipped at 2)."""
    colors = {"head_node": "#d62728", "nodes": "#1f77b4", "slots_held": "#9467bd", "jobs_api": "#ff7f0e",
              "controller_host_cpu": "#2ca02c", "controller_host_mem": "#8c564b", "controller_loop": "#7f7f7f"}
    W, H, pw, ph, m, top = 1250, 330, 175, 200, 40, 2.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>']
    xs = {1: 0.0, 8: 0.5, 64: 1.0}
    for i, (placement, per_node, ms, slots) in enumerate(FAMILIES):
        fr = sorted(family_rows(rows, placement, per_node, ms, slots), key=lambda r: r["nodes"])
        x0, y0 = m + i * (pw + 25), 30
        out.append(f'<text x="{x0}" y="{y0 - 10}" font-size="10">{placement}, {per_node:g} run/node{"" if slots == 1 else f" ({slots} slots)"}, {ms:g} ms</text>')
        out.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        for v in (0.0, 0.5, 1.0, 1.5, 2.0):
            y = y0 + ph * (1 - v / top)
            dash = ' stroke-dasharray="4,3"' if v == 1.0 else ""
            out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + pw}" y2="{y:.1f}" stroke="{"#444" if v == 1.0 else "#eee"}"{dash}/>')
            if i == 0:
                out.append(f'<text x="{x0 - 25}" y="{y + 4:.1f}">{v:g}</text>')
        for n, fx in xs.items():
            out.append(f'<text x="{x0 + fx * pw - 6:.1f}" y="{y0 + ph + 14}">{n}</text>')
        for res, c in colors.items():
            if res == ("head_node" if placement == "pinned" else "slots_held"):
                continue
            pts = [(x0 + xs[r["nodes"]] * pw, y0 + ph * (1 - min(pressure(r, res), top) / top)) for r in fr if r["nodes"] in xs]
            if len(pts) > 1:
                out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                           + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
    out.append(f'<text x="{m}" y="{30 + ph + 32}">x: nodes (1, 8, 64); y: pressure (offered load for node cores and '
               'slots, busy share otherwise; 1 = saturated, clipped at 2)</text>')
    for j, (res, c) in enumerate(colors.items()):
        x = m + j * 140
        out.append(f'<rect x="{x}" y="{30 + ph + 48}" width="10" height="10" fill="{c}"/>'
                   f'<text x="{x + 14}" y="{30 + ph + 57}">{LABELS[res]}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def family_rows(rows: list[dict[str, Any]], placement: str, per_node: float, ms: float, slots: int) -> list[dict[str, Any]]:
    """The rows of one family: one placement, storage latency and slots per node, `per_node` runs per
    node (at least one run)."""
    return [r for r in rows if r["placement"] == placement and r["storage_ms"] == ms and r["slots_per_node"] == slots
            and r["runs"] == max(1, int(r["nodes"] * per_node))]


def markdown(res: dict[str, Any]) -> str:
    rows = res["rows"]
    L = ["# The controller's scheduling past one machine: a simulation", "",
         f"Command: `{res['command']}` ({res['cpu_s']} s of CPU, {res['wall_s']} s wall on a shared 2-core machine). Code: {res['commit']} (working tree). Simulated "
         f"{res['hours']} h per scenario, seed {res['seed']}; deterministic given the seed.", "",
         "What it is: a discrete-event simulation (benchmarks/cluster_sim.py) of R swarm runs, one controller each "
         "(the code supports one run per controller), on N nodes: each controller's loop as the code runs it "
         "(a tick every 2 s; a backtest blocks the loop and pauses the live job; one intervention in flight; "
         "restart backoff), the arms and restarts as Ray jobs, the Jobs API as one FIFO server, the storage as "
         "a latency per file-system operation. `head`: jobs placed as the controller submits them today (no "
         "entrypoint resources: Ray runs every trainer on the head node). `pinned`: each job reserves a node (the "
         "planned fix).", "",
         "## Bottleneck", ""]
    for b in res["bottlenecks"]:
        sat = ", ".join(f"{LABELS[k]} {('at ' + format(v, '.3g') + ' nodes') if v is not None else 'never'}"
                        for k, v in b["saturation_nodes"].items() if k in RESOURCES)
        L.append(f"- **{b['family']}**: {LABELS.get(b['bottleneck'], 'none') if b['bottleneck'] else 'nothing saturates'} "
                 f"— pressure reaches {SATURATED:g} ({sat}; from 8 nodes up, beyond 64 extrapolated along the 8 → 64 line).")
    L += ["", "## Per scenario", "",
          "| placement | nodes × slots | runs | storage ms | nodes busy | head node load | slots load | Jobs API busy | controllers' host CPU | a controller's loop busy (mean / max) | live jobs training | arms done / h | backtests / h | arm queue s (mean / max) | arms timed out | restart queue s | crash → restart submitted s | crash → training again s | pause per backtest s | fault → backtest s | API wait ms |",
          "|" + "---|" * 21]
    for r in rows:
        u, ld, w, wm, c = r["utilisation"], r["load"], r["waits_s"], r["waits_max_s"], r["counts"]

        def f(v: Any) -> str:
            return "—" if v is None else f"{v:g}"
        L.append(f"| {r['placement']} | {r['nodes']} × {r['slots_per_node']} | {r['runs']} | {r['storage_ms']:g} | {u['nodes']:.2f} | {ld['head_node']:.2f} | "
                 f"{ld['slots_held']:.2f} | {u['jobs_api']:.4f} | {u['controller_host_cpu']:.4f} | "
                 f"{u['controller_loop']:.2f} / {r['controller_busy_max']:.2f} | {r['live_training_share']:.2f} | "
                 f"{r['arms_per_hour']:g} | {r['backtests_per_hour']:g} | {f(w['arm_queue'])} / {f(wm['arm_queue'])} | "
                 f"{c['arms_timed_out']} | {f(w['restart_queue'])} | {f(w['restart_wait'])} | {f(w['restart_to_train'])} | {f(w['pause'])} | "
                 f"{f(w['detect_to_backtest'])} | {r['api_wait_ms']:g} |")
    L += ["", "Columns: *busy* is the share of a resource's capacity in use over the simulated time (1 = saturated); "
          "*load* is the offered load, jobs per slot averaged over time (above 1: jobs share the cores or wait): the head node's "
          "counts the jobs computing on it, the slots' every job placed (computing or paused) or waiting for a slot; *pressure* "
          "in the bottleneck lines is the load where there is one, else the busy share; *a controller's loop busy* is "
          "the share of time a controller is not sleeping between ticks (ticks, command waits, backtests); *live jobs training* "
          "is the live jobs' training progress over what R jobs at full speed would make (paused, restarting, slowed by a shared "
          "node all count against it).", "",
          "## Inputs", "", "| input | value | source |", "|---|---|---|"]
    for k, v in res["inputs"].items():
        L.append(f"| {k} | {v['value']} | {v['source']} |")
    L += ["", "Model simplifications: a node's cores are shared equally by the jobs computing on it; the Jobs API is one FIFO "
          "server charged the head's whole CPU per request (an upper bound); the controllers' host is a FIFO server with "
          "its cores; storage latency is a delay per file-system operation with no throughput limit; the live job runs "
          "for the whole simulated time (a run that reaches max_restarts is replaced by a new one); several status "
          "requests in one poll are booked back to back."]
    return "\n".join(L) + "\n"


def inputs(p: Params) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {k: {"value": f"{float(getattr(p, k)):g}", "source": f"code: {src}"} for k, src in POLICY.items()}
    out.update({k: {"value": f"{float(getattr(p, k)):g}", "source": src} for k, src in SOURCES.items()})
    out["storage_s"] = {"value": "0.001, 0.02, 0.08", "source": "swept: per file-system operation (local disk, NFS, an object store)"}
    out["placement"] = {"value": "head, pinned", "source": "head: the code as it is (RayJobs.start submits without "
                        "resources); pinned: one slot per job, the planned fix"}
    return out


def run_all(hours: float, seed: int) -> dict[str, Any]:
    t0, c0 = time.time(), time.process_time()
    rows = [simulate(p) for p in scenarios(hours, seed)]
    fams = {fam: family_rows(rows, *fam) for fam in FAMILIES}
    bns = []
    for (placement, per_node, ms, slots), fr in fams.items():
        # pinned: node 0 is one node among the others; head: nothing reserves slots
        res = tuple(r for r in RESOURCES if r != ("head_node" if placement == "pinned" else "slots_held"))
        name, sat = bottleneck(fr, res)
        bns.append({"family": f"{placement}, {per_node:g} run(s) per node" + (f" of {slots} job slots" if slots > 1 else "")
                    + f", {ms:g} ms storage", "bottleneck": name,
                    "saturation_nodes": {k: (round(v, 2) if v is not None else None) for k, v in sat.items()}})
    return {"rows": rows, "bottlenecks": bns, "hours": hours, "seed": seed, "wall_s": round(time.time() - t0, 1),
            "cpu_s": round(time.process_time() - c0, 1),
            "inputs": inputs(Params())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(RESULTS / "cluster_sim"), help="results path without extension")
    ap.add_argument("--hours", type=float, default=2.0, help="simulated hours per scenario")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import subprocess

    res = run_all(a.hours, a.seed)
    res["command"] = f"python benchmarks/cluster_sim.py --out {a.out}" + (f" --hours {a.hours:g}" if a.hours != 2.0 else "") \
        + (f" --seed {a.seed}" if a.seed else "")
    res["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    out.with_suffix(".md").write_text(markdown(res))
    out.with_suffix(".svg").write_text(svg(res["rows"]))
    for b in res["bottlenecks"]:
        print(f"{b['family']}: {b['bottleneck']}  {b['saturation_nodes']}")


if __name__ == "__main__":
    main()
