"""Clocks that count from boot: code that keeps "the last time X happened" against
`time.monotonic()` must not start that memory at 0.0, or on a machine booted less than the
throttle interval ago the first event is throttled. Here the monotonic clock reads a few seconds
(a freshly booted machine) while the trainer's heartbeat throttle is an hour."""
from __future__ import annotations

import itertools
import time

from trainer.config import RunConfig
from trainer.loop import Trainer
from trainer.runlog import read_heartbeat


def test_first_running_heartbeat_is_written_on_a_freshly_booted_machine(make_cfg, monkeypatch):
    import trainer.loop

    ticks = itertools.count()      # next() on it is atomic: safe if another thread reads the clock
    monkeypatch.setattr(time, "monotonic", lambda: 2.0 + next(ticks) * 1e-3)   # seconds since boot
    monkeypatch.setattr(trainer.loop, "HEARTBEAT_EVERY_S", 3600.0)
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 4, "eval_interval": 0}))
    tr = Trainer(cfg)
    beats = []
    tr.on_step = lambda row: beats.append(read_heartbeat(cfg.run_dir))
    tr.run()
    # the first step writes "running" at once; the next three fall inside the hour
    assert [(b["state"], b["step"]) for b in beats] == [("running", 1)] * 4
    end = read_heartbeat(cfg.run_dir)
    assert end["state"] == "completed" and end["step"] == 4
