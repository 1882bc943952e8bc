"""Does the swarm get better with its memory? A failing goal run twice over one shared library.

For each seed, with a fresh, empty library folder L (no seed skills, so everything in it was
learnt here):
  first     GOAL with memory.library = L (empty)                 → L now holds episodes + skills
  second    GOAL again, same seed, library L                      → measured against `first`
  transfer  TRANSFER (a similar goal on another task), library L  → measured against `cold`
  cold      TRANSFER with its own empty library
Each run is the real CLI (`swarm run --jobs process`) in a wrapper process, exactly as
benchmarks/swarm_vs_train.py runs the swarm arm (trainer CPU polled every 0.5 s).

Reported per run: reached, backtests run, interventions rejected by their backtest, proposals the
lead did not make because memory says they lost before ("avoided"), skills fired / used,
worker-CPU-seconds to target (all trainer processes: live job, restarts, backtest arms), seconds
to target. Ratios second/first and transfer/cold per seed, and their means.

    python benchmarks/skills_second_run.py [--goal truncation] [--transfer truncation_sort]
        [--seeds 0 1 2] [--cap-s 300] [--parallel 2] [--src head|worktree] [--out NAME]

Results: benchmarks/results/<--out, default skills_second_run>.{json,md}.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib.util
import json
import pathlib
import platform
import sys
import tempfile
from typing import Any

import yaml

HERE = pathlib.Path(__file__).resolve().parent
sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
ROOT = HERE.parent
RESULTS = HERE / "results"
GOALS = ROOT / "examples" / "goals"

_spec = importlib.util.spec_from_file_location("swarm_vs_train", HERE / "swarm_vs_train.py")
svt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(svt)


def run(label: str, goal_name: str, seed: int, library: pathlib.Path, cap_s: float, work: pathlib.Path,
        src: pathlib.Path) -> dict[str, Any]:
    goal = yaml.safe_load((GOALS / f"{goal_name}.yaml").read_text())
    goal["run"]["seed"] = seed
    goal["memory"] = {**(goal.get("memory") or {}), "library": str(library), "seed_skills": False}
    run = svt.launch_swarm(goal, work / f"{label}-{goal_name}-s{seed}", cap_s, src, f"{label} {goal_name} s{seed}")
    s, poller, wall = run["summary"], run["poller"], run["wall_s"]
    reached = bool(s and s.get("reached")) and not run["capped"]
    sk = (s or {}).get("skills") or {}
    row = {
        "label": label, "goal": goal_name, "seed": seed, "rc": run["rc"], "reached": reached, "wall_s": wall,
        "steps": s.get("steps") if s else None,
        "backtests": s.get("backtests") if s else None,
        "rejected_by_backtest": s.get("rejected_by_backtest") if s else None,
        "avoided": sk.get("avoided"), "skills_fired": sk.get("fired"), "skills_used": sk.get("used"),
        "skills_added": [a["name"] for a in sk.get("added", [])], "skills_library": sk.get("library"),
        "worker_cpu_s": poller.total, "worker_cpu_s_to_target": poller.total if reached else None,
        "seconds_to_target": s.get("seconds_to_target") if s and reached else None,
        "interventions": [{k: iv.get(k) for k in ("kind", "diagnosis", "status", "effect", "p_value")}
                          for iv in (s.get("interventions", []) if s else [])],
        "log_tail": None if s else run["log_tail"],
    }
    svt.log(f"{label} {goal_name} s{seed}: reached={reached} backtests={row['backtests']} rejected={row['rejected_by_backtest']} "
            f"avoided={row['avoided']} cpu={poller.total:.0f}s wall={wall:.0f}s")
    return row


def per_seed(seed: int, args: argparse.Namespace, work: pathlib.Path, src: pathlib.Path) -> list[dict[str, Any]]:
    lib, cold_lib = work / f"library-s{seed}", work / f"library-cold-s{seed}"
    rows = [run("first", args.goal, seed, lib, args.cap_s, work, src)]
    rows.append(run("second", args.goal, seed, lib, args.cap_s, work, src))
    if args.transfer:
        rows.append(run("transfer", args.transfer, seed, lib, args.cap_s, work, src))
        rows.append(run("cold", args.transfer, seed, cold_lib, args.cap_s, work, src))
    return rows


def fmt(v: Any, nd: int = 0) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def write(rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    out = meta["out"]
    (RESULTS / f"{out}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    lines = [
        "# Second run with the library the first one produced", "",
        f"Command: `{meta['command']}`", "",
        f"Code: {meta['commit']}. Machine: {meta['machine']}. Cap per run {meta['cap_s']:.0f} s; {meta['parallel']} seed(s) at a time.",
        "",
        "Every run starts its workspace with the library folder's skills only (`seed_skills: false`), so whatever "
        "the second and transfer runs know was learnt by the first. Worker-CPU-s: all trainer processes (live job, "
        "restarts, backtest arms), polled every 0.5 s; `—` = target not reached within the cap.", "",
        "| seed | run | goal | reached | backtests | rejected by backtest | avoided (memory) | skills fired | skills used | worker-CPU-s to target | s to target | steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['label']} | {r['goal']} | {'yes' if r['reached'] else 'no'} | {fmt(r['backtests'])} | "
                     f"{fmt(r['rejected_by_backtest'])} | {fmt(r['avoided'])} | "
                     f"{', '.join(f'{k}×{v}' for k, v in (r['skills_fired'] or {}).items()) or '—'} | "
                     f"{', '.join((r['skills_used'] or {}).keys()) or '—'} | {fmt(r['worker_cpu_s_to_target'])} | "
                     f"{fmt(r['seconds_to_target'])} | {fmt(r['steps'])} |")
    lines += ["", "Ratios per seed (later run / earlier run; < 1 = the library helped):", "",
              "| seed | second/first backtests | second/first worker-CPU-s | transfer/cold backtests | transfer/cold worker-CPU-s |",
              "|---|---|---|---|---|"]
    sums: dict[str, list[float]] = {}
    for seed in sorted({r["seed"] for r in rows}):
        by = {r["label"]: r for r in rows if r["seed"] == seed}
        vals = {
            "bt2": ratio((by.get("second") or {}).get("backtests"), (by.get("first") or {}).get("backtests")),
            "cpu2": ratio((by.get("second") or {}).get("worker_cpu_s_to_target"), (by.get("first") or {}).get("worker_cpu_s_to_target")),
            "btt": ratio((by.get("transfer") or {}).get("backtests"), (by.get("cold") or {}).get("backtests")),
            "cput": ratio((by.get("transfer") or {}).get("worker_cpu_s_to_target"), (by.get("cold") or {}).get("worker_cpu_s_to_target")),
        }
        for k, v in vals.items():
            if v is not None:
                sums.setdefault(k, []).append(v)
        lines.append(f"| {seed} | {fmt(vals['bt2'], 2)} | {fmt(vals['cpu2'], 2)} | {fmt(vals['btt'], 2)} | {fmt(vals['cput'], 2)} |")
    mean = {k: sum(v) / len(v) for k, v in sums.items()}
    lines.append(f"| mean | {fmt(mean.get('bt2'), 2)} | {fmt(mean.get('cpu2'), 2)} | {fmt(mean.get('btt'), 2)} | {fmt(mean.get('cput'), 2)} |")
    tot = {lab: sum((r["backtests"] or 0) for r in rows if r["label"] == lab) for lab in ("first", "second", "transfer", "cold")}
    rej = {lab: sum((r["rejected_by_backtest"] or 0) for r in rows if r["label"] == lab) for lab in tot}
    lines += ["", "Totals over seeds: " + "; ".join(f"{lab}: {tot[lab]} backtests, {rej[lab]} rejected" for lab in tot), ""]
    (RESULTS / f"{out}.md").write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--goal", default="truncation")
    ap.add_argument("--transfer", default="truncation_sort", help="a similar goal on another task ('' = none)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cap-s", type=float, default=300.0)
    ap.add_argument("--parallel", type=int, default=1, help="seeds run at a time")
    ap.add_argument("--src", choices=["head", "worktree"], default="head")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default="skills_second_run", help="results file name (without extension) under benchmarks/results")
    args = ap.parse_args()
    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="skills-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    src, commit = svt.prepare_src(args.src, work)
    meta = {"command": "python benchmarks/skills_second_run.py " + " ".join(sys.argv[1:]), "commit": commit,
            "machine": f"{platform.machine()}, {__import__('os').cpu_count()} logical CPUs, Python {platform.python_version()}",
            "cap_s": args.cap_s, "parallel": args.parallel, "workdir": str(work), "out": args.out}
    svt.log(f"work dir {work}; code {commit}")
    rows: list[dict[str, Any]] = []
    with cf.ThreadPoolExecutor(max_workers=args.parallel) as pool:
        for fut in cf.as_completed([pool.submit(per_seed, s, args, work, src) for s in args.seeds]):
            rows += fut.result()
            rows.sort(key=lambda r: (r["seed"], ["first", "second", "transfer", "cold"].index(r["label"])))
            write(rows, meta)
    svt.log(f"results in {RESULTS / (args.out + '.md')}")


if __name__ == "__main__":
    main()
