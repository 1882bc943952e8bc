"""The example goal's fault (examples/steer/goal_lr_too_high.yaml: lr 0.05 in the script's own
arguments) diagnosed on what SwarmCallback writes.

The script runs with the goal's own arguments at its own size (the schedule of its 2000 steps kept;
`$SWARMLAB_STOP_AT_STEP` ends it at step 225, the callback's fork stop). The run's files are read as
the controller reads them (`agents.evidence.collect`, the operators' context of a script run):
`not_learning` fires (the loss fell in the first ~30 steps, then stayed flat for more than the
detector's 100 rows, held-out accuracy at 0) with the live lr in its evidence, and the Diagnostics
operator's fix, adapted to the script run, is a lower `learning_rate` the run's settings accept.
No spike marks this fault: the lr is too high from the start, so `loss_spike` has no stable baseline
to jump from.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from agents.base import OperatorContext
from agents.detection import Known, run_detectors
from agents.evidence import collect
from agents.operators import Diagnostics
from swarm.goal import Target
from swarm.script_run import adapt, operator_view
from trainer.steer.fork import STOP_AT_ENV
from trainer.steer.settings import check_change, read_declared

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOAL = ROOT / "examples" / "steer" / "goal_lr_too_high.yaml"


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_the_too_high_lr_of_the_example_goal_is_diagnosed_on_the_callbacks_output(tmp_path):
    g = yaml.safe_load(GOAL.read_text())
    ep = g["run"]["entrypoint"]
    run = tmp_path / "run"
    subprocess.run([sys.executable, str(ROOT / ep["script"]), *ep["args"], "--output_dir", str(tmp_path / "out"),
                    "--save_steps", "1000"], check=True, capture_output=True, timeout=600, cwd=ROOT,
                   env={**os.environ, "SWARMLAB_RUN_DIR": str(run), STOP_AT_ENV: "225"})

    ev = collect(run, "RUNNING")
    assert ev.step == 225 and [r["step"] for r in ev.evals] == [50, 100, 150, 200, 225]
    target = Target.model_validate(g["target"])
    settings = read_declared(run)
    recipe, harness = operator_view(settings["values"])
    assert recipe["lr"] == pytest.approx(0.05)
    found = {d.name: d for d in run_detectors(ev, known=Known(target_metric=target.metric, target_op=target.op,
                                                                target_threshold=target.threshold))}
    assert "not_learning" in found, sorted(found)
    d = found["not_learning"]
    assert d.evidence["relative_improvement"] < 0.1 and d.evidence["heldout_acc"] <= 0.05
    assert d.evidence["lr_now"] > 0.04    # the lr the callback logs (learning_rate → lr), near the 0.05 peak

    ctx = OperatorContext(goal=g["goal"], target=target, recipe=recipe, harness=harness, history=[], checkpoints=[],
                          skills=[], episodes=[], min_difficulty=0)
    ctx.with_findings(list(found.values()))
    fixes = [iv for iv in Diagnostics().builtin(ev, ctx) if iv.diagnosis.name == "not_learning"]
    assert len(fixes) == 1 and fixes[0].changes == {"recipe.lr": 0.001}
    iv, why = adapt(fixes[0], settings, ev)
    assert why is None and iv.changes == {"recipe.learning_rate": 0.001}
    assert check_change(settings, {"learning_rate": 0.001}) is None
