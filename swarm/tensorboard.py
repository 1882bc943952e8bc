"""TensorBoard export of a swarm run (tensorboardX event files), written by one writer in the
controller's process that tails the run's streams — never by the trainer or its workers.

    swarm run GOAL --tensorboard runs/tb        # live, as the run goes (a swarm.live.Follower sink)
    swarm tensorboard --workspace WS --logdir runs/tb   # the same files from a run's records, after the fact
    tensorboard --logdir runs/tb

What lands where (LOGDIR/...):

    train/                  the live run: every numeric metric as scalar `train/<key>` at its step
                            (the row's own wall time), `swarm/interventions_applied` (the number
                            applied so far, stepping up at each applied step: a marker on the step
                            axis), text `interventions/<id>` (proposal and every status change, at
                            the step it happened), text `harness/version` whenever the live harness
                            version changes, scalar `harness/version_changes`
    backtests/<arm>/        one run per backtest arm (`bt-<id>-candidate-s0`, `...-control-s0`):
                            its metrics as scalars `backtest/<key>`, so TensorBoard overlays the
                            candidate and control arms of the same fork

After a rollback the step counter repeats; the rows keep their steps (TensorBoard draws the new
segment over the old one) and their wall times, so the relative-time axis separates them.
"""
from __future__ import annotations

import bisect
import math
import pathlib
from typing import Any

from swarm.live import Tick

SKIP = {"step", "time", "segment", "final"}


def _numeric(row: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k not in SKIP and isinstance(v, (int, float))
            and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardSink:
    """A `swarm.live` sink writing the run to TensorBoard event files under `logdir`."""

    def __init__(self, logdir: str | pathlib.Path) -> None:
        from tensorboardX import SummaryWriter

        self.logdir = pathlib.Path(logdir)
        self._writer = SummaryWriter
        self.train = SummaryWriter(str(self.logdir / "train"), flush_secs=5)
        self.arms: dict[str, Any] = {}          # arm name -> (writer, StreamTail)
        self.step = 0
        self.harness: str | None = None
        self.harness_changes = 0
        self.applied = 0
        self._times: list[float] = []           # wall time and step of each metric row, for placing events
        self._steps: list[int] = []

    def update(self, view: Any, tick: Tick) -> None:
        for row in tick.rows:
            step = row.get("step")
            if not isinstance(step, int):
                continue
            self.step = step
            wall = row.get("time") if isinstance(row.get("time"), (int, float)) else None
            if wall is not None and (not self._times or wall >= self._times[-1]):
                self._times.append(wall)
                self._steps.append(step)
            for k, v in _numeric(row).items():
                self.train.add_scalar(f"train/{k}", v, step, walltime=wall)
            hv = row.get("harness_version")
            if isinstance(hv, str) and hv and hv != self.harness:
                self.harness = hv
                self.harness_changes += 1
                self.train.add_text("harness/version", f"harness `{hv}` from step {step}", step, walltime=wall)
                self.train.add_scalar("harness/version_changes", self.harness_changes, step, walltime=wall)
        for e in tick.events:
            self._event(view, e)
        self._arms(view)
        if tick.final:
            self.flush()

    def _event(self, view: Any, e: dict[str, Any]) -> None:
        kind, iid = e.get("kind"), e.get("id")
        wall = e.get("time")
        step = e.get("step") if isinstance(e.get("step"), int) else self.step_at(wall)
        if kind == "proposed" and iid:
            self.train.add_text(f"interventions/{iid}", f"proposed: {e.get('iv_kind')} after {e.get('diagnosis')} "
                                f"by {e.get('operator')} ({e.get('policy')})", step, walltime=wall)
        elif kind == "transition" and iid:
            note = f" — {e['note']}" if e.get("note") else ""
            if e.get("to") == "applied":
                try:
                    applied = view.store.get(iid).applied_step
                except KeyError:
                    applied = None
                step = applied if isinstance(applied, int) else step
                self.applied += 1
                self.train.add_scalar("swarm/interventions_applied", self.applied, step, walltime=wall)
            self.train.add_text(f"interventions/{iid}", f"**{e.get('from')} → {e.get('to')}** at step {step}{note}",
                                step, walltime=wall)
        elif kind and kind.startswith("human_"):
            self.train.add_text(f"interventions/{iid or 'run'}", f"{kind.removeprefix('human_')} requested by {e.get('by', '?')}",
                                step, walltime=wall)
        elif kind == "finished":
            self.train.add_text("run/finished", f"finished: {e.get('reason')}", step, walltime=wall)

    def step_at(self, t: Any) -> int:
        """The run's step at wall time `t` (the last metric row written by then)."""
        if not isinstance(t, (int, float)) or not self._times:
            return self.step
        i = bisect.bisect_right(self._times, t)
        return self._steps[i - 1] if i else 0

    def _arms(self, view: Any) -> None:
        from swarm.ui.data import StreamTail

        root = view.sdir / "backtests"
        if not root.is_dir():
            return
        for d in sorted(root.glob("bt-*")):
            if not (d / "metrics.jsonl").is_file():
                continue
            if d.name not in self.arms:
                self.arms[d.name] = (self._writer(str(self.logdir / "backtests" / d.name), flush_secs=5),
                                     StreamTail(d / "metrics.jsonl"))
            writer, tail = self.arms[d.name]
            for row in tail.new_rows():
                if isinstance(row.get("step"), int):
                    wall = row.get("time") if isinstance(row.get("time"), (int, float)) else None
                    for k, v in _numeric(row).items():
                        writer.add_scalar(f"backtest/{k}", v, row["step"], walltime=wall)

    def flush(self) -> None:
        self.train.flush()
        for writer, _ in self.arms.values():
            writer.flush()

    def close(self) -> None:
        self.train.close()
        for writer, _ in self.arms.values():
            writer.close()


def export(workspace: str | pathlib.Path, logdir: str | pathlib.Path) -> pathlib.Path:
    """Write a run's TensorBoard files from its records (what `--tensorboard` writes live)."""
    from swarm.live import Follower

    sink = TensorBoardSink(logdir)
    f = Follower(workspace, [sink])
    f.stop()       # one final tick over everything recorded, then closed
    return pathlib.Path(logdir)
