"""Controller overhead of two code states, side by side: has watching a run become dearer?

Runs `benchmarks/controller_overhead.py` (this checkout's copy, so both states are measured by the
same script) on a git worktree of each commit, alternating base and new in every round so that
both see the same machine load, for each job backend. `--new WORKTREE` measures this checkout's
working tree as it is instead of a commit: a copy of its tracked files (modified ones as modified)
and of the untracked ones git does not ignore. Reported per backend: the median whole-run and
steady-state CPU / wall of the controller, the mean CPU per tick (the steady state's CPU over its
ticks: the job's launch, a private head's start included), the median CPU of one tick (launches
excluded: what a run of days pays per tick), the Ray head's own share, and new / base as ratios
(the machine is shared: only ratios measured in one sitting are compared).

    python benchmarks/controller_overhead_compare.py --base c3045db [--new HEAD|WORKTREE] [--rounds 2] [--jobs process ray]

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
KEYS = ("total_pct", "steady_pct", "mean_tick_ms", "median_tick_ms", "head_steady_pct")
WORKTREE = "WORKTREE"   # --new: the working tree as it is, uncommitted changes included


def git(*args: str, cwd: pathlib.Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def worktree(commit: str, where: pathlib.Path) -> pathlib.Path:
    d = where / commit[:10]
    git("worktree", "add", "--detach", str(d), commit)
    shutil.copy(HERE / "controller_overhead.py", d / "benchmarks" / "controller_overhead.py")
    return d


def snapshot(where: pathlib.Path) -> pathlib.Path:
    """A copy of this checkout's working tree: tracked files as they are now (deleted ones left out)
    and untracked files git does not ignore. Taken once, so edits made meanwhile do not reach the runs."""
    d = where / "worktree"
    for rel in git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0"):
        src = ROOT / rel
        if rel and (src.is_file() or src.is_symlink()):
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, d / rel, follow_symlinks=False)
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
    head = git("rev-parse", "HEAD")
    commits = {"base": git("rev-parse", a.base), "new": f"{WORKTREE}@{head}" if a.new == WORKTREE else git("rev-parse", a.new)}
    changed = git("status", "--porcelain", "--untracked-files=all").splitlines() if a.new == WORKTREE else []
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="overhead-compare-"))
    trees = {k: snapshot(tmp) if c.startswith(WORKTREE) else worktree(c, tmp) for k, c in commits.items()}
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
        for k, d in trees.items():
            if not commits[k].startswith(WORKTREE):
                subprocess.run(["git", "worktree", "remove", "--force", str(d)], cwd=ROOT, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    def med(state: str, jobs: str, key: str) -> float | None:
        v = [x[key] for x in rows if x["state"] == state and x["jobs"] == jobs and x[key] is not None]
        return statistics.median(v) if v else None

    summary = {jobs: {key: {"base": med("base", jobs, key), "new": med("new", jobs, key)} for key in KEYS} for jobs in a.jobs}
    out = {"commits": commits, "changed": changed, "rounds": a.rounds, "rows": rows, "median": summary,
           "command": "python benchmarks/controller_overhead_compare.py " + " ".join(sys.argv[1:])}
    (HERE / "results" / "controller_overhead_compare.json").write_text(json.dumps(out, indent=1))
    label = {"total_pct": "whole run, controller CPU / wall %", "steady_pct": "steady state, controller CPU / wall %",
             "mean_tick_ms": "controller CPU per tick (steady CPU / ticks), ms",
             "median_tick_ms": "controller CPU of one tick, median, ms", "head_steady_pct": "Ray head's own processes, CPU / wall %"}
    new_name = (f"the working tree at {head[:10]} with its uncommitted changes ({len(changed)} files)"
                if commits["new"].startswith(WORKTREE) else commits["new"][:10])
    lines = [f"# Controller overhead, two code states side by side\n",
             f"Command: `{out['command']}`. Base {commits['base'][:10]}, new {new_name}; the healthy example "
             f"(`examples/goals/healthy.yaml`), {a.rounds} rounds alternating the two states, medians. One shared 2-core "
             f"machine: compare the ratio, not the absolute numbers across sittings.\n",
             "| backend | measure | base | new | new / base |", "|---|---|---|---|---|"]
    for jobs, by in summary.items():
        for key, v in by.items():
            if v["base"] is None or v["new"] is None:
                continue
            ratio = v["new"] / v["base"] if v["base"] else float("nan")
            lines.append(f"| {jobs} | {label[key]} | {v['base']:.2f} | {v['new']:.2f} | {ratio:.2f}× |")
    lines += ["", "Every run:", "", "| state | backend | round | whole % | steady % | ms/tick | median tick ms | head % | steps | wall s | ended |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        hp = "—" if x["head_steady_pct"] is None else f"{x['head_steady_pct']:.2f}"
        md = "—" if x["median_tick_ms"] is None else f"{x['median_tick_ms']:.1f}"
        lines.append(f"| {x['state']} | {x['jobs']} | {x['round']} | {x['total_pct']:.2f} | {x['steady_pct']:.2f} | "
                     f"{x['mean_tick_ms']:.1f} | {md} | {hp} | {x['steps']} | {x['wall_s']:.0f} | {x['reason']} |")
    (HERE / "results" / "controller_overhead_compare.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
