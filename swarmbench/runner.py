"""The benchmark runner: calibrate each scenario, run every method x seed, keep a resumable ledger,
show progress, write the results.

    swarm bench benchmarks/suites/dev --methods plain oracle pbt asha swarm --seeds 0 \\
        [--more-seeds 1 2 --more-on 5] [--parallel 2] [--name suite_dev] [--src head|worktree|COMMIT]

Ledger: `RESULTS/<name>/ledger.jsonl`, one JSON line per finished run, keyed by the scenario's
content hash + method + seed + the code state the method depends on (`calibrate.code_state`: the
trainer for the baselines, the swarm's packages as well for the swarm). A run already in the ledger
is not run again, so an interrupted bench resumes where it stopped (the same command); a run that
was going when it was interrupted is started again. Results: `RESULTS/<name>.json`, `.md` and SVG
plots, rewritten after every finished run from the ledger rows of the current plan and code state.

By default the code under test is a snapshot of git HEAD (`git archive`), so edits in the working
tree while a long bench runs do not leak into it; `--src COMMIT` snapshots another commit (a bench
resumed later measures the same code whatever HEAD is then). Each run is its own process
(`python -m swarmbench.worker`) started with the snapshot first on PYTHONPATH.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import json
import os
import pathlib
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import psutil

from swarmbench import calibrate as cal
from swarmbench import report
from swarmbench import machine
from swarmbench.methods import METHODS, summarise
from swarmbench.scenarios import Scenario, load_suite

ROOT = pathlib.Path(__file__).resolve().parents[1]


def part_commands(part: dict[str, Any]) -> list[str]:
    """The commands of one part of session.json, in order (a part written before it kept a list: its one command)."""
    return list(part.get("commands") or [part["command"]])


@dataclasses.dataclass
class BenchConfig:
    suite: str
    methods: list[str]
    seeds: list[int]
    more_seeds: list[int] = dataclasses.field(default_factory=list)
    more_on: int = 0
    more_methods: list[str] | None = None     # of `methods`, those run on the extra seeds (None: all)
    take: dict[str, int] = dataclasses.field(default_factory=dict)   # class -> how many scenarios of it to run
    per_origin: bool = False          # the failing count of `take` and `more_on` hold per fault origin (generator v5)
    parallel: int = 1
    calibrated_only: bool = False     # run only scenarios whose calibration is cached (calibrate none)
    name: str | None = None
    results: str = str(ROOT / "benchmarks" / "results")
    cache: str = str(ROOT / "benchmarks" / "cache" / "calibration")
    src: str = "head"
    workdir: str | None = None
    calib_seed: int = 0
    command: str = ""
    seed_note: str = ""
    cores: int | None = None           # core slots shared by the bench processes on this machine (None: all)
    machine_ref: float | None = None   # the reference workload's CPU-s here (None: measured at the start)
    slots_dir: str | None = None       # the folder of the core slots (None: one per machine, under the temp dir)
    sitting: str | None = None         # the label of this sitting's rows (None: this machine's boot, machine.sitting_id)

    def check(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ValueError(f"--methods: unknown {', '.join(map(repr, bad))}; known: {', '.join(METHODS)}")
        if not self.methods:
            raise ValueError("--methods: at least one method")
        if not self.seeds:
            raise ValueError("--seeds: at least one seed")
        if self.parallel < 1:
            raise ValueError(f"--parallel={self.parallel}: must be >= 1")
        bad = [m for m in (self.more_methods or []) if m not in METHODS]
        if bad:
            raise ValueError(f"--more-methods: unknown {', '.join(map(repr, bad))}; known: {', '.join(METHODS)}")
        if self.more_on < 0:
            raise ValueError(f"--more-on={self.more_on}: must be >= 0")
        for k, v in self.take.items():
            if k not in ("failing", "mild", "healthy") or not isinstance(v, int) or v < 0:
                raise ValueError(f"--take {k}={v!r}: a class (failing, mild, healthy) = a count >= 0")
        if self.per_origin and "failing" not in self.take and not self.more_on:
            raise ValueError("--per-origin: needs --take failing=N or --more-on N (the counts it holds per origin)")
        if "pb2" in self.methods:
            import importlib.util

            if importlib.util.find_spec("sklearn") is None:
                raise ValueError("--methods pb2 needs scikit-learn (Ray Tune's PB2 fits a GP with it): "
                                 "pip install -c constraints.txt -e '.[bench]'")
        if self.cores is not None and self.cores < 1:
            raise ValueError(f"--cores={self.cores}: must be >= 1")
        if self.machine_ref is not None and not self.machine_ref > 0:
            raise ValueError(f"--machine-ref={self.machine_ref}: must be > 0 (CPU-s of the reference workload)")
        if self.src not in ("head", "worktree") and resolve(self.src) is None:
            raise ValueError(f"--src={self.src!r}: head, worktree, or a commit of this repository")


def resolve(rev: str) -> str | None:
    """The full sha of commit `rev` in this repository (None: not one)."""
    out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=ROOT,
                         capture_output=True, text=True)
    return out.stdout.strip() or None if out.returncode == 0 else None


def prepare_src(mode: str, work: pathlib.Path) -> tuple[pathlib.Path, str]:
    """The code under test: a snapshot (`git archive`) under `work` of git HEAD (`head`) or of
    another commit (e.g. the swarm measured at a fixed commit while development goes on), or the
    working tree (`worktree`)."""
    sha = resolve("HEAD" if mode in ("head", "worktree") else mode) or ""
    if mode == "worktree" or not sha:
        return ROOT, f"working tree at {sha[:10] or 'no git'}"
    src = work / f"src-{sha[:10]}"
    if not src.exists():
        tmp = work / f".src-{sha[:10]}-{os.getpid()}"
        tmp.mkdir(parents=True)
        arc = subprocess.run(["git", "archive", "--format=tar", sha], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=arc, check=True)
        os.replace(tmp, src)
    return src, f"snapshot of git {'HEAD ' if mode == 'head' else 'commit '}{sha[:10]}"


def worker_launch(src: pathlib.Path, spec: pathlib.Path, result: pathlib.Path) -> tuple[list[str], dict[str, str]]:
    """The command and environment of one run's process: the worker of the code under test `src`,
    with `src` first on PYTHONPATH (the process starts in `src` as well)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MPLBACKEND", "Agg")
    return [sys.executable, "-m", worker_module(src), str(spec), str(result)], env


