"""Detector calibration: how often each detector fires on the benchmark suite's healthy runs (its
false-alarm rate) and on its faulted ones, replayed tick by tick from the files the runs wrote.

    python benchmarks/detector_calibration.py /tmp/h2/work /tmp/d2/work [--every 25] \
        [--out benchmarks/results/detector_calibration]

Inputs are bench work dirs (`swarm bench ... --workdir W`): `W/runs/<NNNNN>-<scenario>-<method>-s<seed>/`
with the run's `spec.json`, its `result.json` and the trainer's run folder (the folder under `work/`
holding `metrics.jsonl`). Runs of method `oracle` (the scenario's config without its faults) and
`plain` runs of a scenario without faults are the healthy set; `plain` runs with faults (perturbations,
or a run config that differs from the oracle's: a fault in the goal's own config) are the faulted
set, split by whether plain reached the target anyway (`mild`) or not (`failing`). Other methods,
and runs still going (no `result.json`), are counted and left out.

Replay: the run's files are read once, then written back into a scratch folder row by row; at every
tick (a metrics row whose step is a multiple of `--every`; by default the goal's eval interval, or
25 without evals) the scratch folder is read with `agents.evidence.collect` exactly as the
controller reads a live run (metrics window 200, last 50 evals, last 32 samples, events and
acknowledgements written by then), the controller's harness and recipe are filled in
(`Operator.view`), and `run_detectors` runs with the `Known` the controller passes (target metric,
op and threshold, eval difficulty from the goal's curriculum, template from the goal's harness).
A run stops being replayed at the row where it reached its target: a finding after that costs
nothing. The job detectors (`stale_heartbeat`, `crashed_job`) judge the live job's heartbeat and
status, which a replay of files does not have; they are left out (the heartbeat is written fresh
at every tick and the job is RUNNING).

Reported per detector and set: runs where it fired at least once / runs (on healthy runs, the
false-alarm rate per run) and fires / ticks. Results: `<out>.json` and `<out>.md`.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import pathlib
import re
import shutil
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from agents.base import Operator, OperatorContext  # noqa: E402  (imports every detector module)
from agents.detection import DETECTORS, THRESHOLDS, Known, Thresholds, run_detectors  # noqa: E402
from agents.domain import Diagnosis  # noqa: E402
from agents.evidence import collect  # noqa: E402
from swarm.backtest import task_facts  # noqa: E402
from swarm.goal import Goal  # noqa: E402
from trainer.config import ConfigError  # noqa: E402
from trainer.runlog import rotated_parts  # noqa: E402

# judged on the live job (heartbeat age, job status), which files replayed after the fact lack
JOB_DETECTORS = {"stale_heartbeat": "judges the age of the live heartbeat, which a replay writes fresh",
                 "crashed_job": "judges the live job's status, which a replay holds at RUNNING"}
REPLAYED = tuple(n for n in DETECTORS if n not in JOB_DETECTORS)
GROUPS = ("healthy", "mild", "failing")
FLAG_RATE = 0.05           # a detector firing on more healthy runs than this is named in the report
RUN_NAME = re.compile(r"^(\d{5})-(.+)-([a-z0-9]+)-s(\d+)$")


# ---- the runs -----------------------------------------------------------------------------------


@dataclasses.dataclass
class BenchRun:
    """One bench run to replay: where its trainer wrote, what the controller would know of it."""

    name: str
    work: str                    # the bench work dir it came from
    method: str
    scenario: str
    group: str                   # healthy | mild | failing
    trainer_dir: pathlib.Path
    ctx: OperatorContext
    known: Known
    every: int


@dataclasses.dataclass
class Inventory:
    """What a work dir holds: the runs to replay and the counts of those left out."""

    work: str
    suite: str | None
    runs: list[BenchRun]
    by_method: dict[str, int]
    unfinished: int = 0
    other_methods: int = 0
    repeats: int = 0             # earlier finished runs of a scenario, method and seed run again (a resumed bench)
    unreadable: list[str] = dataclasses.field(default_factory=list)


def suite_name(work: pathlib.Path) -> str | None:
    """The suite a bench ran, from the first line of the log beside its work dir, when there is one."""
    for log in (work.parent / "log.txt", work / "log.txt"):
        try:
            m = re.match(r"swarm bench (\S+):", log.read_text(errors="replace").splitlines()[0])
        except (OSError, IndexError):
            continue
        if m:
            return m[1]
    return None


def trainer_dirs(run: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p.parent for p in (run / "work").rglob("metrics.jsonl"))


_FACTS: dict[str, dict[str, Any]] = {}


def facts_of(cfg: dict[str, Any], eval_difficulty: int | None) -> dict[str, Any]:
    """The task's own facts as the controller measures them (swarm.backtest.task_facts), once per task."""
    key = json.dumps([cfg.get("task"), cfg.get("seed"), cfg.get("model"), cfg["recipe"].get("eval_size"), eval_difficulty],
                     sort_keys=True, default=str)
    if key not in _FACTS:
        _FACTS[key] = task_facts(cfg, eval_difficulty)
    return _FACTS[key]


