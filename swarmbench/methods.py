"""One run of one method on one scenario, under one budget accounting.

Every method gets the scenario's goal, a run seed, the calibrated target and worker-CPU budget, and
a wall-clock cap, and returns a `RunResult` dict: reached (target met with worker CPU <= budget),
worker CPU-s to target (C2T), total worker CPU-s, the best-so-far held-out curve against worker CPU,
interventions and wasted compute.

  plain   the scenario's trainer config (faults in force), no agents: `python -m trainer.entry CFG`
          in a child process; CPU from getrusage of the child (exact), a 0.5 s psutil timeline for
          the curve; stopped at the budget or the wall cap.
  oracle  the same with the faults removed: what the run costs without the fault.
  swarm   `swarm run GOAL --jobs process` (built-in policies) with the budget as the goal's
          worker_cpu_s; worker CPU = every `trainer.entry` process under it (live job, restarts,
          backtest arms), polled every 0.1 s (a process's last poll misses at most that much of it);
          `swarm stop` at the budget or the cap, a kill 60 s later. Wasted compute: the arms of every
          backtest not followed by a kept gain, plus the evaluation window of an undone intervention
          (the swarm's own record of the window's live-job CPU).
  pbt / pb2 / asha   see swarmbench/tune_methods.py.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import resource
import signal
import subprocess
import sys
import time
from typing import Any, Callable

import yaml

from swarmbench.accounting import ProcessMeter, cpu_at, is_trainer

POLL_S = 0.5
SWARM_POLL_S = 0.1     # many short-lived trainer processes: each one's last poll interval goes uncounted
Progress = Callable[[dict[str, Any]], None]


def trainer_config(goal: dict[str, Any], out_dir: str, seed: int, target: float, *, faults: bool = True,
                   name: str = "train") -> dict[str, Any]:
    """What the swarm's job runs (Controller.base_cfg + write_job_config), with no agents around it:
    goal.run + goal.perturbations (only the fields the goal set: a full dump would turn a shortcut
    into a no-op), recipe.steps = budget.steps, recipe.stop_at_heldout = the target."""
    from swarm.goal import Goal

    g = Goal.parse(goal)
    cfg = g.run_config(name, out_dir).model_dump(mode="json")
    cfg["seed"] = seed
    cfg["perturbations"] = [p.model_dump(exclude_unset=True) for p in g.perturbations] if faults else []
    cfg["recipe"]["steps"] = g.budget.steps
    cfg["recipe"]["stop_at_heldout"] = target
    return cfg


def read_jsonl(path: pathlib.Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def curve_from(rows: list[dict[str, Any]], timeline: list[tuple[float, float]], scale: float = 1.0) -> list[list[float]]:
    """[[worker CPU-s, held-out]] for each eval row (time mapped through the CPU timeline).
    `scale` corrects a polled timeline to an exact final figure."""
    out = []
    for r in rows:
        v = r.get("heldout_acc")
        if isinstance(v, (int, float)) and isinstance(r.get("time"), (int, float)):
            c = cpu_at(timeline, r["time"])
            if c is not None:
                out.append([round(c * scale, 3), float(v)])
    return out


def summarise(curve: list[list[float]], target: float, budget: float, total_cpu: float, capped: bool) -> dict[str, Any]:
    """reached / C2T from a curve: the first point at or above the target within the budget."""
    hit = next((c for c, v in curve if v >= target - 1e-12 and c <= budget + 1e-9), None)
    best = max((v for _, v in curve), default=None)
    return {"reached": hit is not None, "cpu_to_target": hit, "best_heldout": best, "cpu_total": total_cpu,
            "capped": capped}


def _stop(p: subprocess.Popen, meter: ProcessMeter | None = None, grace_s: float = 3.0) -> None:
    """Stop a process group we started, and any descendant that left it."""
    extra = meter.descendants() if meter else []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for q in extra:
            try:
                q.send_signal(sig)
            except Exception:
                pass
        if sig == signal.SIGTERM:
            try:
                p.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass


def run_trainer(cfg: dict[str, Any], work: pathlib.Path, budget: float, wall_cap: float,
                progress: Progress | None = None) -> dict[str, Any]:
    """`python -m trainer.entry CFG` until it ends, its CPU passes `budget` or the wall cap."""
    work.mkdir(parents=True, exist_ok=True)
    cfg = dict(cfg, out_dir=str(work / "runs"))
    cpath = work / "config.yaml"
    cpath.write_text(yaml.safe_dump(cfg, sort_keys=False))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    with open(work / "stdout.log", "wb") as out:
        p = subprocess.Popen([sys.executable, "-m", "trainer.entry", str(cpath)], stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    meter = ProcessMeter(p.pid, include_root=True)
    capped = None
    while p.poll() is None:
        now = time.time()
        cpu = meter.poll(now)
        if progress:
            progress({"cpu_s": cpu, "wall_s": now - t0})
        if cpu > budget:
            capped = "budget"
        elif now - t0 > wall_cap:
            capped = "wall"
        if capped:
            _stop(p, meter)
            break
        time.sleep(POLL_S)
    p.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    exact = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    polled = meter.total
    rows = read_jsonl(work / "runs" / "train" / "metrics.jsonl")
    # the timeline is polled; scale it so that its end is the exact figure (a short run's last poll
    # can trail the process's end by up to one interval)
    meter.timeline.append((time.time(), polled))
    scale = exact / polled if polled > 0 and exact > 0 else 1.0
    lines = (work / "stdout.log").read_text(errors="replace").strip().splitlines()
    status = None
    for line in reversed(lines):
        try:
            status = json.loads(line).get("status")
            break
        except (json.JSONDecodeError, AttributeError):
            continue
    return {"rows": rows, "timeline": meter.timeline, "scale": scale, "cpu_total": exact if exact > 0 else polled,
            "wall_s": time.time() - t0, "rc": p.returncode, "capped": capped, "status": status,
            "steps": max((r.get("step", 0) for r in rows), default=0),
            "log_tail": None if p.returncode == 0 or capped else "\n".join(lines[-12:])}


def run_plain(goal: dict[str, Any], seed: int, target: float, budget: float, wall_cap: float, work: pathlib.Path,
              progress: Progress | None = None, *, faults: bool = True) -> dict[str, Any]:
    r = run_trainer(trainer_config(goal, str(work / "runs"), seed, target, faults=faults), work, budget, wall_cap, progress)
    curve = curve_from(r["rows"], r["timeline"], r["scale"])
    out = summarise(curve, target, budget, r["cpu_total"], bool(r["capped"]))
    out.update({"curve": curve, "wall_s": r["wall_s"], "rc": r["rc"], "stop": r["capped"] or r["status"],
                "steps": r["steps"], "interventions": 0, "wasted_cpu_s": 0.0, "log_tail": r["log_tail"],
                "wall_to_target": next((row["time"] for row in r["rows"] if (row.get("heldout_acc") or -1) >= target), None)})
    if out["wall_to_target"] is not None:
        out["wall_to_target"] -= r["timeline"][0][0] if r["timeline"] else 0.0
    return out


def run_oracle(goal: dict[str, Any], seed: int, target: float, budget: float, wall_cap: float, work: pathlib.Path,
               progress: Progress | None = None) -> dict[str, Any]:
    return run_plain(goal, seed, target, budget, wall_cap, work, progress, faults=False)


# ---- the swarm -----------------------------------------------------------------------------------

SWARM_WRAPPER = r"""
import sys
from swarm.cli import app
app(args=sys.argv[1:], prog_name="swarm")
"""


def drive_swarm(work: pathlib.Path, gpath: pathlib.Path, ws: pathlib.Path, summ: pathlib.Path,
                match: Callable[[list[str]], bool], why_stop: Callable[[float, ProcessMeter], str | None],
                grace_s: float = 60.0, on_poll: Callable[[float, ProcessMeter], None] | None = None,
                ) -> tuple[ProcessMeter, str | None, int | None]:
    """`swarm run GOAL --jobs process` in `ws` (its output in work/controller.log), the CPU of its
    trainer processes (`match`) polled every SWARM_POLL_S; once `why_stop(now, meter)` names a reason,
    `swarm stop` (the workspace's stop file), a kill `grace_s` later, and any job left behind killed.
    `on_poll(now, meter)` is called at every poll, the grace included. The meter (its timeline ends
    at the last poll), the reason (None: the run ended itself) and the controller's exit code."""
    with open(work / "controller.log", "wb") as logf:
        p = subprocess.Popen([sys.executable, "-c", SWARM_WRAPPER, "run", str(gpath), "--workspace", str(ws), "--jobs", "process",
                              "--summary", str(summ)], stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    meter = ProcessMeter(p.pid, match=match)
    stop_at: float | None = None
    why = None
    while p.poll() is None:
        now = time.time()
        meter.poll(now)
        if on_poll:
            on_poll(now, meter)
        if stop_at is None:
            why = why_stop(now, meter)
            if why:
                (ws / ".swarm").mkdir(parents=True, exist_ok=True)
                (ws / ".swarm" / "stop").write_text(str(now))   # what `swarm stop` does
                stop_at = now
        if stop_at is not None and now - stop_at > grace_s:
            _stop(p, meter)
            break
        time.sleep(SWARM_POLL_S)
    p.wait()
    for q in meter.descendants():   # jobs left behind (there should be none)
        try:
            q.kill()
        except Exception:
            pass
    meter.timeline.append((time.time(), meter.total))
    return meter, why, p.returncode


def run_swarm(goal: dict[str, Any], seed: int, target: float, budget: float, wall_cap: float, work: pathlib.Path,
              progress: Progress | None = None) -> dict[str, Any]:
    """The swarm (built-in policies) on the goal, target and budget of the benchmark."""
    work.mkdir(parents=True, exist_ok=True)
    g = json.loads(json.dumps(goal))
    g.setdefault("run", {})["seed"] = seed
    g["target"] = dict(g.get("target") or {}, threshold=target)
    g["budget"] = dict(g.get("budget") or {}, worker_cpu_s=float(budget), wall_s=float(wall_cap))
    g["llm"] = {"model": None}
    gpath, ws, summ = work / "goal.yaml", work / "ws", work / "summary.json"
    gpath.write_text(yaml.safe_dump(g, sort_keys=False))
    t0 = time.time()

    def why_stop(now: float, meter: ProcessMeter) -> str | None:
        return "budget" if meter.total > budget else "wall" if now - t0 > wall_cap else None

    def on_poll(now: float, meter: ProcessMeter) -> None:
        if progress:
            progress({"cpu_s": meter.total, "wall_s": now - t0})

    meter, capped, rc = drive_swarm(work, gpath, ws, summ, is_trainer, why_stop, on_poll=on_poll)
    s = json.loads(summ.read_text()) if summ.exists() else {}
    rows = read_jsonl(ws / ".swarm" / "runs" / "train" / "metrics.jsonl")   # the live job (Controller.run_dir)
    curve = curve_from(rows, meter.timeline)
    out = summarise(curve, target, budget, meter.total, bool(capped))
    ivs = s.get("interventions") or []
    applied = [iv for iv in ivs if iv.get("applied_step") is not None]
    # wasted: the CPU of the backtest arms of every intervention that was not kept with a positive
    # measured effect (rejected, rolled back, or kept with no effect)
    waste_ids = {str(iv["id"]) for iv in ivs if iv.get("status") != "kept" or not (iv.get("effect") or 0) > 0}
    wasted = 0.0
    for key, cmd in meter.cmd.items():
        m = re.search(r"bt-([0-9a-f]{8})[^/ ]*-(?:candidate|control)-s\d+", cmd)
        if m and m.group(1) in waste_ids:
            wasted += meter.cpu[key]
    # the evaluation window of an undone intervention: its record minus its backtest (measured above)
    wasted += sum(max(float(iv.get("wasted_cpu_s") or 0.0) - float(iv.get("backtest_cpu_s") or 0.0), 0.0)
                  for iv in ivs if iv.get("status") == "rolled_back")
    out.update({"curve": curve, "wall_s": time.time() - t0, "rc": rc, "stop": capped or s.get("reason"),
                "steps": s.get("steps"), "interventions": len(applied), "proposed": len(ivs),
                "intervention_log": [f"{iv.get('kind')}:{iv.get('status')}" for iv in ivs], "wasted_cpu_s": wasted,
                # what suite_targets reads when the run's workspace is gone (the ledger is committed)
                "intervention_records": [{k: iv.get(k) for k in ("kind", "status", "changes", "created")}
                                         | {"outcome": {"gain": iv.get("gain"), "refused": iv.get("refused")}} for iv in ivs],
                "trainer_processes": len(meter.cpu), "restarts": s.get("restarts"),
                "log_tail": None if s else (work / "controller.log").read_text(errors="replace")[-1500:]})
    return out


METHODS = ("plain", "oracle", "pbt", "pb2", "asha", "swarm")


def run_method(method: str, goal: dict[str, Any], seed: int, target: float, budget: float, wall_cap: float,
               work: pathlib.Path, progress: Progress | None = None) -> dict[str, Any]:
    if method == "plain":
        return run_plain(goal, seed, target, budget, wall_cap, work, progress)
    if method == "oracle":
        return run_oracle(goal, seed, target, budget, wall_cap, work, progress)
    if method == "swarm":
        return run_swarm(goal, seed, target, budget, wall_cap, work, progress)
    if method in ("pbt", "pb2", "asha"):
        from swarmbench.tune_methods import run_tune

        return run_tune(method, goal, seed, target, budget, wall_cap, work, progress)
    raise ValueError(f"method={method!r}: unknown; known: {', '.join(METHODS)}")