def worker_module(src: pathlib.Path) -> str:
    """The module a run's process starts in the code under test: `swarmbench.worker`, or
    `swarm.bench.worker` in a snapshot of a commit from before the suite had its own package (so
    a bench on such a commit runs that commit's worker and methods, not this tree's)."""
    if (src / "swarmbench" / "worker.py").is_file() or not (src / "swarm" / "bench" / "worker.py").is_file():
        return "swarmbench.worker"
    return "swarm.bench.worker"


SLEEPERS = ("plain", "pbt", "pb2", "asha")   # the methods that run the faults and restart no hung job
IDLE_WINDOW_S = 30.0     # a run is asleep when its processes used under IDLE_CORES of a core over this
IDLE_CORES = 0.1         # (Ray's own daemons use a few % of a core while every trial sleeps)


def sleeps_through(goal: dict[str, Any], wall_cap: float) -> bool:
    """The goal stalls the trainer for at least the run's wall cap: once every process of a run
    (plain's trainer, every Tune trial) sleeps, none wakes before the cap ends the run. The swarm is
    never such a run: its controller restarts a hung job."""
    from trainer.config import Perturbation
    from trainer.perturb import expand

    for raw in goal.get("perturbations") or []:
        try:
            p = expand(Perturbation(**raw))
        except (TypeError, ValueError):
            continue
        if p.kind == "stall" and float(p.seconds or 0.0) >= wall_cap:
            return True
    return False


def lend_when_asleep(proc: subprocess.Popen, lease: machine.Lease, lent: dict[str, float], poll_s: float = 2.0,
                     window_s: float = IDLE_WINDOW_S, idle_cores: float = IDLE_CORES) -> None:
    """Release `proc`'s core slots once its descendants (the trainers it started, Ray's processes)
    have used under `idle_cores` of a core for `window_s`: it sleeps until its wall cap
    (`sleeps_through`), so its cores go to the next run. The CPU counted is every descendant's,
    including those that ended (a Tune trial replaced by another is no idle time). `lent` gets when,
    and the CPU-s the run's processes used after it (the measurement's check that they slept on)."""
    from swarmbench.accounting import ProcessMeter

    meter = ProcessMeter(proc.pid)      # every descendant's CPU, those that ended included
    seen: list[tuple[float, float]] = []
    started, t0 = False, time.time()
    while proc.poll() is None:
        now = time.time()
        cpu = meter.poll(now)
        started = started or cpu > 1.0       # a trainer has run (not the start-up of an empty tree)
        seen.append((now, cpu))
        if lease.released_at is None:
            old = [x for x in seen if x[0] <= now - window_s]
            if started and old and (cpu - old[-1][1]) < idle_cores * (now - old[-1][0]):
                lease.release()
                lent.update(after_s=round(now - t0, 1), cpu_at_release=round(cpu, 2))
            seen = [x for x in seen if x[0] > now - 2 * window_s]
        else:
            lent["cpu_while_lent"] = round(cpu - lent["cpu_at_release"], 2)
        time.sleep(poll_s)


