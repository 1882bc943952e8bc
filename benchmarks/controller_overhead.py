"""Controller overhead on a long, quiet run: what the swarm costs while nothing goes wrong.

A healthy goal (examples/goals/healthy.yaml) with a target it cannot reach quickly (held-out 1.0
on 3-digit addition) runs for a fixed wall budget with the real controller in this process
(`jobs="process"`: the trainer is a child process, so this process's own CPU time is the
controller's). Measured with getrusage(SELF):
  start-up   imports + Controller.create (workspace, git, sqlite, LangGraph)
  steady     the graph's ticks from the first node to the start of `finish`
  finish     stopping the job, the final report (matplotlib), summary
Reported: steady CPU / steady wall (the per-hour cost of a days-long run; target ≤ 2%), and the
total including start-up and finish for this run's length. Timing is split by tick too.

    python benchmarks/controller_overhead.py [--wall-s 180] [--observe-s 2]

Results: benchmarks/results/controller_overhead.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wall-s", type=float, default=180.0, help="wall budget of the run")
    ap.add_argument("--observe-s", type=float, default=2.0, help="swarm.observe_every_s")
    args = ap.parse_args()
    t0, c0 = time.time(), cpu()
    import yaml

    from swarm.controller import Controller
    from swarm.goal import Goal

    goal = yaml.safe_load((ROOT / "examples" / "goals" / "healthy.yaml").read_text())
    goal["target"]["threshold"] = 1.0
    goal["run"]["harness"]["curriculum"]["start"] = 3
    goal["budget"].update(wall_s=args.wall_s, steps=1_000_000, worker_cpu_s=1e9)
    goal["swarm"]["observe_every_s"] = args.observe_s
    marks: dict[str, tuple[float, float]] = {}

    per_node: dict[str, list] = {}     # node → [calls, CPU-s, [CPU-s of each call]]

    class Timed(Controller):
        def node_plan(self, s):
            marks.setdefault("steady", (time.time(), cpu()))
            return super().node_plan(s)

        def node_finish(self, s):
            marks.setdefault("finish", (time.time(), cpu()))
            return super().node_finish(s)

    def timed(name: str):
        inner = getattr(Timed, name)

        def node(self, s, **kw):
            c = cpu()
            try:
                return inner(self, s, **kw)
            finally:
                acc = per_node.setdefault(name.removeprefix("node_"), [0, 0.0, []])
                acc[0] += 1
                acc[1] += cpu() - c
                acc[2].append(cpu() - c)
        return node

    for name in [n for n in dir(Controller) if n.startswith("node_") and n != "node_finish"]:
        setattr(Timed, name, timed(name))

    work = pathlib.Path(tempfile.mkdtemp(prefix="ctrl-overhead-"))
    ctrl = Timed.create(work / "ws", Goal.parse(goal), jobs="process")
    summary = ctrl.run()
    t_end, c_end = time.time(), cpu()
    (ts, cs), (tf, cf) = marks["steady"], marks["finish"]
    n_interventions = len([r for r in json.loads((work / "ws" / ".swarm" / "summary.json").read_text()).get("interventions", [])])
    res = {
        "wall_s": t_end - t0, "controller_cpu_s": c_end - c0,
        "startup_cpu_s": cs - c0, "startup_wall_s": ts - t0,
        "steady_cpu_s": cf - cs, "steady_wall_s": tf - ts,
        "finish_cpu_s": c_end - cf, "finish_wall_s": t_end - tf,
        "steady_pct": 100 * (cf - cs) / (tf - ts), "total_pct": 100 * (c_end - c0) / (t_end - t0),
        "typical_tick_ms": 1000 * sum(sorted(v[2])[len(v[2]) // 2] for k, v in per_node.items() if v[0] > 1),
        "steps": summary["steps"], "interventions": n_interventions, "reason": summary["reason"],
        "observe_every_s": args.observe_s,
        "typical_tick_pct": 0.1 * sum(sorted(v[2])[len(v[2]) // 2] for k, v in per_node.items() if v[0] > 1) * 1000 / args.observe_s,
        "per_node": {k: {"calls": int(v[0]), "cpu_s": v[1], "ms_per_call": 1000 * v[1] / max(v[0], 1),
                         "median_ms": 1000 * sorted(v[2])[len(v[2]) // 2], "max_ms": 1000 * max(v[2])}
                     for k, v in sorted(per_node.items(), key=lambda kv: -kv[1][1])},
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}",
    }
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "controller_overhead.json").write_text(json.dumps(res, indent=1))
    md = f"""# Controller overhead on a quiet run

Command: `python benchmarks/controller_overhead.py --wall-s {args.wall_s:g} --observe-s {args.observe_s:g}`.
Code: {res['commit']}. Machine: {res['machine']}. The healthy goal with an unreachable target (held-out 1.0 at
difficulty 3), so the controller ticks every {args.observe_s:g} s for the whole budget; {res['steps']} trainer steps;
{res['interventions']} interventions; ended: {res['reason']}.

| phase | controller CPU-s | wall s | CPU / wall |
|---|---|---|---|
| start-up (imports, workspace, git, sqlite, LangGraph) | {res['startup_cpu_s']:.2f} | {res['startup_wall_s']:.1f} | — |
| **steady state (every tick: observe, diagnose, …, report)** | {res['steady_cpu_s']:.2f} | {res['steady_wall_s']:.1f} | **{res['steady_pct']:.2f}%** |
| finish (stop, final report with plots) | {res['finish_cpu_s']:.2f} | {res['finish_wall_s']:.1f} | — |
| whole run | {res['controller_cpu_s']:.2f} | {res['wall_s']:.1f} | {res['total_pct']:.2f}% |

The steady-state share is what a run of days pays; start-up and finish are fixed costs per controller start.

CPU by node (steady state; `observe` excludes its {args.observe_s:g} s sleep, which costs no CPU):

| node | calls | CPU-s | mean ms per call | median ms | max ms |
|---|---|---|---|---|---|
""" + "\n".join(f"| {k} | {v['calls']} | {v['cpu_s']:.2f} | {v['ms_per_call']:.1f} | {v['median_ms']:.1f} | {v['max_ms']:.0f} |"
                for k, v in res["per_node"].items()) + f"""

A typical tick (the sum of the per-node medians) costs {res['typical_tick_ms']:.1f} ms of CPU every {args.observe_s:g} s:
**{res['typical_tick_pct']:.2f}%** of one core. The rest of the steady-state CPU is one-off work: loading the
embedding model when something first goes wrong, a backtest's orchestration, a PR's report and plots.
"""
    (out / "controller_overhead.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
