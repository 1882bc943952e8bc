"""Agentic fault scenarios: the swarm and the trainer's critic vs plain vs oracle on fresh seeds (issue 30).

Each scenario comes from `swarmbench.agentic.generate(seed)`: an agent environment the built-in model
learns in its warm-up, one harness fault (a missing tool, max_turns too small, a parser that rejects
valid calls, observations cut from the wrong side, a wrong tool description) and its origin: in the
starting harness (`config`) or a harness change at a GRPO step after the warm-up (`drift`). Per
scenario, from one common warm-up (SFT on the environment's expert demonstrations under the healthy
harness, in this process, one torch thread; the in-process arms start from its weights, optimiser
state, data cursor and sampling RNG):

    oracle   the healthy harness (no fault), GRPO for `--horizon` steps after the drift point (or the
             warm-up): calibration. target = `--target-frac` x its best held-out success at or after
             the drift point; a target below `--floor` leaves the scenario out (unlearnable). Its
             worker-CPU to target is the reference; the budget is `--budget-x` times it.
    plain    the fault, nothing watching: GRPO until the target or the budget. It classifies the
             scenario: `failing` (the target is not reached within the budget) or `mild`.
    critic   the fault, the agent trainer with its own HarnessCritic (`critic.enabled`, periodic rounds
             every `--critic-every` GRPO steps): a round keeps a typed harness edit only on a
             significant paired gain; GRPO in between; until the target or the budget.
    swarm    the fault, `swarm run` on a goal whose `run.agent` is the faulted run (built-in policies;
             swarmbench/agent_swarm.py): the controller's step-record detectors and HarnessCritic, each
             edit backtested on arms forked from the live checkpoint and applied through the inbox.
             Its own processes and warm-up (the same seed); worker CPU = every agent-trainer process
             (live job, arms, start-ups) less the live job's own evals; until the target or the budget.

`--arms` picks critic, swarm or both; a scenario recorded without the swarm arm runs it alone under
`--resume` (its target and budget are recorded). Distillation is not run: the target is held-out
success under the run's current harness.

Held-out success: greedy, `--eval-size` held-out episodes, under the arm's current harness, at fixed
GRPO steps for the in-process arms (`EVAL_AT`: every 2 steps to 20, then every 10), every
`--swarm-eval-every` GRPO steps on the swarm's live run; a target counts only at or after the drift
point. Worker-CPU of the in-process arms is this process's CPU time (`time.process_time`) spent on the
arm's work, the common warm-up included (every arm is charged it), the benchmark's evals not (the
critic's own rollouts and paired tests are charged: they are its work).

    .venv/bin/python benchmarks/agentic_faults.py --seeds 100-103              # development seeds
    .venv/bin/python benchmarks/agentic_faults.py --seeds 200-219 --resume     # the result's fresh seeds

Writes benchmarks/results/agentic_faults.{json,md}; each scenario's result.json and run logs (events
with the harness change and every critic verdict) go under runs/agentic_faults/.
"""
from __future__ import annotations

import argparse
import copy
import json
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]  # benchmarks/kernels must not shadow kernels
sys.path.insert(0, str(ROOT))
from swarmbench.accounting import WorkClock  # noqa: E402

ARMS = ("oracle", "plain", "critic", "swarm")
UNDER_TEST = ("critic", "swarm")   # the methods whose success on failing runs is the result
EVAL_AT = frozenset(list(range(0, 21, 2)) + list(range(30, 100_000, 10)))   # GRPO steps with an eval



def make_trainer(sc: dict[str, Any], arm: str, out: str, knobs: dict[str, Any]):
    from trainer.agent_train import AgentTrainConfig, AgentTrainer

    data = copy.deepcopy(sc["healthy"] if arm in ("warm", "oracle") else sc["config"])
    data.update({"seed": sc["seed"], "name": f"{sc['id']}-{arm}", "out_dir": out, "threads": 1,
                 "eval_size": knobs["eval_size"]})
    data["critic"] = {"enabled": arm == "critic", "every": knobs["critic_every"]}
    return AgentTrainer(AgentTrainConfig.parse(data), printer=None)


def open_log(t) -> None:
    import yaml

    from trainer.runlog import RunLog, atomic_write_text

    t.t_start = time.time()
    t.log = RunLog(t.cfg.run_dir)
    atomic_write_text(t.cfg.run_dir / "config.yaml", yaml.safe_dump(t.cfg.model_dump(mode="json"), sort_keys=False))


