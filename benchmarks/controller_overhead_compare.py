"""Controller overhead of two code states, side by side: has watching a run become dearer?

Runs `benchmarks/controller_overhead.py` (this checkout's copy, so both states are measured by the
same script) on a git worktree of each commit, alternating base and new in every round so that
both see the same machine load, for each job backend. Reported per backend: the median whole-run
and steady-state CPU / wall of the controller, the mean CPU per tick, the Ray head's own share, and
new / base as ratios (the machine is shared: only ratios measured in one sitting are compared).

    python benchmarks/controller_overhead_compare.py --base c3045db [--new HEAD] [--rounds 2] [--jobs process ray]

Results: benchmarks/results/controller_overhead_compare.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
KEYS = ("total_pct", "steady_pct", "mean_tick_ms", "head_steady_pct")


def git(*args: str, cwd: pathlib.Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def worktree(commit: str, where: pathlib.Path) -> pathlib.Path:
    d = where / commit[:10]
    git("worktree", "add", "--detach", str(d), commit)
    shutil.copy(HERE / "controller_overhead.py", d / "benchmarks" / "controller_overhead.py")
    return d


def run_one(tree: pathlib.Path, jobs: str, name: str) -> dict:
    subprocess.run([sys.executable, str(tree / "benchmarks" / "controller_overhead.py"), "--jobs", jobs, "--out", name],
                   cwd=tree, check=True, stdout=subprocess.DEVNULL)
    return json.loads((tree / "benchmarks" / "results" / f"{name}.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the earlier commit")
    ap.add_argument("--new", default="HEAD", help="the later commit (default: HEAD)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--jobs", nargs="+", choices=["process", "ray"], default=["process", "ray"])
    a = ap.parse_args()
    commits = {"base": git("rev-parse", a.base), "new": git("rev-parse", a.new)}
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="overhead-compare-"))
    trees = {k: worktree(c, tmp) for k, c in commits.items()}
    rows: list[dict] = []
    try:
        for r in range(a.rounds):
            for jobs in a.jobs:
                for k in (("base", "new") if r % 2 == 0 else ("new", "base")):
                    res = run_one(trees[k], jobs, f"compare_{k}_{jobs}_{r}")
                    rows.append({"state": k, "jobs": jobs, "round": r, **{x: res.get(x) for x in KEYS},
                                 "steps": res["steps"], "wall_s": res["wall_s"], "reason": res["reason"]})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        for d in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(d)], cwd=ROOT, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    def med(state: str, jobs: str, key: str) -> float | None:
        v = [x[key] for x in rows if x["state"] == state and x["jobs"] == jobs and x[key] is not None]
        return statistics.median(v) if v else None

    summary = {jobs: {key: {"base": med("base", jobs, key), "new": med("new", jobs, key)} for key in KEYS} for jobs in a.jobs}
    out = {"commits": commits, "rounds": a.rounds, "rows": rows, "median": summary,
           "command": "python benchmarks/controller_overhead_compare.py " + " ".join(sys.argv[1:])}
    (HERE / "results" / "controller_overhead_compare.json").write_text(json.dumps(out, indent=1))
    label = {"total_pct": "whole run, controller CPU / wall %", "steady_pct": "steady state, controller CPU / wall %",
             "mean_tick_ms": "controller CPU per tick, ms", "head_steady_pct": "Ray head's own processes, CPU / wall %"}
    lines = [f"# Controller overhead, two code states side by side\n",
             f"Command: `{out['command']}`. Base {commits['base'][:10]}, new {commits['new'][:10]}; the healthy example "
             f"(`examples/goals/healthy.yaml`), {a.rounds} rounds alternating the two states, medians. One shared 2-core "
             f"machine: compare the ratio, not the absolute numbers across sittings.\n",
             "| backend | measure | base | new | new / base |", "|---|---|---|---|---|"]
    for jobs, by in summary.items():
        for key, v in by.items():
            if v["base"] is None or v["new"] is None:
                continue
            ratio = v["new"] / v["base"] if v["base"] else float("nan")
            lines.append(f"| {jobs} | {label[key]} | {v['base']:.2f} | {v['new']:.2f} | {ratio:.2f}× |")
    lines += ["", "Every run:", "", "| state | backend | round | whole % | steady % | ms/tick | head % | steps | wall s | ended |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        hp = "—" if x["head_steady_pct"] is None else f"{x['head_steady_pct']:.2f}"
        lines.append(f"| {x['state']} | {x['jobs']} | {x['round']} | {x['total_pct']:.2f} | {x['steady_pct']:.2f} | "
                     f"{x['mean_tick_ms']:.1f} | {hp} | {x['steps']} | {x['wall_s']:.0f} | {x['reason']} |")
    (HERE / "results" / "controller_overhead_compare.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
