"""Co-evolution vs weights-only vs harness-only at equal worker-CPU (issue 30, "Performance").

Every arm starts from the same point: a common SFT warm-up on the environment's expert
demonstrations (written for a healthy harness), then a starting harness that carries a fault a
user would meet. From there, on the same budget of worker-CPU seconds:

    coevolution    the agent trainer's `--critic` schedule (trainer/agent_train.py `coevolve`):
                   GRPO under the starting harness, critic rounds (the HarnessCritic proposes typed
                   edits, each kept only on a paired held-out gain), GRPO under the improved
                   harness, distillation into the weights, then GRPO until the budget is spent
    weights_only   the starting harness fixed; GRPO until the budget is spent
    harness_only   the weights fixed after the warm-up; critic rounds only (until a round keeps
                   nothing; the CPU it used is reported, it may be less than the budget)

Held-out success (greedy, the same `eval_size` held-out episodes, under the arm's current harness)
is measured at the start and whenever the arm's work-CPU passes the next of `--evals` equally spaced
checkpoints, and at its end. Worker-CPU is the training process's own CPU time
(`time.process_time`, one torch thread) spent on the arm's work: the benchmark's evals are measured
and reported apart, not charged to the arm (the critic's own rollouts and paired tests are charged:
they are the arm's work). The warm-up is common to the arms of an (environment, seed) and is run
once; its CPU is reported apart.

Jobs run in `--workers` processes: first the warm-ups (environments and seeds interleaved), then each
(environment, seed)'s three arms side by side, the arm order rotated per seed, so that load drift
on a shared machine falls on every arm.

    .venv/bin/python benchmarks/coevolution.py                # the committed configuration
    .venv/bin/python benchmarks/coevolution.py --seeds 0 --budget 10 --evals 2   # a smoke run

Writes benchmarks/results/coevolution.{json,md,svg}; the runs' logs (metrics, events with every
critic verdict) go under runs/coevolution/.

Deviations: the co-evolution arm's schedule is the trainer's as documented (docs/agent-training.md)
with its stages cut at the budget, not tuned per environment; the critic is the rule-based one (no
LLM ranker). The `calc` warm-up is longer than `lookup`'s (the built-in model learns to copy operands
more slowly) and runs with a one-line system prompt (`Tools: calc(expression).`) to keep its steps
cheap; `lookup` keeps the trainer's default (the tool list with an example call).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
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

ARMS = ("coevolution", "weights_only", "harness_only")

# Per environment: the trainer config (without seed/name/out_dir) and the starting harness's fault.
ENVS: dict[str, dict[str, Any]] = {
    "lookup": {
        "config": {"env": "lookup", "demo_calls": "positional",
                   "harness_fault": {"tool_syntax.lenient": False}},
        "fault": "tool_syntax.lenient=false (with positional demonstrations)",
        "why": "the agent data the policy was warmed up on writes calls positionally, get(\"abc\"), as "
               "transcripts recorded under another agent framework do; the deployed harness's parser is "
               "strict and wants named arguments, get(key=\"abc\"), so it rejects calls the policy was taught "
               "(the issue's 'a parser that rejects valid calls')",
    },
    "calc": {
        # a one-line system prompt: the default tool list (~190 characters) makes every warm-up step
        # about 3x dearer and needs max_seq_len 384; 300 steps with it left held-out success at 0
        "config": {"env": "calc", "system_prompt": "Tools: calc(expression).",
                   "harness_fault": {"max_turns": 1}},
        "fault": "max_turns=1",
        "why": "a turn limit left at 1 from a single-shot question-answering setup: the policy can call calc "
               "but gets no turn to answer (the issue's 'max turns too small'); the weights could still win "
               "by answering without the tool, in one turn",
    },
}


# ---- worker side: one job per call, in a pool process --------------------------------------

def make_trainer(env: str, seed: int, name: str, out: str, knobs: dict[str, Any]):
    from trainer.agent_train import AgentTrainConfig, AgentTrainer

    spec = ENVS[env]["config"]
    data = {**spec, "seed": seed, "name": name, "out_dir": out, "threads": 1, "eval_size": knobs["eval_size"],
            "sft": {"steps": knobs["sft_steps"][env]},
            "critic": {"enabled": True, "rounds": knobs["rounds"], "grpo_steps": knobs["grpo_after"],
                       "distill_steps": knobs["distill_steps"]},
            "grpo": {"steps": knobs["grpo_before"]}}
    return AgentTrainer(AgentTrainConfig.parse(data), printer=None)


def open_log(t) -> None:
    import yaml

    from trainer.runlog import RunLog, atomic_write_text

    t.t_start = time.time()
    t.log = RunLog(t.cfg.run_dir)
    atomic_write_text(t.cfg.run_dir / "config.yaml", yaml.safe_dump(t.cfg.model_dump(mode="json"), sort_keys=False))


def job_warm(env: str, seed: int, out: str, knobs: dict[str, Any]) -> dict[str, Any]:
    """The common warm-up; saves weights, optimiser, data cursor and RNG for the arms."""
    import torch

    t = make_trainer(env, seed, f"{env}-s{seed}-warm", out, knobs)
    open_log(t)
    clock = WorkClock()
    t.warm_up()
    cpu, wall = clock.work(), clock.wall()
    start = clock.measure(lambda: t.evaluate(harness=t.start_harness)["heldout_acc"])
    demo = clock.measure(lambda: t.evaluate(harness=t.demo_harness)["heldout_acc"])
    torch.save({"model": t.policy.model.state_dict(), "opt": t.opt.state_dict(), "cursor": t.cursor,
                "rng": t.rng.get_state(), "step": t.step}, t.cfg.run_dir / "warm.pt")
    t.log.close()
    return {"job": "warm", "env": env, "seed": seed, "cpu_s": cpu, "wall_s": wall, "eval_cpu_s": clock.eval_cpu,
            "start_harness_acc": start, "healthy_harness_acc": demo, "state": str(t.cfg.run_dir / "warm.pt")}


def job_arm(env: str, seed: int, arm: str, budget: float, out: str, knobs: dict[str, Any]) -> dict[str, Any]:
    import torch

    from harness.agent import AgentHarness

    t = make_trainer(env, seed, f"{env}-s{seed}-{arm}", out, knobs)
    state = torch.load(pathlib.Path(out) / f"{env}-s{seed}-warm" / "warm.pt", weights_only=False)
    t.policy.model.load_state_dict(state["model"])
    t.opt.load_state_dict(state["opt"])
    t.cursor, t.step = state["cursor"], state["step"]
    t.rng.set_state(state["rng"])
    open_log(t)
    clock = WorkClock()
    marks = [budget * (k + 1) / knobs["evals"] for k in range(knobs["evals"])]
    curve: list[dict[str, Any]] = []
    phases: list[str] = []

    def record(phase: str, harness: AgentHarness | None = None) -> None:
        acc = clock.measure(lambda: t.evaluate(harness=harness)["heldout_acc"])
        curve.append({"cpu_s": round(clock.work(), 2), "wall_s": round(clock.wall(), 1), "phase": phase,
                      "heldout_acc": acc, "harness_version": t.harness.version})

    def spent(phase: str) -> bool:
        """Between units of work: an eval at each checkpoint passed; True once the budget is spent."""
        if not phases or phases[-1] != phase:
            phases.append(phase)
        while marks and clock.work() >= marks[0]:
            marks.pop(0)
            record(phase)
        return clock.work() >= budget

    def grpo(steps: int | None, phase: str) -> None:
        for g in t.opt.param_groups:
            g["lr"] = t.cfg.grpo.lr
        i = 0
        while (steps is None or i < steps) and not spent(phase):
            row = {**t.row_base("grpo"), **t.grpo_step(i)}
            t.step += 1
            t.write_row({**row, "step_time": 0.0, "work_cpu": clock.work()})
            i += 1

    def critic(phase: str) -> int:
        kept = 0
        for _ in range(t.cfg.critic.rounds):
            if spent(phase):
                break
            if t.critic_round() is None:
                break
            kept += 1
        return kept

    record("start")
    distill: dict[str, float] = {}
    if arm == "weights_only":
        grpo(None, "grpo")
    elif arm == "harness_only":
        critic("critic")
    else:
        grpo(knobs["grpo_before"], "grpo_before")
        if critic("critic"):
            grpo(knobs["grpo_after"], "grpo_after")
            distill = t.distill(stop=lambda: spent("distill"))
        grpo(None, "grpo_rest")
    spent(phases[-1] if phases else "end")
    used = clock.work()
    record("end")
    start_acc = clock.measure(lambda: t.evaluate(harness=t.start_harness)["heldout_acc"])
    t.log.close()
    return {"job": "arm", "env": env, "seed": seed, "arm": arm, "budget_cpu_s": budget, "cpu_s": used,
            "wall_s": clock.wall(), "eval_cpu_s": clock.eval_cpu, "curve": curve, "phases": phases,
            "final_acc": curve[-1]["heldout_acc"], "start_harness_final_acc": start_acc,
            "edits": t.edits, "harness_changed": t.harness.version != t.start_harness.version,
            "distill": distill, "grpo_steps": sum(1 for r in t.history if r["algorithm"] == "grpo")}


def result_path(job: dict[str, Any]) -> pathlib.Path:
    return pathlib.Path(job["out"]) / f"{job['env']}-s{job['seed']}-{job.get('arm', 'warm')}" / "result.json"


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """One job in a pool process; its result is also written beside its run's logs (`--resume`)."""
    import torch

    torch.set_num_threads(1)
    if job["job"] == "warm":
        r = job_warm(job["env"], job["seed"], job["out"], job["knobs"])
    else:
        r = job_arm(job["env"], job["seed"], job["arm"], job["budget"], job["out"], job["knobs"])
    result_path(job).write_text(json.dumps(r, default=str))
    return r


