"""Controller overhead: the CPU the swarm's controller spends on a run, as a share of its wall time.

By default the healthy example exactly as shipped (examples/goals/healthy.yaml: the swarm only
watches a run that reaches its target); `--unreachable --wall-s N` instead raises its target out
of reach so the controller watches for a fixed N seconds (the per-hour cost of a long run). The
real controller runs in this process (`jobs="process"`: the trainer is a child process, so this
process's own CPU time is the controller's). Measured with getrusage(SELF):
  start-up   imports + Controller.create (workspace, git, sqlite, LangGraph)
  steady     the graph's ticks from the first node to the start of `finish`
  finish     stopping the job, the final report (SVG curves, no matplotlib), summary
Reported: whole-run CPU / wall (target ≤ 2%), steady CPU / steady wall, per-node CPU, how many
ticks were quiet (diagnose → report, nothing to do) or full passes, the mean CPU per tick (steady
CPU / ticks: the job's launch, and with `--jobs ray` the private head's start and Ray's import,
spread over the ticks) and the median CPU of one tick (from one `observe` to the next: what a run
of days pays per tick, launches excluded).

    python benchmarks/controller_overhead.py [--observe-s 2] [--jobs ray]
    python benchmarks/controller_overhead.py --unreachable --wall-s 300

`--jobs ray` runs the job on a private Ray head as `swarm run` does (the controller then also polls
the Jobs API); the head's own processes (GCS, raylet, dashboard, job supervisor; the trainer
excluded) are measured beside the controller, since a run of days pays for them too.
`benchmarks/controller_overhead_compare.py` runs this script on two code states side by side.

Results: benchmarks/results/controller_overhead[_unreachable][_ray].{json,md} (or `--out NAME`).
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


def ray_head_cpu(since: float) -> dict[int, float]:
    """CPU-s so far of each Ray process started after `since` (this run's private head: GCS, raylet,
    dashboard, the job supervisor...), the trainer and its children excluded."""
    import psutil

    out: dict[int, float] = {}
    skip: set[int] = set()
    procs = []
    for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if p.info["create_time"] < since - 1 or p.pid == os.getpid():
                continue
            if "trainer.entry" in cmd or "trainer/entry" in cmd:
                skip.add(p.pid)
                skip.update(c.pid for c in p.children(recursive=True))
            elif "ray" in cmd:
                procs.append(p)
        except psutil.Error:
            continue
    for p in procs:
        if p.pid in skip:
            continue
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--unreachable", action="store_true", help="target out of reach: watch for --wall-s seconds")
    ap.add_argument("--wall-s", type=float, default=300.0, help="--unreachable: wall budget of the run")
    ap.add_argument("--observe-s", type=float, default=None, help="swarm.observe_every_s (default: the goal's)")
    ap.add_argument("--jobs", choices=["process", "ray"], default="process",
                    help="process: the trainer is a child process; ray: a private Ray head runs it as a job")
    ap.add_argument("--out", default=None, help="results name under benchmarks/results (default: from the options)")
    args = ap.parse_args()
    t0, c0 = time.time(), cpu()
    import yaml

    from swarm.controller import Controller
    from swarm.goal import Goal

    goal = yaml.safe_load((ROOT / "examples" / "goals" / "healthy.yaml").read_text())
    if args.unreachable:
        goal["target"]["threshold"] = 1.0
        goal["budget"].update(wall_s=args.wall_s, steps=1_000_000, worker_cpu_s=1e9)
    if args.observe_s is not None:
        goal["swarm"]["observe_every_s"] = args.observe_s
        goal["swarm"]["observe_quiet_s"] = max(args.observe_s, goal["swarm"].get("observe_quiet_s") or 0)
    observe_s = goal["swarm"]["observe_every_s"]
    quiet_s = goal["swarm"].get("observe_quiet_s") or observe_s
    marks: dict[str, tuple[float, float]] = {}

    per_node: dict[str, list] = {}     # node → [calls, CPU-s, [CPU-s of each call]]
    observe_cpu: list[float] = []      # CPU-s at the start of every observe: consecutive ones bound a tick

    head_cpu: dict[str, dict[int, float]] = {}

    class Timed(Controller):
        def node_plan(self, s):
            if "steady" not in marks:
                head_cpu["steady"] = ray_head_cpu(t0)
            marks.setdefault("steady", (time.time(), cpu()))
            return super().node_plan(s)

        def node_finish(self, s):
            if "finish" not in marks:
                head_cpu["finish"] = ray_head_cpu(t0)
            marks.setdefault("finish", (time.time(), cpu()))
            return super().node_finish(s)

    def timed(name: str):
        inner = getattr(Timed, name)

        def node(self, s, **kw):
            c = cpu()
            if name == "node_observe" and "finish" not in marks:
                observe_cpu.append(c)
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
    ctrl = Timed.create(work / "ws", Goal.parse(goal), jobs=args.jobs)
    summary = ctrl.run()
    t_end, c_end = time.time(), cpu()
    (ts, cs), (tf, cf) = marks["steady"], marks["finish"]
    n_interventions = len([r for r in json.loads((work / "ws" / ".swarm" / "summary.json").read_text()).get("interventions", [])])
    steady_head = (sum(head_cpu.get("finish", {}).values()) - sum(
        v for pid, v in head_cpu.get("steady", {}).items() if pid in head_cpu.get("finish", {})))
    tick_cpu = sorted(b - a for a, b in zip(observe_cpu, observe_cpu[1:]))
    res = {
        "jobs": args.jobs,
        "head_steady_cpu_s": steady_head if args.jobs == "ray" else None,
        "head_steady_pct": 100 * steady_head / (tf - ts) if args.jobs == "ray" else None,
        "wall_s": t_end - t0, "controller_cpu_s": c_end - c0,
        "startup_cpu_s": cs - c0, "startup_wall_s": ts - t0,
        "steady_cpu_s": cf - cs, "steady_wall_s": tf - ts,
        "finish_cpu_s": c_end - cf, "finish_wall_s": t_end - tf,
        "steady_pct": 100 * (cf - cs) / (tf - ts), "total_pct": 100 * (c_end - c0) / (t_end - t0),
        "mean_tick_ms": 1000 * (cf - cs) / max(per_node.get("report", [1])[0], 1),
        "median_tick_ms": 1000 * tick_cpu[len(tick_cpu) // 2] if tick_cpu else None,
        "launch_cpu_s": per_node.get("launch", [0, 0.0])[1],
        "steps": summary["steps"], "interventions": n_interventions, "reason": summary["reason"],
        "observe_every_s": observe_s, "observe_quiet_s": quiet_s, "variant": "unreachable" if args.unreachable else "example",
        "ticks": per_node.get("report", [0])[0], "full_ticks": per_node.get("propose", [0])[0],
        "per_node": {k: {"calls": int(v[0]), "cpu_s": v[1], "ms_per_call": 1000 * v[1] / max(v[0], 1),
                         "median_ms": 1000 * sorted(v[2])[len(v[2]) // 2], "max_ms": 1000 * max(v[2])}
                     for k, v in sorted(per_node.items(), key=lambda kv: -kv[1][1])},
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}",
    }
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    name = args.out or ("controller_overhead" + ("_unreachable" if args.unreachable else "")
                        + ("_ray" if args.jobs == "ray" else ""))
    (out / f"{name}.json").write_text(json.dumps(res, indent=1))
    what = (f"The healthy goal with an unreachable target (held-out 1.0), so the controller ticks every {observe_s:g} s "
            f"for the whole {args.wall_s:g} s budget" if args.unreachable else
            f"The healthy example as shipped (`examples/goals/healthy.yaml`), observed every {observe_s:g} s")
    what += f" ({quiet_s:g} s after a quiet tick)" if quiet_s != observe_s else ""
    head_line = ("" if args.jobs != "ray" else f"\nThe private Ray head's own processes (the trainer excluded) used "
                 f"{steady_head:.2f} CPU-s in the steady state: {res['head_steady_pct']:.2f}% of its wall time, beside the controller's.")
    md = f"""# Controller overhead: {'a long run that never reaches its target' if args.unreachable else 'the healthy example'}

