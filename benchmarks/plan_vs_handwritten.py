"""A minimal goal (sentence + target + budget, planned by the lead) vs a hand-written goal for the
same task and target; and a planned run with memory of a previous planned run vs without it
(issue 32, "Performance").

(1) per task family (FAMILIES): `swarm run` of examples/goals/minimal/<family>.yaml (the plan, its
    pilot, the run) against `swarm run` of the hand-written goal for the same task: the
    repository's example config for the task where it has one (addition: examples/goals/healthy.yaml;
    sort: examples/goals/handwritten/sort.yaml, which is examples/goals/truncation_sort.yaml without
    its fault), else one written from the task's documented facts under
    examples/goals/handwritten/. Both arms get the minimal goal's sentence, target and budget, so
    they differ only in `run:` (and the hand-written file's swarm/approval settings). Target: each
    minimal goal reaches its target; median ratio (minimal / hand-written worker-CPU-s to target)
    <= 1.2. The planned run starts from the pilot winner's last checkpoint (swarm/pilot.py), so its
    steps to target count the winner's pilot steps; the table names the step it went on from and why
    the pilot stopped. A diagnostic arm, `minimal_t1` (--arms), is the minimal goal with
    `run: {threads: 1}` written: the pilot's winner sets threads 1 itself, so it differs from
    `minimal` only where no pilot runs (memory, --no-pilot).
(2) memory (MEMORY_PAIRS): a planned run that shares a memory library folder with a previous
    planned run on a similar task (the previous one run first, in the same library: memory_next)
    against the same goal with a fresh library of its own (memory_alone, run beside the previous
    one). Target: <= 0.8x worker-CPU-s to target. `--memory-threads1` writes run.threads=1 in all
    three runs. swarm/plan_memory.py recalls only a run of the same task family that reached its
    target: a pair whose previous run misses its target measures nothing.

Measurements (each run through benchmarks/swarm_vs_train.py's `launch_swarm`: the CLI in a
CPU-recording wrapper on a snapshot of git HEAD, trainer processes polled every 0.5 s):
  worker CPU-s   the polled CPU of every `trainer.entry` process (live job, restarts, backtest arms)
                 + the pilot's CPU (`.swarm/plan.json` pilot.cpu_s: the pilot runs inside the
                 controller process, one thread, measured with process_time there). Both arms stop
                 at the target, so "to target" is the run's total when reached. The controller's
                 own meter (`summary.worker_cpu_s_to_target`, pilot included) is kept beside it.
  reached        summary.reached, and the run was not stopped at the cap.
  ratio          minimal / hand-written worker-CPU-s to target, when both reached.

Deviations, stated in the results: every arm's `budget.wall_s` is raised to the per-run cap
(`--cap-s`): wall time on a shared, loaded machine says nothing about the plan, and the worker-CPU
budget (what the pilot's share is of) stays the goal's. Seeds override `run.seed` (the minimal
goal then writes `run: {seed: N}`, which is not a plan field). SWARMLAB_LIBRARY is unset for every
run, so a run without `memory.library` has a fresh library in its own workspace.

    python benchmarks/plan_vs_handwritten.py [--families addition reverse sort ...] [--seeds 0]
        [--arms minimal handwritten minimal_t1] [--memory addition sort reverse] [--memory-threads1]
        [--cap-s 2400] [--parallel 1] [--src head|worktree] [--cores N]
        [--note "why rows did not run"] [--findings TEXT] [--fresh] [--workdir DIR]
    python benchmarks/plan_vs_handwritten.py --report-only [--add-rows WORKDIR ...] [--note ...]

Results merge into benchmarks/results/plan_vs_handwritten.json (keyed by row, seed, arm) unless
--fresh, under a file lock, so invocations may run side by side; each also keeps its own rows in
WORKDIR/rows.json (`--report-only --add-rows WORKDIR` merges them back). The .md is rewritten from
the JSON after every finished run and lists the rows that did not run.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import fcntl
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Iterator

import yaml

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from swarm_vs_train import env_for, fmt, launch_swarm, log, note_commit, prepare_src  # noqa: E402,F401
sys.path.remove(str(HERE))   # benchmarks/memory, /sandboxes, /kernels must not shadow the packages

ROOT = HERE.parent
RESULTS = HERE / "results"
GOALS = ROOT / "examples" / "goals"
NAME = "plan_vs_handwritten"

# family -> (minimal goal, hand-written goal, where the hand-written one comes from)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "addition": ("minimal/addition.yaml", "healthy.yaml", "the repository's addition example (examples/goals/healthy.yaml)"),
    "sort": ("minimal/sort.yaml", "handwritten/sort.yaml", "the repository's sort example (truncation_sort.yaml) without its fault"),
    "reverse": ("minimal/reverse.yaml", "handwritten/reverse.yaml", "written from the task's documented facts (no example)"),
    "countdown": ("minimal/countdown.yaml", "handwritten/countdown.yaml", "written from the task's documented facts (the "
                  "example examples/countdown_grpo.yaml needs an SFT checkpoint to start from)"),
    "rg": ("minimal/reasoning_gym.yaml", "handwritten/reasoning_gym.yaml", "written from the task's documented facts (no example)"),
    "code": ("minimal/code.yaml", "handwritten/code.yaml", "written from the task's documented facts (no example)"),
}
# pair name -> (the previous run's goal, the next run's goal), each (family, sentence or None = the family's
# minimal goal as written): the next goal runs with the previous run's library (memory_next) and with a
# fresh one (memory_alone)
Pair = tuple[tuple[str, "str | None"], tuple[str, "str | None"]]
MEMORY_PAIRS: dict[str, Pair] = {
    # the "3-digit after 2-digit addition": the same family, which is what swarm/plan_memory.py recalls
    "addition": (("addition", "a policy that adds 2-digit numbers with >= 95% held-out exact match"), ("addition", None)),
    # the "sort after reverse": another family; swarm/plan_memory.py recalls the same family only
    "sort": (("reverse", None), ("sort", None)),
    # 5-digit after 4-digit reversal: the same family, the cheapest pair
    "reverse": (("reverse", None), ("reverse", "a policy that reverses 5-digit strings with >= 90% held-out exact match")),
}
# the arms of part (1): the minimal goal as written; the same with `run: {threads: 1}` written (a
# diagnostic, not the minimal goal: RunConfig's threads 0 = torch's default, every core, trains
# where no pilot sets threads 1); the hand-written goal
ARMS = ("minimal", "minimal_t1", "handwritten")
RATIO_TARGET = 1.2
MEMORY_TARGET = 0.8


# ---- the goals (pure) ------------------------------------------------------------------------

def read_goal(rel: str) -> dict[str, Any]:
    return yaml.safe_load((GOALS / rel).read_text())


def arm_goal(base: dict[str, Any], minimal: dict[str, Any], seed: int, wall_s: float,
             library: str | None = None, sentence: str | None = None, threads: int | None = None) -> dict[str, Any]:
    """`base` (a goal dict) with the minimal goal's sentence, target and budget, `run.seed`, the
    budget's wall_s raised to `wall_s`, `memory.library` and `run.threads` when given."""
    g = json.loads(json.dumps(base))
    g["goal"] = sentence or minimal["goal"]
    g["target"] = dict(minimal["target"])
    g["budget"] = {**minimal.get("budget", {}), "wall_s": max(float(wall_s), float(minimal.get("budget", {}).get("wall_s", 0)))}
    g.setdefault("run", {})["seed"] = seed
    if threads is not None:
        g["run"]["threads"] = threads
    if library is not None:
        g.setdefault("memory", {})["library"] = library
    return g


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b when both are measured (a reached target on each side), else None."""
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def family_rows(runs: list[dict[str, Any]], arm: str = "minimal") -> list[dict[str, Any]]:
    """One row per (family, seed) of part (1): `arm` (minimal or minimal_t1), the hand-written arm,
    and their ratio."""
    by = {(r["row"], r["seed"], r["arm"]): r for r in runs}
    out = []
    for fam, seed in sorted({(r["row"], r["seed"]) for r in runs if r["arm"] in (arm, "handwritten")},
                            key=lambda k: (list(FAMILIES).index(k[0]) if k[0] in FAMILIES else 99, k[1])):
        m, h = by.get((fam, seed, arm)), by.get((fam, seed, "handwritten"))
        r = ratio(m and m.get("worker_cpu_s_to_target"), h and h.get("worker_cpu_s_to_target"))
        # a minimal run stopped short of the target: its ratio is at least what it spent over the hand-written cost
        low = (ratio(m.get("worker_cpu_s"), h.get("worker_cpu_s_to_target"))
               if r is None and m and h and not m["reached"] and h["reached"] else None)
        out.append({"family": fam, "seed": seed, "minimal": m, "handwritten": h, "ratio": r, "ratio_at_least": low})
    return out


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Part (1)'s targets over the rows where both arms ran: every minimal goal reached; the median ratio."""
    both = [r for r in rows if r["minimal"] and r["handwritten"]]
    ratios = [r["ratio"] for r in both if r["ratio"] is not None]
    missed = [f"{r['family']} s{r['seed']}" for r in both if not r["minimal"]["reached"]]
    med = statistics.median(ratios) if ratios else None
    # each true ratio is >= its bound (a measured ratio is its own), so the median of the bounds bounds the median
    bounds = [r["ratio"] if r["ratio"] is not None else r.get("ratio_at_least") for r in both]
    low = statistics.median(bounds) if bounds and all(b is not None for b in bounds) else None
    return {"pairs": len(both), "ratios": len(ratios), "minimal_missed": missed, "median_ratio": med,
            "median_ratio_at_least": low, "all_reached": not missed and bool(both),
            "median_ok": med is not None and med <= RATIO_TARGET and not missed}