# ---- the report ----------------------------------------------------------------------------
def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """Per environment: final held-out success per arm (median, min-max over seeds) and whether
    co-evolution is ahead of both other arms, by how much (per-seed differences, median and range)."""
    out: dict[str, Any] = {}
    for env in res["envs"]:
        by = {(r["arm"], r["seed"]): r for r in res["arms"] if r["env"] == env}
        seeds = [s for s in res["seeds"] if all((a, s) in by for a in ARMS)]   # seeds with all three arms done
        if not seeds:
            out[env] = {"seeds_complete": []}
            continue
        arms = {a: [by[(a, s)] for s in seeds] for a in ARMS}
        finals = {a: [r["final_acc"] for r in rs] for a, rs in arms.items()}
        diffs = {o: [c - x for c, x in zip(finals["coevolution"], finals[o])] for o in ARMS[1:]}
        ahead = {o: spread(d) for o, d in diffs.items()}
        out[env] = {"seeds_complete": seeds, "final": {a: spread(v) for a, v in finals.items()},
                    "per_seed": finals,
                    "cpu_used": {a: spread([r["cpu_s"] for r in rs]) for a, rs in arms.items()},
                    "coevolution_minus": ahead,
                    "ahead_of_both": all(v["median"] > 0 for v in ahead.values()),
                    "ahead_of_both_every_seed": all(all(x > 0 for x in d) for d in diffs.values()),
                    "start_harness_final": {a: spread([r["start_harness_final_acc"] for r in rs])
                                            for a, rs in arms.items()}}
    return out


