"""The steering SDK's pure parts: `check_change` on a table of changes, the declared settings of
an args/trainer pair, the HF → run-format metric names, the inbox's parsing and acks."""
from __future__ import annotations

import json
import sys
import types

import pytest

from trainer.control import send_command
from trainer.steer.inbox import SteerInbox
from trainer.steer.metrics import run_metrics
from trainer.steer.settings import Setting, as_settings, check_change, declared_settings, needs_restart, settings_version

DECLARED = [
    Setting("learning_rate", "float", "hot", gt=0, le=1),
    Setting("max_grad_norm", "float", "hot", ge=0),
    Setting("max_completion_length", "int", "hot", ge=1),
    Setting("lr_scheduler_type", "str", "restart", choices=("linear", "cosine")),
    Setting("per_device_train_batch_size", "int", "restart", ge=1),
    Setting("packing", "bool", "restart"),
]


@pytest.mark.parametrize("change, reason", [
    ({"learning_rate": 3e-4}, None),
    ({"learning_rate": 1}, None),                                   # an int where a float is declared
    ({"max_completion_length": 64.0}, None),                        # a whole float where an int is
    ({"lr_scheduler_type": "cosine", "packing": False}, None),
    ({}, "a change needs at least one setting"),
    ({"lora_rank": 8}, "unknown setting 'lora_rank' (declared: learning_rate, lr_scheduler_type, max_completion_length, "
                       "max_grad_norm, packing, per_device_train_batch_size)"),
    ({"learning_rate": 0.0}, "learning_rate=0.0: must be > 0"),
    ({"learning_rate": 2.0}, "learning_rate=2.0: must be <= 1"),
    ({"learning_rate": "1e-3"}, "learning_rate='1e-3': must be a number"),
    ({"learning_rate": float("nan")}, "learning_rate=nan: must be finite"),
    ({"max_grad_norm": True}, "max_grad_norm=True: must be a number"),
    ({"max_completion_length": 7.5}, "max_completion_length=7.5: must be an integer"),
    ({"max_completion_length": 0}, "max_completion_length=0: must be >= 1"),
    ({"lr_scheduler_type": "step"}, "lr_scheduler_type='step': must be one of linear, cosine"),
    ({"packing": 1}, "packing=1: must be true or false"),
    ({"learning_rate": 1e-3, "per_device_train_batch_size": -2}, "per_device_train_batch_size=-2: must be >= 1"),
])
def test_check_change(change, reason):
    assert check_change(DECLARED, change) == reason
    # the same answer from the JSON a run writes (what the swarm reads) as from the objects
    as_json = json.loads(json.dumps({"settings": [s.to_json() for s in DECLARED]}))
    assert check_change(as_json, change) == reason


def test_a_change_with_any_restart_setting_needs_a_restart():
    assert not needs_restart(DECLARED, {"learning_rate": 1e-3, "max_grad_norm": 1.0})
    assert needs_restart(DECLARED, {"learning_rate": 1e-3, "per_device_train_batch_size": 8})


def test_settings_round_trip_and_refuse_bad_declarations():
    assert as_settings([s.to_json() for s in DECLARED]) == {s.name: s for s in DECLARED}
    with pytest.raises(ValueError, match="apply='sometimes'"):
        Setting("x", "float", "sometimes")
    with pytest.raises(ValueError, match="type='complex'"):
        Setting("x", "complex", "hot")


def test_settings_version_is_a_content_hash():
    a = settings_version({"learning_rate": 1e-3, "max_grad_norm": 1.0})
    assert a == settings_version({"max_grad_norm": 1.0, "learning_rate": 1e-3})
    assert a != settings_version({"learning_rate": 2e-3, "max_grad_norm": 1.0})


def _args(**kw):
    base = dict(learning_rate=1e-3, weight_decay=0.0, max_grad_norm=1.0, per_device_train_batch_size=4,
                gradient_accumulation_steps=1, max_steps=10, seed=0)
    return types.SimpleNamespace(**{**base, **kw})


def test_declared_settings_follow_what_the_trainer_has():
    names = lambda ss: {s.name: s.apply for s in ss}   # noqa: E731
    plain = names(declared_settings(_args()))
    assert {k: plain[k] for k in ("learning_rate", "weight_decay", "max_grad_norm")} == dict.fromkeys(
        ("learning_rate", "weight_decay", "max_grad_norm"), "hot")
    assert "temperature" not in plain and "num_generations" not in plain and plain["seed"] == "restart"

    grpo_like = types.SimpleNamespace(temperature=1.0, max_completion_length=16,
                                      generation_config=types.SimpleNamespace(temperature=1.0, max_new_tokens=16))
    trl_args = _args(temperature=1.0, max_completion_length=16, num_generations=4, beta=0.0)
    live = names(declared_settings(trl_args, grpo_like))
    assert live["temperature"] == live["max_completion_length"] == "hot" and live["num_generations"] == "restart"
    # vLLM samples in another process: its generation settings need a relaunch
    vllm = names(declared_settings(_args(use_vllm=True, temperature=1.0), grpo_like))
    assert vllm["temperature"] == vllm["max_completion_length"] == "restart"
    # known to the args only (no trainer to set it on): restart
    assert names(declared_settings(trl_args))["temperature"] == "restart"

    extra = declared_settings(_args(), extra=[Setting("lora_rank", "int", "restart", ge=1)])
    assert names(extra)["lora_rank"] == "restart"
    with pytest.raises(ValueError, match="already declared"):
        declared_settings(_args(), extra=[Setting("seed", "int", "restart")])
    with pytest.raises(ValueError, match="apply='hot'"):
        declared_settings(_args(), extra=[Setting("loss_scale", "float", "hot")])


