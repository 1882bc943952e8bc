"""The private Ray head's own CPU: `start_head` as shipped (`quiet`) against Ray's defaults, side by side.

`trainer.launch.start_head` turns off three things nothing here uses: the log monitor
(`--include-log-monitor=false`), the idle workers prestarted when the first driver connects
(`RAY_prestart_worker_first_driver=0`) and the dashboard agent's 5-second psutil sweep
(`REPORTER_UPDATE_INTERVAL_MS=60000`). This script measures what that saves. Two configurations:

  quiet         `start_head()`, as every `swarm run` starts its head
  ray-defaults  `start_head(quiet=False)`: the same head with Ray's own defaults for those three

Each round runs both, in alternating order (quiet first in even rounds), so that a machine whose
load drifts over the run favours neither. One run: start the head, settle, sample the CPU time of
the head's own processes (`_head_processes`: GCS, raylet, dashboard and its module processes,
dashboard and runtime-env agents, autoscaler monitor, client server, log monitor, idle workers)
over an idle window; then submit a job through the Jobs API (with the head's token, as
trainer.launch does) whose entrypoint prints a marker and sleeps, wait until it runs, settle, and
sample again with the job supervisor counted and the job's own processes (its shell and Python)
left out. The job's logs must hold the marker through the Jobs API in both configurations (job logs
come from the supervisor's own file, not the log monitor). Then the job is stopped, the head is
stopped, and no process of it (the job's included), no temp folder and no token file may be left.

A process's CPU is user + system time plus that of its children it has reaped (short-lived ones such
as the job supervisor's watcher's `sleep 1` would otherwise be missed). CPU is per wall second, in %
of one core. Reported: the median over rounds per configuration and window, quiet / ray-defaults
(ratio of the medians, and the per-round paired ratios' range), the spread (min..max) and the
median per process kind. The machine's own load is recorded beside every window: on a shared
machine the absolute numbers move between sittings; compare the ratio.

    .venv/bin/python benchmarks/ray_head_cpu.py                 # 3 rounds, 10 s settle, 25 s windows
    .venv/bin/python benchmarks/ray_head_cpu.py --rounds 5 --out   # benchmarks/results/ray_head_cpu.{json,md}

Needs a local Ray (the project's venv) and about 4 minutes per round (3 rounds: 12 min on 2 cores).
Refuses to run when the environment already sets one of `HEAD_QUIET_ENV`'s variables: `ray-defaults`
would not be Ray's.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import platform
import shlex
import statistics
import subprocess
import sys
import time
import uuid

HERE = pathlib.Path(__file__).resolve().parent
sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from trainer.launch import HEAD_QUIET_ENV, RayHead, _head_processes, start_head, stop_head  # noqa: E402

CONFIGS = {"quiet": True, "ray-defaults": False}   # name -> start_head(quiet=...)
WINDOWS = ("idle", "job")
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "ray_head_cpu"


def kind(p: psutil.Process) -> str:
    """What a head process is, from its command line (Ray names most of its processes `ray::X`)."""
    try:
        args = p.cmdline()
    except psutil.Error:
        return "gone"
    line = " ".join(args)
    first = args[0] if args else p.name()
    if first.startswith("ray::"):
        return first.split()[0]
    if first.startswith("ray-dashboard-"):
        return "dashboard module " + first.split()[0][len("ray-dashboard-"):].rsplit("-", 1)[0]
    for needle, name in (("gcs_server", "gcs_server"), ("raylet/raylet", "raylet"),
                         ("log_monitor.py", "log_monitor"), ("autoscaler/_private/monitor.py", "autoscaler monitor"),
                         ("ray.util.client.server", "client server"), ("dashboard/dashboard.py", "dashboard"),
                         ("multiprocessing.forkserver", "dashboard forkserver"),
                         ("multiprocessing.resource_tracker", "dashboard resource tracker"),
                         ("while kill -s 0", "job watcher (sh)")):
        if needle in line:
            return name
    return pathlib.Path(first).name


def cpu_of(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def sample(head: RayHead, exclude: set[int]) -> dict[int, tuple[str, float]]:
    out = {}
    for p in _head_processes(head):
        if p.pid in exclude:
            continue
        try:
            out[p.pid] = (kind(p), cpu_of(p))
        except psutil.Error:
            pass
    return out


def window(head: RayHead, seconds: float, exclude: set[int]) -> dict:
    """The head's CPU over `seconds` of wall time, in % of one core, total and per process kind;
    the machine's whole CPU use over the same window beside it (% of all its cores)."""
    m0, a, t0 = psutil.cpu_times(), sample(head, exclude), time.monotonic()
    time.sleep(seconds)
    b, wall, m1 = sample(head, exclude), time.monotonic() - t0, psutil.cpu_times()
    by: collections.Counter = collections.Counter()
    for pid, (k, c) in b.items():
        before = a.get(pid)
        by[k] += c - (before[1] if before and before[0] == k else 0.0)
    busy = lambda t: t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)  # noqa: E731
    total = lambda t: busy(t) + t.idle + getattr(t, "iowait", 0.0)  # noqa: E731
    return {"head_pct": 100 * sum(by.values()) / wall,
            "by_kind": {k: round(100 * v / wall, 3) for k, v in by.most_common()},
            "processes": len(b), "wall_s": round(wall, 2),
            "machine_busy_pct": round(100 * (busy(m1) - busy(m0)) / max(total(m1) - total(m0), 1e-9), 1),
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def job_pids(head: RayHead, marker: str) -> set[int]:
    """The job's own processes: its entrypoint (the shell naming the marker, its Python) and their children."""
    pids: set[int] = set()
    for p in _head_processes(head):
        try:
            if marker in " ".join(p.cmdline()) and "kill -s 0" not in " ".join(p.cmdline()):
                pids.add(p.pid)
                pids.update(c.pid for c in p.children(recursive=True))
        except psutil.Error:
            pass
    return pids


def wait_status(client, job_id: str, wanted: set[str], timeout: float) -> str:
    deadline = time.time() + timeout
    while True:
        st = str(client.get_job_status(job_id).value)
        if st in wanted or time.time() > deadline:
            return st
        time.sleep(0.5)


def one_run(config: str, rnd: int, settle: float, seconds: float, num_cpus: int | None) -> dict:
    res: dict = {"config": config, "round": rnd}
    t = time.monotonic()
    head = start_head(num_cpus=num_cpus, quiet=CONFIGS[config])
    res["start_s"] = round(time.monotonic() - t, 1)
    pids: set[int] = set()
    try:
        time.sleep(settle)
        res["idle"] = window(head, seconds, set())
        marker = f"ray-head-cpu-{config}-{rnd}-{uuid.uuid4().hex[:8]}"
        code = f"print({marker!r}, flush=True); import time; time.sleep(3600)"
        client = head.client()
        job_id = client.submit_job(entrypoint=f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}",
                                   runtime_env={"env_vars": head.auth_env()})
        res["job_status"] = wait_status(client, job_id, {"RUNNING", "FAILED", "STOPPED", "SUCCEEDED"}, 120)
        if res["job_status"] != "RUNNING":
            raise RuntimeError(f"{config} round {rnd}: the sleeping job did not run ({res['job_status']})")
        time.sleep(settle)
        pids = job_pids(head, marker)
        res["job_processes_excluded"] = len(pids)
        res["job"] = window(head, seconds, pids)
        res["logs_readable"] = marker in client.get_job_logs(job_id)
        client.stop_job(job_id)
        res["job_end_status"] = wait_status(client, job_id, {"STOPPED", "FAILED", "SUCCEEDED"}, 30)
    finally:
        stop_head(head)
        left = [p.pid for p in _head_processes(head)]
        left += [p for p in pids if psutil.pid_exists(p)]
        res["left_processes"] = left
        res["left_paths"] = [str(x) for x in (pathlib.Path(head.temp_dir).parent, pathlib.Path(head.token_path))
                             if x.exists()]
    return res


