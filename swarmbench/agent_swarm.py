"""The swarm on an agentic fault scenario: `swarm run` of a goal whose `run.agent` is the
scenario's faulted agent run, the controller's built-in policies, until the benchmark's target is
met or the worker-CPU budget is spent (benchmarks/agentic_faults.py, method `swarm`).

The run is what a user would start: its own process, its own warm-up (the scenario's, with the same
seed, so the same demonstrations and weights as the benchmark's common warm-up), its fault hidden
from the controller (`harness_fault` never reaches operators, reports or memory). Worker CPU is every
`trainer.agent_train` process under the controller (the live job and every backtest arm, start-up
included), polled every 0.1 s; the live job's own held-out evaluations are subtracted (each eval row
records its `eval_cpu_s`), as the benchmark's in-process arms leave their evaluations out. The arms'
evaluations are the swarm's work and stay counted. The controller's own CPU is not worker CPU (as in
the suite's swarm runs).

Reached: a live eval row at or above the target, from the first step whose eval sees the fault (after
a drift's first step, or the warm-up's end), at a step the in-process arms evaluate too (`counts`),
with the worker CPU at that row within the budget. The goal says `target.stop: false` for every
origin, so that the controller does not end the run at the warm-up's evaluation, before a drift
arrives; the benchmark stops it once its target is met. The goal's worker-CPU budget is
`CONTROLLER_BUDGET_X` times the benchmark's (the controller counts the live job's evaluations); the
benchmark stops the run at its own budget.
"""
from __future__ import annotations

import copy
import json
import pathlib
import time
from typing import Any, Callable

import yaml

from swarmbench.accounting import cpu_at
from swarmbench.methods import drive_swarm, read_jsonl

# the controller's settings for a run of a few hundred steps at ~1 s a step (the goal's own, as a
# user of agent runs would write them; defaults are sized for runs of thousands of steps)
SWARM = {"observe_every_s": 1, "evaluate_window_steps": 10, "min_steps_between_interventions": 0,
         "backtest": {"horizon_steps": 4, "seeds": [0], "eval_size": 32}}
GRPO_STEPS = 2000        # the live run's GRPO stage: longer than any budget allows
STOP_GRACE_S = 30        # after `swarm stop`, a kill
# the goal's worker-CPU budget over the benchmark's: the controller counts the live job's evals,
# which the benchmark leaves out, so its own budget must not end the run before the benchmark's does
CONTROLLER_BUDGET_X = 2.0
# 2: a training row's own eval is not subtracted from the CPU at its time (it runs after the row's
# stamp), and a hit counts only where the in-process arms evaluate (`counts`); 1 did both otherwise
ACCOUNTING = 2


def is_agent_trainer(cmd: list[str]) -> bool:
    """A process of the agent trainer: the swarm's live job or one of its backtest arms."""
    return "trainer.agent_train" in " ".join(cmd)


def goal(sc: dict[str, Any], target: float, budget: float, wall_cap: float, *, eval_size: int,
         eval_every: int) -> dict[str, Any]:
    """The goal file `swarm run` gets for scenario `sc`."""
    agent = copy.deepcopy(sc["config"])
    grpo = dict(agent.get("grpo") or {}, steps=GRPO_STEPS)
    agent.update(seed=sc["seed"], threads=1, eval_size=eval_size, eval_every=eval_every, grpo=grpo)
    # a drift arrives after the warm-up, whose evaluation may already meet the target: the run goes on
    # (`target.stop: false`, for every origin, so the goal does not tell which) and the benchmark
    # stops it once the target is met where it counts
    return {"goal": f"a tool-using policy that solves {sc['env']} episodes",
            "target": {"metric": "heldout_acc", "op": ">=", "threshold": round(target, 6), "stop": False},
            "budget": {"worker_cpu_s": float(budget) * CONTROLLER_BUDGET_X, "wall_s": float(wall_cap)},
            "run": {"agent": agent}, "llm": {"model": None}, "swarm": copy.deepcopy(SWARM)}


def fault_step(sc: dict[str, Any]) -> int:
    """The first trainer step whose eval counts toward the target: after the drift's first step, or
    the warm-up's end for a fault in the starting harness."""
    cfg = sc["config"]
    drift = cfg.get("harness_fault_step")
    return int(drift) + 1 if drift is not None else int(cfg["sft"]["steps"])


def is_eval_row(r: dict[str, Any]) -> bool:
    """A live run's row the curve reads: a held-out eval with a time (the final summary row left out)."""
    return not r.get("final") and isinstance(r.get("heldout_acc"), (int, float)) and isinstance(r.get("time"), (int, float))