Command: `python benchmarks/controller_overhead.py{' --unreachable --wall-s %g' % args.wall_s if args.unreachable else ''}{' --observe-s %g' % args.observe_s if args.observe_s is not None else ''}{' --jobs ray' if args.jobs == 'ray' else ''}`.
Code: {res['commit']}. Machine: {res['machine']} (shared with other jobs). {what}; {res['steps']} trainer steps;
{res['interventions']} interventions; ended: {res['reason']}. Ticks: {res['ticks']}, of which {res['ticks'] - res['full_ticks']} quiet
(diagnose → report) and {res['full_ticks']} full passes (propose … mine_skills).

| phase | controller CPU-s | wall s | CPU / wall |
|---|---|---|---|
| start-up (imports, workspace, git, sqlite, LangGraph) | {res['startup_cpu_s']:.2f} | {res['startup_wall_s']:.1f} | — |
| steady state (every tick: observe, diagnose, …, report) | {res['steady_cpu_s']:.2f} | {res['steady_wall_s']:.1f} | {res['steady_pct']:.2f}% |
| finish (stop, final report with its SVG curves) | {res['finish_cpu_s']:.2f} | {res['finish_wall_s']:.1f} | — |
| **whole run** | {res['controller_cpu_s']:.2f} | {res['wall_s']:.1f} | **{res['total_pct']:.2f}%** (target ≤ 2%) |

The steady-state share is what a run of days pays; start-up and finish are fixed costs per controller start.{head_line}

CPU by node (steady state; `observe` excludes its sleep, which costs no CPU):

| node | calls | CPU-s | mean ms per call | median ms | max ms |
|---|---|---|---|---|---|
""" + "\n".join(f"| {k} | {v['calls']} | {v['cpu_s']:.2f} | {v['ms_per_call']:.1f} | {v['median_ms']:.1f} | {v['max_ms']:.0f} |"
                for k, v in res["per_node"].items()) + f"""

A tick costs {res['mean_tick_ms']:.1f} ms of CPU on average (steady CPU / ticks, LangGraph's checkpoint writes
included; the job's launch, {res['launch_cpu_s']:.2f} CPU-s{' with the private head started and Ray imported' if args.jobs == 'ray' else ''}, spread over them) and
{(res['median_tick_ms'] or 0):.1f} ms at the median (one tick, from one observe to the next), every {observe_s:g} s{f' ({quiet_s:g} s after a quiet tick)' if quiet_s != observe_s else ''}. One-off work inside the steady state, when something goes wrong: loading the
embedding model, a backtest's orchestration, a PR's report and plots.
"""
    (out / f"{name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