class Ledger:
    """Append-only JSONL of finished runs; one line is written whole (flush + fsync) under a lock."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.rows: dict[str, dict[str, Any]] = {}
        self.history: list[dict[str, Any]] = []     # every row, also those a later one of its key replaced
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                try:
                    r = json.loads(line)
                    self.rows[r["key"]] = r
                    self.history.append(r)
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue   # a line cut by an interruption: that run is redone

    @staticmethod
    def key(scenario_hash: str, method: str, seed: int, code: str) -> str:
        return f"{scenario_hash}|{method}|{seed}|{code}|{machine.REFERENCE_ID}"

    def get(self, key: str) -> dict[str, Any] | None:
        return self.rows.get(key)

    def add(self, row: dict[str, Any]) -> None:
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            cut = self.path.exists() and self.path.stat().st_size > 0 and not self.path.read_bytes().endswith(b"\n")
            with open(self.path, "a") as f:
                # after a line cut by an interruption, start a new one (the cut line stays unreadable)
                f.write(("\n" if cut else "") + json.dumps(row, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.rows[row["key"]] = row
            self.history.append(row)


class Bench:
    def __init__(self, cfg: BenchConfig) -> None:
        cfg.check()
        self.cfg = cfg
        self.scenarios: list[Scenario] = load_suite(cfg.suite)
        self.name = cfg.name or f"suite_{pathlib.Path(cfg.suite).resolve().name}"
        self.results = pathlib.Path(cfg.results)
        self.ledger = Ledger(self.results / self.name / "ledger.jsonl")
        self.cache = pathlib.Path(cfg.cache)
        self.work = pathlib.Path(cfg.workdir or tempfile.mkdtemp(prefix="swarm_bench_"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.src, self.src_desc = prepare_src(cfg.src, self.work)
        self.code = {"baseline": cal.code_state(self.src, cal.BASELINE_DIRS), "swarm": cal.code_state(self.src, cal.SWARM_DIRS)}
        self.cals: dict[str, cal.Calibration] = {}
        self.slots = machine.CoreSlots(cfg.cores, cfg.slots_dir)
        self.machine_ref = cfg.machine_ref
        self.sitting = cfg.sitting or machine.sitting_id()
        seen: dict[str, str] = {}
        # a scenario that runs exactly what an earlier one runs (e.g. two fault-free draws of one
        # family) is the same measurement: it is left out, named in the results
        self.duplicates = {s.name: seen[s.content_hash] for s in self.scenarios if s.content_hash in seen
                           or seen.setdefault(s.content_hash, s.name) != s.name}
        self.cal_locks = {s.name: threading.Lock() for s in self.scenarios}
        self.running: dict[int, dict[str, Any]] = {}
        self.waiting: dict[int, dict[str, Any]] = {}   # runs waiting for their cores
        self.procs: dict[int, subprocess.Popen] = {}
        self.lock = threading.Lock()
        self.stopping = False
        self.done_this_session = 0
        self.seq = 0

    # ---- one run in its own process ---------------------------------------------------------
    def _spawn(self, label: dict[str, Any], method: str, goal: dict[str, Any], seed: int, target: float, budget: float,
               wall_cap: float) -> dict[str, Any]:
        with self.lock:
            self.seq += 1
            rid = self.seq
        d = self.work / "runs" / f"{rid:05d}-{label['scenario']}-{method}-s{seed}"
        if d.exists():      # a run of an earlier sitting in the same work dir: a run starts from nothing
            shutil.rmtree(d)
        d.mkdir(parents=True)
        spec = {"method": method, "goal": goal, "seed": seed, "target": target, "budget": budget, "wall_cap": wall_cap,
                "work": str(d / "work"), "progress": str(d / "progress.json")}
        (d / "spec.json").write_text(json.dumps(spec))
        argv, env = worker_launch(self.src, d / "spec.json", d / "result.json")
        # the cores it keeps busy, held for the run: no run is measured on an oversubscribed machine
        with self.lock:
            self.waiting[rid] = {**label, "method": method, "seed": seed, "since": time.time()}
        held = contextlib.ExitStack()
        try:
            lease = held.enter_context(self.slots.hold(machine.METHOD_CORES.get(method, 1), stop=lambda: self.stopping))
        finally:
            with self.lock:
                self.waiting.pop(rid, None)
        with held:
            with self.lock:
                if self.stopping:
                    raise KeyboardInterrupt
                self.running[rid] = {**label, "method": method, "seed": seed, "budget": budget, "t0": time.time(),
                                     "progress": d / "progress.json"}
                with open(d / "worker.log", "wb") as log:
                    p = subprocess.Popen(argv, cwd=self.src, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                self.procs[rid] = p
            lent: dict[str, float] = {}
            if method in SLEEPERS and sleeps_through(goal, wall_cap):
                threading.Thread(target=lend_when_asleep, args=(p, lease, lent), daemon=True).start()
            try:
                p.wait()
            finally:
                with self.lock:
                    self.running.pop(rid, None)
                    self.procs.pop(rid, None)
        if self.stopping:
            raise KeyboardInterrupt
        res_path = d / "result.json"
        if not res_path.exists():
            tail = (d / "worker.log").read_text(errors="replace")[-2000:]
            return {"reached": False, "cpu_to_target": None, "cpu_total": None, "curve": [], "rc": p.returncode,
                    "stop": "worker died", "log_tail": tail}
        res = json.loads(res_path.read_text())
        if lent:
            res["cores_lent"] = lent
        return res

    # ---- calibration --------------------------------------------------------------------------
    def calibration(self, s: Scenario) -> cal.Calibration:
        with self.cal_locks[s.name]:
            if s.name in self.cals:
                return self.cals[s.name]

            def run(method, goal, seed, target, budget, wall_cap):
                # the oracle runs without the faults: a config-origin fault is the goal's own run config
                goal = s.healthy_goal() if method == "oracle" else goal
                return self._spawn({"scenario": s.name, "cls": "calibrating"}, method, goal, seed, target, budget, wall_cap)

            c, _cached = cal.calibrate(s.name, s.goal, self.cfg.calib_seed, self.code["baseline"], self.cache, run,
                                       has_faults=bool(s.faults), machine_ref=self.machine_ref,
                                       sitting=self.sitting)
            self.cals[s.name] = c
            self._record_calibration_runs(s, c)
            return c

    def parts(self) -> list[str]:
        """Which code states this bench measures: the baselines' (any method but the swarm), the swarm's."""
        return [p for p, on in (("baseline", any(m != "swarm" for m in self.cfg.methods)),
                                ("swarm", "swarm" in self.cfg.methods)) if on]

    def read_session(self) -> dict[str, Any]:
        """session.json as parts: for the baselines and for the swarm, the command, code under test and
        code state of the bench that measures them into this ledger (a file of one bench: both parts)."""
        p = self.results / self.name / "session.json"
        try:
            d = json.loads(p.read_text()) if p.exists() else {}
        except json.JSONDecodeError:
            d = {}
        if "parts" not in d and "command" in d:
            d["parts"] = {k: {"command": d["command"], "src": d["src"], "code": d["code"][k]} for k in ("baseline", "swarm")}
        d.setdefault("parts", {})
        return d

    def save_session(self) -> None:
        """What this bench runs (command, code under test, code states), for `--report-only`. Two bench
        processes on one ledger (the baselines, and the swarm with --calibrated-only) each write their
        own part."""
        d = self.results / self.name
        d.mkdir(parents=True, exist_ok=True)
        parts = self.read_session()["parts"]
        for part in self.parts():
            old = parts.get(part) or {}
            # benches of one code state add to a part (e.g. PBT run later beside plain and the
            # oracle at the same commit): every command that measured into it stays on record
            cmds = part_commands(old) if old.get("code") == self.code[part] else []
            cmds = [c for c in cmds if c != self.cfg.command] + [self.cfg.command]
            parts[part] = {"commands": cmds, "src": self.src_desc, "code": self.code[part]}
        tmp = d / f".session.json.{os.getpid()}"
        tmp.write_text(json.dumps({"parts": parts, "parallel": self.cfg.parallel, "cores": self.slots.cores,
                                   "machine_ref_cpu_s": self.machine_ref, "reference": machine.REFERENCE_ID}))
        os.replace(tmp, d / "session.json")

    def adopt_session(self, code: bool = True) -> None:
        """Report as the benches that run (or ran) into this ledger: their commands and code states
        (`code=False`: keep this bench's code states, e.g. those of a snapshot named with --src)."""
        d = self.read_session()
        parts = {k: v for k, v in d["parts"].items() if k in self.parts()}
        if not parts:
            return
        if code:
            for k, v in parts.items():
                self.code[k] = v["code"]
        cmds = list(dict.fromkeys(c for v in parts.values() for c in part_commands(v)))
        self.cfg.command = cmds[0] if len(cmds) == 1 else cmds
        srcs = {k: v["src"] for k, v in parts.items()}
        if code:
            self.src_desc = (next(iter(srcs.values())) if len(set(srcs.values())) == 1
                             else ", ".join(f"{v} ({'the baselines' if k == 'baseline' else 'the swarm'})" for k, v in srcs.items()))
        self.cfg.parallel = d.get("parallel", self.cfg.parallel)
        if d.get("reference") == machine.REFERENCE_ID and self.machine_ref is None:
            self.machine_ref = d.get("machine_ref_cpu_s")

    def ensure_reference(self) -> None:
        """This sitting's machine reference, measured once per sitting with every core slot held
        (nothing else from a bench runs meanwhile) and shared by the sitting's bench processes."""
        if self.machine_ref is None:
            self.machine_ref = machine.cached_reference(self.slots.folder, self.sitting)
        if self.machine_ref is None:
            with self.slots.hold(self.slots.cores, stop=lambda: self.stopping):
                self.machine_ref = machine.shared_reference(self.slots.folder, self.sitting,
                                                            lambda: machine.measure(self.work / "reference"))

    def speeds(self) -> machine.Speeds:
        """Every sitting's speed, fitted to the ledger's repeated runs (`machine.fit_speeds`)."""
        extra = {c.label: c.machine_ref_cpu_s for c in self.cals.values()}
        return machine.fit_speeds(self.ledger.history, self.sitting, self.machine_ref, extra=extra)

    def cal_factor(self, c: cal.Calibration, speeds: machine.Speeds, to: str | None = None) -> float:
        """What the CPU-s of calibration `c` cost in sitting `to` (default: the speeds' base): by the
        sitting of its healthy run's ledger row (the oracle's at its seed), else by its own label."""
        row = next((r for r in reversed(self.ledger.history) if r.get("from_calibration") and r.get("method") == "oracle"
                    and r.get("seed") == c.seed and r.get("scenario") == c.scenario
                    and r.get("code_state") == self.code["baseline"]), None)
        if row is not None:
            return speeds.of_row(row, to)
        return speeds.ratio(c.label, to)

    def load_cached_calibrations(self) -> None:
        """The calibrations already in the cache (nothing is run): for rewriting the results alone."""
        for s in self.scenarios:
            path = self.cache / f"{cal.calibration_key(s.goal, self.cfg.calib_seed, self.code['baseline'])}.json"
            if path.exists():
                try:
                    self.cals[s.name] = cal.Calibration(**json.loads(path.read_text()))
                except (json.JSONDecodeError, TypeError):
                    continue

    def _record_calibration_runs(self, s: Scenario, c: cal.Calibration) -> None:
        """The healthy and plain runs of the calibration are the oracle's and plain's at its seed
        (without a fault, plain's config is the oracle's: the same run stands for both)."""
        no_fault = not s.faults
        for method, res in (("oracle", c.healthy), ("plain", c.healthy if no_fault else c.plain)):
            if method not in self.cfg.methods or res is None or c.cls == "unlearnable":
                continue
            key = Ledger.key(s.content_hash, method, c.seed, self.code["baseline"])
            if self.ledger.get(key):
                continue
            res = dict(res)
            res.update(summarise(res.get("curve") or [], c.target, c.budget, res.get("cpu_total") or 0.0, bool(res.get("capped"))))
            if method == "oracle" and res.get("cpu_to_target") is not None and res["cpu_to_target"] > c.budget:
                res["reached"] = False
            self.ledger.add(self._row(s, c, method, c.seed, res, from_calibration=True,
                                      machine_ref_cpu_s=c.machine_ref_cpu_s, sitting=c.sitting))

    def _row(self, s: Scenario, c: cal.Calibration, method: str, seed: int, res: dict[str, Any], **extra) -> dict[str, Any]:
        code = self.code["swarm" if method == "swarm" else "baseline"]
        return {"key": Ledger.key(s.content_hash, method, seed, code), "scenario": s.name, "scenario_hash": s.content_hash,
                "method": method, "seed": seed, "code_state": code, "cls": c.cls, "origin": s.origin, "target": c.target, "budget": c.budget,
                "wall_cap": c.wall_cap, "src": self.src_desc, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **extra, **res}

    # ---- the plan -------------------------------------------------------------------------------
    def plan(self) -> list[tuple[Scenario, str, int]]:
        """Base seeds on every scenario; more seeds on the first `more_on` failing ones (once known)."""
        more = self.more_seed_scenarios()
        out = []
        for s in self.scenarios:
            if not self.admitted(s) or (self.cfg.calibrated_only and s.name not in self.cals):
                continue
            out += [(s, m, seed) for seed in self.cfg.seeds for m in self.cfg.methods]
            if s in more:
                out += [(s, m, seed) for seed in self.extra_seeds() for m in self.extra_methods()]
        return out

    # ---- which scenarios run (--take) --------------------------------------------------------
    def _group(self, s: Scenario, cls: str) -> tuple[str, str | None]:
        """What a `--take` count counts: the class, and with `--per-origin` a failing scenario's origin."""
        return (cls, s.origin if self.cfg.per_origin and cls == "failing" else None)

    def _origins(self) -> list[str | None]:
        """The fault origins the failing quota is held for (one group, None, without `--per-origin`)."""
        if not self.cfg.per_origin:
            return [None]
        return sorted({s.origin for s in self.scenarios if s.faults and s.origin}, key=str)

    def _counts(self) -> dict[tuple[str, str | None], int]:
        n: dict[tuple[str, str | None], int] = {}
        by_name = {s.name: s for s in self.scenarios}
        for name, c in list(self.cals.items()):
            if name not in self.duplicates and name in by_name:
                g = self._group(by_name[name], c.cls)
                n[g] = n.get(g, 0) + 1
        return n

    def admitted(self, s: Scenario) -> bool:
        """With `--take CLASS=N`: the first N calibrated scenarios of each class (with `--per-origin`,
        N failing ones of each fault origin), in suite order, run; the others are calibrated (that is
        how their class is known) but not run. A class not named is not limited. A scenario not
        calibrated yet is admitted while its class could still need it."""
        if s.name in self.duplicates:
            return False
        if not self.cfg.take:
            return True
        c = self.cals.get(s.name)
        if c is None:
            return not self.quotas_full()
        quota = self.cfg.take.get(c.cls)
        if quota is None:
            return True
        g = self._group(s, c.cls)
        same = [x for x in self.scenarios if x.name in self.cals and self._group(x, self.cals[x.name].cls) == g
                and x.name not in self.duplicates]
        return same.index(s) < quota

    def quotas_full(self) -> bool:
        """Every class named by `--take` has its count of calibrated scenarios (with `--per-origin`,
        failing ones in every origin; classes not named: never full)."""
        if not self.cfg.take or set(self.cfg.take) != {"failing", "mild", "healthy"}:
            return False
        n = self._counts()
        need = [(("failing", o), self.cfg.take["failing"]) for o in self._origins()]
        need += [((k, None), self.cfg.take[k]) for k in ("mild", "healthy")]
        return all(n.get(g, 0) >= q for g, q in need)

    def _origin_full(self, s: Scenario) -> bool:
        """With `--per-origin`: a scenario with faults whose origin has its failing count and whose
        other classes have theirs is not calibrated (whatever its class turns out to be, it is not needed)."""
        if not (self.cfg.per_origin and s.faults and set(self.cfg.take) == {"failing", "mild", "healthy"}):
            return False
        n = self._counts()
        return (n.get(("failing", s.origin), 0) >= self.cfg.take["failing"]
                and n.get(("mild", None), 0) >= self.cfg.take["mild"])

    def _healthy_full(self, s: Scenario) -> bool:
        """A scenario without faults is healthy before it is calibrated: skip it when enough are."""
        quota = self.cfg.take.get("healthy")
        if quota is None or s.faults:
            return False
        return sum(c.cls == "healthy" for n, c in list(self.cals.items()) if n not in self.duplicates) >= quota

    def scenario_task(self, s: Scenario) -> None:
        if s.name in self.duplicates or (s.name not in self.cals and (self.quotas_full() or self._healthy_full(s)
                                                                       or self._origin_full(s))):
            return                              # enough of its class: not even calibrated
        if self.cfg.calibrated_only and s.name not in self.cals:
            return                              # e.g. another bench process calibrates it
        c = self.calibration(s)
        self.write_results()
        if not self.admitted(s):
            return
        for seed in self.cfg.seeds:
            for m in self.cfg.methods:
                self.run_one(s, m, seed)
        if s in self.more_seed_scenarios():      # its extra seeds now: a bench stopped later has them
            for seed in self.extra_seeds():
                for m in self.extra_methods():
                    self.run_one(s, m, seed)

    def extra_seeds(self) -> list[int]:
        return [x for x in self.cfg.more_seeds if x not in self.cfg.seeds]

    def extra_methods(self) -> list[str]:
        return [m for m in self.cfg.methods if self.cfg.more_methods is None or m in self.cfg.more_methods]

    def more_seed_scenarios(self) -> list[Scenario]:
        """The first `more_on` failing scenarios in suite order (with `--per-origin`, of each origin),
        among those calibrated so far."""
        if not (self.cfg.more_on and self.cfg.more_seeds):
            return []
        failing = [s for s in self.scenarios if s.name in self.cals and self.cals[s.name].cls == "failing"
                   and self.admitted(s)]
        out: list[Scenario] = []
        for o in self._origins():
            out += [s for s in failing if o is None or s.origin == o][: self.cfg.more_on]
        return [s for s in failing if s in out]

    def run_one(self, s: Scenario, method: str, seed: int) -> None:
        if self.cfg.calibrated_only and s.name not in self.cals:
            return
        c = self.calibration(s)
        if c.cls == "unlearnable" or not self.admitted(s):
            return
        key = Ledger.key(s.content_hash, method, seed, self.code["swarm" if method == "swarm" else "baseline"])
        if self.ledger.get(key):
            return
        budget, wall_cap = c.scaled(self.cal_factor(c, self.speeds(), to=self.sitting))
        res = self._spawn({"scenario": s.name, "cls": c.cls}, method, s.healthy_goal() if method == "oracle" else s.goal,
                          seed, c.target, budget, wall_cap)
        self.ledger.add(self._row(s, c, method, seed, res, budget=budget, wall_cap=wall_cap, machine_ref_cpu_s=self.machine_ref,
                                  sitting=self.sitting))
        self.done_this_session += 1
        self.write_results()

    def planned(self) -> int:
        """Runs the whole bench will have (an estimate while scenarios are not calibrated): the plan
        over calibrated scenarios, less unlearnable ones; the base runs of as many uncalibrated ones
        as the `--take` counts still need (all of them without counts); the extra seeds of failing
        scenarios not calibrated yet (assuming `more_on` of them turn out failing)."""
        n = len([p for p in self.plan() if p[0].name in self.cals and self.cals[p[0].name].cls != "unlearnable"])
        open_ = [s for s in self.scenarios if s.name not in self.cals and s.name not in self.duplicates]
        if not open_:
            return n
        if self.cfg.take and set(self.cfg.take) == {"failing", "mild", "healthy"}:
            have = self._counts()
            need = sum(max(0, self.cfg.take["failing"] - have.get(("failing", o), 0)) for o in self._origins())
            need += sum(max(0, self.cfg.take[k] - have.get((k, None), 0)) for k in ("mild", "healthy"))
            need = min(len(open_), need)
        else:
            need = len(open_)
        n += need * len(self.cfg.seeds) * len(self.cfg.methods)
        more_wanted = self.cfg.more_on * len(self._origins())
        n += max(0, more_wanted - len(self.more_seed_scenarios())) * len(self.extra_seeds()) * len(self.extra_methods())
        return n

    def scenario_rows(self, speeds: machine.Speeds | None = None) -> list[dict[str, Any]]:
        speeds = speeds or self.speeds()
        out = []
        for s in self.scenarios:
            c = self.cals.get(s.name)
            if s.name in self.duplicates or (self.cfg.take and not (c and self.admitted(s))):
                continue                         # not run: its class had enough (--take)
            f = self.cal_factor(c, speeds) if c else 1.0
            out.append({"name": s.name, "path": s.path, "hash": s.content_hash, "family": s.family,
                        "faults": "; ".join(f"{f.get('what')} @ step {f.get('at_step')}" for f in s.faults) or "none",
                        "mechanisms": [f.get("mechanism") or f.get("name") for f in s.faults],
                        "fix_in_space": s.fix_in_space, "cls": c.cls if c else None, "target": c.target if c else None,
                        "budget": c.scaled(f)[0] if c else None,
                        "healthy_cpu_to_target": c.healthy_cpu_to_target * f if c and c.healthy_cpu_to_target else None,
                        "wall_cap": c.scaled(f)[1] if c else None, "cpu_scale": f})
        return out

    def current_rows(self, speeds: machine.Speeds | None = None) -> list[dict[str, Any]]:
        """The plan's rows, their CPU in the base sitting's CPU-s (`speeds`, default: fitted now)."""
        speeds = speeds or self.speeds()
        rows = []
        for s, m, seed in self.plan():
            r = self.ledger.get(Ledger.key(s.content_hash, m, seed, self.code["swarm" if m == "swarm" else "baseline"]))
            if r:
                rows.append(dict(scaled_row(r, speeds.of_row(r)), sitting_of_row=speeds.sitting_of_row(r)))
        return rows

    def write_results(self) -> None:
        with self.lock:
            speeds = self.speeds()
            rows = self.current_rows(speeds)
            used = {r["sitting_of_row"] for r in rows}
            walls = [r["wall_s"] for r in rows if isinstance(r.get("wall_s"), (int, float)) and not r.get("from_calibration")]
            meta = {"suite": self.cfg.suite, "command": self.cfg.command, "src": self.src_desc, "code_state": self.code,
                    "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}",
                    "machine_ref_cpu_s": self.machine_ref, "reference": machine.REFERENCE_ID, "cores": self.slots.cores,
                    "sitting": self.sitting, "base_sitting": speeds.base,
                    "sittings": [x for x in speeds.table() if x["name"] in used],
                    "parallel": self.cfg.parallel, "planned": self.planned(),
                    "scenarios": len(self.scenarios), "calibrated": len(self.cals),
                    "budget_multiple": cal.BUDGET_MULTIPLE, "median_wall_s": statistics.median(walls) if walls else None,
                    "wall_sum_s": sum(walls), "seed_note": self.cfg.seed_note,
                    "unlearnable": [n for n, c in self.cals.items() if c.cls == "unlearnable"],
                    "take": dict(self.cfg.take), "per_origin": self.cfg.per_origin, "duplicates": dict(self.duplicates),
                    "not_taken": [s.name for s in self.scenarios if s.name in self.cals and not self.admitted(s)]}
            report.write(self.results, self.name, meta, self.scenario_rows(speeds), rows, self.cfg.methods)

    # ---- driving it ------------------------------------------------------------------------------
    def stop_all(self) -> None:
        with self.lock:
            self.stopping = True
            procs = list(self.procs.values())
        for p in procs:
            try:
                kids = psutil.Process(p.pid).children(recursive=True)
            except psutil.Error:
                kids = []
            for q in [p, *kids]:
                try:
                    os.kill(q.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError, AttributeError):
                    pass

    def run(self, display: Any = None) -> None:
        def phase_fn(fn: Any, tasks: list[tuple[Any, ...]]) -> None:
            ex = cf.ThreadPoolExecutor(self.cfg.parallel)
            futs = [ex.submit(fn, *t) for t in tasks]
            try:
                while True:
                    for f in futs:
                        if f.done() and f.exception() is not None:
                            raise f.exception()   # e.g. an interruption inside a run's thread
                    if all(f.done() for f in futs):
                        break
                    if display:
                        display(self)
                    time.sleep(0.5)
            except BaseException:
                self.stop_all()
                ex.shutdown(wait=True, cancel_futures=True)
                raise
            ex.shutdown(wait=True)

        # scenario by scenario (N at a time): its calibration (target, budget, class; the oracle's
        # and plain's rows at the calibration seed), then its methods on the base seeds, so that a
        # bench stopped part way has whole scenarios, as many as possible; then the extra seeds on
        # the first failing ones
        self.ensure_reference()
        self.save_session()
        if self.cfg.calibrated_only:
            self.load_cached_calibrations()
            for s in self.scenarios:
                if s.name in self.cals:      # their healthy and plain runs are the oracle's and plain's
                    self._record_calibration_runs(s, self.cals[s.name])
        phase_fn(self.scenario_task, [(s,) for s in self.scenarios])
        phase_fn(self.run_one, self.plan())
        self.write_results()


CPU_FIELDS = ("cpu_to_target", "cpu_total", "budget", "wasted_cpu_s", "ray_overhead_cpu_s")


def scaled_row(r: dict[str, Any], f: float | None) -> dict[str, Any]:
    """A ledger row with its CPU figures in the base sitting's CPU-s (`f`: its sitting's factor,
    `machine.fit_speeds`; None or 1: as measured). Wall figures stay as measured."""
    if not f or f == 1.0:
        return r
    out = dict(r, cpu_scale=f)
    for k in CPU_FIELDS:
        if isinstance(r.get(k), (int, float)):
            out[k] = r[k] * f
    out["curve"] = [[p[0] * f, *p[1:]] for p in r.get("curve") or []]
    return out


def live_display(console: Any):
    """A rich table of the running runs (scenario, method, budget spent), refreshed by the runner."""
    from rich.live import Live
    from rich.table import Table

    live = Live(console=console, refresh_per_second=2, transient=False)
    live.start()

    def show(b: Bench) -> None:
        done = len(b.current_rows())
        t = Table(title=f"swarm bench {b.name}: {done}/~{b.planned()} runs finished ({b.done_this_session} this session)")
        for col in ("scenario", "class", "method", "seed", "worker CPU-s / budget", "wall s"):
            t.add_column(col)
        with b.lock:
            items = list(b.running.values())
            waits = list(b.waiting.values())
        for r in items:
            try:
                pr = json.loads(pathlib.Path(r["progress"]).read_text())
            except (OSError, json.JSONDecodeError):
                pr = {}
            budget = r["budget"]
            spent = pr.get("cpu_s", 0.0)
            t.add_row(r["scenario"], r.get("cls", ""), r["method"], str(r["seed"]),
                      f"{spent:.0f} / {budget:.0f}" + (f" ({100 * spent / budget:.0f}%)" if budget else ""),
                      f"{time.time() - r['t0']:.0f}")
        for r in waits:
            t.add_row(r["scenario"], r.get("cls", ""), r["method"], str(r["seed"]), "waiting for cores",
                      f"{time.time() - r['since']:.0f}")
        live.update(t)

    show.stop = live.stop  # type: ignore[attr-defined]
    return show


def log_display():
    """Line-by-line progress for a log file (no terminal): a line when the set of running runs changes."""
    last: list[Any] = [None]

    def show(b: Bench) -> None:
        with b.lock:
            items = sorted((r["scenario"], r["method"], r["seed"]) for r in b.running.values())
            waits = sorted((r["scenario"], r["method"], r["seed"]) for r in b.waiting.values())
        if (items, waits) != last[0]:
            last[0] = (items, waits)
            done = len(b.current_rows())
            print(f"[{time.strftime('%H:%M:%S')}] {done}/~{b.planned()} finished; running: "
                  + ", ".join(f"{s}/{m}/s{seed}" for s, m, seed in items)
                  + ("; waiting for cores: " + ", ".join(f"{s}/{m}/s{seed}" for s, m, seed in waits) if waits else ""),
                  flush=True)

    show.stop = lambda: None  # type: ignore[attr-defined]
    return show
