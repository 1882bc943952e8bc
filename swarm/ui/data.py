"""What the cockpit shows, read from swarm workspaces (sqlite, git, the run's JSONL streams).

    runs = discover(pathlib.Path("runs"))          # {"demo-20261201-101500": Path(...), ...}
    view = RunView("demo", runs["demo"])
    view.overview()                                # status, target progress, budget spent, approvals
    svg = view.curves_svg(max_points=800)          # downsampled on the server

Nothing here writes a workspace: the actions a human takes go through `swarm.cli.queue_human` /
`request_stop`, the same functions as the CLI. Everything shown comes from files the controller
and the trainer write; text that came from a model (diagnoses, rationales, sample trajectories)
is rendered by templates with autoescaping, never as HTML.

Long runs: curves and target progress come from the trainer's bounded history of the metrics
stream (`trainer.runlog.metrics_history`: its downsampled summary plus the rows written since),
re-read only when the stream changed, and are downsampled again per run segment and per plotted key
to the minimum and maximum of each bucket of rows, so a spike survives and the SVG stays a few
hundred points; the drawn SVG is kept until the metrics or the marks change.
"""
from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import time
from typing import Any

import yaml

from agents.domain import Intervention, Status
from swarm.plots import PANELS, curves, to_svg

log = logging.getLogger(__name__)
PLOTTED = tuple(k for _, keys in PANELS for k in keys)
OPEN_STATUSES = (Status.PROPOSED, Status.BACKTESTING, Status.VALIDATED, Status.AWAITING_APPROVAL,
                 Status.APPLIED, Status.EVALUATING)


_SKIPPED: set[str] = set()


def discover(root: pathlib.Path, depth: int = 3) -> dict[str, pathlib.Path]:
    """Workspaces (folders holding `.swarm/state.db`) at or below `root`, at most `depth` levels
    down, by their path relative to `root` ("." for `root` itself). One whose state database is a
    symbolic link, a FIFO, a folder or not a database is left out with a warning: opening it would
    follow the link or block (`swarm.store.state_db_problem`)."""
    from swarm.store import state_db_problem

    root = root.resolve()
    found: dict[str, pathlib.Path] = {}
    frontier = [root]
    for _ in range(depth + 1):
        nxt = []
        for d in frontier:
            db = d / ".swarm" / "state.db"
            if os.path.lexists(db):
                problem = state_db_problem(db)
                if problem is None:
                    found[str(d.relative_to(root)) if d != root else "."] = d
                elif problem not in _SKIPPED:   # discovery runs every few seconds: warn once
                    _SKIPPED.add(problem)
                    log.warning("skipping workspace %s: %s", d, problem)
                continue            # a workspace's own folders are not other workspaces
            try:
                nxt += [c for c in sorted(d.iterdir()) if c.is_dir() and not c.name.startswith(".")]
            except OSError:
                continue
        frontier = nxt
    return found


