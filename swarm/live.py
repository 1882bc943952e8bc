"""Terminal views of a swarm run: the live view of `swarm run` / `swarm demo`, and tables that
keep ids whole at any width.

    follower = Follower(workspace, [LiveView(console)])   # or JsonLines(), EventLines(console)
    follower.start()
    summary = controller.run()                            # in this thread; the view ticks in its own
    follower.stop()                                       # a last tick, so nothing is missed

    console.print(fit_table(console, ["id", "kind", "status", ...], rows, keep=("id",)))

The live view reads only what the run writes (the sqlite timeline and interventions, the
metrics stream, the controller's status file, the goal on main) from a thread of the controller's
process, so the controller's decisions do not know it exists. Each tick hands its sinks the
metric rows and timeline rows new since the last tick (`Tick`) and the run's overview
(`swarm.ui.data.RunView.overview`); a sink that raises is dropped with a warning, never the run.
Sinks: `LiveView` (rich Live: step, the target metric against its threshold with a sparkline of
the evals, budget bars, open interventions and their stage, the newest events), `EventLines`
(one plain line per event, for a pipe), `JsonLines` (one JSON object per event, for scripts),
`Notify` (a command run when an intervention starts waiting for approval and when the run
ends) and `swarm.tensorboard.TensorBoardSink`.

Rich shrinks every column of a table wider than the terminal and cuts cells with an ellipsis, so
at 80 columns (a pipe, a narrow terminal) an id would read "4a29…" — and the id is what
`swarm approve ID` needs. `fit_table` never cuts a cell: it adds columns in the order given (most
important first) while the table still fits, and names the columns it left out in the caption;
`--json` on the commands gives every field.
"""
from __future__ import annotations

import json
import logging
import pathlib
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, TextIO

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

log = logging.getLogger(__name__)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], cols: list[int], caption: str | None) -> Table:
    t = Table(box=box.SIMPLE_HEAD, caption=caption, caption_justify="left")
    for i in cols:
        t.add_column(header[i], no_wrap=True, overflow="ignore")
    for r in rows:
        t.add_row(*(r[i] for i in cols))
    return t


def fit_table(console: Console, header: Sequence[str], rows: Sequence[Sequence[str]],
              keep: Sequence[str] = ("id",)) -> Table:
    """A table of `rows` whose cells are never cut or wrapped. Columns are taken in `header`'s
    order while the table fits `console.width`; the `keep` columns are always there (wider than
    the terminal if they must: a terminal then wraps the line, an id stays whole). Columns left
    out are named in the caption."""
    missing = [k for k in keep if k not in header]
    if missing:
        raise ValueError(f"fit_table: keep columns {missing} are not in the header {list(header)}")
    cols = [i for i, h in enumerate(header) if h in keep]
    unbounded = console.options.update_width(1_000_000)   # a measurement is otherwise capped at the width
    for i, _ in enumerate(header):
        if i in cols:
            continue
        trial = sorted(cols + [i])
        if console.measure(_table(header, rows, trial, None), options=unbounded).maximum <= console.width:
            cols = trial
    left_out = [h for i, h in enumerate(header) if i not in cols]
    caption = f"not shown at {console.width} columns: {', '.join(left_out)} (--json shows all)" if left_out else None
    return _table(header, rows, cols, caption)


# ---- following a run --------------------------------------------------------------------------------
@dataclass
class Tick:
    """What changed since the last tick."""

    overview: dict[str, Any]                                      # swarm.ui.data.RunView.overview()
    rows: list[dict[str, Any]] = field(default_factory=list)      # new metric rows of the live run
    events: list[dict[str, Any]] = field(default_factory=list)    # new timeline rows
    final: bool = False                                           # the run is over (the last tick)


class Sink(Protocol):
    def update(self, view: Any, tick: Tick) -> None: ...

    def close(self) -> None: ...