def plot(res: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"coevolution": "tab:green", "weights_only": "tab:blue", "harness_only": "tab:orange"}
    envs = res["envs"]
    fig, axes = plt.subplots(1, len(envs), figsize=(5.5 * len(envs), 4), squeeze=False)
    for ax, env in zip(axes[0], envs):
        for r in (r for r in res["arms"] if r["env"] == env):
            xs = [p["cpu_s"] for p in r["curve"]]
            ys = [p["heldout_acc"] for p in r["curve"]]
            ax.plot(xs, ys, marker="o", ms=3, color=colors[r["arm"]], alpha=0.75,
                    label=r["arm"] if r["seed"] == res["seeds"][0] else None)
        ax.axvline(res["budget_cpu_s"][env], color="grey", lw=0.8, ls="--")
        ax.set_title(f"{env}: fault {ENVS[env]['fault'].split(' (')[0]}")
        ax.set_xlabel("worker-CPU after the common warm-up (s, evals not charged)")
        ax.set_ylabel("held-out success (greedy, arm's harness)")
        ax.set_ylim(-0.03, 1.03)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"co-evolution vs weights-only vs harness-only, seeds {res['seeds']} (one line per seed)")
    fig.tight_layout()
    fig.savefig(path, format="svg")
    plt.close(fig)


