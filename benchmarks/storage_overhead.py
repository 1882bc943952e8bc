"""Run storage's cost to the controller, and how fast a killed controller of a stored run is back.

Issue 33's performance targets for storage-backed runs (`swarm.storage`, trainer/run_storage.py):

(a) overhead  The healthy goal (examples/goals/healthy.yaml), its target raised out of reach and its
              budget cut to `--steps` trainer steps so that every run ends on the same step count,
              run by the real controller in a child process on a private loopback Ray head as
              `swarm run` starts it (`jobs="ray"`), once with `swarm.storage: file://<temp folder>`
              (the job mirrors to it from its scratch folder, the controller keeps a replica) and
              once without (the job writes the controller's run folder itself). The two variants
              alternate A B A B … (`--repeats` pairs) so that the machine's load drifts over both.
              Measured in the child with getrusage(SELF): the controller process's own CPU (the
              trainer, the Ray head and `ray start` are other processes and are not counted), in
              the steady state (from the graph's first `plan` to `finish`) per tick and per
              trainer step, and the CPU inside `sync_run` (the replica's passes). Target: storage /
              local ≤ 1.05.
(b) resume    `swarm run` of the same goal with storage and an unreachable target, as a separate
              process; while the job trains, the controller is killed with SIGKILL, and
              `swarm resume` is started on the same workspace (a second `swarm run` there refuses
              and names `swarm resume`). Measured: the seconds from that start until the
              replica's metrics.jsonl holds a row of a step past the newest one before the kill (the
              controller re-attached to the job that kept training and pulled its rows);
              `--resumes` kills in one run. Target: ≤ 10 s. The Ray head is asked at the end how
              many jobs it ran: one, if every resume re-attached instead of submitting again. The
              resumed CLI runs with its resume path timed (`traced_swarm`: wrappers set on the
              controller's classes, none of its code changed), and the report breaks each resume down.
(c) passes    The replica's idle pass (nothing new on storage) against how many chunks the run has
              stored, in this process on a `FolderStorage`: a run mirrored for N passes with a row
              in metrics and samples each, then the CPU of one idle `Replica.sync` (median of
              `--pass-repeats`; one get of the job's index), beside the CPU of listing the four
              streams, which is what a pass paid for its streams when it found new chunks by
              listing them. No target; it is why the replica asks for chunks by key.

Everything runs at the caller's niceness (run it under `nice -n 5` on a shared machine); CPU
seconds are measured rather than wall where it matters, and the load average is recorded.

    nice -n 5 .venv/bin/python benchmarks/storage_overhead.py [--repeats 2] [--steps 400] [--resumes 3]
    nice -n 5 .venv/bin/python benchmarks/storage_overhead.py --part resume
    nice -n 5 .venv/bin/python benchmarks/storage_overhead.py --part passes
    .venv/bin/python benchmarks/storage_overhead.py --part report     # the Markdown again from the JSON

A part run on its own keeps the other parts' results in the JSON, each with its own command, code
and load.

Results: benchmarks/results/storage_overhead.{json,md} (`--out NAME` for another name).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # read when ray is imported: loopback only


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def goal_dict(steps: int, storage: str | None, wall_s: float = 1800.0) -> dict[str, Any]:
    """The healthy goal with an unreachable target and a budget of `steps` trainer steps."""
    import yaml

    goal = yaml.safe_load((ROOT / "examples" / "goals" / "healthy.yaml").read_text())
    goal["target"]["threshold"] = 1.0          # out of reach: every run ends on its step budget
    goal["budget"].update(steps=steps, wall_s=wall_s, worker_cpu_s=1e9)
    if storage:
        goal["swarm"]["storage"] = storage
    return goal


def stop_recorded_head(ws: pathlib.Path) -> None:
    """Stop the private head a (killed) controller recorded in `ws`, if it still runs."""
    from trainer.launch import RayHead, stop_head

    rec = ws / ".swarm" / "ray_head.json"
    if rec.is_file():
        stop_head(RayHead.from_record(json.loads(rec.read_text())))


# ---- (a) one controller run, in a child process ------------------------------------------------------
def one_run(variant: str, steps: int, out: pathlib.Path) -> None:
    t0, c0 = time.time(), cpu()
    import swarm.controller as controller_mod
    from swarm.controller import Controller
    from swarm.goal import Goal

    work = pathlib.Path(tempfile.mkdtemp(prefix=f"storage-overhead-{variant}-"))
    storage = f"file://{work / 'store'}" if variant == "storage" else None
    marks: dict[str, float] = {}
    ticks = [0]
    observe_cpu: list[float] = []   # CPU-s at the start of each observe: consecutive ones bound a tick
    sync = {"calls": 0, "cpu_s": 0.0}
    inner_sync = controller_mod.sync_run

    def timed_sync(d):
        c = cpu()
        try:
            return inner_sync(d)
        finally:
            sync["calls"] += 1
            sync["cpu_s"] += cpu() - c
    controller_mod.sync_run = timed_sync   # the name the controller calls (its command path too)

    class Timed(Controller):
        def node_plan(self, s):
            marks.setdefault("steady_c", cpu())
            marks.setdefault("steady_t", time.time())
            return super().node_plan(s)

        def node_observe(self, s):
            if "finish_c" not in marks:
                ticks[0] += 1
                observe_cpu.append(cpu())
            return super().node_observe(s)

        def node_finish(self, s):
            marks.setdefault("finish_c", cpu())
            marks.setdefault("finish_t", time.time())
            return super().node_finish(s)

    ws = work / "ws"
    try:
        ctrl = Timed.create(ws, Goal.parse(goal_dict(steps, storage)), jobs="ray")
        summary = ctrl.run()
    finally:
        stop_recorded_head(ws)   # normally stopped by `finish` already
    c_end, t_end = cpu(), time.time()
    res = {
        "variant": variant, "steps": summary["steps"], "reason": summary["reason"], "ticks": ticks[0],
        "total_cpu_s": c_end - c0, "wall_s": t_end - t0,
        "steady_cpu_s": marks["finish_c"] - marks["steady_c"], "steady_wall_s": marks["finish_t"] - marks["steady_t"],
        "median_tick_ms": 1000 * statistics.median(b - a for a, b in zip(observe_cpu, observe_cpu[1:])),
        "sync_calls": sync["calls"], "sync_cpu_s": sync["cpu_s"],
        "stored_objects": sum(len(f) for _, _, f in os.walk(work / "store")) if storage else 0,
        "load_after": os.getloadavg(),
    }
    out.write_text(json.dumps(res))
    shutil.rmtree(work, ignore_errors=True)


def overhead(repeats: int, steps: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for i in range(repeats):
        for variant in ("local", "storage"):
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                path = pathlib.Path(f.name)
            load = os.getloadavg()
            t = time.time()
            proc = subprocess.run([sys.executable, __file__, "--one", variant, "--steps", str(steps), "--one-out", str(path)],
                                  cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{variant} run {i} failed ({proc.returncode}): {proc.stderr[-2000:]}")
            r = json.loads(path.read_text())
            path.unlink()
            r.update(repeat=i, load_before=load)
            r["steady_ms_per_tick"] = 1000 * r["steady_cpu_s"] / max(r["ticks"], 1)
            r["steady_ms_per_step"] = 1000 * r["steady_cpu_s"] / max(r["steps"], 1)
            r["total_ms_per_step"] = 1000 * r["total_cpu_s"] / max(r["steps"], 1)
            r["sync_ms_per_call"] = 1000 * r["sync_cpu_s"] / max(r["sync_calls"], 1)
            runs.append(r)
            print(f"{variant} #{i}: {r['steps']} steps, {r['ticks']} ticks, steady {r['steady_cpu_s']:.2f} CPU-s "
                  f"({r['steady_ms_per_tick']:.1f} ms/tick, median {r['median_tick_ms']:.1f}, {r['steady_ms_per_step']:.2f} ms/step), sync "
                  f"{r['sync_ms_per_call']:.2f} ms/call, total {r['total_cpu_s']:.2f} CPU-s, {time.time() - t:.0f} s wall, "
                  f"load {load[0]:.1f}", flush=True)
    ratios: dict[str, Any] = {}
    for key in ("median_tick_ms", "steady_ms_per_tick", "steady_ms_per_step", "total_ms_per_step"):
        per_pair = [b[key] / a[key] for a, b in zip(runs[0::2], runs[1::2])]
        loc = [r[key] for r in runs if r["variant"] == "local"]
        sto = [r[key] for r in runs if r["variant"] == "storage"]
        ratios[key] = {"pairs": per_pair, "median": statistics.median(per_pair), "min": min(per_pair), "max": max(per_pair),
                       "of_means": statistics.mean(sto) / statistics.mean(loc)}
    return {"runs": runs, "ratios": ratios, "steps": steps, "repeats": repeats}


# ---- (b) kill the controller, resume it -----------------------------------------------------------------
def _last_step(path: pathlib.Path) -> tuple[int, int | None]:
    """(rows, step of the last complete row) of a metrics.jsonl."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0, None
    lines = [ln for ln in data.split(b"\n")[: -1] if ln.strip()]
    for ln in reversed(lines):
        try:
            return len(lines), int(json.loads(ln)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return len(lines), None


def _lock_pid(ws: pathlib.Path) -> int | None:
    """The pid in the workspace's controller lock (written once the controller, imports done, opens it)."""
    try:
        return int((ws / ".swarm" / "controller.lock").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _cpu_s(pid: int) -> float | None:
    """CPU seconds of a process and its reaped children so far (None once it is gone)."""
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system + t.children_user + t.children_system


def _swarm(args: list[str], log: pathlib.Path, trace: pathlib.Path | None = None) -> subprocess.Popen:
    """`swarm ARGS` as its own process; with `trace`, the same CLI with the resume path's steps timed
    into that file (`traced_swarm`)."""
    swarm = pathlib.Path(sys.executable).parent / "swarm"
    cmd = [str(swarm), *args] if trace is None else [sys.executable, __file__, "--traced-swarm", str(trace), "--", *args]
    with open(log, "ab") as f:   # its own session: the SIGKILL below goes to the controller alone
        return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def traced_swarm(trace: pathlib.Path, args: list[str]) -> None:
    """Run the `swarm` CLI with the steps of a resume timed (the controller's construction, its graph
    nodes, job status and Ray calls, `sync_run`, the lock, every `time.sleep`): each call's start
    (wall clock) and seconds appended to `trace` as JSON lines, named with its thread's name when not
    the main thread's. A measurement aid: the controller's code is untouched, the wrappers are set
    on its classes here."""
    import functools
    import threading

    main = threading.main_thread()
    out = open(trace, "a", buffering=1)

    def wrap(owner: Any, attr: str, name: str) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*a, **kw):
            th = threading.current_thread()
            t = time.time()
            try:
                return fn(*a, **kw)
            finally:
                out.write(json.dumps({"name": name if th is main else f"{name}@{th.name}", "t": t,
                                      "s": time.time() - t}) + "\n")
        setattr(owner, attr, timed)

    import swarm.controller as ctl
    import swarm.job_control as jc
    import swarm.jobs as jobs

    for attr in [a for a in vars(ctl.Controller) if a.startswith("node_")] + ["__init__", "run", "evidence"]:
        wrap(ctl.Controller, attr, f"Controller.{attr}")
    for attr in ("job_status", "after_head_replaced"):
        wrap(jc.JobControl, attr, f"Controller.{attr}")
    for attr in ("_head", "status", "start"):
        wrap(jobs.RayJobs, attr, f"RayJobs.{attr}")
    wrap(ctl, "sync_run", "sync_run")
    wrap(jc, "sync_run", "sync_run")
    wrap(ctl, "acquire_lock", "acquire_lock")   # the name the controller calls
    wrap(time, "sleep", "time.sleep")
    from swarm.cli import app

    sys.argv = ["swarm", *args]
    app()


def _breakdown(trace: pathlib.Path, t0: float, t1: float) -> dict[str, Any]:
    """What a resume's seconds from `t0` (the process started) to `t1` (the first new row seen) went
    on: the first time each traced step began (seconds after t0) and the seconds spent in each
    (calls begun before t1; nested calls count in their callers too)."""
    try:
        rows = [json.loads(x) for x in trace.read_text().splitlines() if x.strip()]
    except FileNotFoundError:
        return {}
    rows = [r for r in rows if t0 <= r["t"] <= t1]
    first: dict[str, float] = {}
    spent: dict[str, float] = {}
    calls: dict[str, int] = {}
    for r in rows:
        first.setdefault(r["name"], r["t"] - t0)
        spent[r["name"]] = spent.get(r["name"], 0.0) + min(r["s"], t1 - r["t"])
        calls[r["name"]] = calls.get(r["name"], 0) + 1
    return {k: {"first_at_s": round(first[k], 3), "spent_s": round(spent[k], 3), "calls": calls[k]}
            for k in sorted(first, key=first.get)}


def resume(resumes: int, dead_s: float, timeout_s: float = 120.0) -> dict[str, Any]:
    import yaml

    from trainer.launch import RayHead

    work = pathlib.Path(tempfile.mkdtemp(prefix="storage-resume-"))
    ws, log = work / "ws", work / "swarm.log"
    goal = work / "goal.yaml"
    goal.write_text(yaml.safe_dump(goal_dict(100_000, f"file://{work / 'store'}", wall_s=1800)))
    metrics = ws / ".swarm" / "runs" / "train" / "metrics.jsonl"
    out: list[dict[str, Any]] = []
    proc = _swarm(["run", str(goal), "--workspace", str(ws), "--quiet"], log)
    jobs: list[str] = []
    try:
        t = time.time()
        while _last_step(metrics)[0] < 20:          # the job trains, its rows reach the replica
            if proc.poll() is not None or time.time() - t > 300:
                raise RuntimeError(f"swarm run did not get going: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        print(f"first rows after {time.time() - t:.0f} s", flush=True)
        for i in range(resumes):
            time.sleep(6 + 2.3 * i)                  # kill at varying points of the tick
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            rows, step = _last_step(metrics)
            time.sleep(dead_s)                       # the job trains on while no controller watches
            load = os.getloadavg()
            t0 = time.time()
            trace = work / f"trace-{i}.jsonl"
            proc = _swarm(["resume", "--workspace", str(ws), "--quiet"], log, trace)
            locked = locked_cpu = cpu_s = None
            while True:
                cpu_s = _cpu_s(proc.pid) or cpu_s
                if locked is None and _lock_pid(ws) == proc.pid:
                    locked, locked_cpu = time.time() - t0, cpu_s
                n, s = _last_step(metrics)
                if s is not None and step is not None and s > step:
                    break
                if proc.poll() is not None or time.time() - t0 > timeout_s:
                    raise RuntimeError(f"resume {i} saw no new row in {timeout_s:.0f} s: {log.read_text()[-2000:]}")
                time.sleep(0.05)
            dt = time.time() - t0
            time.sleep(0.5)   # the trace rows of calls still running when the row was seen are written after it
            out.append({"breakdown": _breakdown(trace, t0, t0 + dt), "resume_s": dt, "locked_s": locked, "cpu_s": cpu_s, "locked_cpu_s": locked_cpu, "step_at_kill": step, "rows_at_kill": rows, "first_new_step": s,
                        "rows_pulled": n - rows, "load_before": load})
            print(f"resume #{i}: {dt:.2f} s, {cpu_s or 0:.2f} CPU-s (step {step} -> {s}, load {load[0]:.1f})", flush=True)
        head = RayHead.from_record(json.loads((ws / ".swarm" / "ray_head.json").read_text()))
        jobs = [j.submission_id for j in head.client().list_jobs()]
        (ws / ".swarm" / "stop").write_text("")       # the controller stops the job and its head
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        stop_recorded_head(ws)
    secs = [r["resume_s"] for r in out]
    res = {"resumes": out, "median_s": statistics.median(secs), "max_s": max(secs), "min_s": min(secs),
           "dead_s": dead_s, "ray_jobs": jobs}
    shutil.rmtree(work, ignore_errors=True)
    return res


# ---- (c) an idle replica pass against the chunks stored ---------------------------------------------------
def passes(sizes: list[int], repeats: int) -> dict[str, Any]:
    from trainer.run_storage import STREAMS, JobMirror, Replica
    from trainer.storage import FolderStorage

    out: list[dict[str, Any]] = []
    work = pathlib.Path(tempfile.mkdtemp(prefix="storage-passes-"))
    try:
        store = FolderStorage(work / "store")
        mirror = JobMirror(work / "scratch" / "run", store)
        mirror.restore()
        rep = Replica(work / "ctrl", store)
        done = 0
        for n in sorted(sizes):
            for step in range(done + 1, n + 1):   # one mirror pass per step, a row in two streams each
                with open(mirror.dir / "metrics.jsonl", "a") as f:
                    f.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\n")
                with open(mirror.dir / "samples.jsonl", "a") as f:
                    f.write(json.dumps({"step": step, "completion": "42"}) + "\n")
                mirror.sync()
            done = n
            rep.sync()                                # catch up, then measure passes with nothing new
            idle, listing = [], []
            for _ in range(repeats):
                c = time.process_time()
                rep.sync()
                idle.append(time.process_time() - c)
                c = time.process_time()
                for st in STREAMS:
                    store.list(f"streams/{st}")
                listing.append(time.process_time() - c)
            row = {"chunks_per_stream": n, "idle_pass_ms": 1000 * statistics.median(idle),
                   "stream_listings_ms": 1000 * statistics.median(listing)}
            out.append(row)
            print(f"{n} chunks: idle pass {row['idle_pass_ms']:.3f} ms, listing the streams {row['stream_listings_ms']:.3f} ms",
                  flush=True)
        rep.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"sizes": out, "repeats": repeats}


# ---- the report ------------------------------------------------------------------------------------------
def _provenance(p: dict[str, Any]) -> str:
    return (f"Command: `{p['command']}`. Code: {p['commit']}{' + uncommitted changes' if p['dirty'] else ''}. "
            f"Machine: {p['machine']}, shared with other long benchmark processes; everything at `nice -n 5`. "
            f"Load average (1 min) from {p['load'][0]:.1f} to {p['load'][1]:.1f} over the measurement "
            f"(`uptime` at the start: {p['uptime']}).\n")


def overhead_verdict(ratios: dict[str, Any]) -> str:
    """Within the ≤ 1.05 target only where every measure's median is (the mean tick alone can turn
    on one heavy tick), over it where every one is over, else not shown either way."""
    m = ratios["steady_ms_per_tick"]["median"]
    meds = [v["median"] for v in ratios.values()]
    word = ("within" if all(x <= 1.05 for x in meds) else "over" if all(x > 1.05 for x in meds)
            else "not shown either way (the measures below disagree) against")
    return f"Verdict: steady controller CPU per tick, storage / local = {m:.3f} at the median: {word} the ≤ 1.05 target."


def report(res: dict[str, Any]) -> str:
    lines = [f"# Run storage: controller overhead and resume time\n",
             "Each part was run on its own (`--part`); its command, code and the machine's load are given with it.\n"]
    ov = res.get("overhead")
    if ov:
        lines += [f"## (a) Controller overhead, storage-backed vs local runs\n", _provenance(ov["provenance"]),
                  f"The healthy goal (examples/goals/healthy.yaml) with its target out of reach and a budget of {ov['steps']} "
                  f"steps, on a private loopback Ray head started by the controller (`jobs=\"ray\"`, as `swarm run`); "
                  f"`swarm.storage: file://<temp folder>` vs none; {ov['repeats']} pairs, run local, storage, local, "
                  f"storage, …. CPU is the controller process's own (getrusage SELF): the trainer, the Ray head and "
                  f"the job's mirror are other processes. Steady state: from the graph's first `plan` to `finish`.\n",
                  "| run | variant | steps | ticks | steady CPU-s | ms / tick | median tick ms | ms / step | in `sync_run`: calls, ms / call | whole-run CPU-s | wall s | load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in ov["runs"]:
            lines.append(f"| {r['repeat']} | {r['variant']} | {r['steps']} | {r['ticks']} | {r['steady_cpu_s']:.2f} | "
                         f"{r['steady_ms_per_tick']:.1f} | {r['median_tick_ms']:.1f} | {r['steady_ms_per_step']:.2f} | {r['sync_calls']}, "
                         f"{r['sync_ms_per_call']:.2f} | {r['total_cpu_s']:.2f} | {r['wall_s']:.0f} | {r['load_before'][0]:.1f} |")
        lines += ["", "| measure | storage / local, per pair | median | min – max | ratio of the means |", "|---|---|---|---|---|"]
        names = {"median_tick_ms": "CPU of one tick (observe to observe), median",
                 "steady_ms_per_tick": "steady CPU per tick", "steady_ms_per_step": "steady CPU per step",
                 "total_ms_per_step": "whole-run CPU per step (start-up and finish included)"}
        for k, v in ov["ratios"].items():
            lines.append(f"| {names[k]} | {', '.join(f'{x:.3f}' for x in v['pairs'])} | **{v['median']:.3f}** | "
                         f"{v['min']:.3f} – {v['max']:.3f} | {v['of_means']:.3f} |")
        sto = [r for r in ov["runs"] if r["variant"] == "storage"]
        loc = [r for r in ov["runs"] if r["variant"] == "local"]
        more = statistics.mean(r["steady_ms_per_tick"] for r in sto) - statistics.mean(r["steady_ms_per_tick"] for r in loc)
        in_sync = (statistics.mean(1000 * r["sync_cpu_s"] / max(r["ticks"], 1) for r in sto)
                   - statistics.mean(1000 * r["sync_cpu_s"] / max(r["ticks"], 1) for r in loc))
        lines += ["", overhead_verdict(ov["ratios"])]
        main = ov["ratios"]["steady_ms_per_tick"]["median"]
        short = {"median_tick_ms": "median tick", "steady_ms_per_step": "steady CPU per step",
                 "total_ms_per_step": "whole-run CPU per step"}
        others = {k: v["median"] for k, v in ov["ratios"].items() if k != "steady_ms_per_tick"}
        if any((v <= 1.05) != (main <= 1.05) for v in others.values()):
            ticks = [r["ticks"] for r in ov["runs"]]
            lines += ["", "The other measures of the same runs disagree: " + ", ".join(
                f"{short[k]} {v:.3f}" for k, v in others.items()) + f". With {min(ticks)}–{max(ticks)} ticks a "
                f"run, one heavy tick (an evaluation, a report) moves a run's mean tick by milliseconds, so these runs do not "
                f"settle the target either way."]
        walls = [b["wall_s"] / a["wall_s"] for a, b in zip(ov["runs"][0::2], ov["runs"][1::2])]
        tick_r = [b["ticks"] / max(a["ticks"], 1) for a, b in zip(ov["runs"][0::2], ov["runs"][1::2])]
        lines += ["", f"Wall seconds of the same steps, storage / local, per pair: {', '.join(f'{x:.2f}' for x in walls)}; ticks: "
                  f"{', '.join(f'{x:.2f}' for x in tick_r)}. A run with more ticks for the same steps spreads the same "
                  f"per-step work (evidence of new rows, reports, evaluations) over more ticks, which lowers its mean tick: "
                  f"compare the median tick and CPU per step when the tick counts differ this much."]
        lines += ["",
                  f"Storage minus local: {more:+.1f} ms per tick, of which {in_sync:+.1f} ms inside `sync_run` (the "
                  f"replica's pass, once a tick). The ticks are wall-clock driven (a tick waits `observe_every_s` / "
                  f"`observe_quiet_s`), so how many a run of {ov['steps']} steps gets follows the trainer's speed and the "
                  f"machine's load; the target is set per tick, and per step is shown beside it. Both are CPU "
                  f"seconds of the controller alone"
                  + (", but at a load above the core count they are inflated by contention for the cores and their "
                     "caches alike in both variants." if ov["provenance"]["load"][1] > (os.cpu_count() or 1) else "."), ""]
    rs = res.get("resume")
    if rs:
        lines += [f"## (b) Resume after a controller kill, storage-backed run\n", _provenance(rs["provenance"]),
                  f"`swarm run` of the healthy goal with `swarm.storage: file://…` and an unreachable target; "
                  f"{len(rs['resumes'])} times: SIGKILL to the controller, {rs['dead_s']:g} s with no controller (the job "
                  f"trains on), then `swarm resume --workspace WS`. Measured: from starting it until the replica's "
                  f"metrics.jsonl holds a row of a step past the last one before the kill. Beside the wall seconds, "
                  f"the CPU seconds the resumed `swarm` process used over them (psutil, sampled every 50 ms): what the "
                  f"resume costs whatever the machine's load, where the wall seconds also hold the waits for a core.\n",
                  "| resume | seconds | of which until the controller holds the workspace lock (CLI start-up, imports) | CPU-s of the resumed process | of which until the lock | step at kill | first new step | rows pulled | load |",
                  "|---|---|---|---|---|---|---|---|---|"]
        def num(x: float | None) -> str:
            return "—" if x is None else f"{x:.2f}"
        for i, r in enumerate(rs["resumes"]):
            lines.append(f"| {i} | {r['resume_s']:.2f} | {num(r['locked_s'])} | {num(r.get('cpu_s'))} | {num(r.get('locked_cpu_s'))} | "
                         f"{r['step_at_kill']} | {r['first_new_step']} | {r['rows_pulled']} | {r['load_before'][0]:.1f} |")
        lines += ["", f"Median **{rs['median_s']:.2f} s**, max **{rs['max_s']:.2f} s** (target ≤ 10 s). Ray jobs the head ran: "
                  f"{len(rs['ray_jobs'])} ({'the resumed controllers re-attached to the running job' if len(rs['ray_jobs']) == 1 else 'see the JSON'}).",
                  "", res.get("resume_verdict", ""), ""]
        bds = [r.get("breakdown") or {} for r in rs["resumes"]]
        if any(bds):
            names = sorted({k for b in bds for k in b}, key=lambda k: min(b[k]["first_at_s"] for b in bds if k in b))
            lines += ["Where those seconds went: the resumed CLI ran with the steps of the resume path timed "
                      "(`--traced-swarm`: wrappers set on the controller's classes, its code untouched). Per step, the "
                      "seconds after the process started at which it first began, and the seconds spent in it before "
                      "the first new row was seen (calls nested in another count in both; `@thread`: another thread "
                      "than the main one).\n",
                      "| step | " + " | ".join(f"resume {i}: first at, spent (calls)" for i in range(len(bds))) + " |",
                      "|---|" + "---|" * len(bds)]
            for k in names:
                cells = [f"{b[k]['first_at_s']:.2f}, {b[k]['spent_s']:.2f} ({b[k]['calls']})" if k in b else "—" for b in bds]
                lines.append(f"| `{k}` | " + " | ".join(cells) + " |")
            lines += ["", "From the controller's construction (the lock is its first act) to the first new row, per resume:"]
            for i, (r, b) in enumerate(zip(rs["resumes"], bds)):
                if "Controller.__init__" not in b:
                    continue
                after = r["resume_s"] - b["Controller.__init__"]["first_at_s"]
                spent = {k: b.get(k, {}).get("spent_s", 0.0) for k in ("time.sleep", "RayJobs.status", "sync_run")}
                lines.append(f"- resume {i}: {after:.2f} s, of which {spent['time.sleep']:.2f} s asleep in the main thread "
                             f"(the resumed tick's wait before it observes), {spent['RayJobs.status']:.2f} s in the first "
                             f"Ray job-status calls, {spent['sync_run']:.2f} s in the replica's passes, and "
                             f"{after - sum(spent.values()):.2f} s the rest (the controller built, the graph's state read "
                             f"and its run started).")
            lines.append("")
        cpu = [r["cpu_s"] for r in rs["resumes"] if r.get("cpu_s") is not None]
        if cpu:
            lines += [f"The resumed process used {min(cpu):.1f}–{max(cpu):.1f} CPU-s over those seconds"
                      + (": the wall time at this load (above the core count) is mostly waiting for a core, which an idle "
                         "machine would not add." if rs["provenance"]["load"][1] > (os.cpu_count() or 1) else
                         "; the rest of the wall time is waiting (sleeps, the Ray head's answers, the job's next mirror "
                         "pass), see the breakdown above."), ""]
    ps = res.get("passes")
    if ps:
        lines += ["## (c) An idle replica pass against the chunks a run has stored\n", _provenance(ps["provenance"]),
                  f"A run mirrored to a `FolderStorage` for N passes (a row in metrics and samples each: N chunks in each "
                  f"of those streams), the replica caught up, then the CPU of one idle `Replica.sync` (median of "
                  f"{ps['repeats']}: one get of the job's index, which names the chunks stored) and of listing the four "
                  f"streams, which a pass did before it asked for chunks by key. A stepping run stores about 2 chunks "
                  f"per stream per second (7,200 an hour).\n",
                  "| chunks per stream | idle pass ms | listing the 4 streams ms |", "|---|---|---|"]
        for r in ps["sizes"]:
            lines.append(f"| {r['chunks_per_stream']} | {r['idle_pass_ms']:.3f} | {r['stream_listings_ms']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["all", "overhead", "resume", "passes", "report"], default="all",
                    help="report: write the Markdown again from the JSON, measuring nothing")
    ap.add_argument("--repeats", type=int, default=2, help="(a): pairs of runs, local then storage")
    ap.add_argument("--steps", type=int, default=400, help="(a): the trainer steps of every run")
    ap.add_argument("--resumes", type=int, default=3, help="(b): kills and resumes in one run")
    ap.add_argument("--dead-s", type=float, default=3.0, help="(b): seconds with no controller before each resume")
    ap.add_argument("--pass-sizes", default="10,1000,10000", help="(c): chunks per stream at each measurement")
    ap.add_argument("--pass-repeats", type=int, default=50, help="(c): idle passes timed at each size")
    ap.add_argument("--out", default="storage_overhead", help="results name under benchmarks/results")
    ap.add_argument("--one", choices=["local", "storage"], help=argparse.SUPPRESS)
    ap.add_argument("--one-out", help=argparse.SUPPRESS)
    ap.add_argument("--traced-swarm", help=argparse.SUPPRESS)
    if "--traced-swarm" in sys.argv:   # `swarm ARGS` with its resume path timed: the arguments after -- are swarm's
        i = sys.argv.index("--")
        traced_swarm(pathlib.Path(sys.argv[sys.argv.index("--traced-swarm") + 1]), sys.argv[i + 1:])
        return
    args = ap.parse_args()
    if args.one:
        one_run(args.one, args.steps, pathlib.Path(args.one_out))
        return
    if args.part == "report":
        md = report(json.loads((HERE / "results" / f"{args.out}.json").read_text()))
        (HERE / "results" / f"{args.out}.md").write_text(md)
        print(md)
        return
    prov: dict[str, Any] = {
        "command": "nice -n 5 python benchmarks/storage_overhead.py" + "".join(
            f" {a}" for a in sys.argv[1:]),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
        "dirty": bool(subprocess.run(["git", "status", "--porcelain", "trainer", "swarm"], cwd=ROOT, capture_output=True,
                                     text=True).stdout.strip()),
        "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}",
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "niceness": os.nice(0),
    }
    res: dict[str, Any] = {}

    def stamp(part: str, loads: list[float]) -> None:
        res[part]["provenance"] = {**prov, "load": [min(loads), max(loads)]}

    load0 = os.getloadavg()[0]
    if args.part in ("all", "overhead"):
        res["overhead"] = overhead(args.repeats, args.steps)
        stamp("overhead", [load0, os.getloadavg()[0]] + [r["load_before"][0] for r in res["overhead"]["runs"]])
        res["overhead_verdict"] = overhead_verdict(res["overhead"]["ratios"])
    if args.part in ("all", "resume"):
        load1 = os.getloadavg()[0]
        res["resume"] = resume(args.resumes, args.dead_s)
        stamp("resume", [load1, os.getloadavg()[0]] + [r["load_before"][0] for r in res["resume"]["resumes"]])
        res["resume_verdict"] = (f"Verdict: max {res['resume']['max_s']:.2f} s, "
                                 + ("within" if res["resume"]["max_s"] <= 10 else "over") + " the ≤ 10 s target.")
    if args.part in ("all", "passes"):
        load1 = os.getloadavg()[0]
        res["passes"] = passes([int(x) for x in args.pass_sizes.split(",")], args.pass_repeats)
        stamp("passes", [load1, os.getloadavg()[0]])
    path = HERE / "results" / f"{args.out}.json"
    if path.exists():   # the parts not run now keep their results (read now: another part may have run meanwhile)
        old = json.loads(path.read_text())
        for k in ("overhead", "resume", "passes"):
            if k not in res and k in old:
                res[k] = old[k]
                if f"{k}_verdict" in old:
                    res[f"{k}_verdict"] = old[f"{k}_verdict"]
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    md = report(res)
    (HERE / "results" / f"{args.out}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