def warm(sc: dict[str, Any], out: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """The common warm-up under the healthy harness; its state for the arms, in memory."""
    t = make_trainer(sc, "warm", out, knobs)
    open_log(t)
    clock = WorkClock()
    t.warm_up()
    cpu = clock.work()
    acc = clock.measure(lambda: t.evaluate()["heldout_acc"])
    state = {"model": copy.deepcopy(t.policy.model.state_dict()), "opt": copy.deepcopy(t.opt.state_dict()),
             "cursor": t.cursor, "rng": t.rng.get_state(), "step": t.step}
    t.log.close()
    return {"cpu_s": cpu, "wall_s": clock.wall(), "heldout_acc": acc, "state": state}


def run_arm(sc: dict[str, Any], arm: str, w: dict[str, Any], out: str, knobs: dict[str, Any], *,
            target: float | None, budget: float | None, horizon: int | None) -> dict[str, Any]:
    """One arm from the common warm-up: GRPO (with the critic's periodic rounds in the critic arm)
    until held-out success reaches `target` at or after the drift point, or the worker-CPU
    `budget` (warm-up included) is spent, or `horizon` GRPO steps after the drift point."""
    t = make_trainer(sc, arm, out, knobs)
    s = w["state"]
    t.policy.model.load_state_dict(s["model"])
    t.opt.load_state_dict(s["opt"])
    t.cursor, t.step = s["cursor"], s["step"]
    t.rng.set_state(s["rng"])
    open_log(t)
    for g in t.opt.param_groups:
        g["lr"] = t.cfg.grpo.lr
    d = sc["drift_after_grpo_steps"] or 0
    clock = WorkClock(charged=w["cpu_s"])
    curve: list[dict[str, Any]] = []
    reached: float | None = None
    i = 0
    while True:
        if arm == "critic" and t.critic_due(i, t.cfg.critic.every):
            t.critic_rounds()
        t.apply_harness_change()
        if i in EVAL_AT:
            acc = clock.measure(lambda: t.evaluate()["heldout_acc"])
            curve.append({"grpo_step": i, "cpu_s": round(clock.work(), 2), "heldout_acc": acc,
                          "harness_version": t.harness.version})
            if target is not None and i >= d and acc >= target:
                reached = clock.work()
                break
        if horizon is not None and i >= d + horizon:
            break
        if budget is not None and clock.work() >= budget:
            break
        row = {**t.row_base("grpo"), **t.grpo_step(i)}
        t.step += 1
        t.write_row({**row, "step_time": 0.0, "work_cpu": clock.work()})
        i += 1
    used = clock.work()
    t.log.close()
    return {"arm": arm, "cpu_s": used, "wall_s": clock.wall(), "eval_cpu_s": clock.eval_cpu, "grpo_steps": i,
            "curve": curve, "reached": reached is not None, "cpu_to_target": reached,
            "edits": t.edits, "start_harness": t.start_harness.version, "harness": t.harness.version}


def run_scenario(sc: dict[str, Any], out: str, knobs: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    t0 = time.perf_counter()
    res = _scenario(sc, out, knobs, log)
    res["wall_s"] = time.perf_counter() - t0
    return res


def _scenario(sc: dict[str, Any], out: str, knobs: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    w = warm(sc, out, knobs)
    log(f"  warm-up: {w['cpu_s']:.1f} CPU-s, held-out {w['heldout_acc']:.3f}")
    res: dict[str, Any] = {"scenario": {k: v for k, v in sc.items()}, "warm": {k: v for k, v in w.items() if k != "state"}}
    o = run_arm(sc, "oracle", w, out, knobs, target=None, budget=None, horizon=knobs["horizon"])
    d = sc["drift_after_grpo_steps"] or 0
    best = max(p["heldout_acc"] for p in o["curve"] if p["grpo_step"] >= d)
    target = knobs["target_frac"] * best
    res["oracle_best"], res["target"] = best, target
    if target < knobs["floor"]:
        res["status"] = "unlearnable"
        res["arms"] = {"oracle": o}
        log(f"  oracle best {best:.3f}: target {target:.3f} below the floor {knobs['floor']}: left out")
        return res
    hit = next(p for p in o["curve"] if p["grpo_step"] >= d and p["heldout_acc"] >= target)
    o["reached"], o["cpu_to_target"] = True, hit["cpu_s"]
    budget = knobs["budget_x"] * hit["cpu_s"]
    res["budget_cpu_s"] = budget
    log(f"  oracle: best {best:.3f}, target {target:.3f} at {hit['cpu_s']:.1f} CPU-s; budget {budget:.1f}")
    arms = {"oracle": o}
    for arm in ["plain"] + [m for m in knobs["arms"] if m != "swarm"]:
        arms[arm] = run_arm(sc, arm, w, out, knobs, target=target, budget=budget, horizon=None)
        r = arms[arm]
        log(f"  {arm}: " + (f"target at {r['cpu_to_target']:.1f} CPU-s ({r['cpu_to_target'] / hit['cpu_s']:.2f}x)"
                            if r["reached"] else f"no target in {r['cpu_s']:.1f} CPU-s") +
            (f"; kept {[(e['path'], e['value']) for e in r['edits'] if e['kept']]}" if arm == "critic" else ""))
    res["arms"] = arms
    if "swarm" in knobs["arms"]:
        arms.update(extra_arms(sc, res, out, {**knobs, "arms": ["swarm"]}, log))
    res["status"] = "failing" if not arms["plain"]["reached"] else "mild"
    return res


def extra_arms(sc: dict[str, Any], res: dict[str, Any], out: str, knobs: dict[str, Any],
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """The swarm arm of a scenario whose target and budget are known (`res`, from this run or a
    recorded one): it needs neither the warm-up's state nor the other arms. The critic arm needs
    the warm-up: a recorded scenario without it is rerun whole (`--resume` off)."""
    from swarmbench import agent_swarm

    got: dict[str, Any] = {}
    for m in knobs["arms"]:
        if m != "swarm":
            raise SystemExit(f"{sc['id']}: the {m} arm needs the warm-up's state: rerun the scenario without --resume")
        got[m] = agent_swarm.run(sc, pathlib.Path(out) / sc["id"] / "swarm", target=res["target"],
                                 budget=res["budget_cpu_s"], wall_cap=knobs["swarm_wall_x"] * res["budget_cpu_s"],
                                 eval_size=knobs["eval_size"], eval_every=knobs["swarm_eval_every"],
                                 counts=on_grid(sc), log=log)
    return got


def on_grid(sc: dict[str, Any]) -> Callable[[int], bool]:
    """Whether the swarm's live eval at a trainer step is one the in-process arms also take (`EVAL_AT`,
    in GRPO steps after the warm-up): a denser schedule would see the target sooner."""
    warm = int(sc["config"]["sft"]["steps"])
    return lambda step: step - warm in EVAL_AT


def rescore_swarm(r: dict[str, Any], out: str) -> dict[str, Any]:
    """A swarm arm recorded with the first accounting (`agent_swarm.ACCOUNTING` 1: a training row's
    own eval subtracted from the CPU before it ran; a hit on any eval) scored again from its stored
    curve and its run folder's eval rows: each training row's point gains its own eval's CPU, and a
    hit counts only on the in-process arms' schedule (a run stopped at a hit off it, before their next
    eval, is charged to that eval at its CPU per step, marked `estimated`). An arm whose rows do not
    match its curve is marked `unscored` and left out of the summary."""
    from swarmbench import agent_swarm
    from swarmbench.methods import read_jsonl

    a = r.get("arms", {}).get("swarm")
    if not a or a.get("accounting", 1) >= agent_swarm.ACCOUNTING:
        return r
    sc = r["scenario"]
    rows = [x for x in read_jsonl(pathlib.Path(out) / sc["id"] / "swarm" / "ws" / ".swarm" / "runs" / "train"
                                  / "metrics.jsonl") if agent_swarm.is_eval_row(x)]
    pts = a["curve"]
    if len(rows) != len(pts) or any(int(x.get("step", 0)) != p["step"] for x, p in zip(rows, pts)):
        return {**r, "arms": {**r["arms"], "swarm": {**a, "unscored": True, "rescored": "its run folder's rows do not "
                                                                      "match the curve: left out"}}}
    fixed = [{**p, "cpu_s": round(p["cpu_s"] + (0.0 if x.get("algorithm") == "eval" else float(x.get("eval_cpu_s") or 0.0)), 2)}
             for p, x in zip(pts, rows)]
    first, grid = agent_swarm.fault_step(sc), on_grid(sc)
    h = agent_swarm.hit(fixed, r["target"], r["budget_cpu_s"], first, grid)
    note = ""
    off = agent_swarm.hit(fixed, r["target"], float("inf"), first)
    if h is None and off is not None and not grid(off["step"]):
        # the run was stopped at a hit off the in-process arms' schedule. Where it went on to their next
        # eval, that eval decides (it found no hit there); where it did not, the CPU to that eval is
        # estimated at the run's CPU per step before the hit, and the hit's held-out is assumed to hold
        nxt = next(k for k in range(off["step"] + 1, off["step"] + 1000) if grid(k))
        i = fixed.index(off)
        prev = next((p for p in reversed(fixed[:i]) if p["step"] < off["step"]), None)
        slope = (off["cpu_s"] - prev["cpu_s"]) / (off["step"] - prev["step"]) if prev else 0.0
        if max(p["step"] for p in fixed) >= nxt:
            note = f"; its hit at step {off['step']} lies off the in-process schedule and its evals from step {nxt} on missed"
        elif slope <= 0:
            note = f"; its hit at step {off['step']} lies off the in-process schedule, with no CPU per step to charge to step {nxt}: missed"
        else:
            est = round(off["cpu_s"] + (nxt - off["step"]) * slope, 2)
            h = {"step": nxt, "cpu_s": est, "heldout_acc": off["heldout_acc"], "estimated": True} \
                if est <= r["budget_cpu_s"] + 1e-9 else None
            note = (f"; its hit at step {off['step']} lies off the in-process schedule: charged to step {nxt} at "
                    f"{slope:.2f} CPU-s a step (estimated)")
    was = f"{a['cpu_to_target']:.1f} CPU-s" if a["reached"] else "missed"
    now = {**a, "curve": fixed, "reached": h is not None, "cpu_to_target": h["cpu_s"] if h else None,
           "estimated": bool(h and h.get("estimated")),
           "accounting": agent_swarm.ACCOUNTING, "rescored": f"accounting 1 -> {agent_swarm.ACCOUNTING}: was {was}{note}"}
    return {**r, "arms": {**r["arms"], "swarm": now}}


# ---- the report ----------------------------------------------------------------------------
def methods_in(results: list[dict[str, Any]]) -> list[str]:
    """The methods under test that every measured scenario ran."""
    measured = [r for r in results if r["status"] in ("failing", "mild")]
    return [m for m in UNDER_TEST if measured and all(m in r["arms"] for r in measured)]


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per origin and mechanism, and overall: scenarios, how many the plain arm fails, and per
    method under test its success on those and its worker-CPU to target over the oracle's (median,
    max over the failing runs it reached)."""
    methods = methods_in(results)

    def group(rs: list[dict[str, Any]]) -> dict[str, Any]:
        measured = [r for r in rs if r["status"] in ("failing", "mild")]
        failing = [r for r in measured if r["status"] == "failing"]
        out: dict[str, Any] = {"scenarios": len(rs), "unlearnable": len(rs) - len(measured), "failing": len(failing),
                               "mild": len(measured) - len(failing), "measured": len(measured),
                               "plain_success_all": sum(r["arms"]["plain"]["reached"] for r in measured)}
        for m in methods:
            scored = [r for r in measured if not r["arms"][m].get("unscored")]   # see rescore_swarm
            fail = [r for r in scored if r["status"] == "failing"]
            ok = [r for r in fail if r["arms"][m]["reached"]]
            ratios = [r["arms"][m]["cpu_to_target"] / r["arms"]["oracle"]["cpu_to_target"] for r in ok]
            out[m] = {"success_failing": len(ok), "failing": len(fail), "success_rate": len(ok) / len(fail) if fail else None,
                      "success_all": sum(r["arms"][m]["reached"] for r in scored), "measured": len(scored),
                      "unscored": len(measured) - len(scored),
                      "estimated": sum(bool(r["arms"][m].get("estimated")) for r in ok),
                      "ratio_median": statistics.median(ratios) if ratios else None,
                      "ratio_max": max(ratios) if ratios else None}
        return out
    out: dict[str, Any] = {"methods": methods, "all": group(results)}
    for origin in ("config", "drift"):
        rs = [r for r in results if r["scenario"]["origin"] == origin]
        out[origin] = group(rs)
        for m in sorted({r["scenario"]["mechanism"] for r in rs}):
            out[f"{origin}/{m}"] = group([r for r in rs if r["scenario"]["mechanism"] == m])
    return out


def _fmt(x: float | None, f: str = ".2f") -> str:
    return "–" if x is None else format(x, f)


DESCRIBE = {
    "critic": lambda k: ("`critic`: the agent trainer's own HarnessCritic, in the benchmark's process (periodic critic "
                         f"rounds every {k['critic_every']} GRPO steps, each keeping a typed harness edit only on a "
                         "significant paired gain; no distillation)"),
    "swarm": lambda k: ("`swarm`: `swarm run` on a goal whose `run.agent` is the faulted run (swarmbench/agent_swarm.py): "
                        "the controller's built-in policies, its step-record detectors and HarnessCritic, each edit "
                        "backtested on arms forked from the live checkpoint and applied through the inbox; the run's own "
                        "process and warm-up (same seed), held-out evals every "
                        f"{k.get('swarm_eval_every', '?')} GRPO steps; worker CPU = every agent-trainer process (live job, "
                        "arms, start-ups), less the live job's own evals. Goal settings: "
                        f"`swarm: {json.dumps(k.get('swarm_settings', {}))}`"),
}


def _cell(x: dict[str, Any]) -> str:
    return (f"{x['cpu_to_target']:.1f}" if x["reached"] else
            f"missed ({x['cpu_s']:.1f} spent, last {x['curve'][-1]['heldout_acc'] if x['curve'] else 0.0:.2f})")


def _changes(r: dict[str, Any], m: str) -> str:
    a = r["arms"][m]
    if m == "critic":
        return "; ".join(f"`{e['path']}=" + ("<the environment's spec>" if isinstance(e["value"], dict) else repr(e["value"]))
                         + f"` {e['before']}/{e['n']}→{e['after']}/{e['n']}" for e in a["edits"] if e["kept"]) or "–"
    shown = lambda v: "<the environment's spec>" if isinstance(v, dict) else repr(v)  # noqa: E731
    return "; ".join(f"{e['diagnosis']}: " + ", ".join(f"`{k}={shown(v)}`" for k, v in (e["changes"] or {}).items())
                     + f" ({e['status']})" for e in a["interventions"]) or "–"


def markdown(res: dict[str, Any]) -> str:
    k, s = res["knobs"], res["summary"]
    a, methods = s["all"], s.get("methods", [])
    lines = [
        "# Agentic fault scenarios: " + " / ".join(methods) + " vs plain vs oracle",
        "",
        f"`{res['command']}` (commit {res['commit']}, {sum(r.get('wall_s', 0.0) for r in res['results']) / 60:.0f} "
        "min wall over the scenarios, one torch thread per process, on a shared 2-core machine). Script: "
        f"`benchmarks/agentic_faults.py`; scenarios: `swarmbench/agentic.py`; numbers: "
        f"`{res.get('numbers', 'agentic_faults.json')}`.",
        "",
        res.get("status_note", ""),
        "",
        "Methods under test: " + "; ".join(DESCRIBE[m](k) for m in methods) + ". `plain`: the same run with the fault "
        "and nothing watching it. `oracle`: the healthy harness.",
        "",
        f"Setup: per scenario one common warm-up under the healthy harness; oracle GRPO for {k['horizon']} steps "
        f"after the drift point gives the target ({k['target_frac']} x its best held-out success at or after the "
        f"drift point; below {k['floor']} the scenario is left out) and the budget ({k['budget_x']} x the oracle's "
        "worker-CPU to target). Worker-CPU includes the warm-up, not the benchmark's evals. Held-out "
        f"success: greedy, {k['eval_size']} held-out episodes, under the arm's current harness; a target counts "
        "only at or after the drift point.",
        "",
        "## Targets",
        "",
        "| target | measured | met? |",
        "|---|---|---|",
    ]
    for m in methods:
        g = a[m]
        rate = g["success_rate"]
        extra = "".join([f" ({g['estimated']} with an estimated CPU, see below)" if g.get("estimated") else "",
                         f" ({g['unscored']} arm(s) left out, see below)" if g.get("unscored") else ""])
        lines.append(f"| {m} success >= 90% of failing runs | {g['success_failing']}/{g.get('failing', a['failing'])} = "
                     f"{_fmt(rate, '.0%')}{extra} | " + ("–" if rate is None else "yes" if rate >= 0.9 else
                                                  f"no, {100 * (0.9 - rate):.1f} points short") + " |")
        lines.append(f"| {m} worker-CPU to target <= 1.5x the oracle's | median {_fmt(g['ratio_median'])}x, max "
                     f"{_fmt(g['ratio_max'])}x | " + ("–" if g["ratio_max"] is None else "yes" if g["ratio_max"] <= 1.5
                                                      else f"no: max {g['ratio_max'] - 1.5:.2f}x over" +
                                                      (" (median within)" if g["ratio_median"] <= 1.5 else "")) + " |")
    rescored = [(r["scenario"]["id"], r["arms"]["swarm"]) for r in res["results"]
                if "swarm" in r.get("arms", {}) and r["arms"]["swarm"].get("rescored")]
    if rescored:
        lines += ["", f"{len(rescored)} swarm arm(s) were recorded with the first accounting and scored again from their "
                  "run folders (`rescore_swarm`: each training row's own eval is no longer subtracted before it ran, "
                  "and a hit counts only where the in-process arms evaluate); each one's result before:", ""]
        lines += [f"- {sid}: {a['rescored']}; now " + (f"{a['cpu_to_target']:.1f} CPU-s" if a["reached"] else "missed")
                  for sid, a in rescored]
    lines += ["", "## Per origin and mechanism", "",
              "| origin / mechanism | scenarios | left out | plain failing / mild | plain success, all measured | "
              + " | ".join(f"{m} success on failing | {m} success, all measured | {m} CPU to target / oracle's "
                           "(median, max)" for m in methods) + " |",
              "|---|---|---|---|---|" + "---|---|---|" * len(methods)]
    for key, g in s.items():
        if key in ("all", "methods"):
            continue
        lines.append(f"| {'**' + key + '**' if '/' not in key else key} | {g['scenarios']} | {g['unlearnable']} | "
                     f"{g['failing']} / {g['mild']} | {g['plain_success_all']}/{g['measured']} | "
                     + " | ".join(f"{g[m]['success_failing']}/{g[m].get('failing', g['failing'])} | "
                                  f"{g[m]['success_all']}/{g[m].get('measured', g['measured'])} | "
                                  f"{_fmt(g[m]['ratio_median'])}, {_fmt(g[m]['ratio_max'])}" for m in methods) + " |")
    lines += ["", "## Per scenario", "",
              "| scenario | fault | warm-up CPU-s, held-out | oracle best → target | oracle CPU to target | budget | plain | "
              + " | ".join(f"{m} | {m} / oracle | {m}'s changes" for m in methods) + " |",
              "|---|---|---|---|---|---|---|" + "---|---|---|" * len(methods)]
    for r in res["results"]:
        sc = r["scenario"]
        fault = ", ".join(f"`{p}={v!r}`" for p, v in sc["fault"].items())
        if sc["origin"] == "drift":
            fault += f" at GRPO step {sc['drift_after_grpo_steps']}"
        head = (f"| {sc['id']} | {fault} | {r['warm']['cpu_s']:.1f}, {r['warm']['heldout_acc']:.2f} | "
                f"{r['oracle_best']:.2f} → {r['target']:.2f} |")
        if r["status"] == "unlearnable":
            lines.append(head + " left out: below the floor |" + " |" * (2 + 3 * len(methods)))
            continue
        ar = r["arms"]
        row = head + f" {ar['oracle']['cpu_to_target']:.1f} | {r['budget_cpu_s']:.1f} | {_cell(ar['plain'])} ({r['status']}) |"
        for m in methods:
            ratio = f"{ar[m]['cpu_to_target'] / ar['oracle']['cpu_to_target']:.2f}x" if ar[m]["reached"] else "–"
            row += f" {_cell(ar[m])} | {ratio} | {_changes(r, m)} |"
        lines.append(row)
    lines += ["", "## Reading", "", res.get("reading", "(filled in by hand after the run)"), ""]
    return "\n".join(lines)


def main() -> None:
    from swarmbench.agentic import generate, parse_seeds

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="100-103", help="scenario seeds: a range 200-219 or a list 200,205")
    ap.add_argument("--eval-size", type=int, default=64)
    ap.add_argument("--horizon", type=int, default=6, help="oracle: GRPO steps after the drift point (calibration)")
    ap.add_argument("--target-frac", type=float, default=0.9, help="target = this x the oracle's best")
    ap.add_argument("--floor", type=float, default=0.5, help="a target below it leaves the scenario out")
    ap.add_argument("--budget-x", type=float, default=3.0, help="budget = this x the oracle's worker-CPU to target")
    ap.add_argument("--critic-every", type=int, default=2, help="critic rounds every N GRPO steps (critic.every)")
    ap.add_argument("--arms", default="critic,swarm", help="the methods under test beside plain and oracle: critic, swarm "
                    "or both (a resumed scenario that lacks one runs it alone: its target and budget are recorded)")
    ap.add_argument("--swarm-eval-every", type=int, default=2, help="swarm: the live run's held-out eval every N GRPO steps")
    ap.add_argument("--swarm-wall-x", type=float, default=10.0, help="swarm: wall-clock cap = this x the budget in seconds")
    ap.add_argument("--out", default=str(ROOT / "runs" / "agentic_faults"))
    ap.add_argument("--results", default=str(HERE / "results" / "agentic_faults"))
    ap.add_argument("--resume", action="store_true", help="reuse scenarios whose result.json is under --out")
    ap.add_argument("--report-only", action="store_true", help="report the scenarios done under --out, run nothing")
    ap.add_argument("--reading", help="a markdown file: the report's Reading section")
    ap.add_argument("--status-note", default="", help="a line under the command (e.g. that the run is partial)")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from swarmbench import agent_swarm

    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    bad = [x for x in arms if x not in UNDER_TEST]
    if bad or not arms:
        ap.error(f"--arms {a.arms!r}: choose from {', '.join(UNDER_TEST)}")
    knobs = {"eval_size": a.eval_size, "horizon": a.horizon, "target_frac": a.target_frac, "floor": a.floor,
             "budget_x": a.budget_x, "critic_every": a.critic_every, "arms": arms,
             "swarm_eval_every": a.swarm_eval_every, "swarm_wall_x": a.swarm_wall_x, "swarm_settings": agent_swarm.SWARM}
    seeds = parse_seeds(a.seeds)
    # the code the scenarios run is the code at the start (a later commit does not reach this process)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    t0 = time.perf_counter()
    results = []
    for seed in seeds:
        sc = generate(seed)
        path = pathlib.Path(a.out) / sc["id"] / "result.json"
        if (a.resume or a.report_only) and path.is_file():
            r = rescore_swarm(json.loads(path.read_text()), a.out)
            missing = [m for m in arms if m not in r.get("arms", {})] if r["status"] != "unlearnable" else []
            if missing and not a.report_only:
                print(f"[{time.perf_counter() - t0:6.0f}s] {sc['id']}: {', '.join(missing)} (target and budget recorded)",
                      flush=True)
                r = {**r, "arms": {**r["arms"], **extra_arms(sc, r, a.out, {**knobs, "arms": missing})},
                     "commit": f"{r.get('commit')}+{commit}"}
                path.write_text(json.dumps(r, default=str))
            results.append(r)
            continue
        if a.report_only:
            continue
        print(f"[{time.perf_counter() - t0:6.0f}s] {sc['id']}: {sc['fault']}", flush=True)
        r = {**run_scenario(sc, a.out, knobs, lambda line: print(line, flush=True)), "commit": commit}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(r, default=str))
        results.append(r)
    commit = ", ".join(sorted({str(r.get("commit", "unrecorded")) for r in results})) or commit   # each scenario's
    shown = [x for k, x in enumerate(sys.argv[1:]) if x not in ("--reading", "--status-note")
             and (k == 0 or sys.argv[k] not in ("--reading", "--status-note"))]   # the report's own text stays out
    res = {"command": "benchmarks/agentic_faults.py " + " ".join(shown), "commit": commit, "seeds": seeds,
           "knobs": knobs, "wall_s": time.perf_counter() - t0, "status_note": a.status_note, "results": results,
           "summary": summarize(results)}
    if a.reading:
        res["reading"] = pathlib.Path(a.reading).read_text().strip()
    base = pathlib.Path(a.results)
    res["numbers"] = base.with_suffix(".json").name
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    base.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
