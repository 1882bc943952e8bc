"""Backtest arms train on the same amount of data: a change to what a step trains on (the batch,
the GRPO group) gives the candidate arm as many steps as train on what the control's do
(swarm/backtest.py `equal_compute_horizon`), so a larger batch is not credited with the extra
examples it was handed."""
from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from agents.domain import Diagnosis, Intervention, InterventionKind
from swarm.backtest import equal_compute_horizon, run_arms, step_size


@pytest.mark.parametrize("recipe, changes, want", [
    ({"batch_size": 64}, {"recipe.batch_size": 128}, 60),          # twice the examples a step: half the steps
    ({"batch_size": 64}, {"recipe.batch_size": 32}, 240),
    ({}, {"recipe.batch_size": 128}, 60),                           # the recipe's default batch (64)
    ({"algorithm": "grpo", "batch_size": 16, "group_size": 8}, {"recipe.group_size": 4}, 240),   # completions a step
    ({"algorithm": "sft", "batch_size": 64, "group_size": 8}, {"recipe.group_size": 4}, 120),   # SFT samples no group
    ({"batch_size": 64}, {"recipe.lr": 0.01}, 120),                 # the step is the same
    ({"batch_size": 64}, {"recipe.batch_size": 100000}, 1),          # never fewer than one step
])
def test_the_candidates_horizon_trains_on_what_the_controls_does(recipe, changes, want):
    assert equal_compute_horizon({"recipe": recipe}, changes, 120) == want


def test_step_size_is_unknown_rather_than_guessed():
    assert step_size({"batch_size": "many"}) is None
    assert equal_compute_horizon({"recipe": {"batch_size": "many"}}, {"recipe.batch_size": 128}, 120) == 120


class Arms:
    """Writes what an arm would: one loss row per step it is configured to train, then an eval."""

    def start(self, name, config_path, restart=0):
        cfg = yaml.safe_load(pathlib.Path(config_path).read_text())
        o = cfg["fork_overrides"]
        d = pathlib.Path(cfg["out_dir"]) / name
        d.mkdir(parents=True, exist_ok=True)
        rows = [{"step": s, "loss": 1.0} for s in range(100 + 1, o["recipe.steps"] + 1)]
        rows.append({"step": o["recipe.steps"], "heldout_acc": 0.5, "heldout_truncated": 0.0, "heldout_malformed": 0.0})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return name

    def status(self, handle):
        return "SUCCEEDED"

    def stop(self, handle):
        pass


def test_run_arms_gives_the_candidate_its_equal_compute_steps(tmp_path):
    iv = Intervention(kind=InterventionKind.RECIPE_EDIT, changes={"recipe.batch_size": 128},
                      diagnosis=Diagnosis(name="plateau", summary="flat", operator="explorer", policy="builtin"),
                      rationale="r", operator="explorer", policy="builtin")
    run_arms(iv, base_config={"recipe": {"algorithm": "sft", "batch_size": 64}}, ckpt="x.pt", step=100,
             metric="heldout_acc", horizon=40, seeds=[0], eval_size=50, jobs=Arms(), workdir=tmp_path / "bt")
    cand = yaml.safe_load((tmp_path / "bt" / f"bt-{iv.id}-candidate-s0.yaml").read_text())["fork_overrides"]
    ctrl = yaml.safe_load((tmp_path / "bt" / f"bt-{iv.id}-control-s0.yaml").read_text())["fork_overrides"]
    assert (cand["recipe.steps"], cand["recipe.eval_interval"], cand["recipe.batch_size"]) == (120, 20, 128)
    assert (ctrl["recipe.steps"], ctrl["recipe.eval_interval"]) == (140, 40) and "recipe.batch_size" not in ctrl