class StreamTail:
    """The rows appended to a JSONL stream since the last call (`agents.evidence.Tail`: only new
    bytes are parsed, the stream's rotation is followed, a replaced file is read again from the
    start). `reset` tells whether the last call started over."""

    def __init__(self, path: pathlib.Path) -> None:
        from agents.evidence import Tail

        self.path, self._tail, self.reset = path, Tail(keep=1), False

    def new_rows(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []

        def restart() -> None:
            out.clear()
            self.reset = True

        self.reset = False
        self._tail.rows(self.path, on_row=out.append, on_reset=restart)
        return out


def downsample(rows: list[dict[str, Any]], max_points: int = 800, keys: tuple[str, ...] = PLOTTED) -> list[dict[str, Any]]:
    """At most about `max_points` rows per plotted key that draw the same curves: within each run
    segment the rows are cut into buckets of consecutive rows, and each bucket keeps, for every key,
    the rows holding its minimum and its maximum (so spikes and dips survive), plus every row with a
    non-finite value (drawn as marks) and the segment's first and last rows. Sparse keys (held-out
    evals) with fewer rows than the budget keep all their rows."""
    live = [r for r in rows if not r.get("final")]
    if len(live) <= max_points:
        return live
    by_seg: dict[int, list[int]] = {}
    for i, r in enumerate(live):
        by_seg.setdefault(int(r.get("segment", 0) or 0), []).append(i)
    keep: set[int] = set()
    for key in keys:
        holders = [i for i in range(len(live)) if key in live[i]]
        if len(holders) <= max_points:
            keep.update(holders)
            continue
        n_buckets = max(1, max_points // 2)
        for idx in by_seg.values():
            idx = [i for i in idx if key in live[i]]
            if not idx:
                continue
            share = max(1, round(n_buckets * len(idx) / len(holders)))
            size = max(1, math.ceil(len(idx) / share))
            keep.update((idx[0], idx[-1]))
            for b in range(0, len(idx), size):
                lo = hi = None
                for i in idx[b:b + size]:
                    v = live[i].get(key)
                    if not isinstance(v, (int, float)) or isinstance(v, bool):
                        continue
                    if not math.isfinite(v):
                        keep.add(i)
                        continue
                    if lo is None or v < live[lo][key]:
                        lo = i
                    if hi is None or v > live[hi][key]:
                        hi = i
                keep.update(x for x in (lo, hi) if x is not None)
    return [live[i] for i in sorted(keep)]


def finite_values(rows: list[dict[str, Any]], metric: str) -> list[float]:
    """`metric`'s finite values in training and eval rows (not the end-of-run rows), in order."""
    return [float(r[metric]) for r in rows if isinstance(r.get(metric), (int, float)) and not isinstance(r.get(metric), bool)
            and math.isfinite(r[metric]) and not r.get("final")]


def _goal(ws_root: pathlib.Path) -> dict[str, Any]:
    """The public goal (goal.yaml on main, never the private copy that names perturbations)."""
    from swarm.workspace import Workspace

    try:
        return yaml.safe_load(Workspace.open(ws_root).goal_text()) or {}
    except (ValueError, yaml.YAMLError):
        return {}


def _alive(pid: int | None) -> bool:
    import psutil

    try:
        return bool(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class RunView:
    """One workspace as the cockpit reads it. Cheap to keep: the store connection and the metrics
    tail are reused across requests."""

    def __init__(self, name: str, root: pathlib.Path) -> None:
        from swarm.store import Store

        self.name, self.root = name, pathlib.Path(root)
        self.sdir = self.root / ".swarm"
        self.store = Store(self.sdir / "state.db")
        self.run_dir = self.sdir / "runs" / "train"
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self._goal: dict[str, Any] | None = None
        self._history: tuple[Any, list[dict[str, Any]]] = (None, [])
        self._svg: tuple[Any, str] = (None, "")

    def close(self) -> None:
        self.store.close()

    @property
    def goal(self) -> dict[str, Any]:
        if self._goal is None:
            self._goal = _goal(self.root)
        return self._goal

    def workspace(self):
        from swarm.workspace import Workspace

        return Workspace.open(self.root)

    # ---- the overview (runs page row, run page header) -----------------------------------------
    def _json(self, name: str) -> dict[str, Any]:
        try:
            return json.loads((self.sdir / name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def state(self) -> tuple[str, str]:
        """("running" | "finished" | "stopped", a detail)."""
        from swarm.store import lock_holder

        summary = self._json("summary.json")
        if summary:
            return "finished", str(summary.get("reason") or "")
        pid = lock_holder(self.root)
        if _alive(pid):
            return "running", f"controller pid {pid}"
        return "stopped", "no controller (swarm resume continues it)"

    @property
    def target_metric(self) -> str:
        return str((self.goal.get("target") or {}).get("metric", "heldout_acc"))

    def target(self, values: list[float] | None = None) -> dict[str, Any]:
        """Progress toward the goal's target; `values` (the target metric's finite values, oldest
        first) when the caller tails the stream itself, else read from the bounded history."""
        t = self.goal.get("target") or {}
        metric, op, thr = self.target_metric, str(t.get("op", ">=")), float(t.get("threshold", 0.95))
        if values is None:
            values = finite_values(self.history(), metric)
        latest = values[-1] if values else None
        best = (max(values) if op == ">=" else min(values)) if values else None
        met = latest is not None and (latest >= thr if op == ">=" else latest <= thr)
        progress = None
        if latest is not None and op == ">=" and thr > 0:
            progress = max(0.0, min(1.0, latest / thr))
        elif latest is not None and op == "<=" and latest > 0:
            progress = max(0.0, min(1.0, thr / latest))
        return {"metric": metric, "op": op, "threshold": thr, "latest": latest, "best": best, "met": met,
                "progress": progress, "values": values}

    def _metrics_sig(self) -> tuple[Any, ...]:
        out = []
        for p in (self.metrics_path, self.run_dir / "metrics_summary.json"):
            try:
                st = os.stat(p)
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except FileNotFoundError:
                out.append(None)
        return tuple(out)

    def history(self) -> list[dict[str, Any]]:
        """The run's metrics, bounded however long it ran: the trainer's downsampled summary plus
        every row written after it (`trainer.runlog.metrics_history`), re-read only when the
        stream or the summary changed."""
        from trainer.runlog import metrics_history

        sig = self._metrics_sig()
        if sig != self._history[0]:
            self._history = (sig, metrics_history(self.run_dir))
        return self._history[1]

    def live_cpu(self) -> float:
        """Worker CPU seconds the trainers' heartbeats report now: the live job's current process
        and every backtest arm still on disk. A lower bound of the run's total (earlier segments
        and deleted arms are missing), so the budget shown is the larger of it and the status file's
        exact total as of its last write (which a backtest of many seconds can leave behind)."""
        from trainer.runlog import read_heartbeat

        dirs = [self.run_dir, *sorted((self.sdir / "backtests").glob("*/"))]
        return math.fsum(float((read_heartbeat(d) or {}).get("cpu_s") or 0.0) for d in dirs)

    def budget(self) -> list[dict[str, Any]]:
        """Spent against the goal's budget, from the controller's status file (current as of the
        last timeline change) and the live heartbeat."""
        from trainer.runlog import read_heartbeat

        b = self.goal.get("budget") or {}
        s = self._json("summary.json") or self._json("status.json")
        hb = read_heartbeat(self.run_dir) or {}
        steps = max(int(s.get("steps") or 0), int(hb.get("step") or 0))
        llm = (s.get("llm") or {}).get("cost_usd", 0.0)
        started = next((r["started"] for r in self.store.runs()), None)
        wall = s.get("wall_s") or 0.0
        if self.state()[0] == "running" and started:
            wall = max(wall, time.time() - started)
        out = []
        for key, label, spent, unit in (("steps", "steps", steps, ""), ("wall_s", "wall clock", wall, "s"),
                                        ("worker_cpu_s", "worker CPU", max(float(s.get("worker_cpu_s") or 0.0), self.live_cpu()), "s"),
                                        ("llm_usd", "LLM spend", llm or 0.0, "$")):
            limit = b.get(key)
            frac = min(1.0, spent / limit) if isinstance(limit, (int, float)) and limit > 0 else None
            out.append({"key": key, "label": label, "spent": spent, "limit": limit, "unit": unit, "fraction": frac})
        return out

    def interventions(self) -> list[Intervention]:
        return self.store.list()

    def overview(self, values: list[float] | None = None) -> dict[str, Any]:
        state, detail = self.state()
        ivs = self.interventions()
        counts: dict[str, int] = {}
        for iv in ivs:
            counts[iv.status.value] = counts.get(iv.status.value, 0) + 1
        from trainer.runlog import read_heartbeat

        hb = read_heartbeat(self.run_dir) or {}
        return {"name": self.name, "root": str(self.root), "state": state, "detail": detail,
                "goal": str(self.goal.get("goal") or ""), "target": self.target(values), "budget": self.budget(),
                "step": hb.get("step"), "job_state": hb.get("state"),
                "awaiting": [iv for iv in ivs if iv.status == Status.AWAITING_APPROVAL],
                "open": [iv for iv in ivs if iv.status in OPEN_STATUSES], "counts": counts}

    # ---- the run page ---------------------------------------------------------------------------
    def marks(self) -> list[tuple[int, str]]:
        return [(iv.applied_step, f"{iv.id} {iv.kind.value}") for iv in self.interventions() if iv.applied_step is not None]

    def curves_svg(self, max_points: int = 800) -> str:
        """The curves as SVG, from at most about `max_points` rows per key (drawn again only when
        the metrics or the intervention marks changed)."""
        marks = self.marks()
        key = (self._metrics_sig(), tuple(marks), max_points)
        if key != self._svg[0]:
            rows = downsample(self.history(), max_points)
            t = self.target()
            chart = curves(rows, marks=marks, target=(t["metric"], t["threshold"]), title="")
            self._svg = (key, to_svg(chart, width=900, panel_h=170).decode())
        return self._svg[1]

    def timeline(self, limit: int = 200) -> list[dict[str, Any]]:
        """The newest `limit` timeline rows, newest first, each with a one-line summary."""
        last = self.store.last_seq()
        rows = self.store.timeline(since=max(0, last - limit))
        t0 = next((r["started"] for r in self.store.runs()), rows[0]["time"] if rows else 0.0)
        out = []
        for r in reversed(rows):
            data = {k: v for k, v in r.items() if k not in ("seq", "time", "kind")}
            iid = data.pop("id", None)
            out.append({"seq": r["seq"], "t": r["time"] - t0, "kind": r["kind"], "id": iid,
                        "details": ", ".join(f"{k}={_short(v)}" for k, v in data.items())})
        return out

    def harness_recipe(self) -> tuple[str, str]:
        ws = self.workspace()
        return (yaml.safe_dump(ws.current_harness(), sort_keys=False), yaml.safe_dump(ws.current_recipe(), sort_keys=False))

    def live_harness_version(self) -> str | None:
        return next((r.get("harness_version") for r in reversed(self.history()) if r.get("harness_version")), None)

    def signature(self) -> tuple[Any, ...]:
        """Changes when anything the pages show changes (for server-sent events)."""
        msig = self._metrics_sig()
        stat = []
        for n in ("status.json", "summary.json", "controller.lock"):
            try:
                stat.append(os.stat(self.sdir / n).st_mtime_ns)
            except FileNotFoundError:
                stat.append(None)
        return (msig, self.store.last_seq(), *stat)

    # ---- an intervention --------------------------------------------------------------------------
    def intervention_page(self, iid: str) -> dict[str, Any]:
        """Everything the PR page shows; KeyError for an unknown id."""
        iv = self.store.get(iid)
        ws = self.workspace()
        try:
            state = ws.pr_state(iid)
            report, diff = ws.report(iid), ws.diff(iid)
            files = self.pr_files(iid)
        except ValueError:
            state, report, diff, files = None, "", "", []
        actions = [r for r in self.store.timeline() if r.get("id") == iid and str(r.get("kind", "")).startswith("human_")]
        return {"iv": iv, "pr_state": state, "report": report, "diff": diff, "files": files, "actions": actions}

    def pr_files(self, iid: str) -> list[str]:
        ws = self.workspace()
        try:
            tree = ws._tip(iid).tree / f"reports/{iid}"
        except (KeyError, AssertionError):
            return []
        return [b.name for b in tree.blobs if b.name not in ("REPORT.md", "intervention.json")]

    def pr_file(self, iid: str, name: str) -> bytes | None:
        """An attachment of the PR (a plot), None when it has no such file."""
        if name not in self.pr_files(iid):
            return None
        ws = self.workspace()
        return (ws._tip(iid).tree / f"reports/{iid}/{name}").data_stream.read()

    # ---- skills -------------------------------------------------------------------------------------
    def skills(self) -> tuple[list[dict[str, Any]], list[str]]:
        from memory import Memory, library_root
        from skills import SkillLibrary, utility_from_episodes

        library = None
        goal = self.sdir / "private" / "goal.yaml"
        if goal.is_file():
            library = ((yaml.safe_load(goal.read_text()) or {}).get("memory") or {}).get("library")
        skills, errors = SkillLibrary(self.root / "skills").load()
        mem = Memory.open(library_root(self.root, library), backend="memory")
        try:
            util = utility_from_episodes(mem.episodes(), mem.retrievals())
        finally:
            mem.close()
        out = []
        for sk in skills:
            sw, u = sk.swarmlab, util.get(sk.name)
            iv = sw.intervention if sw is not None else None
            out.append({"name": sk.name, "active": sk.active, "version": sw.version if sw else None,
                        "diagnosis": (sw and sw.diagnosis) or "", "description": getattr(sk, "description", ""),
                        "intervention": f"{iv.kind} {','.join(iv.fields)}" if iv is not None else "",
                        "retrieved": u.retrieved if u else 0, "applied": u.applied if u else 0,
                        "wins": u.wins if u else 0, "losses": u.losses if u else 0,
                        "mean_effect": u.mean_effect if u else None})
        return out, [str(e) for e in errors]


def _short(v: Any, n: int = 80) -> str:
    if isinstance(v, float):
        s = f"{v:.4g}"
    elif isinstance(v, (dict, list)):
        s = json.dumps(v, default=str)
    else:
        s = str(v)
    return s if len(s) <= n else s[:n] + "…"
