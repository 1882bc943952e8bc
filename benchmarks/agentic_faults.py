"""Agentic fault scenarios: critic vs plain vs oracle on fresh seeds (issue 30, item 7).

Each scenario comes from `swarmbench.agentic.generate(seed)`: an agent environment the built-in model
learns in its warm-up, one harness fault (a missing tool, max_turns too small, a parser that rejects
valid calls, observations cut from the wrong side, a wrong tool description) and its origin: in the
starting harness (`config`) or a harness change at a GRPO step after the warm-up (`drift`). Per
scenario, in one process, one torch thread, from one common warm-up (SFT on the environment's expert
demonstrations under the healthy harness; every arm starts from its weights, optimiser state, data
cursor and sampling RNG):

    oracle   the healthy harness (no fault), GRPO for `--horizon` steps after the drift point (or the
             warm-up): calibration. target = `--target-frac` x its best held-out success at or after
             the drift point; a target below `--floor` leaves the scenario out (unlearnable). Its
             worker-CPU to target is the reference; the budget is `--budget-x` times it.
    plain    the fault, no critic: GRPO until the target or the budget. It classifies the scenario:
             `failing` (the target is not reached within the budget) or `mild`.
    critic   the fault, the agent trainer with its HarnessCritic (`critic.enabled`, periodic rounds
             every `--critic-every` GRPO steps, `critic.every`): critic rounds keep a typed harness
             edit only on a significant paired gain; GRPO in between; until the target or the budget.

The swarm controller does not drive agent runs: the method under test for agentic faults is the
agent trainer's own critic (trainer/agent_train.py), named `critic` here. Distillation is not run:
the target is held-out success under the run's current harness.

Held-out success: greedy, `--eval-size` held-out episodes, under the arm's current harness, at fixed
GRPO steps (`EVAL_AT`: every 2 steps to 20, then every 10), the same for every arm; a target counts
only at or after the drift point. Worker-CPU is this process's CPU time (`time.process_time`) spent
on the arm's work, the common warm-up included (every arm is charged it), the benchmark's evals not
(the critic's own rollouts and paired tests are charged: they are its work).

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

ARMS = ("oracle", "plain", "critic")
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
    for arm in ("plain", "critic"):
        arms[arm] = run_arm(sc, arm, w, out, knobs, target=target, budget=budget, horizon=None)
        r = arms[arm]
        log(f"  {arm}: " + (f"target at {r['cpu_to_target']:.1f} CPU-s ({r['cpu_to_target'] / hit['cpu_s']:.2f}x)"
                            if r["reached"] else f"no target in {r['cpu_s']:.1f} CPU-s") +
            (f"; kept {[(e['path'], e['value']) for e in r['edits'] if e['kept']]}" if arm == "critic" else ""))
    res["arms"] = arms
    res["status"] = "failing" if not arms["plain"]["reached"] else "mild"
    return res


# ---- the report ----------------------------------------------------------------------------
def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per origin and mechanism, and overall: scenarios, how many the plain arm fails, the critic's
    success on those, and its worker-CPU to target over the oracle's (median, max)."""
    def group(rs: list[dict[str, Any]]) -> dict[str, Any]:
        measured = [r for r in rs if r["status"] in ("failing", "mild")]
        failing = [r for r in measured if r["status"] == "failing"]
        ok = [r for r in failing if r["arms"]["critic"]["reached"]]
        ratios = [r["arms"]["critic"]["cpu_to_target"] / r["arms"]["oracle"]["cpu_to_target"] for r in ok]
        plain_ok = [r for r in measured if r["arms"]["plain"]["reached"]]
        return {"scenarios": len(rs), "unlearnable": len(rs) - len(measured), "failing": len(failing),
                "mild": len(measured) - len(failing), "critic_success_failing": len(ok),
                "critic_success_rate": len(ok) / len(failing) if failing else None,
                "plain_success_all": len(plain_ok), "measured": len(measured),
                "critic_success_all": sum(r["arms"]["critic"]["reached"] for r in measured),
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_max": max(ratios) if ratios else None}
    out: dict[str, Any] = {"all": group(results)}
    for origin in ("config", "drift"):
        rs = [r for r in results if r["scenario"]["origin"] == origin]
        out[origin] = group(rs)
        for m in sorted({r["scenario"]["mechanism"] for r in rs}):
            out[f"{origin}/{m}"] = group([r for r in rs if r["scenario"]["mechanism"] == m])
    return out


def _fmt(x: float | None, f: str = ".2f") -> str:
    return "–" if x is None else format(x, f)


def markdown(res: dict[str, Any]) -> str:
    k, s = res["knobs"], res["summary"]
    a = s["all"]
    rate = a["critic_success_rate"]
    lines = [
        "# Agentic fault scenarios: critic vs plain vs oracle",
        "",
        f"`{res['command']}` (commit {res['commit']}, {sum(r.get('wall_s', 0.0) for r in res['results']) / 60:.0f} "
        "min wall over the scenarios, one process, one torch "
        "thread, `nice -n 19` on a shared 2-core machine). Script: `benchmarks/agentic_faults.py`; scenarios: "
        f"`swarmbench/agentic.py`; numbers: `{res.get('numbers', 'agentic_faults.json')}`.",
        "",
        res.get("status_note", ""),
        "",
        "The swarm controller does not drive agent runs. The method under test is the agent trainer's own "
        "HarnessCritic (`critic`: periodic critic rounds every "
        f"{k['critic_every']} GRPO steps, each keeping a typed harness edit only on a significant paired gain; "
        "no distillation). `plain`: the same run with the fault and no critic. `oracle`: the healthy harness.",
        "",
        f"Setup: per scenario one common warm-up under the healthy harness; oracle GRPO for {k['horizon']} steps "
        f"after the drift point gives the target ({k['target_frac']} x its best held-out success at or after the "
        f"drift point; below {k['floor']} the scenario is left out) and the budget ({k['budget_x']} x the oracle's "
        "worker-CPU to target). Worker-CPU includes the common warm-up, not the benchmark's evals. Held-out "
        f"success: greedy, {k['eval_size']} held-out episodes, under the arm's current harness, at GRPO steps 0, 2, "
        "4, ..., 20, 30, 40, ...",
        "",
        "## Targets",
        "",
        "| target | measured | met? |",
        "|---|---|---|",
        f"| critic success >= 90% of failing runs | {a['critic_success_failing']}/{a['failing']} = {_fmt(rate, '.0%')} | "
        + ("–" if rate is None else "yes" if rate >= 0.9 else f"no, {100 * (0.9 - rate):.1f} points short") + " |",
        f"| critic worker-CPU to target <= 1.5x the oracle's | median {_fmt(a['ratio_median'])}x, max "
        f"{_fmt(a['ratio_max'])}x | " + ("–" if a["ratio_max"] is None else "yes" if a["ratio_max"] <= 1.5 else
                                         f"no: max {a['ratio_max'] - 1.5:.2f}x over" +
                                         (" (median within)" if a["ratio_median"] <= 1.5 else "")) + " |",
        "",
        "## Per origin and mechanism",
        "",
        "| origin / mechanism | scenarios | left out | plain failing / mild | critic success on failing | "
        "critic / plain success, all measured | critic CPU to target / oracle's (median, max) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, g in s.items():
        if key == "all":
            continue
        lines.append(f"| {'**' + key + '**' if '/' not in key else key} | {g['scenarios']} | {g['unlearnable']} | "
                     f"{g['failing']} / {g['mild']} | {g['critic_success_failing']}/{g['failing']} | "
                     f"{g['critic_success_all']}/{g['measured']} / {g['plain_success_all']}/{g['measured']} | "
                     f"{_fmt(g['ratio_median'])}, {_fmt(g['ratio_max'])} |")
    lines += ["", "## Per scenario", "",
              "| scenario | fault | warm-up CPU-s, held-out | oracle best → target | oracle CPU to target | budget | "
              "plain | critic | critic / oracle | critic's kept edits |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["results"]:
        sc = r["scenario"]
        fault = ", ".join(f"`{p}={v!r}`" for p, v in sc["fault"].items())
        if sc["origin"] == "drift":
            fault += f" at GRPO step {sc['drift_after_grpo_steps']}"
        head = (f"| {sc['id']} | {fault} | {r['warm']['cpu_s']:.1f}, {r['warm']['heldout_acc']:.2f} | "
                f"{r['oracle_best']:.2f} → {r['target']:.2f} |")
        if r["status"] == "unlearnable":
            lines.append(head + " left out: below the floor | | | | | |")
            continue
        ar = r["arms"]
        cell = lambda x: (f"{x['cpu_to_target']:.1f}" if x["reached"] else f"missed ({x['cpu_s']:.1f} spent, "  # noqa: E731
                          f"last {x['curve'][-1]['heldout_acc']:.2f})")
        ratio = (f"{ar['critic']['cpu_to_target'] / ar['oracle']['cpu_to_target']:.2f}x" if ar["critic"]["reached"]
                 else "–")
        kept = "; ".join(f"`{e['path']}=" + ("<the environment's spec>" if isinstance(e["value"], dict) else repr(e["value"]))
                         + f"` {e['before']}/{e['n']}→{e['after']}/{e['n']}"
                         for e in ar["critic"]["edits"] if e["kept"]) or "–"
        lines.append(head + f" {ar['oracle']['cpu_to_target']:.1f} | {r['budget_cpu_s']:.1f} | {cell(ar['plain'])} "
                     f"({r['status']}) | {cell(ar['critic'])} | {ratio} | {kept} |")
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
    ap.add_argument("--out", default=str(ROOT / "runs" / "agentic_faults"))
    ap.add_argument("--results", default=str(HERE / "results" / "agentic_faults"))
    ap.add_argument("--resume", action="store_true", help="reuse scenarios whose result.json is under --out")
    ap.add_argument("--report-only", action="store_true", help="report the scenarios done under --out, run nothing")
    ap.add_argument("--reading", help="a markdown file: the report's Reading section")
    ap.add_argument("--status-note", default="", help="a line under the command (e.g. that the run is partial)")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    knobs = {"eval_size": a.eval_size, "horizon": a.horizon, "target_frac": a.target_frac, "floor": a.floor,
             "budget_x": a.budget_x, "critic_every": a.critic_every}
    seeds = parse_seeds(a.seeds)
    # the code the scenarios run is the code at the start (a later commit does not reach this process)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    t0 = time.perf_counter()
    results = []
    for seed in seeds:
        sc = generate(seed)
        path = pathlib.Path(a.out) / sc["id"] / "result.json"
        if (a.resume or a.report_only) and path.is_file():
            results.append(json.loads(path.read_text()))
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