def context(spec: dict[str, Any]) -> tuple[OperatorContext, Known, int]:
    """The controller's context for a bench run's goal (swarm/controller.py `context` and `known`):
    the goal's harness and recipe, its target at the bench's threshold, the eval difficulty."""
    g = Goal.parse(spec["goal"])
    cfg = g.run_config("train", "/nonexistent").model_dump(mode="json")
    target = g.target.model_copy(update={"threshold": float(spec.get("target", g.target.threshold))})
    cur = cfg["harness"]["curriculum"]
    asked = cur.get("end") or cur["start"]
    ctx = OperatorContext(goal=g.goal, target=target, recipe=cfg["recipe"], harness=cfg["harness"],
                          start_harness=cfg["harness"], eval_difficulty=asked,
                          settled_since=0.0,     # a run without agents: nothing changed by a controller
                          **facts_of(cfg, asked))     # measured by the controller at its first look
    known = dataclasses.replace(ctx.known(), stale_heartbeat_s=g.swarm.stale_heartbeat_s, since_launch_s=None)
    return ctx, known, int(cfg["recipe"].get("eval_interval") or 0)


def inventory(work: pathlib.Path, every: int | None) -> Inventory:
    """The oracle and plain runs of a bench work dir that finished, grouped; of a scenario, method
    and seed run more than once (a bench resumed after an interruption starts its numbering over),
    the newest finished run."""
    inv = Inventory(work=str(work), suite=suite_name(work), runs=[], by_method={})
    newest: dict[str, tuple[float, pathlib.Path]] = {}
    for d in (work / "runs").glob("*/"):
        m = RUN_NAME.match(d.name)
        key = f"{m[2]}-{m[3]}-s{m[4]}" if m else d.name
        try:
            t = (d / "result.json").stat().st_mtime
        except FileNotFoundError:
            t = -1.0
        if key in newest:
            inv.repeats += 1
        if key not in newest or t > newest[key][0]:
            newest[key] = (t, d)
    # the oracle's run config per scenario (its faults removed): a plain run whose config differs
    # from it carries a fault written in the goal's own config, with no perturbation to show it
    clean: dict[str, Any] = {}
    for d in sorted(d for _, d in newest.values()):
        try:
            spec = json.loads((d / "spec.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        m = RUN_NAME.match(d.name)
        if spec.get("method") == "oracle" and m:
            clean[m[2]] = (spec.get("goal") or {}).get("run")
    for d in sorted(d for _, d in newest.values()):
        spec_path = d / "spec.json"
        if not spec_path.exists():
            continue
        try:
            spec = json.loads(spec_path.read_text())
        except (OSError, json.JSONDecodeError):
            inv.unreadable.append(f"{d.name}: spec.json unreadable")
            continue
        method = str(spec.get("method"))
        inv.by_method[method] = inv.by_method.get(method, 0) + 1
        if method not in ("oracle", "plain"):
            inv.other_methods += 1
            continue
        try:
            result = json.loads((d / "result.json").read_text())
        except FileNotFoundError:
            inv.unfinished += 1
            continue
        except (OSError, json.JSONDecodeError):
            inv.unreadable.append(f"{d.name}: result.json unreadable")
            continue
        m = RUN_NAME.match(d.name)
        goal = spec.get("goal") or {}
        faulted = method == "plain" and (bool(goal.get("perturbations"))
                                         or (m is not None and m[2] in clean and goal.get("run") != clean[m[2]]))
        group = ("mild" if result.get("reached") else "failing") if faulted else "healthy"
        try:
            ctx, known, eval_interval = context(spec)
        except (ConfigError, KeyError, TypeError, ValueError) as e:
            inv.unreadable.append(f"{d.name}: goal does not parse ({str(e)[:120]})")
            continue
        scenario = m[2] if m else d.name
        dirs = trainer_dirs(d)
        if not dirs:
            inv.unreadable.append(f"{d.name}: no metrics.jsonl under work/")
            continue
        for t in dirs:
            name = d.name if len(dirs) == 1 else f"{d.name}/{t.relative_to(d)}"
            inv.runs.append(BenchRun(name=name, work=str(work), method=method, scenario=scenario, group=group,
                                     trainer_dir=t, ctx=ctx, known=known, every=every or eval_interval or 25))
    return inv


# ---- replay -------------------------------------------------------------------------------------


Line = tuple[dict[str, Any], bytes]


def read_lines(path: pathlib.Path) -> list[Line]:
    """Every parsed row of a JSONL stream with its raw line, oldest first (rolled parts first)."""
    out: list[Line] = []
    for part in [*rotated_parts(path), path]:
        try:
            with (gzip.open(part, "rb") if part.suffix == ".gz" else open(part, "rb")) as f:
                data = f.read()
        except FileNotFoundError:
            continue
        for raw in data.splitlines():
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(row, dict):
                out.append((row, raw + b"\n"))
    return out


def target_row(metrics: list[Line], known: Known) -> int | None:
    """Index of the first metrics row at which the target metric met the threshold."""
    if known.target_threshold is None:
        return None
    for i, (r, _) in enumerate(metrics):
        v = r.get(known.target_metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if (v >= known.target_threshold) if known.target_op != "<=" else (v <= known.target_threshold):
                return i
    return None


@dataclasses.dataclass
class Replay:
    ticks: list[int]                                  # the step of each tick, in order
    fires: dict[str, list[int]]                       # detector -> steps of the ticks it fired at
    first: dict[str, Diagnosis]                       # detector -> its first finding
    reached_at: int | None                            # step of the row that met the target
    # detector -> the steps it named as where the data changed (good_before_step)
    onsets: dict[str, list[int]] = dataclasses.field(default_factory=dict)


def replay(run_dir: pathlib.Path, ctx: OperatorContext, known: Known, every: int,
           names: tuple[str, ...] = REPLAYED, th: Thresholds = THRESHOLDS) -> Replay:
    """Replay a trainer run folder tick by tick through `collect` and `run_detectors`."""
    if every < 1:
        raise ValueError(f"every={every!r}: must be >= 1")
    metrics = read_lines(run_dir / "metrics.jsonl")
    samples = read_lines(run_dir / "samples.jsonl")
    events = read_lines(run_dir / "events.jsonl")
    acks = read_lines(run_dir / "command_log.jsonl")
    stop = target_row(metrics, known)
    out = Replay(ticks=[], fires={}, first={}, reached_at=int(metrics[stop][0].get("step", 0)) if stop is not None else None)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="detector-replay-")) / "train"
    scratch.mkdir()
    ptr = {"samples": 0, "events": 0, "acks": 0}
    files = {k: open(scratch / f, "ab") for k, f in (("metrics", "metrics.jsonl"), ("samples", "samples.jsonl"),
                                                      ("events", "events.jsonl"), ("acks", "command_log.jsonl"))}

    def feed(key: str, rows: list[Line], upto: Any) -> None:
        i = ptr[key]
        while i < len(rows) and upto(rows[i][0]):
            files[key].write(rows[i][1])
            i += 1
        ptr[key] = i

    try:
        for i, (row, raw) in enumerate(metrics):
            if stop is not None and i >= stop:
                break
            files["metrics"].write(raw)
            step, seg = int(row.get("step", 0)), int(row.get("segment", 0))
            if row.get("final") or step <= 0 or step % every:
                continue
            t = row.get("time")
            # a sample is written during the step its metrics row closes: step k's samples carry k - 1
            feed("samples", samples, lambda s: (int(s.get("segment", 0)), int(s.get("step", 0))) < (seg, step))
            for key, rows in (("events", events), ("acks", acks)):
                feed(key, rows, lambda e: (e["time"] <= t) if isinstance(e.get("time"), (int, float)) and isinstance(t, (int, float))
                     else int(e.get("step", 0)) <= step)
            for f in files.values():
                f.flush()
            (scratch / "heartbeat.json").write_text(json.dumps({"time": time.time(), "step": step, "state": "running"}))
            ev = Operator.view(collect(scratch, "RUNNING"), ctx)
            out.ticks.append(step)
            for d in run_detectors(ev, names, th, known):
                out.fires.setdefault(d.name, []).append(step)
                out.first.setdefault(d.name, d)
                began = d.evidence.get("good_before_step")
                if isinstance(began, int) and began not in out.onsets.get(d.name, []):
                    out.onsets.setdefault(d.name, []).append(began)
    finally:
        for f in files.values():
            f.close()
        shutil.rmtree(scratch.parent, ignore_errors=True)
        collect(scratch)   # the files are gone: the collector's readers forget this folder
    return out


# ---- the report ---------------------------------------------------------------------------------


def tally(results: list[tuple[BenchRun, Replay]], names: tuple[str, ...] = REPLAYED) -> dict[str, Any]:
    """Per set and detector: runs it fired on (at least once), fires, and the totals they divide by
    (runs with at least one tick, their ticks)."""
    out: dict[str, Any] = {}
    for g in GROUPS:
        rs = [rp for run, rp in results if run.group == g and rp.ticks]   # a run never observed cannot alarm
        ticks = sum(len(rp.ticks) for rp in rs)
        det = {}
        for n in names:
            fired = sum(1 for rp in rs if rp.fires.get(n))
            fires = sum(len(rp.fires.get(n, [])) for rp in rs)
            det[n] = {"runs_fired": fired, "run_rate": fired / len(rs) if rs else None,
                      "fires": fires, "tick_rate": fires / ticks if ticks else None}
        alarm = sum(1 for rp in rs if any(d.severity != "info" for d in rp.first.values()))
        out[g] = {"runs": len(rs), "ticks": ticks, "detectors": det,
                  "any_alarm": {"runs_fired": alarm, "run_rate": alarm / len(rs) if rs else None}}
    return out


def severities(results: list[tuple[BenchRun, Replay]]) -> dict[str, str]:
    sev: dict[str, set[str]] = {}
    for _, rp in results:
        for n, d in rp.first.items():
            sev.setdefault(n, set()).add(d.severity)
    return {n: "/".join(sorted(s)) for n, s in sev.items()}


def examples(results: list[tuple[BenchRun, Replay]]) -> dict[str, dict[str, Any]]:
    """Per detector and set, its first finding on the first run it fired on (the numbers behind it)."""
    out: dict[str, dict[str, Any]] = {}
    for run, rp in results:
        for n, d in rp.first.items():
            out.setdefault(n, {}).setdefault(run.group, {"run": run.name, "work": run.work, "step": d.step,
                                                         "summary": d.summary, "severity": d.severity,
                                                         "evidence": d.evidence})
    return out


def build_report(invs: list[Inventory], results: list[tuple[BenchRun, Replay]], command: str,
                 every: int | None) -> dict[str, Any]:
    t = tally(results)
    flagged = [n for n in REPLAYED if (t["healthy"]["detectors"][n]["run_rate"] or 0.0) > FLAG_RATE]
    return {
        "command": command,
        "every": every if every else "the goal's eval interval (25 without evals)",
        "untouched_runs": sum(1 for _, rp in results if not rp.ticks),
        "inputs": [{"work": i.work, "suite": i.suite, "runs_by_method": i.by_method,
                    "replayed": {g: sum(r.group == g for r in i.runs) for g in GROUPS},
                    "unfinished_left_out": i.unfinished, "other_methods_left_out": i.other_methods,
                    "repeats_left_out": i.repeats,
                    "unreadable": i.unreadable} for i in invs],
        "detectors": list(REPLAYED),
        "left_out": JOB_DETECTORS,
        "thresholds": THRESHOLDS.as_dict(),
        "flag_rate": FLAG_RATE,
        "flagged": flagged,
        "severity": severities(results),
        "groups": t,
        "examples": examples(results),
        "runs": [{"run": run.name, "work": run.work, "method": run.method, "scenario": run.scenario, "group": run.group,
                  "every": run.every, "ticks": len(rp.ticks), "last_tick": rp.ticks[-1] if rp.ticks else None,
                  "reached_at_step": rp.reached_at, "fired": rp.fires, "onsets": rp.onsets} for run, rp in results],
    }


def _cell(d: dict[str, Any], runs: int, ticks: int) -> tuple[str, str]:
    if not runs:
        return "–", "–"
    rate = f"{d['runs_fired']}/{runs} ({d['runs_fired'] / runs:.0%})"
    per_tick = f"{d['fires']}/{ticks} ({d['fires'] / ticks:.1%})" if ticks else "–"
    return rate, per_tick


def markdown(rep: dict[str, Any]) -> str:
    g = rep["groups"]
    lines = ["# Detector calibration: false alarms on healthy runs, fire rates on faulted ones", "",
             "Each finished oracle and plain run of the bench work dirs below, replayed tick by tick from its files "
             "as the controller reads them (`agents.evidence.collect`, `Operator.view`, `run_detectors` with the "
             "controller's `Known`), up to the row where it reached its target. "
             "**healthy**: oracle runs (the scenario without its faults) and plain runs of fault-free scenarios; "
             "**mild**: plain runs with faults that reached the target anyway; **failing**: plain runs with faults "
             "that did not. A fire on a faulted run is not necessarily a detection (a fault may be in force or not yet).",
             "", f"Command: `{rep['command']}`", "",
             f"Tick: every {rep['every']} steps." if isinstance(rep["every"], int) else f"Tick: every N steps, N = {rep['every']}.",
             "", "Inputs:", ""]
    for i in rep["inputs"]:
        rm = ", ".join(f"{k} {v}" for k, v in sorted(i["runs_by_method"].items()))
        rp = ", ".join(f"{k} {v}" for k, v in i["replayed"].items())
        lines.append(f"- `{i['work']}`{' (' + i['suite'] + ')' if i['suite'] else ''}: runs by method: {rm or 'none'}; "
                     f"finished: {rp}; left out: {i['unfinished_left_out']} oracle/plain still running, "
                     f"{i['other_methods_left_out']} of other methods, {i['repeats_left_out']} older repeats of a run"
                     + (f", {len(i['unreadable'])} unreadable ({'; '.join(i['unreadable'][:3])})" if i["unreadable"] else ""))
    lines += ["", f"Runs (ticks): healthy {g['healthy']['runs']} ({g['healthy']['ticks']}), "
              f"mild {g['mild']['runs']} ({g['mild']['ticks']}), failing {g['failing']['runs']} ({g['failing']['ticks']}); "
              f"left out besides: {rep['untouched_runs']} runs that reached the target at or before their first tick "
              "(nothing to replay).", "",
              "| detector | severity | healthy: runs fired (false alarms) | healthy: fires/ticks | mild: runs fired | "
              "mild: fires/ticks | failing: runs fired | failing: fires/ticks |",
              "|---|---|---|---|---|---|---|---|"]
    for n in rep["detectors"]:
        cells = []
        for grp in GROUPS:
            cells += _cell(g[grp]["detectors"][n], g[grp]["runs"], g[grp]["ticks"])
        mark = " **⚑**" if n in rep["flagged"] else ""
        lines.append(f"| {n}{mark} | {rep['severity'].get(n, '')} | " + " | ".join(cells) + " |")
    alarm = [(f"{g[grp]['any_alarm']['runs_fired']}/{g[grp]['runs']}" if g[grp]["runs"] else "–") for grp in GROUPS]
    lines.append(f"| any non-info finding | | {alarm[0]} | | {alarm[1]} | | {alarm[2]} | |")
    n = g["healthy"]["runs"]
    bound = (f" A detector that fired on none of the {n} healthy runs has a per-run false-alarm rate below "
             f"{1 - 0.05 ** (1 / n):.0%} at 95% confidence (1 − 0.05^(1/{n})): more runs narrow it." if n else "")
    lines += ["", f"⚑: fires on more than {rep['flag_rate']:.0%} of healthy runs. Severity `info` findings are "
              "shown but do not make the controller look for a fix; the last row counts runs with any other finding."
              + bound, ""]
    if rep["flagged"]:
        lines += ["## Detectors that fire on healthy runs", ""]
        for n in rep["flagged"]:
            ex = rep["examples"][n]["healthy"]
            ev = json.dumps(ex["evidence"], sort_keys=True)
            lines += [f"- **{n}** ({g['healthy']['detectors'][n]['runs_fired']}/{g['healthy']['runs']} healthy runs), "
                      f"first on `{ex['run']}` at step {ex['step']}: {ex['summary']}. Evidence: `{ev[:600]}`"]
        lines.append("")
    named = [r for r in rep["runs"] if r.get("onsets")]
    lines += ["## Steps named as where the data changed", "",
              "Each run on which a finding named the step its data changed at (`good_before_step`, which the "
              "data source is read from before): the steps named, over all ticks.", ""]
    lines += [f"- `{r['run']}` ({r['group']}): " + "; ".join(f"`{n}` {', '.join(map(str, steps))}"
                                                          for n, steps in sorted(r["onsets"].items()))
              for r in named] or ["- none"]
    lines += ["", "## Left out", ""]
    lines += [f"- `{n}`: {why}." for n, why in rep["left_out"].items()]
    lines += ["", "## Thresholds (agents/detection.py `Thresholds`, defaults)", "",
              ", ".join(f"`{k}`={v}" for k, v in rep["thresholds"].items()), ""]
    return "\n".join(lines)


# ---- CLI ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", nargs="+", help="bench work dirs (each with runs/<NNNNN>-<scenario>-<method>-s<seed>/)")
    ap.add_argument("--every", type=int, default=None, help="steps between ticks (default: the goal's eval interval, 25 without)")
    ap.add_argument("--out", default=str(HERE / "results" / "detector_calibration"), help="results path without suffix")
    a = ap.parse_args(argv)
    if a.every is not None and a.every < 1:
        print(f"error: --every={a.every}: must be >= 1", file=sys.stderr)
        return 2
    invs = []
    for w in a.work:
        p = pathlib.Path(w)
        if not any((p / "runs").glob("*/spec.json")):
            print(f"error: {w}: no bench runs (expected {w}/runs/<NNNNN>-<scenario>-<method>-s<seed>/spec.json)", file=sys.stderr)
            return 2
        invs.append(inventory(p, a.every))
    results = []
    for inv in invs:
        for run in inv.runs:
            results.append((run, replay(run.trainer_dir, run.ctx, run.known, run.every)))
    argv_shown = " ".join(argv if argv is not None else sys.argv[1:])
    rep = build_report(invs, results, f"python benchmarks/detector_calibration.py {argv_shown}", a.every)
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(markdown(rep))
    print(markdown(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