def markdown(res: dict[str, Any]) -> str:
    s = res["summary"]
    k = res["knobs"]
    warm_steps = ", ".join(f"{e} {k['sft_steps'][e]} steps" for e in res["envs"])
    budgets = ", ".join(f"{res['budget_cpu_s'][e]:.0f} s ({e})" for e in res["envs"])
    lines = [
        "# Co-evolution vs weights-only vs harness-only at equal worker-CPU",
        "",
        (f"`{res['command']}` (commit {res['commit']}, {res['wall_s'] / 60:.1f} min wall, {res['workers']} worker "
         "processes on a shared 2-core machine)." if res["wall_s"] is not None else
         f"`{res['command']}` (commit {res['commit']}): assembled from the jobs' result.json files; how they were "
         "run is under Reading.") +
        " Script: `benchmarks/coevolution.py`; plot: `coevolution.svg`; numbers: `coevolution.json`.",
        "",
        "Setup: built-in model (d_model 64, 2 layers, learned positions), one torch thread per process; "
        f"common SFT warm-up ({warm_steps}) on expert "
        "demonstrations written for a healthy harness; then each arm from the same weights and the same faulty "
        f"starting harness, with a budget of {budgets} "
        "of worker-CPU (the process's CPU time, evals not charged). Co-evolution: "
        f"{k['grpo_before']} GRPO steps, critic rounds (at most {k['rounds']}, each keeps at most one edit, a round "
        f"that keeps none ends them), {k['grpo_after']} GRPO steps under the improved harness, distillation (at most "
        f"{k['distill_steps']} steps), then GRPO, each cut at the budget. Weights-only: GRPO until the budget. "
        "Harness-only: critic rounds until one keeps nothing. Held-out success: greedy, "
        f"{k['eval_size']} held-out episodes, under the arm's own current harness, at the start, at each of "
        f"{k['evals']} equally spaced CPU checkpoints and at the end. Seeds {res['seeds']}.",
        "",
        "## Faults (the same per environment in every arm)",
        "",
        "| env | fault in the starting harness | why a user meets it |",
        "|---|---|---|",
    ]
    for env in res["envs"]:
        lines.append(f"| {env} | `{ENVS[env]['fault']}` | {ENVS[env]['why']} |")
    lines += ["", "## Final held-out success (median [min–max] over seeds)", "",
              "| env | warm-up under the healthy / faulty harness | coevolution | weights_only | harness_only | "
              "co-evolution − weights-only | co-evolution − harness-only | ahead of both? |",
              "|---|---|---|---|---|---|---|---|"]
    fmt = lambda d: f"{d['median']:.3f} [{d['min']:.3f}–{d['max']:.3f}]"  # noqa: E731
    sfmt = lambda d: f"{d['median']:+.3f} [{d['min']:+.3f}…{d['max']:+.3f}]"  # noqa: E731
    for env in res["envs"]:
        e = s[env]
        if not e["seeds_complete"]:
            lines.append(f"| {env} | no seed with all three arms done | | | | | | |")
            continue
        w = [r for r in res["warm"] if r["env"] == env and r["seed"] in e["seeds_complete"]]
        warm = f"{fmt(spread([r['healthy_harness_acc'] for r in w]))} / {fmt(spread([r['start_harness_acc'] for r in w]))}"
        verdict = ("yes, on every seed" if e["ahead_of_both_every_seed"] else
                   "yes (median), not on every seed" if e["ahead_of_both"] else "no")
        lines.append(f"| {env} | {warm} | {fmt(e['final']['coevolution'])} | {fmt(e['final']['weights_only'])} | "
                     f"{fmt(e['final']['harness_only'])} | {sfmt(e['coevolution_minus']['weights_only'])} | "
                     f"{sfmt(e['coevolution_minus']['harness_only'])} | {verdict} |")
    lines += ["", "Seeds with all three arms done: " + "; ".join(f"{env} {s[env]['seeds_complete']}" for env in res["envs"]) +
              ". Differences are per seed (same warm-up), median [min…max]. Worker-CPU each arm used "
              "(median [min–max] s):", "",
              "| env | coevolution | weights_only | harness_only | held-out success under the *starting* harness at "
              "the end: coevolution / weights_only / harness_only |", "|---|---|---|---|---|"]
    for env in res["envs"]:
        e = s[env]
        if not e["seeds_complete"]:
            continue
        cpu = " | ".join(f"{e['cpu_used'][a]['median']:.1f} [{e['cpu_used'][a]['min']:.1f}–{e['cpu_used'][a]['max']:.1f}]"
                         for a in ARMS)
        sh = " / ".join(fmt(e["start_harness_final"][a]) for a in ARMS)
        lines.append(f"| {env} | {cpu} | {sh} |")
    lines += ["", "## Per run", "", "| env | seed | arm | CPU used (s) | held-out success over CPU (s: success) | "
              "kept edits | GRPO steps | distill rows |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(res["arms"], key=lambda r: (r["env"], r["seed"], ARMS.index(r["arm"]))):
        curve = ", ".join(f"{p['cpu_s']:.0f}: {p['heldout_acc']:.2f}" for p in r["curve"])
        kept = "; ".join(f"`{e['path']}={e['value']}` {e['before']}/{e['n']}→{e['after']}/{e['n']}"
                         for e in r["edits"] if e["kept"]) or "–"
        rows = int(r["distill"].get("distill_rows", 0)) if r["distill"] else "–"
        lines.append(f"| {r['env']} | {r['seed']} | {r['arm']} | {r['cpu_s']:.1f} | {curve} | {kept} | "
                     f"{r['grpo_steps']} | {rows} |")
    lines += ["", "## Reading", "", res.get("reading", "(filled in by hand after the run)"), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", nargs="+", default=["lookup", "calc"], choices=sorted(ENVS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--budget", nargs="+", type=float, default=[15.0],
                    help="worker-CPU seconds per arm after the warm-up: one for all envs, or one per env")
    ap.add_argument("--evals", type=int, default=3, help="equally spaced CPU checkpoints with an eval")
    ap.add_argument("--eval-size", type=int, default=64)
    ap.add_argument("--sft-steps", nargs="+", type=int, default=[300, 500], help="warm-up steps, one per env")
    ap.add_argument("--grpo-before", type=int, default=5, help="co-evolution: GRPO steps before the critic")
    ap.add_argument("--grpo-after", type=int, default=10, help="co-evolution: GRPO steps after a kept edit")
    ap.add_argument("--rounds", type=int, default=4, help="critic rounds at most (both arms that use the critic)")
    ap.add_argument("--distill-steps", type=int, default=300)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--out", default=str(ROOT / "runs" / "coevolution"))
    ap.add_argument("--results", default=str(HERE / "results" / "coevolution"))
    ap.add_argument("--resume", action="store_true", help="skip jobs whose result.json is under --out")
    ap.add_argument("--report-only", action="store_true", help="report the jobs done under --out, run nothing")
    ap.add_argument("--reading", help="a markdown file: the report's Reading section")
    a = ap.parse_args()
    budgets = a.budget * len(a.envs) if len(a.budget) == 1 else a.budget
    if len(budgets) != len(a.envs) or len(a.sft_steps) not in (1, len(a.envs)):
        raise SystemExit(f"error: --budget {a.budget} and --sft-steps {a.sft_steps} need one value or one per env {a.envs}")
    sft = a.sft_steps * len(a.envs) if len(a.sft_steps) == 1 else a.sft_steps
    knobs = {"eval_size": a.eval_size, "evals": a.evals, "sft_steps": dict(zip(a.envs, sft)),
             "grpo_before": a.grpo_before, "grpo_after": a.grpo_after, "rounds": a.rounds,
             "distill_steps": a.distill_steps}
    budget = dict(zip(a.envs, budgets))
    t0 = time.perf_counter()
    warm_jobs = [{"job": "warm", "env": e, "seed": s, "out": a.out, "knobs": knobs} for s in a.seeds for e in a.envs]
    warm, arms = [], []

    def done_before(j: dict[str, Any]) -> dict[str, Any] | None:
        p = result_path(j)
        return json.loads(p.read_text()) if (a.resume or a.report_only) and p.is_file() else None

    with cf.ProcessPoolExecutor(a.workers) as pool:
        futs: dict[Any, dict[str, Any]] = {}
        for j in warm_jobs:
            r = done_before(j)
            f: cf.Future = cf.Future()
            if r is not None:
                f.set_result(r)
            elif a.report_only:
                continue
            else:
                f = pool.submit(run_job, j)
            futs[f] = j
        while futs:
            done, _ = cf.wait(futs, return_when=cf.FIRST_COMPLETED)
            for f in done:
                j = futs.pop(f)
                r = f.result()
                print(f"[{time.perf_counter() - t0:6.0f}s] {j['job']} {j['env']} s{j['seed']} "
                      f"{j.get('arm', '')}: " + (f"final {r['final_acc']:.3f}, cpu {r['cpu_s']:.1f}" if j["job"] == "arm"
                                                 else f"cpu {r['cpu_s']:.1f}, start harness {r['start_harness_acc']:.3f},"
                                                      f" healthy {r['healthy_harness_acc']:.3f}"), flush=True)
                if j["job"] == "warm":
                    warm.append(r)
                    k = a.seeds.index(j["seed"])
                    order = ARMS[k % 3:] + ARMS[: k % 3]   # the arm order rotated per seed
                    for arm in order:
                        aj = {**j, "job": "arm", "arm": arm, "budget": budget[j["env"]]}
                        prev = done_before(aj)
                        if prev is not None:
                            arms.append(prev)
                        elif not a.report_only:
                            futs[pool.submit(run_job, aj)] = aj
                else:
                    arms.append(r)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    res = {"command": "benchmarks/coevolution.py " + " ".join(sys.argv[1:]), "commit": commit, "envs": a.envs,
           "seeds": a.seeds, "budget_cpu_s": budget, "knobs": knobs, "workers": a.workers,
           "faults": {e: {"fault": ENVS[e]["fault"], "why": ENVS[e]["why"], "config": ENVS[e]["config"]} for e in a.envs},
           "wall_s": None if a.report_only else time.perf_counter() - t0, "warm": warm, "arms": arms}
    if a.reading:
        res["reading"] = pathlib.Path(a.reading).read_text().strip()
    res["summary"] = summarize(res)
    base = pathlib.Path(a.results)
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    plot(res, base.with_suffix(".svg"))
    base.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
