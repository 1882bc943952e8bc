"""The swarm vs the plain script, on the steering examples' goals (a fault in the user's own script).

For each example goal (`examples/steer/goal_*.yaml`) and seed:
  (a) swarm: `swarm run GOAL --jobs process --summary S` in the CPU-recording wrapper of
      benchmarks/swarm_vs_train.py; the swarm watches the script through SwarmCallback, backtests
      and applies its fixes;
  (b) plain: the same script with the same arguments (the fault included) and no swarm: the goal's
      budget spent training it as given. It runs with SwarmCallback attached, as the user's script
      is, only to read its held-out evaluations; no command is ever sent. It stops at the first
      evaluation that meets the target (the swarm stops there too), at the end of its `--max_steps`,
      or when it has spent the goal's `budget.worker_cpu_s`.
  (c) healthy (optional): the plain arm with the fault's flag (FAULTS) left out, so the script's own
      default applies: the check that the target is within the script's reach without the fault.
The seed is the script's `--seed` (appended to its arguments: model init and data order). Each run
has a wall-clock cap (--cap-s); a run still going at the cap is stopped and counts as not reached.

Measurements
  reached              held-out target met (swarm: summary.reached, within the cap; plain: an
                       evaluation row of the script's metrics.jsonl meets it, within cap and budget)
  worker CPU-s         CPU seconds of the script's processes (polled every 0.5 s with psutil: the
                       live script, its relaunches and every backtest arm; plain: getrusage of the
                       script at exit). Both arms stop at the target, so "to target" is the total
                       when reached.
  steps                the live run's optimizer steps (swarm: the summary's; plain: the last row)

    python benchmarks/steer_examples.py [--goals lr_too_high short_completions trl_sft_lr_too_high] [--seeds 0 1 2]
        [--cap-s 900] [--arms swarm plain healthy] [--parallel 1] [--src head|worktree] [--fresh]

The code under test is a snapshot of git HEAD (`git archive`, as swarm_vs_train.py), unless
`--src worktree`. Results merge into benchmarks/results/steer_examples.json (keyed by goal, seed,
arm) unless --fresh; the .md is rewritten from the JSON after every finished run.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import psutil
import yaml

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from swarm_vs_train import env_for, fmt, fresh_dir, launch_swarm, log, note_commit, prepare_src  # noqa: E402
sys.path.remove(str(HERE))   # benchmarks/memory, /sandboxes, /kernels must not shadow the packages

ROOT = HERE.parent
RESULTS = HERE / "results"
GOALS_DIR = ROOT / "examples" / "steer"
GOALS = ["lr_too_high", "short_completions", "trl_sft_lr_too_high"]
POLL_S = 0.5
# the flag of each example goal that holds its fault (the healthy arm leaves it out)
FAULTS = {"lr_too_high": "--learning_rate", "short_completions": "--max_completion_length",
          "trl_sft_lr_too_high": "--learning_rate"}


def without_flag(args: list[str], flag: str) -> list[str]:
    """`args` with every `flag VALUE` pair left out."""
    out, i = [], 0
    while i < len(args):
        if args[i] == flag:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def load_goal(name: str, seed: int, src: pathlib.Path, cwd: pathlib.Path, healthy: bool = False) -> dict[str, Any]:
    """The example goal, its script taken from the code under test and run in `cwd` (its ./runs
    there), with `--seed SEED` appended (the last flag wins); `healthy`: without its fault's flag."""
    data = yaml.safe_load((GOALS_DIR / f"goal_{name}.yaml").read_text())
    ep = data["run"]["entrypoint"]
    if healthy:
        ep["args"] = without_flag(list(ep.get("args", [])), FAULTS[name])
    ep["script"] = str(src / ep["script"])
    ep["cwd"] = str(cwd)
    ep["args"] = [*ep.get("args", []), "--seed", str(seed)]
    return data