# ---- a run -----------------------------------------------------------------------------------

def measure(goal: dict[str, Any], d: pathlib.Path, cap_s: float, src: pathlib.Path, tag: str) -> dict[str, Any]:
    """`swarm run` of `goal` (launch_swarm), its worker CPU with the pilot's, and its plan record."""
    run = launch_swarm(goal, d, cap_s, src, tag)
    s, capped, poller = run["summary"], run["capped"], run["poller"]
    plan_path = run["ws"] / ".swarm" / "plan.json"
    rec = json.loads(plan_path.read_text()) if plan_path.exists() else None
    pilot = (rec or {}).get("pilot") or None
    pilot_cpu = float(pilot["cpu_s"]) if pilot else 0.0
    worker = poller.total + pilot_cpu
    reached = bool(s and s.get("reached")) and not capped
    sources = {c["field"]: c["source"] for c in ((rec or {}).get("plan") or {}).get("choices", [])}
    chosen = {c["field"]: c["value"] for c in ((rec or {}).get("plan") or {}).get("choices", [])
              if c["field"] in ("model.d_model", "model.n_layers", "recipe.lr")}
    start = next((c for c in ((rec or {}).get("plan") or {}).get("choices", []) if c["field"] == "fork_from"), None)
    return {
        "rc": run["rc"], "capped": capped, "reached": reached, "wall_s": run["wall_s"],
        "steps": s.get("steps") if s else None, "final_metric": s.get("final_metric") if s else None,
        "reason": s.get("reason") if s else None,
        "worker_cpu_s": worker, "worker_cpu_s_to_target": worker if reached else None,
        "trainer_cpu_s": poller.total, "pilot_cpu_s": pilot_cpu if pilot else None,
        "pilot_runs": len(pilot["results"]) if pilot else None,
        "pilot_winner": pilot["winner"] if pilot else None,
        "pilot_prediction": pilot.get("prediction") if pilot else None,
        "pilot_stop": (pilot.get("stop") or {}).get("reason") if pilot else None,
        "start_steps": (start.get("evidence") or {}).get("steps") if start else None,   # the winner's steps the run went on from
        "pilot_skipped": (rec or {}).get("pilot_skipped"),
        "size_lr": chosen, "size_lr_sources": {f: sources[f] for f in chosen},
        "summary_worker_cpu_s": s.get("worker_cpu_s") if s else None,
        "summary_worker_cpu_s_to_target": s.get("worker_cpu_s_to_target") if s else None,
        "plan_prediction": s.get("plan_prediction") if s else None,
        "interventions": [f"{iv.get('kind')}:{iv.get('status')}" for iv in (s.get("interventions") or [])] if s else [],
        "trainer_processes": len(poller.cpu),
        "log_tail": None if s else run["log_tail"],
    }