def test_check_change_needs_neither_torch_nor_transformers():
    import subprocess

    code = ("import sys, json; from trainer.steer import check_change; "
            "print(check_change({'settings': [{'name': 'learning_rate', 'type': 'float', 'apply': 'hot', 'gt': 0}]}, "
            "{'learning_rate': -1})); print('torch' in sys.modules, 'transformers' in sys.modules)")
    import pathlib

    repo = pathlib.Path(__file__).parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo).stdout.split("\n")
    assert out[:2] == ["learning_rate=-1: must be > 0", "False False"]


def test_metric_names():
    logs = {"loss": 2.0, "learning_rate": 1e-3, "grad_norm": 0.5, "reward": 0.25, "completions/mean_length": 12.0,
            "completions/clipped_ratio": 0.1, "kl": 0.01, "eval_loss": 1.5, "eval_accuracy": 0.8, "eval_runtime": 0.2,
            "eval_exact": 0.4, "eval_completions/clipped_ratio": 0.5, "table": [1, 2], "flag": True}
    assert run_metrics(logs, {"eval_exact": "heldout_exact_match"}) == {
        "loss": 2.0, "lr": 1e-3, "grad_norm": 0.5, "reward_mean": 0.25, "response_len": 12.0, "truncation_rate": 0.1,
        "kl": 0.01, "heldout_loss": 1.5, "heldout_acc": 0.8, "eval_runtime": 0.2, "heldout_exact_match": 0.4,
        "heldout_truncated": 0.5}


def test_the_inbox_reads_new_lines_once_and_skips_acked_ids(tmp_path):
    send_command(tmp_path, "set_fields", id="a", fields={"learning_rate": 1e-3})
    send_command(tmp_path, "set_recipe", id="b", recipe={"lr": 1e-3})
    send_command(tmp_path, "rollback", id="c")                 # no checkpoint named
    with open(tmp_path / "commands.jsonl", "a") as f:
        f.write("[1, 2]\n{\"id\": \"torn\"")          # a non-object line, then one being written
    box = SteerInbox(tmp_path)
    got = box.poll()
    assert [(c["id"], c.get("invalid")) for c in got] == [
        ("a", None),
        ("b", "command 'set_recipe' is not supported here (supported: set_fields, eval, checkpoint, rollback, stop, pause, resume)"),
        ("c", "rollback needs 'name': the checkpoint's name in the run's index"),
        ("line4", "a command must be a JSON object")]
    assert box.poll() == []
    with open(tmp_path / "commands.jsonl", "a") as f:
        f.write(", \"cmd\": \"stop\"}\n")
    assert [c["id"] for c in box.poll()] == ["torn"]
    box.ack("a", "set_fields", 3, "applied", {"values": {"learning_rate": 1e-3}})
    box.ack("b", "set_recipe", 3, "rejected", "not supported")
    box.close()
    again = SteerInbox(tmp_path)   # a resumed process: acked ids are not offered again
    assert [c["id"] for c in again.poll()] == ["c", "line4", "torn"]
    again.close()
    rows = [json.loads(x) for x in (tmp_path / "command_log.jsonl").read_text().splitlines()]
    assert [(r["id"], r["status"], "result" in r, "reason" in r) for r in rows] == [
        ("a", "applied", True, False), ("b", "rejected", False, True)]


def test_the_docs_settings_table_is_what_a_run_declares():
    import pathlib

    from trainer.steer.settings import _RESTART

    doc = (pathlib.Path(__file__).parents[1] / "docs" / "steering.md").read_text()
    table = doc.split("## Settings", 1)[1].split("\n\n")
    rows = [line.split("|")[1:5] for part in table for line in part.splitlines() if line.startswith("| `")]
    documented = {c[0].strip().strip("`"): (c[1].strip(), c[3].strip().split()[0]) for c in rows}
    everything = _args(**{s.name: 1 for s in _RESTART}, temperature=1.0, max_completion_length=8)
    on_trainer = types.SimpleNamespace(temperature=1.0, max_completion_length=8)
    declared = {s.name: (s.type, s.apply) for s in declared_settings(everything, on_trainer)}
    assert documented == declared
