"""Starting a steered script over from a checkpoint: `SwarmCallback` saves the untrained start as
`init`, and its `rollback` command has the relauncher relaunch the script from a checkpoint of the
run's index with the changes sent in the same pause (the controller sends a rollback and its change
at one safe point). Real `transformers.Trainer` on the example script (a tiny random Qwen2, CPU).
"""
from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest
import torch
from safetensors.torch import load_file

from test_steer_relaunch import ack, acks_once, finish, relaunch, step_at_least, wait_for
from trainer.control import send_command
from trainer.runlog import read_jsonl
from trainer.steer import SwarmCallback

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["--d_model", "32", "--n_layers", "1", "--train_size", "256", "--eval_size", "32", "--eval_strategy", "no",
        "--save_strategy", "no", "--max_steps", "2", "--per_device_train_batch_size", "8"]


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("SWARMLAB_STOP_AT_STEP", raising=False)


def example():
    spec = importlib.util.spec_from_file_location("steer_sft_rollback_example", ROOT / "examples" / "steer" / "sft_addition.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_a_fresh_run_keeps_its_untrained_start_and_a_fork_keeps_none(tmp_path):
    sft = example()
    out, run = tmp_path / "out", tmp_path / "run"
    assert sft.main([*TINY, "--output_dir", str(out), "--run_dir", str(run), "--seed", "7"]) == 0
    init = json.loads((run / "checkpoints" / "init.json").read_text())
    assert init["name"] == "init" and init["step"] == 0 and init["kind"] == "init"
    assert pathlib.Path(init["path"]) == (out / "swarm-init").resolve()
    assert json.loads((out / "swarm-init" / "trainer_state.json").read_text())["global_step"] == 0
    # the weights saved are the model before its first update: the script's model for that seed
    saved = load_file(out / "swarm-init" / "model.safetensors")
    fresh = sft.tiny_qwen2(32, 1, seed=7).state_dict()
    assert saved and all(torch.equal(saved[k], fresh[k]) for k in saved)
    assert not list(out.glob("checkpoint-*"))        # not in the Trainer's own rotation

    fork_run = tmp_path / "fork"
    fork_run.mkdir()
    (fork_run / "settings.json").write_text(json.dumps({"version": 1, "fork": True, "overrides": {}}))
    assert sft.main([*TINY, "--output_dir", str(tmp_path / "fork-out"), "--run_dir", str(fork_run)]) == 0
    assert not (fork_run / "checkpoints" / "init.json").exists() and not (tmp_path / "fork-out" / "swarm-init").exists()
    assert json.loads((fork_run / "settings.json").read_text())["fork"] is True   # kept when the callback rewrites it

    again = tmp_path / "again"   # a run told to keep no start
    script, args = sft.parser().parse_args_into_dataclasses(args=[*TINY, "--output_dir", str(again / "out"), "--steer", "false"])
    trainer = sft.build(script, args)
    trainer.add_callback(SwarmCallback(again / "run", trainer=trainer, save_init=False))
    trainer.train()
    assert not (again / "run" / "checkpoints" / "init.json").exists()


def test_a_rollback_relaunches_from_the_untrained_start_with_the_changes_sent_in_its_pause(tmp_path):
    # a too-high lr trains the run; in one pause: a rollback to `init` with a lower lr (hot) and a
    # shorter run (restart), as the controller sends them
    p, run = relaunch(tmp_path, "--max_steps", "400", "--per_device_train_batch_size", "8", "--learning_rate", "0.05",
                      "--save_strategy", "steps", "--save_steps", "10", "--warmup_steps", "10", size=("32", "1"))
    wait_for(step_at_least(run, 21), p)
    send_command(run, "pause", id="hold")
    wait_for(ack(run, "hold"), p)
    for cid, cmd, kw in (("nope", "rollback", {"name": "checkpoint-999"}), ("rb", "rollback", {"name": "init"}),
                         ("lr", "set_fields", {"fields": {"learning_rate": 1e-3}}),
                         ("ms", "set_fields", {"fields": {"max_steps": 15}})):
        send_command(run, cmd, id=cid, **kw)
        wait_for(ack(run, cid), p)
    left = json.loads((run / "heartbeat.json").read_text())["step"]
    send_command(run, "resume", id="go")
    out = finish(p)

    got = acks_once(run)
    init = str(tmp_path / "out" / "swarm-init")
    assert got["nope"]["status"] == "rejected" and "no checkpoint 'checkpoint-999'" in got["nope"]["reason"]
    assert got["rb"]["status"] == "restart" and got["rb"]["result"] == {"rollback": "init", "checkpoint": init, "restart": {}}
    assert got["lr"]["status"] == "restart" and got["lr"]["result"]["hot"] == {"learning_rate": 1e-3}
    assert got["ms"]["status"] == "restart" and got["ms"]["result"]["restart"] == {"max_steps": 15}
    assert {got[c]["step"] for c in ("nope", "rb", "lr", "ms")} == {left}   # one safe point: no step in between

    launches = [r for r in read_jsonl(run / "launches.jsonl") if r["event"] == "launch"]
    assert [r["reason"] for r in launches] == ["start", "restart"], out[-2000:]
    assert launches[1]["resume_from"] == init and launches[1]["argv"][-4:] == ["--max_steps", "15",
                                                                              "--resume_from_checkpoint", init]
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    first, second = [r for r in rows if r["segment"] == 0], [r for r in rows if r["segment"] == 1]
    assert [r["step"] for r in first] == list(range(1, left + 1)) and [r["step"] for r in second] == list(range(1, 16))
    # the same weights and the same first batch: the run starts over from where it began
    assert second[0]["loss"] == pytest.approx(first[0]["loss"], rel=1e-6)
    # at the new lr from its first update (the warm-up of the run's own schedule towards 1e-3)
    assert max(r["lr"] for r in first) > 0.01 and max(r["lr"] for r in second) == pytest.approx(1e-3, rel=0.05)
    req = json.loads((run / "restart.json").read_text())
    assert req["status"] == "applied" and req["live"] == {"max_steps": 15, "learning_rate": 1e-3}
    assert json.loads((run / "settings.json").read_text())["overrides"] == {"learning_rate": 1e-3}
    # the abandoned steps' checkpoints left the index: a crash now resumes from this timeline's
    index = {json.loads(m.read_text())["name"]: json.loads(m.read_text()) for m in (run / "checkpoints").glob("*.json")}
    assert set(index) == {"init", "checkpoint-10", "checkpoint-15"}     # 15: the Trainer's save at max_steps
    assert all(c["time"] > got["rb"]["time"] for n, c in index.items() if n != "init")
    rolled = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "rolled_back"]
    assert len(rolled) == 1 and rolled[0]["name"] == "init" and f"checkpoint-{left // 10 * 10}" in rolled[0]["dropped"]
