"""The swarm (built-in policies) vs the same goal with no agents, on the example goals.

For each goal and seed:
  (a) swarm: `swarm run GOAL --jobs process --summary S` (the CLI's own `app`, run inside a thin
      wrapper process so that its exact CPU time can be read with getrusage at exit);
  (b) plain: the same trainer config the swarm's job gets — goal.run + goal.perturbations,
      recipe.steps = budget.steps, recipe.stop_at_heldout = target.threshold — run as
      `python -m trainer.entry CFG` (the swarm's job entrypoint) in a child process, no agents.
Seeds override goal.run.seed. Each run has a wall-clock cap (--cap-s); a run still going at the
cap is stopped and counts as not reached.

Measurements
  reached           held-out target met (swarm: summary.reached and within the cap; plain: the
                    trainer stopped with status target_reached / a held-out eval met the target)
  worker CPU-s      CPU seconds of the trainer processes. plain: getrusage of the child (exact).
                    swarm: polled CPU of every `trainer.entry` process under the controller
                    (the live job, its restarts, and backtest arms), every 0.5 s; the summary's own
                    `worker_cpu_s` (live job only, sampled every observe tick) is kept beside it.
                    Both runs stop at the target, so "to target" = the run's total when reached.
  wall / seconds to target
                    plain: from spawning the process to the first eval row meeting the target.
                    swarm: the summary's seconds_to_target (from the controller's plan node).
  controller overhead (healthy goal): controller CPU-s / swarm wall-s, where controller CPU =
                    the controller process's own CPU (getrusage SELF, exact, imports included) +
                    every child process that is not a trainer (git etc.: children total from
                    getrusage minus the polled trainer CPU — conservative: the polling's
                    undercount of trainer CPU is charged to the controller). Also reported:
                    (swarm wall − plain wall) / plain wall, which is noisy on shared cores.

    python benchmarks/swarm_vs_train.py [--goals healthy truncation ...] [--seeds 0 1 2]
        [--cap-s 360] [--parallel 1] [--cores N] [--src head|worktree] [--fresh]

By default the code under test is a snapshot of git HEAD (`git archive`), so edits being made
in the working tree while the benchmark runs do not leak into it (`--src worktree` runs the
working tree). Results are merged into benchmarks/results/swarm_vs_train.json (keyed by goal,
seed, arm) unless --fresh; the .md is regenerated from the JSON after every finished run.
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
ROOT = HERE.parent
RESULTS = HERE / "results"
GOALS_DIR = ROOT / "examples" / "goals"
PRIORITY = ["healthy", "truncation", "broken_template", "too_hard", "lr_too_high", "worker_killed",
            "stalled_worker", "noisy_labels", "low_temperature", "reward_hack"]
FAILING = [g for g in PRIORITY if g != "healthy"]
POLL_S = 0.5

# The swarm CLI, in-process, in a wrapper that records its own and its reaped children's CPU.
WRAPPER = r"""
import json, resource, sys, time
t0 = time.time()
out = sys.argv[1]
rc = 0
try:
    from swarm.cli import app
    app(args=sys.argv[2:], prog_name="swarm")
except SystemExit as e:
    rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
finally:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    import swarm
    json.dump({"rc": rc, "self_cpu_s": s.ru_utime + s.ru_stime, "children_cpu_s": c.ru_utime + c.ru_stime,
               "wrapper_wall_s": time.time() - t0, "swarm_module": swarm.__file__}, open(out, "w"))
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the code under test --------------------------------------------------------------------

def prepare_src(mode: str, tmp: pathlib.Path) -> tuple[pathlib.Path, str]:
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if mode == "worktree":
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return ROOT, sha + (" + uncommitted changes" if dirty else "")
    src = tmp / f"src-{sha[:10]}"
    if not src.exists():
        src.mkdir(parents=True)
        arc = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=arc, check=True)
    return src, sha