def run_swarm(name: str, seed: int, cap_s: float, work: pathlib.Path, src: pathlib.Path) -> dict[str, Any]:
    d = work / f"swarm-{name}-s{seed}"
    goal = load_goal(name, seed, src, d)
    script = goal["run"]["entrypoint"]["script"]
    # the relauncher names the script in its command line and counts it as its child once it exits
    got = launch_swarm(goal, d, cap_s, src, f"swarm {name} s{seed}", match=script, cwd=d, skip="trainer.steer.relaunch")
    s, r, capped, wall, poller = got["summary"], got["rusage"], got["capped"], got["wall_s"], got["poller"]
    reached = bool(s and s.get("reached")) and not capped
    worker = poller.total
    return {
        "goal": name, "seed": seed, "arm": "swarm", "rc": got["rc"], "capped": capped, "reached": reached,
        "wall_s": wall, "steps": s.get("steps") if s else None, "final_metric": s.get("final_metric") if s else None,
        "reason": s.get("reason") if s else None, "seconds_to_target": s.get("seconds_to_target") if s and reached else None,
        "worker_cpu_s": worker, "worker_cpu_s_to_target": worker if reached else None,
        "summary_worker_cpu_s": s.get("worker_cpu_s") if s else None, "script_processes": len(poller.cpu),
        "backtests": s.get("backtests") if s else None, "controller_self_cpu_s": r.get("self_cpu_s"),
        "interventions": [{k: iv.get(k) for k in ("kind", "operator", "diagnosis", "status", "effect", "p_value", "applied_step")}
                          for iv in (s.get("interventions", []) if s else [])],
        "log_tail": None if s else got["log_tail"],
    }


def heldout_rows(run_dir: pathlib.Path, metric: str) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    rows = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r.get(metric), (int, float)):
            rows.append(r)
    return rows


def met(value: float, op: str, threshold: float) -> bool:
    return value >= threshold if op == ">=" else value > threshold if op == ">" else value <= threshold if op == "<=" else value < threshold