def med(runs: list[dict], config: str, win: str, key: str = "head_pct") -> float:
    return statistics.median(r[win][key] for r in runs if r["config"] == config)


def summarize(runs: list[dict]) -> dict:
    s: dict = {"median": {}, "spread": {}, "ratio": {}, "paired_ratios": {}, "by_kind": {}, "machine_busy_pct": {}}
    for win in WINDOWS:
        for c in CONFIGS:
            vals = [r[win]["head_pct"] for r in runs if r["config"] == c]
            s["median"][f"{c}/{win}"] = round(statistics.median(vals), 3)
            s["spread"][f"{c}/{win}"] = [round(min(vals), 3), round(max(vals), 3)]
            s["machine_busy_pct"][f"{c}/{win}"] = round(med(runs, c, win, "machine_busy_pct"), 1)
            kinds = sorted({k for r in runs if r["config"] == c for k in r[win]["by_kind"]})
            s["by_kind"][f"{c}/{win}"] = {k: round(statistics.median(r[win]["by_kind"].get(k, 0.0) for r in runs
                                                                     if r["config"] == c), 3) for k in kinds}
        s["ratio"][win] = round(med(runs, "quiet", win) / med(runs, "ray-defaults", win), 3)
        rounds = sorted({r["round"] for r in runs})
        pair = []
        for i in rounds:
            q = [r for r in runs if r["round"] == i and r["config"] == "quiet"]
            d = [r for r in runs if r["round"] == i and r["config"] == "ray-defaults"]
            if q and d:
                pair.append(round(q[0][win]["head_pct"] / d[0][win]["head_pct"], 3))
        s["paired_ratios"][win] = pair
    return s


def machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor() or "?")
    import ray

    return (f"{platform.machine()}, {os.cpu_count()} logical CPUs ({model}), Python {platform.python_version()}, "
            f"Ray {ray.__version__}")


def code_state() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "HEAD") or "?"
    dirty = git("status", "--porcelain", "--", "trainer/launch.py", "benchmarks/ray_head_cpu.py")
    return head + (" plus uncommitted changes to trainer/launch.py / this script" if dirty else "")


def markdown(data: dict) -> str:
    s, a = data["summary"], data["args"]
    # how the kinds group in the table: one line per kind whose median is >= 0.05% in some column
    cols = [f"{c}/{w}" for w in WINDOWS for c in CONFIGS]
    kinds = sorted({k for col in cols for k, v in s["by_kind"][col].items() if v >= 0.05},
                   key=lambda k: -s["by_kind"]["ray-defaults/job"].get(k, 0.0))
    lines = [
        "# CPU of the private Ray head: quiet (as shipped) vs Ray's defaults",
        "",
        f"Command: `{data['command']}`.  ",
        f"Code: {data['code']}. Machine: {data['machine']}.",
        "",
        f"{a['rounds']} rounds, each running both configurations in alternating order; per run a "
        f"{a['settle']:g} s settle, a {a['window']:g} s idle window, then a job that only sleeps "
        f"(its own processes excluded, the job supervisor counted), {a['settle']:g} s settle and a "
        f"{a['window']:g} s window. CPU of the head's own processes per wall second, in % of one core; "
        "medians over rounds.",
        "",
        "This machine is shared with other agents' jobs (2 cores) and was measured under load: the "
        "machine-wide CPU use during the windows (% of all cores, this head included) is in the last column, and the absolute numbers move "
        "between sittings. Compare the ratio, measured side by side.",
        "",
        "| window | quiet % | ray-defaults % | quiet / ray-defaults | paired ratios per round | spread quiet | spread ray-defaults | machine busy %, all cores (q / d) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in WINDOWS:
        q, d = s["spread"][f"quiet/{w}"], s["spread"][f"ray-defaults/{w}"]
        lines.append(f"| {'idle head' if w == 'idle' else 'a job running'} | {s['median'][f'quiet/{w}']:.2f} | "
                     f"{s['median'][f'ray-defaults/{w}']:.2f} | **{s['ratio'][w]:.2f}×** | "
                     f"{', '.join(f'{x:.2f}' for x in s['paired_ratios'][w])} | {q[0]:.2f}–{q[1]:.2f} | "
                     f"{d[0]:.2f}–{d[1]:.2f} | {s['machine_busy_pct'][f'quiet/{w}']:.0f} / "
                     f"{s['machine_busy_pct'][f'ray-defaults/{w}']:.0f} |")
    lines += ["", "Per process kind (median % of one core; kinds under 0.05% everywhere left out):", "",
              "| process | " + " | ".join(c.replace("/", ", ") for c in cols) + " |",
              "|---|" + "---|" * len(cols)]
    for k in kinds:
        lines.append(f"| {k} | " + " | ".join(f"{s['by_kind'][c].get(k, 0.0):.2f}" if k in s["by_kind"][c] else "—"
                                             for c in cols) + " |")
    mods = {c: sum(v for k, v in s["by_kind"][c].items() if k.startswith("dashboard module ")) for c in cols}
    lines.append("| *dashboard modules together* | " + " | ".join(f"{mods[c]:.2f}" for c in cols) + " |")
    ok_logs = all(r["logs_readable"] for r in data["runs"])
    clean = all(not r["left_processes"] and not r["left_paths"] for r in data["runs"])
    lines += ["", f"The job's log line was {'read through the Jobs API in every run, in both configurations' if ok_logs else 'NOT readable in some run'}; "
              f"after `stop_head` {'no process, temp folder or token file of the head was left in any run' if clean else 'something was LEFT in some run (see the JSON)'}.",
              "", "Every run:", "",
              "| round | config | start s | idle % | job % | machine busy % idle / job | load 1m |",
              "|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        lines.append(f"| {r['round']} | {r['config']} | {r['start_s']:.1f} | {r['idle']['head_pct']:.2f} | "
                     f"{r['job']['head_pct']:.2f} | {r['idle']['machine_busy_pct']:.0f} / {r['job']['machine_busy_pct']:.0f} | "
                     f"{r['job']['loadavg_1m']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each running both configurations")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds before each window")
    ap.add_argument("--window", type=float, default=25.0, help="seconds of each sampling window")
    ap.add_argument("--num-cpus", type=int, default=None, help="the head's CPUs (default: Ray's count, as swarm run)")
    ap.add_argument("--out", nargs="?", const=str(DEFAULT_OUT), default=None,
                    help=f"write STEM.json and STEM.md (default stem: {DEFAULT_OUT.relative_to(ROOT)})")
    a = ap.parse_args()
    if a.rounds < 1 or a.window <= 0 or a.settle < 0:
        ap.error(f"--rounds={a.rounds} must be >= 1, --window={a.window} > 0, --settle={a.settle} >= 0")
    preset = sorted(k for k in HEAD_QUIET_ENV if k in os.environ)
    if preset:
        sys.exit(f"ray_head_cpu: {', '.join(preset)} set in the environment: ray-defaults would not be Ray's; unset it")

    runs = []
    for rnd in range(a.rounds):
        order = list(CONFIGS) if rnd % 2 == 0 else list(reversed(CONFIGS))
        for c in order:
            r = one_run(c, rnd, a.settle, a.window, a.num_cpus)
            runs.append(r)
            print(f"round {rnd} {c:12s} idle {r['idle']['head_pct']:5.2f}%  job {r['job']['head_pct']:5.2f}%  "
                  f"(machine busy {r['idle']['machine_busy_pct']:.0f}/{r['job']['machine_busy_pct']:.0f}%)  "
                  f"logs {'ok' if r['logs_readable'] else 'MISSING'}  "
                  f"left {r['left_processes'] or r['left_paths'] or 'nothing'}", flush=True)
    cmd = "python benchmarks/ray_head_cpu.py" + "".join(
        f" {x}" for x in sys.argv[1:])
    data = {"command": cmd, "code": code_state(), "machine": machine(), "args": vars(a),
            "summary": summarize(runs), "runs": runs}
    s = data["summary"]
    for w in WINDOWS:
        print(f"{w:5s} quiet {s['median'][f'quiet/{w}']:.2f}%  ray-defaults {s['median'][f'ray-defaults/{w}']:.2f}%  "
              f"ratio {s['ratio'][w]:.2f}  (paired {s['paired_ratios'][w]})")
    if a.out:
        stem = pathlib.Path(a.out)
        stem.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
        stem.with_suffix(".md").write_text(markdown(data))
        print(f"wrote {stem.with_suffix('.json')} and {stem.with_suffix('.md')}")
    failed = [f"{r['config']} round {r['round']}" for r in runs
              if not r["logs_readable"] or r["left_processes"] or r["left_paths"]]
    if failed:
        sys.exit(f"ray_head_cpu: job logs unreadable or the head not fully stopped in: {', '.join(failed)}")


if __name__ == "__main__":
    main()
