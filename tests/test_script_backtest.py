"""Backtests for script runs (swarm/script_backtest.py, trainer/steer/fork.py).

Pure parts on tables: how a change splits into hot overrides and restart flags, a rollback's
horizon, a fork's command line, the decision rule's settings for a script run. Then the real example
script (examples/steer/sft_addition.py, a tiny Qwen2 on a CPU): a live run saves a checkpoint; a candidate
arm with a lower learning rate and a control arm fork from it, each in its own folder, train a few
steps, evaluate once and stop; the live run's files are untouched; `swarm.decisions.decide` takes
the pairs and `swarm.backtest.result` records a result. The controller's path (checkpoint, pause,
arms, resume) runs in tests/test_script_run.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

from agents.domain import BacktestResult, Diagnosis, Intervention, InterventionKind, Risk
from swarm.backtest import result, rollback_horizon
from swarm.decisions import Extend, Rejected, Validated, decide
from swarm.script_backtest import run_script_arms, script_rule, split_change
from trainer.runlog import read_jsonl
from trainer.steer import SwarmCallback
from trainer.steer.fork import STOP_AT_ENV, fork_argv
from trainer.steer.settings import Setting

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "steer" / "sft_addition.py"
TINY = ["--d_model", "32", "--n_layers", "1", "--train_size", "512", "--eval_size", "64"]
DECLARED = {"settings": [Setting("learning_rate", "float", "hot", gt=0, le=1).to_json(),
                         Setting("max_grad_norm", "float", "hot", ge=0).to_json(),
                         Setting("per_device_train_batch_size", "int", "restart", ge=1).to_json(),
                         Setting("warmup_steps", "float", "restart", ge=0).to_json()]}


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def proposal(changes: dict) -> Intervention:
    d = Diagnosis(name="plateau", summary="held-out flat", operator="diagnostics", policy="builtin")
    return Intervention(kind=InterventionKind.RECIPE_EDIT, changes=changes, diagnosis=d, rationale="lower the lr.",
                        operator="diagnostics", policy="builtin", risk=Risk.MEDIUM)


@pytest.mark.parametrize("horizon, start, live, want", [
    (60, 0, 145, 145),    # a run that never learnt, rolled back to init at 145: the arms train the 145 steps given up
    (60, 0, 20, 60),      # fewer steps given up than the goal's horizon: the goal's horizon
    (60, 0, 1000, 240),   # a long stretch: at most the longest retry horizon (4x)
    (60, 100, 180, 80),   # a checkpoint-100: only the steps since it
    (120, 0, 145, 145),   # a retry's doubled horizon is the floor
    (240, 0, 145, 240),
    (60, 145, 145, 60),
])
def test_a_rollbacks_arms_train_the_steps_it_gives_up_within_the_longest_retry_horizon(horizon, start, live, want):
    assert rollback_horizon(horizon, start, live) == want


@pytest.mark.parametrize("horizon, start, live", [(0, 0, 10), (60, -1, 10), (60, 20, 10)])
def test_a_rollback_horizon_refuses_what_cannot_be(horizon, start, live):
    with pytest.raises(ValueError, match=f"horizon={horizon}, start={start}, live={live}"):
        rollback_horizon(horizon, start, live)


@pytest.mark.parametrize("fields, hot, restart", [
    ({"learning_rate": 1e-3}, {"learning_rate": 1e-3}, {}),
    ({"learning_rate": 1e-3, "warmup_steps": 5}, {"learning_rate": 1e-3}, {"warmup_steps": 5}),
    ({"per_device_train_batch_size": 8}, {}, {"per_device_train_batch_size": 8}),
    ({}, {}, {}),
])
def test_a_change_splits_into_hot_overrides_and_restart_flags(fields, hot, restart):
    assert split_change(DECLARED, fields) == (hot, restart)


def test_an_undeclared_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="^seed: the script run declares no such setting$"):
        split_change(DECLARED, {"seed": 3})


def test_a_forks_command_line_resumes_in_its_own_folder_with_the_flags_last():
    argv = fork_argv(["py", "train.py", "--learning_rate", "0.05", "--output_dir", "live"],
                     flags={"warmup_steps": 5.0, "bf16": False}, checkpoint="/c/checkpoint-20", output_dir="/arm/out", seed=1)
    assert argv == ["py", "train.py", "--learning_rate", "0.05", "--output_dir", "live", "--warmup_steps", "5.0",
                    "--bf16", "false", "--output_dir", "/arm/out", "--save_strategy", "no", "--seed", "1",
                    "--resume_from_checkpoint", "/c/checkpoint-20"]


@pytest.mark.parametrize("changes, algorithm, losses, data", [
    ({"recipe.learning_rate": 1e-3}, "sft", True, True),
    ({"recipe.learning_rate": 1e-3}, "grpo", False, True),      # RL losses say nothing about the target
    ({"recipe.learning_rate": 1e-3}, None, False, True),        # a run that names no algorithm: not assumed SFT
    ({"recipe.per_device_train_batch_size": 8}, "sft", False, False),
    ({"recipe.max_length": 16}, "sft", False, False),           # other targets: the losses do not compare
])
def test_the_rule_compares_losses_only_on_the_same_sft_targets(changes, algorithm, losses, data):
    r = script_rule(proposal(changes), algorithm, alpha=0.2, higher_is_better=True, metric="heldout_acc",
                    eval_size=64, looks=2, look=1)
    assert (r.losses_compare, r.same_data, r.target_is_rate, r.eval_size, r.looks) == (losses, data, True, 64, 2)


def test_arms_refuse_to_fork_from_a_folder_that_is_no_checkpoint(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "settings.json").write_text(json.dumps(DECLARED))
    with pytest.raises(FileNotFoundError, match="not a Trainer checkpoint"):
        run_script_arms(proposal({"recipe.learning_rate": 1e-3}), argv=["true"], cwd=tmp_path, live_run_dir=tmp_path / "run",
                        checkpoint=tmp_path / "checkpoint-5", step=5, metric="heldout_acc", horizon=2, seeds=[0],
                        workdir=tmp_path / "bt")
    assert not list((tmp_path / "bt").glob("bt-*"))    # no arm started


def test_a_bad_stop_step_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv(STOP_AT_ENV, "ten")
    with pytest.raises(ValueError, match=r"^\$SWARMLAB_STOP_AT_STEP='ten' must be an integer step$"):
        SwarmCallback("/tmp/unused")
    monkeypatch.delenv(STOP_AT_ENV)
    with pytest.raises(ValueError, match="stop_at_step=0 must be >= 1"):
        SwarmCallback("/tmp/unused", stop_at_step=0)


def digest(d: pathlib.Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_lower_lr_arm_and_a_control_fork_from_the_scripts_checkpoint(tmp_path):
    live = tmp_path / "live"
    argv = [sys.executable, str(SCRIPT), *TINY, "--max_steps", "2000", "--learning_rate", "0.05", "--eval_steps", "50",
            "--save_steps", "20"]
    # the live run: stopped at step 20 (its checkpoint-20 saved), as if it were still training to 2000
    subprocess.run([*argv, "--output_dir", str(live / "out")], check=True, capture_output=True, timeout=300,
                   env={**os.environ, "SWARMLAB_RUN_DIR": str(live / "run"), STOP_AT_ENV: "20"})
    ckpt = live / "out" / "checkpoint-20"
    assert (ckpt / "trainer_state.json").is_file()
    live_lr = [r["lr"] for r in read_jsonl(live / "run" / "metrics.jsonl") if "lr" in r][-1]
    before = digest(live)

    iv = proposal({"recipe.learning_rate": 0.003})
    pairs, cpu, n = run_script_arms(iv, argv=argv, cwd=tmp_path, live_run_dir=live / "run", checkpoint=ckpt, step=20,
                                    metric="heldout_acc", horizon=10, seeds=[0], workdir=tmp_path / "bt")
    assert digest(live) == before                       # the live run's files: only read
    rows = {}
    for arm in ("candidate", "control"):
        d = tmp_path / "bt" / f"bt-{iv.id}-{arm}-s0"
        rows[arm] = read_jsonl(d / "metrics.jsonl")
        launch = [r for r in read_jsonl(d / "launches.jsonl") if r.get("event") == "launch"]
        assert len(launch) == 1 and launch[0]["argv"][-2:] == ["--resume_from_checkpoint",
                                                               str((tmp_path / "bt" / f"fork-{iv.id}" / "checkpoint-20").resolve())]
        train = [r for r in rows[arm] if "loss" in r]
        assert [r["step"] for r in train] == list(range(21, 31))   # from the checkpoint, for the horizon
        assert "heldout_acc" in rows[arm][-1] and rows[arm][-1]["step"] == 30 and rows[arm][-1]["eval_examples"] == 64
        assert not (d / "out").exists() or not list((d / "out").glob("checkpoint-*"))   # a fork saves nothing
    # the control keeps the run's lr schedule; the candidate has the change, applied as a hot override
    assert rows["control"][0]["lr"] == pytest.approx(live_lr, rel=1e-3)
    assert rows["candidate"][0]["lr"] == pytest.approx(0.003 * live_lr / 0.05, rel=1e-3)
    assert any(e.get("event") == "settings_restored" and e["values"] == {"learning_rate": 0.003}
               for e in read_jsonl(tmp_path / "bt" / f"bt-{iv.id}-candidate-s0" / "events.jsonl"))
    # same data for both arms (same seed): the first step's batch is the same, only the lr differs
    assert rows["candidate"][0]["loss"] == pytest.approx(rows["control"][0]["loss"], rel=1e-6)
    (p,) = pairs
    assert p.seed == 0 and p.candidate.target is not None and p.control.target is not None
    assert p.candidate.loss != p.control.loss
    assert p.candidate.format_fail is None and p.control.format_fail is None   # the script logs no such rate
    assert cpu > 0 and n == 64

    rule = script_rule(iv, "sft", alpha=0.2, higher_is_better=True, metric="heldout_acc", eval_size=n, looks=1, look=1)
    d = decide(pairs, rule)
    assert isinstance(d, (Validated, Rejected)) and not isinstance(d, Extend)   # one look: conclusive either way
    res = result(d, pairs, metric="heldout_acc", horizon=10, seeds=[0], cpu_s=cpu)
    assert isinstance(res, BacktestResult) and res.candidate == [p.candidate.target] and res.control == [p.control.target]
    assert res.passed is isinstance(d, Validated) and res.cpu_s == cpu

    # a rollback to the run's untrained start (`init`, saved by the callback before step 1): the
    # candidate starts from it, the control carries on from the live checkpoint; each trains the horizon
    init = json.loads((live / "run" / "checkpoints" / "init.json").read_text())
    assert init["step"] == 0 and pathlib.Path(init["path"]) == (live / "out" / "swarm-init").resolve()
    rb = proposal({"recipe.learning_rate": 0.003})
    run_script_arms(rb, argv=argv, cwd=tmp_path, live_run_dir=live / "run", checkpoint=ckpt, step=20,
                    candidate_checkpoint=init["path"], candidate_step=0, metric="heldout_acc", horizon=10, seeds=[0],
                    workdir=tmp_path / "bt")
    assert digest(live) == before
    for arm, src, steps in (("candidate", "swarm-init", range(1, 11)), ("control", "checkpoint-20", range(21, 31))):
        d = tmp_path / "bt" / f"bt-{rb.id}-{arm}-s0"
        launch = [r for r in read_jsonl(d / "launches.jsonl") if r.get("event") == "launch"]
        assert launch[0]["argv"][-1] == str((tmp_path / "bt" / f"fork-{rb.id}" / src).resolve())
        assert [r["step"] for r in read_jsonl(d / "metrics.jsonl") if "loss" in r] == list(steps)
        assert not (d / "checkpoints" / "init.json").exists()       # a fork keeps no start of its own
    with pytest.raises(ValueError, match="give both or neither"):
        run_script_arms(rb, argv=argv, cwd=tmp_path, live_run_dir=live / "run", checkpoint=ckpt, step=20,
                        candidate_checkpoint=init["path"], metric="heldout_acc", horizon=10, seeds=[0], workdir=tmp_path / "bt")


def test_a_script_runs_judgement_reads_its_held_out_size_from_its_eval_rows():
    """The noise of a script run's held-out accuracy is that of the script's own eval set (the
    `eval_examples` its eval rows carry), not the built-in recipe's default of 200."""
    from types import SimpleNamespace

    from agents.evidence import Evidence
    from swarm.deciding import Deciding

    evals = [{"step": 10, "eval_examples": 32, "heldout_acc": 0.1}, {"step": 20, "eval_examples": 48, "heldout_acc": 0.2}]
    obj = SimpleNamespace(base_cfg={"recipe": {}, "harness": {}}, script=object(),
                          tick=SimpleNamespace(evidence=Evidence(run_dir="x", evals=evals)))
    assert Deciding.held_out_size(obj) == 48
    obj.tick.evidence = None                                    # nothing read yet this tick
    assert Deciding.held_out_size(obj) == 200
    own = SimpleNamespace(base_cfg={"recipe": {"eval_size": 64}}, script=None, tick=obj.tick)
    assert Deciding.held_out_size(own) == 64                    # the built-in trainer's recipe says