class Follower:
    """Tails a workspace in a daemon thread every `interval_s` and hands each sink the `Tick`."""

    def __init__(self, workspace: str | pathlib.Path, sinks: Sequence[Sink], interval_s: float = 0.5) -> None:
        from swarm.ui.data import RunView, StreamTail

        if interval_s <= 0:
            raise ValueError(f"interval_s={interval_s!r}: must be > 0")
        root = pathlib.Path(workspace).resolve()
        self.view = RunView(root.name, root)
        self.sinks = list(sinks)
        self.interval_s = interval_s
        self._metrics = StreamTail(self.view.metrics_path)   # every row once, rotation followed
        self._values: list[float] = []                        # the target metric, from those rows
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> "Follower":
        self._thread = threading.Thread(target=self._loop, name="swarm-follower", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()

    def tick(self, final: bool = False) -> Tick:
        from swarm.ui.data import finite_values

        with self._lock:
            new_rows = self._metrics.new_rows()
            if self._metrics.reset:
                self._values = []
            self._values += finite_values(new_rows, self.view.target_metric)
            events = self.view.store.timeline(since=self._seq)
            if events:
                self._seq = events[-1]["seq"]
            t = Tick(self.view.overview(self._values), list(new_rows), events, final)
            for s in list(self.sinks):
                try:
                    s.update(self.view, t)
                except Exception as e:  # a view must never stop the run: drop it, say so once
                    log.warning("%s stopped following the run: %s: %s", type(s).__name__, type(e).__name__, e)
                    self.sinks.remove(s)
            return t

    def stop(self) -> None:
        """Stop the thread, run a final tick and close the sinks."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        try:
            self.tick(final=True)
        finally:
            for s in self.sinks:
                try:
                    s.close()
                except Exception as e:  # closing a view must not hide the run's outcome
                    log.warning("%s did not close cleanly: %s: %s", type(s).__name__, type(e).__name__, e)
            self.view.close()

    def __enter__(self) -> "Follower":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ---- the sinks ----------------------------------------------------------------------------------------
SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 32, lo: float | None = None, hi: float | None = None) -> str:
    """The last `width` values as block characters between `lo` and `hi` (default: their range)."""
    vals = [v for v in values[-width:]]
    if not vals:
        return ""
    lo = min(vals) if lo is None else lo
    hi = max(vals) if hi is None else hi
    span = hi - lo
    if span <= 0:
        return SPARK[len(SPARK) // 2] * len(vals)
    return "".join(SPARK[max(0, min(len(SPARK) - 1, int((v - lo) / span * (len(SPARK) - 1) + 0.5)))] for v in vals)


def event_line(e: dict[str, Any], t0: float | None = None) -> str:
    """One timeline row as a line: time, kind, the intervention it is about, the rest."""
    data = {k: v for k, v in e.items() if k not in ("seq", "time", "kind", "id")}
    if e.get("kind") == "transition":
        what = f"{data.pop('from', '?')} → {data.pop('to', '?')}" + (f"  {data.pop('note')}" if data.get("note") else "")
        data.pop("note", None)
    else:
        what = ""
    rest = ", ".join(f"{k}={_short(v)}" for k, v in data.items())
    t = f"{e['time'] - t0:7.1f}s " if t0 is not None and isinstance(e.get("time"), (int, float)) else ""
    return f"{t}{e.get('kind', '?')}" + (f" {e['id']}" if e.get("id") else "") + (f" {what}" if what else "") + \
        (f" {rest}" if rest else "")


def _short(v: Any, n: int = 60) -> str:
    s = f"{v:.4g}" if isinstance(v, float) else json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)
    return s if len(s) <= n else s[:n] + "…"


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "—"
    if unit == "$":
        return f"${float(v):.2f}"
    if isinstance(v, float):
        return f"{v:.0f}{unit}" if abs(v) >= 100 else f"{v:.3g}{unit}"
    return f"{v}{unit}"


def render(ov: dict[str, Any], events: Sequence[dict[str, Any]], t0: float | None = None, width: int = 100) -> Panel:
    """The live view of one run: a rich renderable."""
    t = ov["target"]
    steps = next((b for b in ov["budget"] if b["key"] == "steps"), None)
    head = Text.assemble((f"{ov['state']}", "bold green" if ov["state"] == "running" else "bold"),
                         f"  step {_fmt(ov.get('step'))}" + (f"/{_fmt(steps['limit'])}" if steps and steps["limit"] else ""),
                         f"  job {ov.get('job_state') or '—'}")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(justify="right", style="bold", no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    op = "≥" if t["op"] == ">=" else "≤"
    hi = max([t["threshold"], *t["values"][-32:]]) if t["values"] else t["threshold"]
    spark = Text(sparkline(t["values"], 32, lo=0.0 if t["op"] == ">=" else None, hi=hi), style="cyan")
    grid.add_row("target", Text.assemble(f"{t['metric']} {_fmt(t['latest'])} {op} {t['threshold']:g} ",
                                         ("✓ met" if t["met"] else "", "bold green")), spark)
    for b in ov["budget"]:
        if not b["limit"]:
            continue
        bar = ProgressBar(total=1.0, completed=b["fraction"] or 0.0, width=24)
        grid.add_row(b["label"], bar, f"{_fmt(b['spent'], b['unit'])} / {_fmt(b['limit'], b['unit'])}")
    parts: list[Any] = [head, grid]
    if ov["open"]:
        ivs = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title="open interventions", title_justify="left")
        ivs.add_column("id", no_wrap=True)
        ivs.add_column("stage", no_wrap=True)
        ivs.add_column("what", overflow="fold")
        for iv in ov["open"]:
            stage = iv.status.value
            hint = f"  → swarm approve {iv.id}" if stage == "awaiting_approval" else ""
            ivs.add_row(iv.id, Text(stage, style="bold yellow" if hint else ""), f"{iv.kind.value} after {iv.diagnosis.name}{hint}")
        parts.append(ivs)
    if events:
        parts.append(Text("newest events", style="bold"))
        parts += [Text(event_line(e, t0), overflow="ellipsis", no_wrap=True) for e in events]
    return Panel(Group(*parts), title=f"swarm · {ov['name']}", subtitle=ov["goal"][:width - 20] or None, width=width)


class LiveView:
    """rich Live on a terminal: redrawn on every tick."""

    def __init__(self, console: Console, events: int = 6) -> None:
        from rich.live import Live

        self.console = console
        self.events: deque[dict[str, Any]] = deque(maxlen=events)
        self.t0: float | None = None
        self.live = Live(console=console, auto_refresh=False, transient=False)   # other output is printed above it
        self._started = False

    def update(self, view: Any, tick: Tick) -> None:
        if self.t0 is None:
            self.t0 = next((r["started"] for r in view.store.runs()), None)
        self.events.extend(tick.events)
        if not self._started:
            self.live.start()
            self._started = True
        width = min(self.console.width, 120)
        self.live.update(render(tick.overview, list(reversed(self.events)), self.t0, width), refresh=True)

    def close(self) -> None:
        if self._started:
            self.live.stop()


class EventLines:
    """Plain lines for a pipe or a log: one per timeline event, and the progress every `every_s`."""

    def __init__(self, console: Console, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.every_s, self.clock = console, every_s, clock
        self._last: float | None = None
        self.t0: float | None = None

    def update(self, view: Any, tick: Tick) -> None:
        if self.t0 is None:
            self.t0 = next((r["started"] for r in view.store.runs()), None)
        for e in tick.events:
            self.console.print(event_line(e, self.t0), markup=False, highlight=False, soft_wrap=True)
        now = self.clock()
        if self._last is None or now - self._last >= self.every_s or tick.final:
            self._last = now
            ov, t = tick.overview, tick.overview["target"]
            self.console.print(f"step {_fmt(ov.get('step'))}  {t['metric']} {_fmt(t['latest'])} (target {t['op']} {t['threshold']:g})  "
                               + "  ".join(f"{b['label']} {_fmt(b['spent'], b['unit'])}/{_fmt(b['limit'], b['unit'])}"
                                           for b in ov["budget"] if b["limit"])
                               + (f"  awaiting approval: {' '.join(iv.id for iv in ov['awaiting'])}" if ov["awaiting"] else ""),
                               markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        pass


class JsonLines:
    """One JSON object per line for scripts: `{"event": {...}}` per timeline row as it happens."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def update(self, view: Any, tick: Tick) -> None:
        out = self.stream or sys.stdout
        for e in tick.events:
            out.write(json.dumps({"event": e}, default=str) + "\n")
        out.flush()

    def close(self) -> None:
        pass


class Notify:
    """Runs a command when an intervention starts waiting for approval and when the run ends
    (`swarm run --notify CMD`): CMD is split like a shell line but run without a shell, with
    SWARM_EVENT (`awaiting_approval` | `finished`), SWARM_WORKSPACE, SWARM_INTERVENTION (the id,
    when an intervention waits), SWARM_DETAIL (the transition's note, or why the run ended) and
    SWARM_APPROVE (the command that approves it) in its environment. It runs in the follower's
    thread, never the controller's, at most `timeout_s`; a failure is logged, the run goes on."""

    def __init__(self, command: str, timeout_s: float = 30.0, name: str = "--notify") -> None:
        from swarm.goal import notify_argv

        self.argv = notify_argv(command, name)   # a ValueError naming `name`: the one check of a hook
        self.timeout_s = timeout_s
        self.sent: list[dict[str, str]] = []

    def _run(self, env: dict[str, str]) -> None:
        import os
        import subprocess

        try:
            r = subprocess.run(self.argv, env={**os.environ, **env}, timeout=self.timeout_s, capture_output=True,
                               stdin=subprocess.DEVNULL)
            if r.returncode != 0:
                log.warning("notify command %s exited %d: %s", self.argv[0], r.returncode, r.stderr[-300:].decode(errors="replace"))
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("notify command %s failed: %s", self.argv[0], e)
        self.sent.append(env)

    def update(self, view: Any, tick: Tick) -> None:
        for e in tick.events:
            base = {"SWARM_WORKSPACE": str(view.root)}
            if e.get("kind") == "transition" and e.get("to") == "awaiting_approval" and e.get("id"):
                self._run({**base, "SWARM_EVENT": "awaiting_approval", "SWARM_INTERVENTION": str(e["id"]),
                           "SWARM_DETAIL": str(e.get("note") or ""),
                           "SWARM_APPROVE": f"swarm approve {e['id']} --workspace {view.root}"})
            elif e.get("kind") == "finished":
                self._run({**base, "SWARM_EVENT": "finished", "SWARM_DETAIL": str(e.get("reason") or "")})

    def close(self) -> None:
        pass


def sinks_for(mode: str, console: Console) -> list[Sink]:
    """The sinks of an output mode: "live" (rich Live on a terminal, plain lines otherwise),
    "json" (JSON lines), "quiet" (none)."""
    if mode not in ("live", "json", "quiet"):
        raise ValueError(f"output mode {mode!r}: must be live, json or quiet")
    if mode == "quiet":
        return []
    if mode == "json":
        return [JsonLines()]
    return [LiveView(console)] if console.is_terminal else [EventLines(console)]