def run_plain(name: str, seed: int, cap_s: float, work: pathlib.Path, src: pathlib.Path,
              healthy: bool = False) -> dict[str, Any]:
    arm = "healthy" if healthy else "plain"
    d = fresh_dir(work / f"{arm}-{name}-s{seed}")
    goal = load_goal(name, seed, src, d, healthy=healthy)
    ep, t = goal["run"]["entrypoint"], goal["target"]
    budget = float((goal.get("budget") or {}).get("worker_cpu_s") or float("inf"))
    run_dir = d / "run"
    cmd = [sys.executable, ep["script"], *ep["args"], "--run_dir", str(run_dir)]
    t0 = time.time()
    with open(d / "stdout.log", "wb") as logf:
        p = subprocess.Popen(cmd, cwd=d, env=env_for(src), stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    proc = psutil.Process(p.pid)
    capped, spent, hit, cpu_seen = False, False, None, 0.0
    while True:
        pid, st, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        try:
            c = proc.cpu_times()
            cpu_seen = c.user + c.system
        except psutil.Error:
            pass
        hit = hit or next((r for r in heldout_rows(run_dir, t["metric"]) if met(r[t["metric"]], t["op"], t["threshold"])), None)
        over = time.time() - t0 > cap_s
        if hit or over or cpu_seen > budget:
            capped, spent = (over and not hit), (cpu_seen > budget and not hit)
            os.killpg(p.pid, signal.SIGKILL)
            _, st, ru = os.wait4(p.pid, 0)
            break
        time.sleep(POLL_S)
    wall = time.time() - t0
    cpu = ru.ru_utime + ru.ru_stime
    rows = heldout_rows(run_dir, t["metric"])
    hit = hit or next((r for r in rows if met(r[t["metric"]], t["op"], t["threshold"])), None)
    reached = hit is not None and not capped
    vals = [r[t["metric"]] for r in rows]
    steps = 0
    for line in ((run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []):
        try:
            steps = max(steps, int(json.loads(line).get("step") or 0))
        except (json.JSONDecodeError, TypeError, ValueError):
            pass
    status = "target reached" if reached else "killed at cap" if capped else "budget spent" if spent else "finished its max_steps"
    return {
        "goal": name, "seed": seed, "arm": arm, "rc": os.waitstatus_to_exitcode(st), "capped": capped, "reached": reached,
        "status": status, "wall_s": wall, "steps": steps, "final_metric": vals[-1] if vals else None,
        "best_metric": max(vals) if vals else None, "seconds_to_target": (hit["time"] - t0) if reached else None,
        "worker_cpu_s": cpu, "worker_cpu_s_to_target": cpu if reached else None,
        "log_tail": None if reached or vals else (d / "stdout.log").read_text(errors="replace")[-1500:],
    }


def write_md(res: dict[str, Any]) -> None:
    runs = res["runs"]
    by = {(r["goal"], r["seed"], r["arm"]): r for r in runs}
    keys = sorted({(r["goal"], r["seed"]) for r in runs}, key=lambda k: (GOALS.index(k[0]) if k[0] in GOALS else 99, k[1]))
    m = res.get("meta", {})
    L = ["# Steering examples: the swarm vs the plain script (the fault left in)", "",
         "Commands (in order): " + "; ".join(f"`{c}`" for c in m.get("commands", [])), "",
         f"Code under test: {m.get('src', '?')} at " + ", ".join(f"`{c[:10]}`" for c in m.get("commits", []))
         + (" + uncommitted changes" if m.get("uncommitted_changes") else "") + f". Machine: {m.get('machine', '?')}, "
         "shared with other work (wall times are noisy; worker CPU much less so).", "",
         "Worker-CPU-s to target: CPU seconds of every process running the example script until the held-out target was "
         "met (swarm: the live script, its relaunches and the backtest arms, polled every 0.5 s; plain: getrusage of "
         "the script). `—`: not reached. Plain: the script as the goal gives it, stopped at the target, at its "
         "`--max_steps`, or when the goal's worker-CPU budget is spent. Each run has a wall cap (`--cap-s` of its command).", "",
         "| goal | seed | swarm reached? | swarm worker-CPU-s to target | swarm s to target | swarm steps | swarm interventions | "
         "plain reached? | plain worker-CPU-s to target | plain steps | plain best held-out | plain ended |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for g, seed in keys:
        s, p = by.get((g, seed, "swarm")), by.get((g, seed, "plain"))
        row = [g, str(seed)]
        if s:
            ivs = ", ".join(f"{iv['kind']}:{iv['status']}" for iv in s.get("interventions") or []) or "none"
            row += [fmt(s["reached"]) + (" (capped)" if s["capped"] else ""), fmt(s["worker_cpu_s_to_target"]),
                    fmt(s["seconds_to_target"]), fmt(s["steps"]), ivs]
        else:
            row += ["not run"] + ["—"] * 4
        if p:
            row += [fmt(p["reached"]) + (" (capped)" if p["capped"] else ""), fmt(p["worker_cpu_s_to_target"]), fmt(p["steps"]),
                    fmt(p.get("best_metric"), 3), p.get("status") or "—"]
        else:
            row += ["not run"] + ["—"] * 4
        L.append("| " + " | ".join(row) + " |")
    L += ["", "Totals whether reached or not:", "", "| goal | seed | swarm worker-CPU-s | swarm wall s | swarm backtests | "
          "swarm reason | swarm final held-out | plain worker-CPU-s | plain wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for g, seed in keys:
        s, p = by.get((g, seed, "swarm")), by.get((g, seed, "plain"))
        L.append("| " + " | ".join([g, str(seed), fmt(s and s["worker_cpu_s"]), fmt(s and s["wall_s"]), fmt(s and s.get("backtests")),
                                    fmt(s and s.get("reason")), fmt(s and s.get("final_metric"), 3),
                                    fmt(p and p["worker_cpu_s"]), fmt(p and p["wall_s"])]) + " |")
    healthy = [k for k in keys if (k[0], k[1], "healthy") in by]
    if healthy:
        L += ["", f"Healthy: the plain script with the fault's flag left out (the script's own default: "
              + ", ".join(f"{g} without `{FAULTS[g]}`" for g in dict.fromkeys(g for g, _ in healthy)) + "), stopped as plain is.", "",
              "| goal | seed | healthy reached? | healthy worker-CPU-s to target | healthy steps | healthy best held-out | healthy ended |",
              "|---|---|---|---|---|---|---|"]
        for g, seed in healthy:
            h = by[(g, seed, "healthy")]
            L.append("| " + " | ".join([g, str(seed), fmt(h["reached"]) + (" (capped)" if h["capped"] else ""),
                                        fmt(h["worker_cpu_s_to_target"]), fmt(h["steps"]), fmt(h.get("best_metric"), 3),
                                        h.get("status") or "—"]) + " |")
    failed = [r for r in runs if r.get("log_tail")]
    if failed:
        L += ["", "## Runs that ended with an error", ""]
        for r in failed:
            L += [f"- {r['arm']} {r['goal']} seed {r['seed']} (rc {r['rc']}):", "", "```", r["log_tail"].strip()[-1200:], "```", ""]
    (RESULTS / "steer_examples.md").write_text("\n".join(L) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--goals", nargs="+", default=GOALS, help="example goals: examples/steer/goal_NAME.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cap-s", type=float, default=900.0, help="wall-clock cap per run (seconds)")
    ap.add_argument("--arms", nargs="+", default=["swarm", "plain"], choices=["swarm", "plain", "healthy"],
                    help="healthy: the plain script without the goal's fault")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time")
    ap.add_argument("--src", choices=["head", "worktree"], default="head", help="snapshot of git HEAD (default) or the working tree")
    ap.add_argument("--fresh", action="store_true", help="start a new results file instead of merging")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the .md from the .json")
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "steer_examples.json"
    res = json.loads(path.read_text()) if path.exists() and not a.fresh else {"runs": []}
    if a.report_only:
        write_md(res)
        return
    for g in a.goals:
        if not (GOALS_DIR / f"goal_{g}.yaml").is_file():
            sys.exit(f"error: no goal {g!r} in {GOALS_DIR} (goal_{g}.yaml)")
    work = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="steer_examples_"))
    work.mkdir(parents=True, exist_ok=True)
    src, commit = prepare_src(a.src, work)
    meta = res.setdefault("meta", {})
    note_commit(meta, commit)
    meta.update({"src": "snapshot of git HEAD" if a.src == "head" else "working tree",
                 "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}"})
    cmd = "python benchmarks/steer_examples.py " + " ".join(sys.argv[1:])
    meta.setdefault("commands", []).append(cmd)
    log(f"work dir {work}; code under test {src} ({commit})")
    lock = threading.Lock()

    def one(t: tuple[str, int, str]) -> dict[str, Any]:
        g, s, arm = t
        log(f"start {arm} {g} seed {s}")
        try:
            row = (run_swarm(g, s, a.cap_s, work, src) if arm == "swarm"
                   else run_plain(g, s, a.cap_s, work, src, healthy=arm == "healthy"))
        except Exception:   # one broken run is a row, not the end of the benchmark
            import traceback

            row = {"goal": g, "seed": s, "arm": arm, "rc": None, "capped": False, "reached": False, "wall_s": 0.0,
                   "steps": None, "worker_cpu_s": None, "worker_cpu_s_to_target": None, "seconds_to_target": None,
                   "log_tail": traceback.format_exc()}
        row["command"], row["commit"], row["cap_s"] = cmd, commit, a.cap_s
        with lock:
            res["runs"] = [r for r in res["runs"] if (r["goal"], r["seed"], r["arm"]) != (g, s, arm)] + [row]
            res["runs"].sort(key=lambda r: (GOALS.index(r["goal"]) if r["goal"] in GOALS else 99, r["seed"], r["arm"]))
            path.write_text(json.dumps(res, indent=1, default=str))
            write_md(res)
        log(f"done  {arm} {g} seed {s}: reached={row['reached']} wall={row['wall_s']:.0f}s "
            f"worker_cpu={fmt(row.get('worker_cpu_s'))} steps={row.get('steps')}")
        return row

    tasks = [(g, s, arm) for s in a.seeds for g in a.goals for arm in a.arms]
    with cf.ThreadPoolExecutor(max(1, a.parallel)) as ex:
        list(ex.map(one, tasks))
    log(f"wrote {path} and .md")


if __name__ == "__main__":
    main()
