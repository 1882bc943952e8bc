"""Ray Tune baselines on a scenario: PBT (population 4), PB2 (population 4) and ASHA + random search
(8 samples), all over one search space, with the scenario's faults in force in every trial.

Search space (`space`): recipe.lr (log-uniform, base / 10 .. base x 10), harness.sampling.temperature
(0.3 .. 1.5), harness.sampling.max_new_tokens (1 .. 2 x base), harness.curriculum.start (the task's
minimum .. base + 2) and recipe.kl_coef (0 .. 0.1). Four trials at 0.5 CPU each on 2 cores.

The trainable (`trainable` → `train_segment`) wraps the trainer (one process per trial, in-process
`Trainer`), reports at every held-out eval with a Tune checkpoint (the trainer's checkpoint of that
step and the faults' fired state) and restores through the trainer's own fork:
  * fork_mode "state": recipe and harness come from the checkpoint, so a fault that already fired (a
    broken template, a swapped verifier, a bad lr) stays in force after an exploit — a "full" fork
    would take the config's healthy harness and silently drop it;
  * the search values go in as fork_overrides, applied to the live config after the fork;
  * faults not yet due still fire at their step (the scenario's perturbations are in every trial's
    config); which ones fired travels with the checkpoint, and a one-shot kill or stall that fired in
    this trial or in the donor's history does not fire again (kill/stall are events of the process;
    overrides, the data faults and an OOM are state of the run, and a slow worker slows only the
    trainer it fired in);
  * every trial and every restore gets its own seed (data order and sampling), derived from the run
    seed, the trial id and the segment number;
  * `CheckpointConfig(num_to_keep=None)`: Tune deletes checkpoints that exploit still points at when
    it keeps only N (ray issues #27170, #53831); the experiment folder is removed after the run.
A killed trial is retried from its last checkpoint (`FailureConfig(max_failures=3)`), which is what a
Tune user gets for a crash; a hung trial is not detected by Tune.

Worker CPU is counted in the trial's own process (getrusage SELF, deltas from the segment's start:
the trainer and the Ray worker's own threads), written at every report; the CPU of a killed segment
after its last report is lost (at most one eval interval). `BudgetStopper` stops the whole
experiment when the sum over trials passes the budget or a trial reaches the target. The Ray
processes' own CPU (GCS, raylet, the driver) is polled and reported beside it (`ray_overhead_cpu_s`),
not charged to the method.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import resource
import shutil
import time
from typing import Any, Callable

from sandboxes.private import private_dir
from swarmbench.methods import Progress, trainer_config
from trainer.runlog import HELDOUT_METRICS

EVAL_FIELDS = tuple(HELDOUT_METRICS)
PROCESS_KINDS = ("kill", "stall")   # events of a process: once per trial lineage
POPULATION = 4
ASHA_SAMPLES = 8


# ---- the search space -----------------------------------------------------------------------------

def space_bounds(cfg: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Continuous bounds of the search space around the scenario's (healthy) config."""
    from trainer.tasks import make_task

    lr = cfg["recipe"]["lr"]
    mnt = cfg["harness"]["sampling"]["max_new_tokens"]
    start = cfg["harness"]["curriculum"]["start"]
    lo = make_task(cfg["task"]["name"], seed=0, **cfg["task"].get("options", {})).min_difficulty
    return {"lr": (lr / 10, min(10.0, lr * 10)), "temperature": (0.3, 1.5), "max_new_tokens": (1, 2 * mnt),
            "curriculum_start": (lo, start + 2), "kl_coef": (0.0, 0.1)}


