"""benchmarks/detector_calibration.py on hand-written bench work dirs: a healthy oracle run (falling
loss, rising held-out accuracy, reaches its target at step 300), a plain run whose loss goes
non-finite after step 100 (never reaches it) and a plain run with a fault that reaches it anyway.
The replay must see each tick's rows only, stop at the target, and count runs and ticks per set."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
import sys

import pytest

GOAL = {"goal": "add 2-digit numbers", "target": {"metric": "heldout_acc", "op": ">=", "threshold": 0.9},
        "run": {"seed": 0, "task": {"name": "addition"},
                "harness": {"template": "{question}=", "answer": {"stop": "\n", "reverse_digits": True},
                            "curriculum": {"start": 2}},
                "recipe": {"algorithm": "sft", "lr": 0.003, "batch_size": 64, "eval_interval": 50}},
        "budget": {"steps": 300}}
FAULT = [{"kind": "override", "at_step": 100, "set": {"recipe.lr": 5.0}}]
HELDOUT = {50: 0.1, 100: 0.3, 150: 0.5, 200: 0.7, 250: 0.85, 300: 0.95}


@pytest.fixture(scope="module")
def dc():
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "detector_calibration.py"
    spec = importlib.util.spec_from_file_location("detector_calibration", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _version() -> str:
    """The version of GOAL's harness as the trainer reports it (what the controller set)."""
    from swarm.goal import Goal

    return Goal.parse(GOAL).run_config("train", "/nonexistent").harness.version


VERSION = _version()


def metrics_row(step: int, nonfinite: bool = False, heldout: float | None = None) -> dict:
    """A metrics row in the trainer's format (an SFT addition run's keys)."""
    loss = 3.0 * math.exp(-step / 80) + 0.05
    r = {"step": step, "segment": 0, "time": 1000.0 + 0.03 * step, "lr": 0.003, "difficulty": 2,
         "harness_version": VERSION, "algorithm": "sft", "entropy": 2.8 * math.exp(-step / 150), "t_logprob": 0.007,
         "tokens": 680.0, "loss": "nan" if nonfinite else loss, "grad_norm": "nan" if nonfinite else 1.0 + 0.2 * math.sin(step),
         "skipped": 1.0 if nonfinite else 0.0, "nonfinite": 1.0 if nonfinite else 0.0, "t_update": 0.012,
         "reward_mean": min(1.0, step / 300), "reward_std": 0.0, "pass_rate": min(1.0, step / 300), "malformed_rate": 0.0,
         "truncation_rate": 0.0, "response_len": 3.5, "t_generate": 0.004, "step_time": 0.03, "tokens_per_s": 9000.0}
    if heldout is not None:
        r.update(heldout_acc=heldout, heldout_malformed=0.0, heldout_truncated=0.0)
    return r


