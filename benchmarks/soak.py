"""Soak: a compressed long run — does the swarm stay bounded in disk, memory and per-tick CPU?

One `swarm run` (local processes, `--jobs process`) of a tiny built-in model on 2-digit addition for
`--steps` steps (default 50,000), with a generic fault from trainer/perturb.py every
`--fault-every` steps (an lr spike, a killed worker, a stall, truncated answers, a corrupt
checkpoint, a low sampling temperature, … in turn) and `--kills` SIGKILLs of the controller at
random moments, each followed by `swarm resume`. The trainer's streams roll at
`--rotate-bytes` (SWARMLAB_LOG_ROTATE_BYTES), small enough that rolling happens within the soak.

Sampled every `--sample-s` seconds: the trainer's step, the workspace's disk use (whole, and by
part), the controller's RSS, and its CPU seconds and tick count (the LangGraph state's `tick`), from
which CPU per tick follows. After warm-up (the first `--warmup` share of the steps) a least-squares
slope per 1,000 steps is fitted to each series; a 3-day projection extrapolates it at the soak's
step rate. At the end the ledger and git are audited: every proposed intervention is in the store,
none is applied twice, every trainer command is acknowledged at most once, every decided
intervention's PR is in the state its status says (merged / reverted / closed).

    python benchmarks/soak.py                       # ~25-35 min on 2 cores
    python benchmarks/soak.py --steps 3000 --kills 1 --fault-every 1000 --out /tmp/soak-smoke

Results: benchmarks/results/soak.{json,md,svg} (or --out PREFIX).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import platform
import random
import signal
import sqlite3
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import yaml  # noqa: E402

WARM_PROCESS_S = 60.0      # RSS samples of a controller up for less than this are start-up, not growth
# the generic perturbations, in turn (trainer/perturb.py); overrides stay until the swarm fixes them
FAULTS: list[dict[str, Any]] = [
    {"shortcut": "lr_spike"},
    {"shortcut": "worker_kill"},
    {"shortcut": "truncation"},
    {"shortcut": "hang", "seconds": 20.0},
    {"shortcut": "corrupt_checkpoint"},
    {"shortcut": "low_temperature"},
    {"shortcut": "worker_kill"},
    {"shortcut": "lr_spike"},
    {"shortcut": "truncation"},
    {"shortcut": "hang", "seconds": 20.0},
]


def soak_goal(steps: int, fault_every: int) -> dict[str, Any]:
    faults = [dict(FAULTS[i % len(FAULTS)], at_step=at) for i, at in enumerate(range(fault_every // 2, steps, fault_every))]
    return {
        "goal": "soak: a tiny model adds 2-digit numbers for many steps while faults come and go",
        # out of reach on purpose: the run goes on for all its steps
        "target": {"metric": "heldout_acc", "op": ">=", "threshold": 1.0},
        "run": {
            "seed": 0, "task": {"name": "addition"},
            "model": {"kind": "builtin", "d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 24,
                      "charset": "0123456789+-*=\n "},
            "harness": {"template": "{question}=", "answer": {"reverse_digits": True, "stop": "\n"},
                        "sampling": {"temperature": 1.0, "max_new_tokens": 5}, "curriculum": {"start": 2}},
            "recipe": {"algorithm": "sft", "lr": 0.003, "schedule": "constant", "warmup_steps": 0, "batch_size": 16,
                       "eval_interval": 100, "eval_size": 50},
            "checkpoint": {"interval": 100, "keep_last": 10},
            "samples_per_step": 2, "threads": 1,
        },
        "budget": {"wall_s": 6 * 3600, "steps": steps, "worker_cpu_s": 6 * 3600, "llm_usd": 0.0},
        "approval": {"auto": ["low", "medium", "high"]},
        "llm": {"model": None},
        "memory": {"backend": "memory"},
        "swarm": {"observe_every_s": 2, "observe_quiet_s": 4, "min_steps_between_interventions": 200,
                  "evaluate_window_steps": 300,
                  "backtest": {"horizon_steps": 30, "seeds": [0, 1], "alpha": 0.2, "eval_size": 50}},
        "perturbations": faults,
    }


def du(path: pathlib.Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


def parts(ws: pathlib.Path) -> dict[str, int]:
    s = ws / ".swarm"
    out = {"git": du(ws / ".git"), "run_streams": 0, "run_checkpoints": du(s / "runs" / "train" / "checkpoints"),
           "backtests": du(s / "backtests"), "logs": du(s / "logs"), "memory": du(s / "memory"),
           "state_db": sum(p.stat().st_size for p in s.glob("state.db*")),
           "graph_db": sum(p.stat().st_size for p in s.glob("graph.db*"))}
    run = s / "runs" / "train"
    if run.is_dir():
        out["run_streams"] = sum(p.stat().st_size for p in run.iterdir() if p.is_file() and ".jsonl" in p.name)
    return out


def heartbeat_step(ws: pathlib.Path) -> int:
    try:
        return int(json.loads((ws / ".swarm" / "runs" / "train" / "heartbeat.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def graph_tick(ws: pathlib.Path) -> tuple[int | None, int | None]:
    """The LangGraph state's tick counter and the size of its newest checkpoint, read without the controller."""
    db = ws / ".swarm" / "graph.db"
    if not db.exists():
        return None, None
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5, check_same_thread=False)
        try:
            saver = SqliteSaver(conn)
            t = saver.get_tuple({"configurable": {"thread_id": "main"}})
            size = conn.execute("SELECT length(checkpoint) FROM checkpoints ORDER BY checkpoint_id DESC LIMIT 1").fetchone()
            return (int(t.checkpoint["channel_values"].get("tick", 0)) if t else None), (size[0] if size else None)
        finally:
            conn.close()
    except Exception:       # a read racing a write: skip this sample's tick
        return None, None