def env_for(src: pathlib.Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("MPLBACKEND", "Agg")
    return env


def load_goal(name: str, seed: int) -> dict[str, Any]:
    data = yaml.safe_load((GOALS_DIR / f"{name}.yaml").read_text())
    data.setdefault("run", {})["seed"] = seed
    return data


def plain_config(goal: dict[str, Any], name: str, out_dir: str) -> dict[str, Any]:
    """What the swarm's job runs (Controller.base_cfg + write_job_config), with no agents around it."""
    from swarm.goal import Goal

    g = Goal.parse(goal)
    cfg = g.run_config(name, out_dir).model_dump(mode="json")
    # exactly as Controller.write_job_config: only the fields the goal set. A full dump
    # (model_dump of a parsed RunConfig) writes `set: {}` etc., which override a shortcut's
    # defaults on reload and silently turn the perturbation into a no-op.
    cfg["perturbations"] = [p.model_dump(exclude_unset=True) for p in g.perturbations]
    cfg["recipe"]["steps"] = g.budget.steps
    if g.target.op == ">=":
        cfg["recipe"]["stop_at_heldout"] = g.target.threshold
    return cfg


# ---- process accounting ---------------------------------------------------------------------

class TrainerPoller:
    """Polls CPU of the processes under a root pid whose command line holds `match` (the trainer's
    `trainer.entry`, or a user's script), keyed by pid + start time."""

    def __init__(self, root: int, match: str = "trainer.entry", skip: str | None = None) -> None:
        self.root, self.match, self.skip = root, match, skip   # skip: a wrapper that names `match` too
        self.cpu: dict[str, float] = {}
        self.cmd: dict[str, str] = {}

    def poll(self) -> None:
        try:
            procs = psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return
        for p in procs:
            try:
                cmd = " ".join(p.cmdline())
                if self.match not in cmd or (self.skip and self.skip in cmd):
                    continue
                t = p.cpu_times()
                key = f"{p.pid}:{p.create_time():.2f}"
                self.cpu[key] = max(self.cpu.get(key, 0.0), t.user + t.system + t.children_user + t.children_system)
                self.cmd[key] = cmd.split(self.match, 1)[1].strip()
            except psutil.Error:
                continue

    @property
    def total(self) -> float:
        return sum(self.cpu.values())

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return []


def kill_tree(root: subprocess.Popen, extra: list[psutil.Process]) -> None:
    """Stop a run we started: its process group, then any descendant in its own session."""
    try:
        os.killpg(root.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    for p in extra:
        try:
            p.terminate()
        except psutil.Error:
            pass
    time.sleep(3)
    for p in extra:
        try:
            p.kill()
        except psutil.Error:
            pass
    try:
        os.killpg(root.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---- the two arms ---------------------------------------------------------------------------

def fresh_dir(d: pathlib.Path) -> pathlib.Path:
    """`d`, empty: a folder an earlier invocation left under the same name (its workspace, its
    summary) is moved aside to `<name>.prev-<n>`, kept, so that nothing of it is read as this
    run's (a workspace that holds a run makes `swarm run` refuse, and its old summary would
    stand in for the new one)."""
    if d.exists():
        n = 1
        while d.with_name(f"{d.name}.prev-{n}").exists():
            n += 1
        d.rename(d.with_name(f"{d.name}.prev-{n}"))
        log(f"{d.name}: an earlier run's folder moved aside to {d.name}.prev-{n}")
    d.mkdir(parents=True)
    return d


def launch_swarm(goal: dict[str, Any], d: pathlib.Path, cap_s: float, src: pathlib.Path, tag: str,
                 match: str = "trainer.entry", cwd: pathlib.Path | None = None, skip: str | None = None) -> dict[str, Any]:
    """`swarm run` of `goal` in the CPU-recording wrapper (in `cwd`, default `src`), the processes
    whose command line holds `match` polled, `swarm stop` at the cap (a kill 90 s later). Returns
    rc, capped, wall_s, the summary (None if none), the wrapper's rusage, the poller and the
    workspace path."""
    fresh_dir(d)
    goal_path, ws, summ, ru = d / "goal.yaml", d / "ws", d / "summary.json", d / "rusage.json"
    goal_path.write_text(yaml.safe_dump(goal, sort_keys=False))
    cmd = [sys.executable, "-c", WRAPPER, str(ru), "run", str(goal_path), "--workspace", str(ws),
           "--jobs", "process", "--summary", str(summ)]
    t0 = time.time()
    with open(d / "controller.log", "wb") as logf:
        p = subprocess.Popen(cmd, cwd=cwd or src, env=env_for(src), stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True)
    poller = TrainerPoller(p.pid, match, skip)
    capped = False
    while p.poll() is None:
        poller.poll()
        if not capped and time.time() - t0 > cap_s:
            capped = True
            (ws / ".swarm").mkdir(parents=True, exist_ok=True)
            (ws / ".swarm" / "stop").write_text(str(time.time()))  # what `swarm stop` does
            log(f"{tag}: cap {cap_s:.0f}s reached, `swarm stop` requested")
        if capped and time.time() - t0 > cap_s + 90:
            log(f"{tag}: did not stop within 90 s of `swarm stop`; killing it")
            kill_tree(p, poller.descendants())
            p.wait()
            break
        time.sleep(POLL_S)
    wall = time.time() - t0
    for q in poller.descendants():  # jobs left behind by the controller (there should be none)
        log(f"{tag}: left-over process {q.pid} {' '.join(q.cmdline())[:120]}; stopping it")
        kill_tree(p, [q])
    return {"rc": p.returncode, "capped": capped, "wall_s": wall, "poller": poller, "ws": ws,
            "summary": json.loads(summ.read_text()) if summ.exists() else None,
            "rusage": json.loads(ru.read_text()) if ru.exists() else {},
            "log_tail": (d / "controller.log").read_text(errors="replace")[-1500:]}


def run_swarm(goal_name: str, seed: int, cap_s: float, work: pathlib.Path, src: pathlib.Path) -> dict[str, Any]:
    d = work / f"swarm-{goal_name}-s{seed}"
    run = launch_swarm(load_goal(goal_name, seed), d, cap_s, src, f"swarm {goal_name} s{seed}")
    s, r, poller, ws, capped, wall = run["summary"], run["rusage"], run["poller"], run["ws"], run["capped"], run["wall_s"]
    worker = poller.total
    children = r.get("children_cpu_s")
    ctrl_cpu = None if not r else r["self_cpu_s"] + max(0.0, children - worker)
    reached = bool(s and s.get("reached")) and wall <= cap_s + 1e-9 and not capped
    tail = run["log_tail"]
    return {
        "goal": goal_name, "seed": seed, "arm": "swarm", "rc": run["rc"], "capped": capped,
        "reached": reached, "wall_s": wall, "steps": s.get("steps") if s else None,
        "final_metric": s.get("final_metric") if s else None, "reason": s.get("reason") if s else None,
        "seconds_to_target": s.get("seconds_to_target") if s and reached else None,
        "worker_cpu_s": worker, "worker_cpu_s_to_target": worker if reached else None,
        "summary_worker_cpu_s": s.get("worker_cpu_s") if s else None,
        "summary_wall_s": s.get("wall_s") if s else None, "restarts": s.get("restarts") if s else None,
        "trainer_processes": len(poller.cpu),
        "trainer_cpu_by_process": {poller.cmd[k].replace(str(ws), "WS"): round(v, 2) for k, v in poller.cpu.items()},
        "controller_self_cpu_s": r.get("self_cpu_s"), "children_cpu_s": children, "controller_cpu_s": ctrl_cpu,
        "interventions": [{k: iv.get(k) for k in ("kind", "operator", "diagnosis", "status", "effect", "p_value", "applied_step")}
                          for iv in (s.get("interventions", []) if s else [])],
        "swarm_module": r.get("swarm_module"), "log_tail": None if s else tail,
    }


def run_plain(goal_name: str, seed: int, cap_s: float, work: pathlib.Path, src: pathlib.Path) -> dict[str, Any]:
    d = fresh_dir(work / f"plain-{goal_name}-s{seed}")
    goal = load_goal(goal_name, seed)
    cfg = plain_config(goal, "train", str(d / "runs"))
    cfg_path = d / "train.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    threshold = goal["target"]["threshold"]
    t0 = time.time()
    with open(d / "stdout.log", "wb") as logf:
        p = subprocess.Popen([sys.executable, "-m", "trainer.entry", str(cfg_path)], cwd=src, env=env_for(src),
                             stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    capped, status, ru = False, None, None
    while True:
        pid, st, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            status = os.waitstatus_to_exitcode(st)
            break
        if time.time() - t0 > cap_s:
            capped = True
            log(f"plain {goal_name} s{seed}: cap {cap_s:.0f}s reached, stopping it")
            os.killpg(p.pid, signal.SIGKILL)
            _, st, ru = os.wait4(p.pid, 0)
            status = os.waitstatus_to_exitcode(st)
            break
        time.sleep(POLL_S)
    p.returncode = status
    wall = time.time() - t0
    cpu = ru.ru_utime + ru.ru_stime
    rows = []
    mpath = d / "runs" / "train" / "metrics.jsonl"
    if mpath.exists():
        for line in mpath.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    hit = next((r for r in rows if isinstance(r.get("heldout_acc"), (int, float)) and r["heldout_acc"] >= threshold), None)
    out_lines = (d / "stdout.log").read_text(errors="replace").strip().splitlines()
    summary = None
    for line in reversed(out_lines):
        try:
            summary = json.loads(line)
            break
        except json.JSONDecodeError:
            continue
    reached = hit is not None and not capped
    steps = max((r.get("step", 0) for r in rows), default=0)
    evals = [r["heldout_acc"] for r in rows if isinstance(r.get("heldout_acc"), (int, float))]
    return {
        "goal": goal_name, "seed": seed, "arm": "plain", "rc": status, "capped": capped, "reached": reached,
        "wall_s": wall, "steps": steps, "status": (summary or {}).get("status") if isinstance(summary, dict) else None,
        "final_metric": evals[-1] if evals else None, "best_metric": max(evals) if evals else None,
        "seconds_to_target": (hit["time"] - t0) if reached else None,
        "worker_cpu_s": cpu, "worker_cpu_s_to_target": cpu if reached else None,
        "log_tail": None if status == 0 else "\n".join(out_lines[-15:]),
    }


# ---- results --------------------------------------------------------------------------------

IMPORTS = ("import resource, time; t = time.time(); import swarm.cli, swarm.controller, swarm.report, agents.operators; "
           "r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime, time.time() - t)")


def import_cost(src: pathlib.Path) -> dict[str, float]:
    """CPU and wall seconds a fresh controller process spends importing its modules (a fixed cost)."""
    out = subprocess.run([sys.executable, "-c", IMPORTS], cwd=src, env=env_for(src), capture_output=True, text=True)
    cpu, wall = (float(x) for x in out.stdout.split())
    return {"cpu_s": cpu, "wall_s": wall}


def load_results(fresh: bool) -> dict[str, Any]:
    p = RESULTS / "swarm_vs_train.json"
    if p.exists() and not fresh:
        return json.loads(p.read_text())
    return {"runs": []}


def merge(res: dict[str, Any], row: dict[str, Any]) -> None:
    res["runs"] = [r for r in res["runs"] if (r["goal"], r["seed"], r["arm"]) != (row["goal"], row["seed"], row["arm"])]
    res["runs"].append(row)
    res["runs"].sort(key=lambda r: (PRIORITY.index(r["goal"]) if r["goal"] in PRIORITY else 99, r["seed"], r["arm"]))


def fmt(v: Any, nd: int = 0) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def overhead(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    by = {(r["goal"], r["seed"], r["arm"]): r for r in res["runs"]}
    for (g, seed, arm), r in sorted(by.items()):
        if g != "healthy" or arm != "swarm" or r.get("controller_cpu_s") is None:
            continue
        plain = by.get((g, seed, "plain"))
        o = {"seed": seed, "controller_cpu_s": r["controller_cpu_s"], "controller_self_cpu_s": r["controller_self_cpu_s"],
             "swarm_wall_s": r["wall_s"], "cpu_over_wall": r["controller_cpu_s"] / r["wall_s"]}
        if plain and plain["reached"] and r["reached"]:
            o.update({"plain_wall_s": plain["wall_s"], "wall_delta_over_plain": (r["wall_s"] - plain["wall_s"]) / plain["wall_s"],
                      "plain_steps": plain["steps"], "swarm_steps": r["steps"]})
        out.append(o)
    return out


def write_md(res: dict[str, Any]) -> None:
    runs = res["runs"]
    by = {(r["goal"], r["seed"], r["arm"]): r for r in runs}
    pairs = sorted({(r["goal"], r["seed"]) for r in runs}, key=lambda k: (PRIORITY.index(k[0]) if k[0] in PRIORITY else 99, k[1]))
    m = res.get("meta", {})
    L = ["# Swarm (built-in policies) vs the same goal with no agents", "",
         f"Commands (in order): " + "; ".join(f"`{c}`" for c in m.get("commands", [])), "",
         f"Code under test: {m.get('src', '?')} at commit{'s' if len(m.get('commits', [])) > 1 else ''} "
         + ", ".join(f"`{c[:10]}`" for c in m.get("commits", []))
         + (f" ({', '.join(d + '/' for d in CODE_DIRS)} identical across them)" if len(m.get("commits", [])) > 1 and m.get("code_identical_across_commits")
            else " (the code differs between them: see each run's `commit` in the JSON)" if len(m.get("commits", [])) > 1 else "")
         + f". Machine: {m.get('machine', '?')}. "
         + (f"Cap per run: {m.get('cap_s', '?')} s wall (a run still going is stopped and counts as not reached). "
            f"Runs in parallel: {m.get('parallel', 1)}." if len(m.get("commands", [])) <= 1 else
            "Cap per run (a run still going is stopped and counts as not reached) and runs in parallel: `--cap-s` and "
            "`--parallel` of the command that ran it (above)."), "",
         "Worker-CPU-s to target: CPU seconds of all trainer processes until the target was met on the held-out split "
         "(both arms stop at the target, so this is the run's total when reached; swarm: live job + restarts + backtest arms, "
         "polled every 0.5 s; plain: getrusage of the trainer process). `—` = target not reached.", "",
         "| goal | seed | swarm reached? | swarm worker-CPU-s to target | swarm s to target | swarm steps | swarm interventions (applied/kept) | "
         "plain reached? | plain worker-CPU-s to target | plain s to target | plain steps | plain best held-out |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for g, seed in pairs:
        s, p = by.get((g, seed, "swarm")), by.get((g, seed, "plain"))
        ivs = s.get("interventions", []) if s else []
        used = [f"{iv['kind']}:{iv['status']}" for iv in ivs if iv.get("applied_step") is not None]
        rej = sum(iv.get("status") == "rejected" for iv in ivs)
        row = [g, str(seed)]
        if s:
            row += [fmt(s["reached"]) + (" (capped)" if s["capped"] else ""), fmt(s["worker_cpu_s_to_target"]),
                    fmt(s["seconds_to_target"]), fmt(s["steps"]),
                    (", ".join(used) or "none applied") + (f"; {rej} rejected by backtest" if rej else "")]
        else:
            row += ["not run"] + ["—"] * 4
        if p:
            row += [fmt(p["reached"]) + (" (capped)" if p["capped"] else ""), fmt(p["worker_cpu_s_to_target"]),
                    fmt(p["seconds_to_target"]), fmt(p["steps"]), fmt(p.get("best_metric"), 3)]
        else:
            row += ["not run"] + ["—"] * 4
        L.append("| " + " | ".join(row) + " |")
    L += ["", "Swarm's own summary beside the polled numbers (worker_cpu_s there counts the live job only, sampled at each observe tick):", "",
          "| goal | seed | swarm wall s | summary worker_cpu_s | polled worker CPU-s (all trainer processes) | trainer processes | restarts | reason | controller CPU-s (% of wall) | plain wall s | plain status |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for g, seed in pairs:
        s, p = by.get((g, seed, "swarm")), by.get((g, seed, "plain"))
        L.append("| " + " | ".join([g, str(seed), fmt(s and s["wall_s"]), fmt(s and s["summary_worker_cpu_s"]), fmt(s and s["worker_cpu_s"]),
                                    fmt(s and s["trainer_processes"]), fmt(s and s["restarts"]), fmt(s and s["reason"]),
                                    (f"{s['controller_cpu_s']:.1f} ({100 * s['controller_cpu_s'] / s['wall_s']:.1f}%)" if s and s.get("controller_cpu_s") is not None else "—"),
                                    fmt(p and p["wall_s"]), fmt(p and (p.get("status") or ("killed at cap" if p["capped"] else f"rc={p['rc']}")))]) + " |")
    ov = overhead(res)
    L += ["", "## Controller overhead (healthy goal)", "",
          "Definition: controller CPU-s / swarm wall-s. Controller CPU = the controller process's own CPU time (getrusage SELF at exit, "
          "imports, LangGraph, sqlite, git workspace, reports and plots included) + the CPU of its non-trainer child processes "
          "(git: getrusage CHILDREN minus the polled trainer CPU, which charges any polling undercount to the controller). "
          "Target ≤ 2%. Also shown: (swarm wall − plain wall) / plain wall, only meaningful on quiet cores.", ""]
    if ov:
        L += ["| seed | controller CPU-s | of which controller process | swarm wall s | **controller CPU / wall** | plain wall s | (swarm wall − plain wall) / plain wall | swarm steps | plain steps |",
              "|---|---|---|---|---|---|---|---|---|"]
        for o in ov:
            L.append("| " + " | ".join([str(o["seed"]), fmt(o["controller_cpu_s"], 1), fmt(o["controller_self_cpu_s"], 1), fmt(o["swarm_wall_s"]),
                                        f"**{100 * o['cpu_over_wall']:.1f}%**", fmt(o.get("plain_wall_s")),
                                        f"{100 * o['wall_delta_over_plain']:+.1f}%" if "wall_delta_over_plain" in o else "—",
                                        fmt(o.get("swarm_steps")), fmt(o.get("plain_steps"))]) + " |")
        ic = m.get("controller_import_cost")
        if ic:
            L += ["", f"Of the controller's CPU, importing its modules (swarm.cli, swarm.controller, swarm.report, agents.operators; "
                  f"measured in a separate fresh process) costs {ic['cpu_s']:.1f} CPU-s, a fixed cost per controller start: on a run "
                  f"this short it is a large part of the overhead; the rest grows with the run's length."]
    else:
        L.append("Not measured (no healthy swarm run in the results).")
    failed = [r for r in runs if r.get("log_tail")]
    if failed:
        L += ["", "## Runs that ended with an error", ""]
        for r in failed:
            L += [f"- {r['arm']} {r['goal']} seed {r['seed']} (rc {r['rc']}):", "", "```", r["log_tail"].strip()[-1200:], "```", ""]
    if res.get("coverage"):
        L += ["", "## Coverage against the issue's matrix", "", res["coverage"]]
    (RESULTS / "swarm_vs_train.md").write_text("\n".join(L) + "\n")


CODE_DIRS = ["swarm", "agents", "trainer", "harness", "kernels"]


def note_commit(meta: dict[str, Any], commit: str | None) -> None:
    """Record the commit under test; say whether the code the benchmark exercises differs between them."""
    import re

    commits = meta.setdefault("commits", [])
    for sha in re.findall(r"[0-9a-f]{40}", meta.pop("commit", "") or "") + ([commit.split()[0]] if commit else []):
        if sha not in commits:
            commits.append(sha)
    same = all(subprocess.run(["git", "diff", "--quiet", commits[0], c, "--", *CODE_DIRS], cwd=ROOT).returncode == 0
               for c in commits[1:])
    meta["code_identical_across_commits"] = same
    if commit and " + uncommitted" in commit:
        meta["uncommitted_changes"] = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--goals", nargs="+", default=PRIORITY, help="goal names under examples/goals")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--cap-s", type=float, default=360.0, help="wall-clock cap per run (seconds)")
    ap.add_argument("--arms", nargs="+", default=["swarm", "plain"], choices=["swarm", "plain"])
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time (1 = sequential; wall numbers assume 1)")
    ap.add_argument("--src", choices=["head", "worktree"], default="head", help="snapshot of git HEAD (default) or the working tree")
    ap.add_argument("--fresh", action="store_true", help="start a new results file instead of merging")
    ap.add_argument("--report-only", action="store_true", help="only rewrite the .md from the .json")
    ap.add_argument("--coverage", default=None, help="text for the coverage section of the .md")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--cores", type=int, default=None, help="core slots shared with every bench process on this machine "
                    "(swarmbench.machine.CoreSlots; default: all cores): a run waits until its cores are free")
    a = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    res = load_results(a.fresh)
    if a.coverage is not None:
        res["coverage"] = a.coverage
    if a.report_only:
        if "meta" in res:
            note_commit(res["meta"], None)
        (RESULTS / "swarm_vs_train.json").write_text(json.dumps(res, indent=1))
        write_md(res)
        return
    for g in a.goals:
        if not (GOALS_DIR / f"{g}.yaml").is_file():
            sys.exit(f"error: no goal {g!r} in {GOALS_DIR}")
    work = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="swarm_vs_train_"))
    work.mkdir(parents=True, exist_ok=True)
    src, commit = prepare_src(a.src, work)
    sys.path.insert(0, str(src))
    meta = res.setdefault("meta", {})
    note_commit(meta, commit)
    meta.update({"src": "snapshot of git HEAD" if a.src == "head" else "working tree", "cap_s": a.cap_s,
                 "parallel": a.parallel, "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, "
                 f"Python {platform.python_version()}"})
    cmd = "python benchmarks/swarm_vs_train.py " + " ".join(sys.argv[1:])
    meta.setdefault("commands", []).append(cmd)
    log(f"work dir {work}; code under test {src} ({commit})")
    if "healthy" in a.goals and "swarm" in a.arms:
        meta["controller_import_cost"] = import_cost(src)
        log(f"controller import cost: {meta['controller_import_cost']}")
    tasks = [(g, s, arm) for s in a.seeds for g in a.goals for arm in a.arms]
    lock = threading.Lock()
    from swarmbench.machine import METHOD_CORES, CoreSlots

    slots = CoreSlots(a.cores)   # the same slots as `swarm bench`: no run is measured on an oversubscribed machine

    def one(t: tuple[str, int, str]) -> dict[str, Any]:
        g, s, arm = t
        log(f"start {arm} {g} seed {s}")
        fn = run_swarm if arm == "swarm" else run_plain
        try:
            with slots.hold(METHOD_CORES[arm]):
                row = fn(g, s, a.cap_s, work, src)
        except Exception as e:  # one broken run is a row, not the end of the benchmark
            import traceback

            row = {"goal": g, "seed": s, "arm": arm, "rc": None, "capped": False, "reached": False, "wall_s": 0.0,
                   "steps": None, "worker_cpu_s": None, "worker_cpu_s_to_target": None, "seconds_to_target": None,
                   "log_tail": traceback.format_exc()}
        row["command"], row["commit"] = cmd, commit
        with lock:
            merge(res, row)
            (RESULTS / "swarm_vs_train.json").write_text(json.dumps(res, indent=1, default=str))
            write_md(res)
        log(f"done  {arm} {g} seed {s}: reached={row['reached']} wall={row['wall_s']:.0f}s "
            f"worker_cpu={fmt(row.get('worker_cpu_s'))} steps={row.get('steps')}")
        return row

    with cf.ThreadPoolExecutor(max(1, a.parallel)) as ex:
        list(ex.map(one, tasks))
    log(f"wrote {RESULTS / 'swarm_vs_train.json'} and .md")


if __name__ == "__main__":
    main()