def to_fields(params: dict[str, Any], bounds: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Search values → dotted trainer fields (ints rounded, every value clipped to its bounds)."""
    def clip(k: str, v: float) -> float:
        lo, hi = bounds[k]
        return min(hi, max(lo, float(v)))
    return {"recipe.lr": clip("lr", params["lr"]),
            "harness.sampling.temperature": clip("temperature", params["temperature"]),
            "harness.sampling.max_new_tokens": int(round(clip("max_new_tokens", params["max_new_tokens"]))),
            "harness.curriculum.start": int(round(clip("curriculum_start", params["curriculum_start"]))),
            "recipe.kl_coef": clip("kl_coef", params["kl_coef"])}


def segment_seed(base_seed: int, trial_id: str, segment: int) -> int:
    h = hashlib.sha256(f"{base_seed}:{trial_id}:{segment}".encode()).digest()
    return int.from_bytes(h[:4], "little") % 1_000_000


# ---- the trainable ----------------------------------------------------------------------------------

def fired_after_restore(items: list[Any], ckpt_fired: set[int], own_fired: set[int]) -> set[int]:
    """Which faults count as fired in a restored trial: state faults (overrides, data faults, corrupt
    checkpoint, OOM, slow worker) as the checkpoint says; process events (kill, stall) once fired
    anywhere in this trial or in the checkpoint's history."""
    state = {i for i in ckpt_fired if items[i].kind not in PROCESS_KINDS}
    process = {i for i in ckpt_fired | own_fired if items[i].kind in PROCESS_KINDS}
    return state | process


def _own_fired(trial_dir: pathlib.Path) -> set[int]:
    out: set[int] = set()
    for p in trial_dir.glob("seg*/.perturb/train.json"):
        try:
            out |= set(json.loads(p.read_text()).get("fired", []))
        except (json.JSONDecodeError, OSError):
            continue
    return out


def _segments(trial_dir: pathlib.Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(trial_dir.glob("seg*/segment.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (json.JSONDecodeError, OSError):
            continue
    return out


def train_segment(spec: dict[str, Any], params: dict[str, Any], trial_id: str, trial_dir: pathlib.Path,
                  restore: pathlib.Path | None, report: Callable[[dict[str, Any], pathlib.Path | None], None]) -> dict[str, Any]:
    """Train one trial from scratch or from a Tune checkpoint folder `restore`, calling
    `report(metrics, checkpoint_dir)` at every held-out eval. Returns the trainer's summary."""
    from trainer.config import RunConfig
    from trainer.loop import Trainer
    from trainer.perturb import expand

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = cpu0.ru_utime + cpu0.ru_stime
    trial_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(trial_dir.glob("seg*")))
    out = trial_dir / f"seg{n:03d}"
    out.mkdir()
    prior_cpu = sum(s.get("cpu_s", 0.0) for s in _segments(trial_dir))
    fields = to_fields(params, {k: tuple(v) for k, v in spec["bounds"].items()})
    cfg = json.loads(json.dumps(spec["config"]))
    cfg.update(name="train", out_dir=str(out), seed=segment_seed(spec["seed"], trial_id, n))
    cfg["checkpoint"] = {"interval": cfg["recipe"]["eval_interval"], "keep_last": 2}
    cfg["samples_per_step"] = 0
    donor = None
    if restore is not None:
        meta = json.loads((restore / "meta.json").read_text())
        donor = {"trial_id": meta["trial_id"], "segment": meta["segment"], "step": meta["step"]}
        cfg.update(fork_from=str(restore / "state.pt"), fork_mode="state", fork_overrides=fields)
        items = [expand(p) for p in RunConfig.parse(cfg).perturbations]
        fired = fired_after_restore(items, set(meta.get("fired", [])), _own_fired(trial_dir))
        (out / ".perturb").mkdir()
        (out / ".perturb" / "train.json").write_text(json.dumps({"fired": sorted(fired)}))
    seg = {"trial_id": trial_id, "segment": n, "donor": donor, "fields": fields, "cpu_s": 0.0, "start_step": None}

    def cpu_now() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime - cpu0

    def write_seg() -> None:
        seg["cpu_s"] = cpu_now()
        tmp = out / "segment.json.tmp"
        tmp.write_text(json.dumps(seg))
        os.replace(tmp, out / "segment.json")

    trainer = Trainer(RunConfig.parse(cfg))
    if restore is None:
        # the search values on the live config, as a fork's overrides are: the config keeps the
        # scenario's curriculum, so held-out stays at the scenario's difficulty in every trial
        trainer.apply_overrides(fields, silent=True)
    write_seg()

    def on_step(row: dict[str, Any]) -> None:
        if seg["start_step"] is None:
            seg["start_step"] = row["step"] - 1
        if "heldout_acc" not in row:
            return
        seg["end_step"] = row["step"]
        write_seg()
        ck = out / f"tune-ckpt-{row['step']:07d}"
        ck.mkdir()
        src = trainer.ckpt.newest_path()
        if src is not None and src.exists():
            shutil.copy2(src, ck / "state.pt")
            shutil.copy2(src.with_suffix(".json"), ck / "state.json")
        (ck / "meta.json").write_text(json.dumps({"trial_id": trial_id, "segment": n, "step": row["step"],
                                                   "fired": sorted(trainer.perturber.fired)}))
        metrics = {k: row[k] for k in EVAL_FIELDS if k in row}
        metrics.update(step=row["step"], trial_cpu_s=prior_cpu + seg["cpu_s"], live_lr=row.get("lr"),
                       harness_version=row.get("harness_version"), segment=n,
                       live_template=trainer.harness.template, live_max_new_tokens=trainer.harness.sampling.max_new_tokens)
        report(metrics, ck if src is not None else None)
        shutil.rmtree(ck, ignore_errors=True)   # Tune copied it into its own storage

    trainer.on_step = on_step
    summary = trainer.run()
    seg["end_step"] = summary.get("step")
    seg["status"] = summary.get("status")
    write_seg()
    shutil.rmtree(out / "runs", ignore_errors=True)
    return summary


def trainable(params: dict[str, Any], spec: dict[str, Any]) -> None:
    """The Ray Tune function trainable (bound with tune.with_parameters)."""
    from ray import tune

    ctx = tune.get_context()
    trial_id = ctx.get_trial_id()
    trial_dir = pathlib.Path(spec["work"]) / "trials" / trial_id
    ckpt = tune.get_checkpoint()

    def report(metrics: dict[str, Any], ck: pathlib.Path | None) -> None:
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(str(ck)) if ck is not None else None)

    if ckpt is None:
        train_segment(spec, params, trial_id, trial_dir, None, report)
    else:
        with ckpt.as_directory() as d:
            local = trial_dir.parent.parent / "restore" / f"{trial_id}-{time.time_ns()}"
            shutil.copytree(d, local)
        try:
            train_segment(spec, params, trial_id, trial_dir, local, report)
        finally:
            shutil.rmtree(local, ignore_errors=True)


class BudgetStopper:
    """Stops the experiment when the trials' worker CPU passes the budget or one reaches the target;
    keeps the best-so-far curve against the total worker CPU."""

    def __init__(self, budget: float, target: float, progress: Progress | None = None) -> None:
        self.budget, self.target, self.progress = budget, target, progress
        self.cpu: dict[str, float] = {}
        self.curve: list[list[float]] = []
        self.hit: float | None = None
        self.best: tuple[float, str] | None = None   # (held-out, trial id) of the best report
        self.t0 = time.time()

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if "trial_cpu_s" in result:
            self.cpu[trial_id] = max(self.cpu.get(trial_id, 0.0), float(result["trial_cpu_s"]))
        total = sum(self.cpu.values())
        v = result.get("heldout_acc")
        if isinstance(v, (int, float)):
            self.curve.append([round(total, 3), float(v)])
            if self.best is None or v > self.best[0]:
                self.best = (float(v), trial_id)
            if self.hit is None and v >= self.target - 1e-12 and total <= self.budget + 1e-9:
                self.hit = total
        if self.progress:
            self.progress({"cpu_s": total, "wall_s": time.time() - self.t0})
        return False

    def stop_all(self) -> bool:
        return self.hit is not None or sum(self.cpu.values()) > self.budget


def _scheduler(method: str, bounds: dict[str, tuple[float, float]], eval_interval: int, steps: int):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

    interval = 2 * eval_interval
    if method == "pbt":
        return PopulationBasedTraining(
            time_attr="step", perturbation_interval=interval, quantile_fraction=0.25, resample_probability=0.25,
            hyperparam_mutations={"lr": tune.loguniform(*bounds["lr"]), "temperature": tune.uniform(*bounds["temperature"]),
                                  "max_new_tokens": tune.randint(int(bounds["max_new_tokens"][0]), int(bounds["max_new_tokens"][1]) + 1),
                                  "curriculum_start": tune.randint(int(bounds["curriculum_start"][0]), int(bounds["curriculum_start"][1]) + 1),
                                  "kl_coef": tune.uniform(*bounds["kl_coef"])})
    if method == "pb2":
        from ray.tune.schedulers.pb2 import PB2   # needs scikit-learn (the `bench` extra)

        return PB2(time_attr="step", perturbation_interval=interval, quantile_fraction=0.25,
                   hyperparam_bounds={k: list(v) for k, v in bounds.items()})
    if method == "asha":
        return ASHAScheduler(time_attr="step", max_t=steps, grace_period=4 * eval_interval, reduction_factor=2)
    raise ValueError(f"method={method!r}: not a Tune method (pbt, pb2, asha)")


def param_space(method: str, bounds: dict[str, tuple[float, float]], cfg: dict[str, Any]) -> dict[str, Any]:
    from ray import tune

    if method == "pb2":   # continuous bounds only; ints are rounded in to_fields
        return {k: tune.uniform(*v) for k, v in bounds.items()}
    return {"lr": tune.loguniform(*bounds["lr"]), "temperature": tune.uniform(*bounds["temperature"]),
            "max_new_tokens": tune.randint(int(bounds["max_new_tokens"][0]), int(bounds["max_new_tokens"][1]) + 1),
            "curriculum_start": tune.randint(int(bounds["curriculum_start"][0]), int(bounds["curriculum_start"][1]) + 1),
            "kl_coef": tune.uniform(*bounds["kl_coef"])}


def lineage_cpu(trials_dir: pathlib.Path, best_trial: str | None) -> tuple[float, float, int]:
    """(total segment CPU, CPU of segments outside the best trial's lineage, restores from another
    trial). The lineage: the best trial's last segment, its donor segment, and so on back."""
    segs: dict[tuple[str, int], dict[str, Any]] = {}
    for d in trials_dir.glob("*"):
        for s in _segments(d):
            segs[(s["trial_id"], s["segment"])] = s
    total = sum(s["cpu_s"] for s in segs.values())
    exploits = sum(1 for s in segs.values() if s.get("donor") and s["donor"]["trial_id"] != s["trial_id"])
    keep: set[tuple[str, int]] = set()
    if best_trial is not None:
        cur = max((k for k in segs if k[0] == best_trial), key=lambda k: k[1], default=None)
        while cur is not None and cur not in keep:
            keep.add(cur)
            s = segs[cur]
            if s.get("donor"):
                cur = (s["donor"]["trial_id"], s["donor"]["segment"])
            else:   # a trial's own earlier segments (a restore after a failure is also a donor link)
                cur = (cur[0], cur[1] - 1) if (cur[0], cur[1] - 1) in segs else None
            if cur is not None and cur not in segs:
                cur = None
    return total, total - sum(segs[k]["cpu_s"] for k in keep), exploits


def run_tune(method: str, goal: dict[str, Any], seed: int, target: float, budget: float, wall_cap: float,
             work: pathlib.Path, progress: Progress | None = None) -> dict[str, Any]:
    # before ray is first imported: it reads these at import time, and without the first one the
    # local cluster ray.init starts binds its servers to the machine's external address and 0.0.0.0
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # every Ray server on 127.0.0.1
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import tune

    from swarmbench.accounting import ProcessMeter

    work.mkdir(parents=True, exist_ok=True)
    cfg = trainer_config(goal, str(work / "runs"), seed, target)
    bounds = space_bounds(cfg)
    spec = {"config": cfg, "seed": seed, "bounds": {k: list(v) for k, v in bounds.items()}, "work": str(work)}
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    t0 = time.time()
    ray_home = private_dir(f"/tmp/swarmlab-bench-ray-{os.getpid()}")   # 0700 around Ray's sockets (trainer/launch.py)
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             _temp_dir=str(ray_home / "r"), configure_logging=False)
    meter = ProcessMeter(os.getpid(), include_root=True)
    stopper = BudgetStopper(budget, target, progress)
    eval_interval = cfg["recipe"]["eval_interval"]
    error = None
    try:
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(trainable, spec=spec), {"cpu": 0.5}),
            param_space=param_space(method, bounds, cfg),
            tune_config=tune.TuneConfig(scheduler=_scheduler(method, bounds, eval_interval, cfg["recipe"]["steps"]),
                                        num_samples=ASHA_SAMPLES if method == "asha" else POPULATION,
                                        metric="heldout_acc", mode="max", reuse_actors=False,
                                        max_concurrent_trials=POPULATION, time_budget_s=wall_cap),
            run_config=tune.RunConfig(name="tune", storage_path=str(work / "storage"), stop=_StopperAdapter(stopper, meter),
                                      checkpoint_config=tune.CheckpointConfig(num_to_keep=None),
                                      failure_config=tune.FailureConfig(max_failures=3), verbose=0))
        grid = tuner.fit()
        errors = [str(r.error)[:300] for r in grid if r.error is not None]
    except Exception as e:   # a broken baseline is a row, not the end of the benchmark
        error = f"{type(e).__name__}: {e}"[:1500]
        grid, errors = None, []
    finally:
        meter.poll(time.time())
        ray.shutdown()
        shutil.rmtree(ray_home, ignore_errors=True)
    wall = time.time() - t0
    best_trial = stopper.best[1] if stopper.best else None
    total, wasted, exploits = lineage_cpu(work / "trials", best_trial)
    # ASHA: trials the scheduler stopped before max_t (they ended without reaching the target or the steps)
    stopped_early = sum(1 for s in (work / "trials").glob("*/seg*/segment.json")
                        if json.loads(s.read_text()).get("status") is None) if method == "asha" else 0
    curve = [list(x) for x in stopper.curve]
    reached = stopper.hit is not None
    out = {"reached": reached, "cpu_to_target": stopper.hit, "best_heldout": max((v for _, v in curve), default=None),
           "cpu_total": max(total, sum(stopper.cpu.values())), "capped": not reached, "curve": curve, "wall_s": wall,
           "rc": 0 if error is None else 1, "stop": "target" if reached else ("budget" if sum(stopper.cpu.values()) > budget else "wall/steps"),
           "steps": None, "interventions": exploits if method in ("pbt", "pb2") else stopped_early,
           "wasted_cpu_s": wasted, "trials": len(list((work / "trials").glob("*"))) if (work / "trials").exists() else 0,
           "ray_overhead_cpu_s": max(0.0, meter.total - total), "trial_errors": errors[:4],
           "search_space": {k: list(v) for k, v in bounds.items()}, "log_tail": error}
    shutil.rmtree(work / "storage", ignore_errors=True)   # every checkpoint was kept for exploit; prune now
    return out


class _StopperAdapter:
    """A tune.Stopper around BudgetStopper that also polls the Ray processes' CPU."""

    def __new__(cls, inner: BudgetStopper, meter: Any):
        from ray.tune import Stopper

        class S(Stopper):
            def __call__(self, trial_id, result):
                meter.poll(time.time())
                return inner(trial_id, result)

            def stop_all(self):
                return inner.stop_all()

        return S()