def curve(rows: list[dict[str, Any]], timeline: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """Each live eval row as {step, cpu_s, heldout_acc}: worker CPU at the row's time less the live
    job's evaluation CPU before it. A training row (`sft`, `grpo`) is stamped before its eval runs,
    so its own eval is not in the CPU at its time; the run's first `eval` row is stamped after it."""
    out, evals = [], 0.0
    times = [x[0] for x in timeline]
    for r in rows:
        own = float(r.get("eval_cpu_s") or 0.0)
        if r.get("algorithm") == "eval":
            evals += own
        if is_eval_row(r):
            c = cpu_at(timeline, r["time"], times)
            if c is not None:
                out.append({"step": int(r.get("step", 0)), "cpu_s": round(max(c - evals, 0.0), 2),
                            "heldout_acc": float(r["heldout_acc"])})
        if r.get("algorithm") != "eval":
            evals += own
    return out


def hit(points: list[dict[str, Any]], target: float, budget: float, first_step: int,
        counts: Callable[[int], bool] | None = None) -> dict[str, Any] | None:
    """The first point at or after `first_step` at or above the target within the budget; with
    `counts`, only at the steps it accepts (the in-process arms' eval schedule)."""
    return next((p for p in points if p["step"] >= first_step and (counts is None or counts(p["step"]))
                 and p["heldout_acc"] >= target - 1e-12 and p["cpu_s"] <= budget + 1e-9), None)


def run(sc: dict[str, Any], work: pathlib.Path, *, target: float, budget: float, wall_cap: float,
        eval_size: int, eval_every: int, counts: Callable[[int], bool] | None = None, log=print) -> dict[str, Any]:
    """`swarm run` on the scenario until the target is met (at or after the fault), the budget is
    spent or the wall cap passes; the arm's record for the benchmark."""
    work.mkdir(parents=True, exist_ok=True)
    gpath, ws, summ = work / "goal.yaml", work / "ws", work / "summary.json"
    gpath.write_text(yaml.safe_dump(goal(sc, target, budget, wall_cap, eval_size=eval_size, eval_every=eval_every),
                                    sort_keys=False))
    live = ws / ".swarm" / "runs" / "train" / "metrics.jsonl"
    first = fault_step(sc)
    t0 = time.time()
    last = [0.0]

    def why_stop(now: float, meter: Any) -> str | None:
        if now - last[0] < 1.0:   # the live rows are read once a second
            return None
        last[0] = now
        rows = read_jsonl(live)
        if hit(curve(rows, meter.timeline), target, budget, first, counts):
            return "target"
        return "budget" if meter.total > budget + _evals(rows) else "wall" if now - t0 > wall_cap else None

    meter, why, rc = drive_swarm(work, gpath, ws, summ, is_agent_trainer, why_stop, grace_s=STOP_GRACE_S)
    rows = read_jsonl(live)
    points = curve(rows, meter.timeline)
    h = hit(points, target, budget, first, counts)
    s = json.loads(summ.read_text()) if summ.exists() else {}
    ivs = s.get("interventions") or []
    edits = [{"kind": iv.get("kind"), "status": iv.get("status"), "changes": iv.get("changes"),
              "diagnosis": iv.get("diagnosis"), "gain": iv.get("gain"), "effect": iv.get("effect")} for iv in ivs]
    used = max(meter.total - _evals(rows), 0.0)
    log(f"  swarm: " + (f"target at {h['cpu_s']:.1f} CPU-s (step {h['step']})" if h else
                        f"no target in {used:.1f} CPU-s ({why or s.get('reason')})") +
        f"; {len(ivs)} proposals: {[(e['changes'], e['status']) for e in edits]}")
    return {"arm": "swarm", "cpu_s": used, "wall_s": time.time() - t0, "curve": points, "reached": h is not None,
            "cpu_to_target": h["cpu_s"] if h else None, "stop": why or s.get("reason"), "rc": rc,
            "accounting": ACCOUNTING,
            "interventions": edits, "trainer_processes": len(meter.cpu), "first_counted_step": first,
            "log_tail": None if s else (work / "controller.log").read_text(errors="replace")[-1500:]}


def _evals(rows: list[dict[str, Any]]) -> float:
    """The live job's evaluation CPU in `rows` (its eval rows' `eval_cpu_s`)."""
    return sum(float(r.get("eval_cpu_s") or 0.0) for r in rows)