def write_run(work: pathlib.Path, n: int, scenario: str, method: str, perturbations: list, reached: bool,
              fault_at: int | None, pool_after: int | None = None) -> pathlib.Path:
    """A bench run folder; its sampled questions are new at every step, or, after step `pool_after`,
    drawn from a pool of 16."""
    d = work / "runs" / f"{n:05d}-{scenario}-{method}-s0"
    t = d / "work" / "runs" / "train"
    t.mkdir(parents=True)
    goal = dict(GOAL, perturbations=perturbations) if perturbations else GOAL
    (d / "spec.json").write_text(json.dumps({"method": method, "goal": goal, "seed": 0, "target": 0.9, "budget": 60.0}))
    (d / "result.json").write_text(json.dumps({"reached": reached, "steps": 300}))
    rows, samples = [], []
    for step in range(1, 301):
        bad = fault_at is not None and step > fault_at
        held = HELDOUT.get(step)
        if held is not None and fault_at is not None and step > fault_at:
            held = 0.3     # stuck once the fault is in force
        rows.append(metrics_row(step, bad, held))
        for k in range(4):
            q = f"{k}+{step % 4}" if pool_after is not None and step > pool_after else f"{10 + k}+{20 + step}"
            samples.append({"step": step - 1, "segment": 0, "uid": f"addition/train/d2/{4 * step + k}", "question": q,
                            "prompt": q + "=", "completion": "1\n", "reward": 0.0, "verdict": "wrong", "truncated": False})
    if reached:
        rows.append({"step": 300, "segment": 0, "time": 1010.0, "final": True, "heldout_acc": 0.95})
    (t / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (t / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (t / "events.jsonl").write_text(json.dumps({"time": 999.0, "step": 0, "event": "start"}) + "\n")
    return d


@pytest.fixture
def bench(tmp_path):
    work = tmp_path / "work"
    old = write_run(work, 1, "g9000-addition2-none", "oracle", [], reached=False, fault_at=100)
    os.utime(old / "result.json", (1e9, 1e9))
    # a resumed bench numbers its runs from 1 again: the newer finished run of g9000/oracle/s0 counts
    write_run(work, 2, "g9000-addition2-none", "oracle", [], reached=True, fault_at=None)
    write_run(work, 3, "g9001-addition2-lr", "plain", FAULT, reached=False, fault_at=100, pool_after=150)
    write_run(work, 4, "g9002-addition2-lr", "plain", FAULT, reached=True, fault_at=None)    # a fault that did not hurt: mild
    write_run(work, 5, "g9000-addition2-none", "pbt", [], reached=True, fault_at=None)       # another method: left out
    return work


def test_replay_sees_each_tick_only_and_stops_at_the_target(dc, bench):
    inv = dc.inventory(bench, None)
    assert inv.other_methods == 1 and inv.unfinished == 0 and inv.repeats == 1 and len(inv.runs) == 3
    by_group = {r.group: r for r in inv.runs}
    assert set(by_group) == {"healthy", "mild", "failing"}
    healthy = by_group["healthy"]
    assert healthy.name.startswith("00002-") and healthy.every == 50 and healthy.known.template == "{question}=" and healthy.known.eval_difficulty == 2
    rp = dc.replay(healthy.trainer_dir, healthy.ctx, healthy.known, healthy.every)
    assert rp.reached_at == 300 and rp.ticks == [50, 100, 150, 200, 250]
    assert not {"nonfinite_loss", "loss_spike", "grad_norm_explosion"} & set(rp.fires)
    assert not [d for d in rp.first.values() if d.severity != "info"], {n: d.summary for n, d in rp.first.items()}
    bad = by_group["failing"]
    rp = dc.replay(bad.trainer_dir, bad.ctx, bad.known, bad.every)
    assert rp.reached_at is None and rp.ticks == [50, 100, 150, 200, 250, 300]
    # step 100 is the last clean row: a replay that leaked later rows into a tick would fire there
    assert rp.fires["nonfinite_loss"] == [150, 200, 250, 300]
    # the first fire sees the 20 rows 131..150 (the detector's scan window), all non-finite
    assert rp.first["nonfinite_loss"].evidence["onset_step"] == 131 and rp.first["nonfinite_loss"].step == 150


def test_report_counts_per_set(dc, bench, tmp_path):
    out = tmp_path / "res" / "detector_calibration"
    assert dc.main([str(bench), "--every", "25", "--out", str(out)]) == 0
    rep = json.loads(out.with_suffix(".json").read_text())
    g = rep["groups"]
    assert (g["healthy"]["runs"], g["mild"]["runs"], g["failing"]["runs"]) == (1, 1, 1)
    assert g["healthy"]["ticks"] == 11 and g["failing"]["ticks"] == 12    # 25..275 before the target; 25..300
    assert g["healthy"]["detectors"]["nonfinite_loss"] == {"runs_fired": 0, "run_rate": 0.0, "fires": 0, "tick_rate": 0.0}
    nf = g["failing"]["detectors"]["nonfinite_loss"]
    assert nf["runs_fired"] == 1 and nf["fires"] == 8 and nf["tick_rate"] == pytest.approx(8 / 12)   # 125, 150 … 300
    assert rep["inputs"][0]["runs_by_method"] == {"oracle": 1, "plain": 2, "pbt": 1}
    assert rep["inputs"][0]["repeats_left_out"] == 1
    assert "stale_heartbeat" not in rep["detectors"] and "crashed_job" in rep["left_out"]
    assert "nonfinite_loss" not in rep["flagged"]
    md = out.with_suffix(".md").read_text()
    assert "| nonfinite_loss | critical | 0/1 (0%) | 0/11 (0.0%) | 0/1 (0%) |" in md
    # where the failing run's stream began to repeat (its samples of step 151 on carry step 150):
    # named a step early, never after
    assert {r["run"][:5]: r["onsets"] for r in rep["runs"]} == {"00002": {}, "00003": {"repeated_examples": [149]},
                                                                 "00004": {}}
    assert "- `00003-g9001-addition2-lr-plain-s0` (failing): `repeated_examples` 149" in md


def test_a_folder_without_runs_is_one_line_and_exit_2(dc, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert dc.main([str(tmp_path / "empty"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "no bench runs" in err and "\n" not in err
    assert not (tmp_path / "x.json").exists()