def proc_cpu(p: psutil.Process) -> float:
    """The controller's own CPU seconds: its children (the trainer, backtest arms, git) are left out —
    the arms' and the trainer's CPU is worker CPU, not what watching costs."""
    t = p.cpu_times()
    return t.user + t.system


def fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares slope of ys on xs and its standard error, both per 1,000 units of x."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    res = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys))
    return 1000.0 * b, 1000.0 * math.sqrt(res / (n - 2) / sxx)


def audit(ws: pathlib.Path) -> dict[str, Any]:
    """Ledger and git against each other and the trainer's command log."""
    from swarm.store import Store
    from swarm.workspace import Workspace
    from trainer.runlog import read_jsonl

    store = Store(ws / ".swarm" / "state.db")
    wsp = Workspace.open(ws)
    ivs = {iv.id: iv for iv in store.list()}
    proposed = [r["id"] for r in store.timeline("proposed")]
    applied = [r["id"] for r in store.timeline("applied")]
    acks = read_jsonl(ws / ".swarm" / "runs" / "train" / "command_log.jsonl")
    ack_ids = [a.get("id") for a in acks]
    lost, doubled = [], []
    lost += [f"proposed {i} not in the store" for i in proposed if i not in ivs]
    doubled += [f"{i} proposed {proposed.count(i)} times" for i in set(proposed) if proposed.count(i) > 1]
    doubled += [f"{i} applied {applied.count(i)} times" for i in set(applied) if applied.count(i) > 1]
    doubled += [f"command {c} acknowledged {ack_ids.count(c)} times" for c in set(ack_ids) if c and ack_ids.count(c) > 1]
    want = {"kept": ("merged",), "evaluating": ("merged",), "applied": ("merged",), "rolled_back": ("reverted",),
            "rejected": ("closed",)}
    states: dict[str, int] = {}
    for iv in ivs.values():
        try:
            st = wsp.pr_state(iv.id)
        except ValueError:
            st = "none"
        states[f"{iv.status.value}/{st}"] = states.get(f"{iv.status.value}/{st}", 0) + 1
        ok = want.get(iv.status.value)
        if iv.status.value == "rolled_back" and iv.outcome.get("undone") is False:
            ok = ("merged",)      # judged a loss but left in force (nothing to undo it to): its PR stays merged
        if ok and st not in ok and not (iv.status.value == "rejected" and st == "none" and iv.backtest is None
                                        and iv.kind.value == "restart"):
            lost.append(f"{iv.id} is {iv.status.value} but its PR is {st}")
        if iv.status.value in ("kept", "evaluating", "rolled_back") and iv.kind.value not in ("restart",) and iv.changes:
            if f"{iv.id}-apply" not in ack_ids:
                lost.append(f"{iv.id} is {iv.status.value} but the trainer never acknowledged {iv.id}-apply")
    merges = subprocess.run(["git", "log", "--merges", "--format=%s", "main"], cwd=ws, capture_output=True, text=True).stdout.splitlines()
    for i in ivs:
        n = sum(1 for m in merges if m.startswith(f"Merge intervention {i} "))
        if n > 1:
            doubled.append(f"{i} merged {n} times")
    open_ = [iv.id for iv in ivs.values() if iv.status.value in ("proposed", "backtesting", "validated", "awaiting_approval")]
    return {"interventions": len(ivs), "by_status_and_pr": dict(sorted(states.items())), "lost": lost, "doubled": doubled,
            "undecided_at_end": open_, "commands_acknowledged": len(acks),
            "skills_added": len(store.timeline("skill_added")), "episodes": len(store.timeline("episode"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--fault-every", type=int, default=2000)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    ap.add_argument("--sample-s", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=0.25, help="share of the steps left out of the slopes")
    ap.add_argument("--rotate-bytes", type=int, default=1 << 20)
    ap.add_argument("--keep-rotated", type=int, default=4)
    ap.add_argument("--max-wall-s", type=float, default=45 * 60, help="stop the run (swarm stop) after this long")
    ap.add_argument("--workdir", default=None, help="where the workspace goes (default: a temp dir)")
    ap.add_argument("--out", default=str(HERE / "results" / "soak"))
    ap.add_argument("--commit", default=None, help="the commit measured (default: git rev-parse HEAD here)")
    a = ap.parse_args()
    if a.steps < 1000 or a.fault_every < 100 or a.kills < 0:
        raise SystemExit("--steps >= 1000, --fault-every >= 100, --kills >= 0")
    import tempfile

    work = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="swarm-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    ws = work / "ws"
    goal_path = work / "soak.yaml"
    goal_path.write_text(yaml.safe_dump(soak_goal(a.steps, a.fault_every), sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SWARMLAB_LOG_ROTATE_BYTES": str(a.rotate_bytes),
           "SWARMLAB_LOG_KEEP_ROTATED": str(a.keep_rotated)}
    log = open(work / "controller.log", "ab")
    cli = [sys.executable, "-m", "swarm.cli"]

    def launch(resume: bool) -> subprocess.Popen:
        args = ["resume", "--workspace", str(ws), "--jobs", "process"] if resume else \
               ["run", str(goal_path), "--workspace", str(ws), "--jobs", "process"]
        return subprocess.Popen(cli + args, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)

    rng = random.Random(a.seed)
    lo, hi = int(0.1 * a.steps), int(0.9 * a.steps)
    kill_at = sorted(rng.sample(range(lo, hi), a.kills)) if a.kills else []
    kill_jitter = [rng.uniform(0.0, 8.0) for _ in kill_at]
    print(f"workspace {ws}; controller kills after steps {kill_at}", flush=True)
    t0 = time.time()
    ctrl = launch(False)
    proc = psutil.Process(ctrl.pid)
    started = time.time()     # of the current controller process
    samples: list[dict[str, Any]] = []
    kills: list[dict[str, Any]] = []
    cpu_done = 0.0            # CPU seconds of controllers that were killed
    cpu_last = 0.0
    next_sample = 0.0
    stopped = None
    while True:
        now = time.time() - t0
        step = heartbeat_step(ws)
        if kill_at and step >= kill_at[0]:
            time.sleep(kill_jitter[len(kills)])
            try:
                cpu_last = proc_cpu(proc)
            except psutil.Error:
                pass
            at = heartbeat_step(ws)
            ctrl.send_signal(signal.SIGKILL)
            ctrl.wait()
            cpu_done += cpu_last
            kills.append({"t": round(time.time() - t0, 1), "step": at})
            kill_at.pop(0)
            print(f"[{now:7.1f}s] SIGKILL controller at step {at}; swarm resume", flush=True)
            ctrl = launch(True)
            proc = psutil.Process(ctrl.pid)
            started = time.time()
            continue
        if now >= next_sample:
            try:
                rss = proc.memory_info().rss
                cpu_last = proc_cpu(proc)
            except psutil.Error:
                rss = None
            tick, ckpt_bytes = graph_tick(ws)
            row = {"t": round(now, 1), "step": step, "disk": du(ws), "rss": rss, "cpu_s": round(cpu_done + cpu_last, 3),
                   "tick": tick, "graph_checkpoint_bytes": ckpt_bytes, "kills": len(kills), "up_s": round(time.time() - started, 1), **{f"disk_{k}": v for k, v in parts(ws).items()}}
            samples.append(row)
            print(f"[{now:7.1f}s] step {step} disk {row['disk'] / 1e6:.1f} MB rss {(rss or 0) / 1e6:.0f} MB "
                  f"cpu {row['cpu_s']:.1f}s tick {row['tick']}", flush=True)
            next_sample = now + a.sample_s
        if ctrl.poll() is not None:
            if (ws / ".swarm" / "summary.json").exists():
                break               # finished (exit 1 when the target was not reached)
            # the controller died on its own (not our SIGKILL): record it and resume, as a user would
            kills.append({"t": round(now, 1), "step": step, "exited": ctrl.returncode})
            print(f"[{now:7.1f}s] controller exited {ctrl.returncode}; swarm resume", flush=True)
            cpu_done += cpu_last
            cpu_last = 0.0
            ctrl = launch(True)
            proc = psutil.Process(ctrl.pid)
            started = time.time()
        if now > a.max_wall_s and stopped is None:
            stopped = round(now, 1)
            subprocess.run(cli + ["stop", "--workspace", str(ws)], cwd=work, env=env, capture_output=True)
        time.sleep(1.0)
    wall = time.time() - t0
    summary = json.loads((ws / ".swarm" / "summary.json").read_text()) if (ws / ".swarm" / "summary.json").exists() else {}
    result = analyse(a, samples, kills, wall, stopped, summary, audit(ws), work)
    write(a, result, samples)


def analyse(a, samples, kills, wall, stopped, summary, aud, work) -> dict[str, Any]:
    last_step = max((s["step"] for s in samples), default=0)
    warm = [s for s in samples if s["step"] >= a.warmup * last_step]
    # a controller just (re)started is still importing and loading: its RSS says nothing about growth
    warm_rss = [s for s in warm if s["rss"] is not None and s["up_s"] >= WARM_PROCESS_S]
    # tick CPU: controller CPU seconds per tick between consecutive samples of one controller process
    tick_rows = []
    for p, q in zip(samples, samples[1:]):
        if p["kills"] == q["kills"] and p["tick"] is not None and q["tick"] is not None and q["tick"] > p["tick"]:
            tick_rows.append({"step": q["step"], "ms": 1000.0 * (q["cpu_s"] - p["cpu_s"]) / (q["tick"] - p["tick"])})
    warm_ticks = [r for r in tick_rows if r["step"] >= a.warmup * last_step]
    rate = last_step / wall if wall else 0.0
    steps_3d = rate * 3 * 86400

    def series(rows, key):
        xs, ys = [r["step"] for r in rows], [r[key] for r in rows]
        f = fit(xs, ys)
        sl, se = f if f else (None, None)
        end = ys[-1] if ys else None
        mean = sum(ys) / len(ys) if ys else None
        # extrapolated at the fitted slope (a falling series counts as flat) and at its upper 95% bound
        left = (steps_3d - xs[-1]) / 1000.0 if xs else 0.0
        proj = end + max(sl, 0.0) * left if (sl is not None and end is not None) else None
        proj_hi = end + max(sl + 1.96 * se, 0.0) * left if (sl is not None and end is not None) else None
        return {"slope_per_1k_steps": sl, "slope_se": se, "mean_after_warmup": mean, "end": end,
                "projected_3_days": proj, "projected_3_days_upper95": proj_hi,
                "slope_share_of_mean_per_1k": (sl / mean) if (sl is not None and mean) else None}

    disk_parts = {k[5:]: series(warm, k) for k in (warm[0] if warm else {}) if k.startswith("disk_")}
    return {
        "settings": {"steps": a.steps, "fault_every": a.fault_every, "faults": [f for f in soak_goal(a.steps, a.fault_every)["perturbations"]],
                     "kills": a.kills, "seed": a.seed, "sample_s": a.sample_s, "warmup_share": a.warmup,
                     "rotate_bytes": a.rotate_bytes, "keep_rotated": a.keep_rotated, "goal": soak_goal(a.steps, a.fault_every)["run"],
                     "swarm": soak_goal(a.steps, a.fault_every)["swarm"]},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "commit": a.commit or subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or None,
        "wall_s": round(wall, 1), "steps_reached": last_step, "steps_per_s": rate, "stopped_at_wall_s": stopped,
        "controller_kills": kills, "samples": len(samples),
        "disk_bytes": series(warm, "disk"), "rss_bytes": series(warm_rss, "rss"),
        "tick_cpu_ms": series(warm_ticks, "ms") if warm_ticks else None,
        "tick_cpu_ms_median": sorted(r["ms"] for r in warm_ticks)[len(warm_ticks) // 2] if warm_ticks else None,
        "graph_checkpoint_bytes": series([s for s in warm if s.get("graph_checkpoint_bytes")], "graph_checkpoint_bytes"),
        "disk_by_part": disk_parts,
        "projection": {"steps_in_3_days_at_this_rate": steps_3d},
        "audit": aud, "summary": {k: summary.get(k) for k in ("reason", "steps", "restarts", "backtests", "final_metric")},
        "tick_rows": tick_rows, "workdir": str(work),
    }


def write(a, r: dict[str, Any], samples: list[dict[str, Any]]) -> None:
    from swarm.plots import Chart, Panel, Series, to_svg

    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.with_suffix(".json")).write_text(json.dumps({**r, "series": samples}, indent=1, default=str))
    ok = [s for s in samples if s["rss"] is not None]
    panels = [
        Panel("disk (MB)", [Series("workspace", "#1f77b4", [([s["step"] for s in samples], [s["disk"] / 1e6 for s in samples])], False, [])]),
        Panel("controller RSS (MB)", [Series("rss", "#ff7f0e", [([s["step"] for s in ok], [s["rss"] / 1e6 for s in ok])], False, [])]),
        Panel("controller CPU per tick (ms)", [Series("cpu/tick", "#2ca02c",
                                                       [([t["step"] for t in r["tick_rows"]], [t["ms"] for t in r["tick_rows"]])],
                                                       True, [])]),
    ]
    marks = [(k["step"], "SIGKILL") for k in r["controller_kills"]]
    (out.with_suffix(".svg")).write_bytes(to_svg(Chart(panels, marks, f"soak: {r['steps_reached']} steps, "
                                                                        f"{len(r['controller_kills'])} controller kills")))

    def fmt(x, unit=1.0, nd=2):
        return "—" if x is None else f"{x / unit:.{nd}f}"

    rows = []
    for name, key, unit, u in (("workspace disk", "disk_bytes", 1e6, "MB"), ("controller RSS", "rss_bytes", 1e6, "MB"),
                               ("controller CPU per tick", "tick_cpu_ms", 1.0, "ms"),
                               ("one LangGraph checkpoint (graph.db)", "graph_checkpoint_bytes", 1e3, "kB")):
        s = r.get(key) or {}
        share = s.get("slope_share_of_mean_per_1k")
        rows.append(f"| {name} | {fmt(s.get('mean_after_warmup'), unit)} {u} | {fmt(s.get('end'), unit)} {u} | "
                    f"{fmt(s.get('slope_per_1k_steps'), unit, 3)} ± {fmt(s.get('slope_se'), unit, 3)} {u} | "
                    f"{fmt(share * 100 if share is not None else None, 1.0, 2)} % | "
                    f"{fmt(s.get('projected_3_days'), unit, 1)} {u} (≤ {fmt(s.get('projected_3_days_upper95'), unit, 1)}) |")
    parts_rows = [f"| {k} | {fmt(v.get('end'), 1e6)} MB | {fmt(v.get('slope_per_1k_steps'), 1e6, 4)} ± {fmt(v.get('slope_se'), 1e6, 4)} MB | "
                  f"{fmt(v.get('projected_3_days'), 1e6, 1)} MB |"
                  for k, v in sorted(r["disk_by_part"].items())]
    aud = r["audit"]
    md = f"""# Soak: bounded disk, memory and tick CPU over a compressed long run

`python benchmarks/soak.py` (defaults) at commit `{r['commit']}`; {r['machine']['cpus']} CPUs shared with other
work, Python {r['machine']['python']}. Raw samples and settings: `soak.json`; plot: `soak.svg`.

## What ran

- One `swarm run --jobs process` of the built-in model (d_model 32, 1 layer, 2 heads) on 2-digit
  addition, SFT, batch 16, eval every 100 steps on 50 examples, checkpoint every 100 (keep 10), 2 samples
  per step; target held-out accuracy 1.0 (out of reach: the run goes on for its {r['settings']['steps']} steps).
- A generic fault every {r['settings']['fault_every']} steps ({len(r['settings']['faults'])} in all): {', '.join(f"{f['shortcut']}@{f['at_step']}" for f in r['settings']['faults'])}.
- {len(r['controller_kills'])} controller SIGKILLs at random moments (seed {r['settings']['seed']}), each followed by `swarm resume`:
  {', '.join(f"step {k['step']}" + (f" (exited {k['exited']})" if 'exited' in k else '') for k in r['controller_kills']) or 'none'}.
- Streams roll at {r['settings']['rotate_bytes']} bytes, {r['settings']['keep_rotated']} rolled parts kept; memory backend `memory`
  (the vector index in process; the episode log on disk as always).
- Reached step {r['steps_reached']} in {r['wall_s']:.0f} s ({r['steps_per_s']:.1f} steps/s){f"; stopped by `swarm stop` at {r['stopped_at_wall_s']} s (wall cap)" if r['stopped_at_wall_s'] else ''}; the run ended: {r['summary'].get('reason')}; {r['samples']} samples every {r['settings']['sample_s']:g} s.

## Flat after warm-up (the first {r['settings']['warmup_share'] * 100:.0f}% of the steps left out; RSS only from controllers up ≥ {WARM_PROCESS_S:.0f} s)

| series | mean | at the end | slope per 1,000 steps (± s.e.) | slope / mean per 1,000 steps | 3-day projection (upper 95%) |
|---|---|---|---|---|---|
{chr(10).join(rows)}

CPU per tick is the controller's own CPU (its children — trainer, arms, git — left out) between two
samples over the ticks between them; median after warm-up {fmt(r['tick_cpu_ms_median'], 1.0, 1)} ms (ticks that ran a
backtest or wrote PRs cost more than quiet ones). The 3-day projection extrapolates from the end value at the fitted slope (a negative slope counts as
flat) and, in brackets, at the slope's upper 95% bound, to {r['projection']['steps_in_3_days_at_this_rate']:,.0f} steps (3 days at this
soak's step rate).

Disk by part. Parts bounded by design fill up to their bound and then stay there — SQLite's WAL files
(`state.db-wal`, `graph.db-wal`) grow to the autocheckpoint size (~1,000 pages, ≈ 4 MB) and are then
reused, the streams roll, checkpoints are pruned — so a straight line through a part that was still
filling overstates its 3 days (the samples in `soak.json` show when each part levelled off). What grows without a bound is per intervention (git: each PR's report commits and plots;
the ledger's rows; the memory's episodes).

| part | at the end | slope per 1,000 steps after warm-up | 3-day projection |
|---|---|---|---|
{chr(10).join(parts_rows)}

## Ledger and git at the end

{aud['interventions']} interventions; by status / PR state: {', '.join(f"{k} {v}" for k, v in aud['by_status_and_pr'].items())}.
Lost: **{len(aud['lost'])}**{(' — ' + '; '.join(aud['lost'])) if aud['lost'] else ''}. Doubled: **{len(aud['doubled'])}**{(' — ' + '; '.join(aud['doubled'])) if aud['doubled'] else ''}.
Undecided at the end: {len(aud['undecided_at_end'])}. Trainer commands acknowledged: {aud['commands_acknowledged']}; episodes {aud['episodes']}; skills added {aud['skills_added']}.
"""
    (out.with_suffix(".md")).write_text(md)
    print(md)


if __name__ == "__main__":
    main()