# ---- the report ------------------------------------------------------------------------------

def _cell(r: dict[str, Any] | None) -> list[str]:
    if r is None:
        return ["not run", "—", "—", "—"]
    reached = fmt(r["reached"]) + (" (capped)" if r["capped"] else "")
    if not r["reached"]:
        reached += f", best/final {fmt(r.get('final_metric'), 3)} ({r.get('reason') or 'no summary'})"
    return [reached, fmt(r["worker_cpu_s_to_target"]) if r["reached"] else f"— ({fmt(r['worker_cpu_s'])} spent)",
            fmt(r["pilot_cpu_s"]), fmt(r["steps"])]


def _pair_table(rows: list[dict[str, Any]], arm: str) -> list[str]:
    L = [f"| family | seed | {arm} reached? | {arm} worker-CPU-s to target | of which pilot | {arm} steps | "
         f"hand-written reached? | hand-written worker-CPU-s to target | hand-written steps | **ratio {arm} / hand-written** |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mm, hh = _cell(r["minimal"]), _cell(r["handwritten"])
        L.append("| " + " | ".join([r["family"], str(r["seed"]), *mm, hh[0], hh[1], hh[3],
                                    f"**{r['ratio']:.2f}×**" if r["ratio"] is not None else
                                    f"≥ {r['ratio_at_least']:.1f}× (spent, not reached)" if r.get("ratio_at_least") else "—"]) + " |")
    return L + [""]


def write_md(res: dict[str, Any]) -> None:
    m, runs = dict(res.get("meta", {})), res["runs"]
    m["commands"] = list(dict.fromkeys(m.get("commands", []) + [r["command"] for r in runs if r.get("command")]))
    m["commits"] = list(dict.fromkeys(m.get("commits", []) + [str(r["commit"]).split()[0] for r in runs if r.get("commit")]))
    rows = family_rows(runs)
    v = verdict(rows)
    L = [f"# Minimal goal (planned) vs hand-written goal; planned run with vs without memory", "",
         "Issue 32's performance benchmark (`benchmarks/plan_vs_handwritten.py`; its docstring has the method).", "",
         "Commands: " + "; ".join(f"`{c}`" for c in m.get("commands", [])), "",
         f"Code under test: {m.get('src', '?')} at " + ", ".join(f"`{c[:10]}`" for c in m.get("commits", []))
         + " (each run's `commit` in the JSON)"
         + f". Machine: {m.get('machine', '?')}; load average at the start of each command: "
         + ", ".join(m.get("loads", [])) + ". Runs in parallel: `--parallel` of each command, and commands side by side. Every arm's budget.wall_s is raised to the per-run cap "
         "(`--cap-s`); a run still going at the cap is stopped and counts as not reached.", "",
         "Worker-CPU-s: CPU of every trainer process of the run (live job, restarts, backtest arms; polled) plus "
         "the pilot's (it runs inside the controller process; `.swarm/plan.json`). `—` = target not reached.", "",
         "## (1) Minimal goal vs hand-written goal, same task, target and budget", ""]
    L += _pair_table(rows, "minimal")
    L += ["", f"Targets over the rows that ran: every minimal goal reaches its target — "
          + ("**met**" if v["all_reached"] else f"**missed** ({', '.join(v['minimal_missed']) or 'no pair ran'})")
          + f"; median ratio ≤ {RATIO_TARGET}× — "
          + (f"**{'met' if v['median_ok'] else 'missed'}: {v['median_ratio']:.2f}×** over the {v['ratios']} pair(s) where both reached"
             if v["median_ratio"] is not None else "not measured (no pair where both reached)")
          + (f"; counting a minimal run stopped short at what it had spent, the median over all {v['pairs']} pairs is "
             f"**≥ {v['median_ratio_at_least']:.1f}×**" if v.get("median_ratio_at_least") is not None and v["minimal_missed"] else "")
          + ".", ""]
    t1 = [r for r in family_rows(runs, "minimal_t1") if r["minimal"]]
    if t1:
        v1 = verdict(t1)
        L += ["Diagnostic, not the minimal goal: the minimal goal with `run: {threads: 1}` written (arm `minimal_t1`). "
              "The pilot's winner sets `threads: 1` itself; without a pilot (memory, `--no-pilot`) the plan keeps "
              "RunConfig's 0 (torch's default: every core), and this arm separates that default from the plan's "
              "other choices.", ""]
        L += _pair_table(t1, "minimal_t1")
        L += [f"Median ratio minimal_t1 / hand-written: " + (f"{v1['median_ratio']:.2f}× over {v1['ratios']} pair(s)"
              if v1["median_ratio"] is not None else "not measured") + ".", ""]
    L += ["What each arm trained (model size and lr; source of each in the plan) and the pilot:", "",
          "| family | seed | arm | d_model, n_layers, lr (source) | pilot runs, winner | pilot prediction | trainer CPU-s | interventions |",
          "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        sl = r.get("size_lr") or {}
        src = sorted(set((r.get("size_lr_sources") or {}).values()))
        pred = r.get("pilot_prediction") or {}
        pl = (f"{pred['steps']} steps, {pred['worker_cpu_s']:.0f} CPU-s" if pred.get("steps") else
              (pred.get("why") or "—")[:90]) if r.get("pilot_runs") else (r.get("pilot_skipped") or "—")[:90]
        L.append("| " + " | ".join([r["row"], str(r["seed"]), r["arm"],
                                    (f"{sl.get('model.d_model')}, {sl.get('model.n_layers')}, {sl.get('recipe.lr')} "
                                     f"({'/'.join(src)})") if sl else "—",
                                    (f"{r['pilot_runs']}, {r['pilot_winner']['name']}"
                                     + (f" (stop: {r['pilot_stop']})" if r.get("pilot_stop") else "")
                                     + (f"; the run went on from its step {r['start_steps']}" if r.get("start_steps")
                                        else "; the run started from scratch")) if r.get("pilot_runs") else "no pilot",
                                    pl, fmt(r.get("trainer_cpu_s")), ", ".join(r.get("interventions") or []) or "none"]) + " |")
    L += ["", "## (2) Planned run with memory of a previous planned run vs without", "",
          "| pair | seed | previous run (same library) | previous reached? | with memory: reached? | with memory: worker-CPU-s to target "
          "| size/lr from memory? | without memory (the same goal, a fresh library): worker-CPU-s to target "
          "| **ratio with / without** |",
          "|---|---|---|---|---|---|---|---|---|"]
    by = {(r["row"], r["seed"], r["arm"]): r for r in runs}
    mem_keys = sorted({(r["row"], r["seed"]) for r in runs if r["arm"].startswith("memory_")})
    for row, seed in mem_keys:
        pair, _, variant = row.split(":", 1)[1].partition("/")
        prev, nxt = by.get((row, seed, "memory_prev")), by.get((row, seed, "memory_next"))
        base = by.get((row, seed, "memory_alone")) or (   # an older pair without its own: row (1)'s minimal arm
            by.get((MEMORY_PAIRS[pair][1][0], seed, "minimal_t1" if variant == "t1" else "minimal"))
            if MEMORY_PAIRS[pair][1][1] is None else None)
        rt = ratio(nxt and nxt.get("worker_cpu_s_to_target"), base and base.get("worker_cpu_s_to_target"))
        from_mem = nxt and "memory" in (nxt.get("size_lr_sources") or {}).values()
        L.append("| " + " | ".join([pair + (" (run.threads: 1 written in every run)" if variant == "t1" else "")
                                    + f": {(nxt or base or {}).get('goal_sentence', '?')}", str(seed), (prev or {}).get("goal_sentence", "—"), _cell(prev)[0], _cell(nxt)[0],
                                    _cell(nxt)[1], fmt(from_mem) if nxt else "—",
                                    _cell(base)[1] if base else "not run",
                                    f"**{rt:.2f}×** (target ≤ {MEMORY_TARGET}×)" if rt is not None else "—"]) + " |")
    if not mem_keys:
        L.append("| — | — | not run | | | | | | |")
    L += ["", "## Rows not run", ""]
    ran = {(r["row"], r["seed"]) for r in runs}
    seeds = sorted({r["seed"] for r in runs}) or [0]
    missing = [f for f in FAMILIES if not any((f, s) in ran for s in seeds)]
    missing += [f"memory:{p}" for p in MEMORY_PAIRS if not any(r["row"].startswith(f"mem:{p}") for r in runs)]
    L.append(("Not run: " + ", ".join(missing) + ". " if missing else "Every family and memory pair ran. ")
             + (m.get("note") or ""))
    if res.get("findings"):
        L += ["", "## Findings", "", res["findings"]]
    failed = [r for r in runs if r.get("log_tail")]
    if failed:
        L += ["", "## Runs that ended without a summary", ""]
        for r in failed:
            L += [f"- {r['row']} {r['arm']} seed {r['seed']} (rc {r['rc']}):", "", "```", str(r["log_tail"]).strip()[-1200:], "```", ""]
    (RESULTS / f"{NAME}.md").write_text("\n".join(L) + "\n")


# ---- main ------------------------------------------------------------------------------------

def merge_rows(res: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """`rows` into `res["runs"]`, each replacing the row with its (row, seed, arm)."""
    keys = {(r["row"], r["seed"], r["arm"]) for r in rows}
    res["runs"] = [r for r in res["runs"] if (r["row"], r["seed"], r["arm"]) not in keys] + list(rows)


@contextlib.contextmanager
def _file_lock() -> Iterator[None]:
    """An exclusive lock on the results, across invocations running at once."""
    fd = os.open(pathlib.Path(tempfile.gettempdir()) / f"{NAME}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES), help="part (1) task families")
    ap.add_argument("--arms", nargs="+", default=["minimal", "handwritten"], choices=list(ARMS),
                    help="minimal_t1: the minimal goal with run.threads=1 written (a diagnostic arm)")
    ap.add_argument("--memory", nargs="*", default=list(MEMORY_PAIRS), choices=list(MEMORY_PAIRS),
                    help="part (2) pairs (their 'without memory' arm is part (1)'s minimal run of the family)")
    ap.add_argument("--memory-threads1", action="store_true", help="the memory pairs write run.threads=1 in both "
                    "runs and compare with the minimal_t1 arm")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--cap-s", type=float, default=2400.0, help="wall-clock cap per run (seconds); also every arm's budget.wall_s")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time (worker CPU is CPU time, not wall)")
    ap.add_argument("--src", choices=["head", "worktree"], default="head")
    ap.add_argument("--cores", type=int, default=None, help="hold swarmbench.machine.CoreSlots (2 per run) shared with "
                    "other bench processes; default: do not wait for them")
    ap.add_argument("--note", default=None, help="why the rows not run did not run (kept in the .md)")
    ap.add_argument("--findings", default=None, help="text for the findings section of the .md")
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--add-rows", nargs="*", default=[], help="with --report-only: merge the rows.json of these work "
                    "folders (what an invocation that ran beside another recorded)")
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    RESULTS.mkdir(exist_ok=True)
    p = RESULTS / f"{NAME}.json"
    res = json.loads(p.read_text()) if p.exists() and not a.fresh else {"runs": []}
    meta = res.setdefault("meta", {})
    if a.note is not None:
        meta["note"] = a.note
    if a.findings is not None:
        res["findings"] = a.findings
    if a.report_only:
        for f in a.add_rows:
            merge_rows(res, json.loads((pathlib.Path(f) / "rows.json").read_text()))
        p.write_text(json.dumps(res, indent=1, default=str))
        write_md(res)
        return
    for f in a.families:
        for rel in FAMILIES[f][:2]:
            if not (GOALS / rel).is_file():
                sys.exit(f"error: family {f}: no goal file {GOALS / rel}")
    os.environ.pop("SWARMLAB_LIBRARY", None)   # a run without memory.library: a fresh library in its workspace
    work = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix=f"{NAME}_"))
    work.mkdir(parents=True, exist_ok=True)
    src, commit = prepare_src(a.src, work)
    note_commit(meta, commit)
    meta.update({"src": "snapshot of git HEAD" if a.src == "head" else "working tree",
                 "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}"})
    meta.setdefault("loads", []).append("{:.1f}/{:.1f}/{:.1f}".format(*os.getloadavg()))
    cmd = f"python benchmarks/{NAME}.py " + " ".join(sys.argv[1:])
    meta.setdefault("commands", []).append(cmd)
    with _file_lock():
        if p.exists() and not a.fresh:   # what another invocation wrote since this one read it
            cur = json.loads(p.read_text())
            for k in ("commands", "loads", "commits"):
                meta[k] = list(dict.fromkeys(cur.get("meta", {}).get(k, []) + meta.get(k, [])))
            res["runs"] = cur["runs"]
        p.write_text(json.dumps(res, indent=1, default=str))
    log(f"work dir {work}; code under test {src} ({commit})")
    lock = threading.Lock()
    mine: list[dict[str, Any]] = []
    slots = None
    if a.cores:
        from swarmbench.machine import CoreSlots
        slots = CoreSlots(a.cores)

    def record(row: dict[str, Any]) -> None:
        row["command"], row["commit"] = cmd, commit
        with lock, _file_lock():   # another invocation may be writing the same results: merge into what is on disk
            mine.append(row)
            (work / "rows.json").write_text(json.dumps(mine, indent=1, default=str))   # this invocation's rows (--add-rows)
            cur = json.loads(p.read_text()) if p.exists() else res
            merge_rows(cur, mine)
            p.write_text(json.dumps(cur, indent=1, default=str))
            write_md(cur)
        log(f"done  {row['row']} {row['arm']} s{row['seed']}: reached={row['reached']} wall={row['wall_s']:.0f}s "
            f"worker_cpu={fmt(row.get('worker_cpu_s'))} (pilot {fmt(row.get('pilot_cpu_s'))}) steps={row.get('steps')}")

    def one(row: str, arm: str, seed: int, goal: dict[str, Any]) -> dict[str, Any]:
        tag = f"{row} {arm} s{seed}"
        log(f"start {tag}")
        d = work / f"{row.replace(':', '-').replace('/', '-')}-{arm}-s{seed}"
        try:
            if slots is not None:
                with slots.hold(2):
                    out = measure(goal, d, a.cap_s, src, tag)
            else:
                out = measure(goal, d, a.cap_s, src, tag)
        except Exception:   # one broken run is a row, not the end of the benchmark
            import traceback
            out = {"rc": None, "capped": False, "reached": False, "wall_s": 0.0, "steps": None, "worker_cpu_s": None,
                   "worker_cpu_s_to_target": None, "pilot_cpu_s": None, "log_tail": traceback.format_exc()}
        out.update(row=row, arm=arm, seed=seed, goal_sentence=goal["goal"])
        record(out)
        return out

    def family_task(fam: str, arm: str, seed: int) -> None:
        minimal = read_goal(FAMILIES[fam][0])
        base = read_goal(FAMILIES[fam][1]) if arm == "handwritten" else minimal
        one(fam, arm, seed, arm_goal(base, minimal, seed, a.cap_s, threads=1 if arm == "minimal_t1" else None))

    def memory_task(pair: str, seed: int) -> None:
        (prev_fam, prev_sentence), (next_fam, next_sentence) = MEMORY_PAIRS[pair]
        th = 1 if a.memory_threads1 else None
        row = f"mem:{pair}" + ("/t1" if th else "")
        lib = str(work / f"library-{pair}{'-t1' if th else ''}-s{seed}")
        prev_min, nxt = read_goal(FAMILIES[prev_fam][0]), read_goal(FAMILIES[next_fam][0])
        # the run without memory (its own fresh library) beside the previous run; then the run with it
        alone = threading.Thread(target=one, args=(row, "memory_alone", seed,
                                                   arm_goal(nxt, nxt, seed, a.cap_s, sentence=next_sentence, threads=th)))
        alone.start()
        one(row, "memory_prev", seed, arm_goal(prev_min, prev_min, seed, a.cap_s, lib, prev_sentence, th))
        one(row, "memory_next", seed, arm_goal(nxt, nxt, seed, a.cap_s, lib, next_sentence, th))
        alone.join()

    # the memory pairs first: each is two runs one after the other
    jobs = [(memory_task, (pair, s)) for s in a.seeds for pair in a.memory]
    jobs += [(family_task, (f, arm, s)) for s in a.seeds for f in a.families for arm in a.arms]
    with cf.ThreadPoolExecutor(max(1, a.parallel)) as ex:
        for fut in [ex.submit(fn, *args) for fn, args in jobs]:
            fut.result()
    log(f"wrote {p} and .md")


if __name__ == "__main__":
    main()
