"""The control channel: every command is applied at the next safe point and acknowledged with its
result; invalid ones are rejected with a reason while training goes on; an acknowledged command is
never applied again, even after a resume.

Most tests send commands from the trainer's `on_step` hook (so they land at a known step); the
pause/resume/stop tests drive a trainer running in a background thread from outside, as an operator
would."""
from __future__ import annotations

import threading
import time

import yaml

from harness.spec import HarnessSpec
from trainer.config import RunConfig
from trainer.control import send_command, wait_for_ack
from trainer.loop import Trainer
from trainer.runlog import read_heartbeat, read_jsonl


def step_rows(run_dir):
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if not r.get("final")]


def acks(run_dir):
    return {a["id"]: a for a in read_jsonl(run_dir / "command_log.jsonl")}


def run_with_commands(cfg: RunConfig, schedule: dict[int, list[tuple[str, dict]]], **run_kw):
    """Run `cfg`, sending `schedule[step]` commands right after `step` first completes (once: after
    a rollback the step is reached again)."""
    schedule = dict(schedule)
    tr = Trainer(cfg)
    ids: dict[str, str] = {}

    def on_step(row):
        for i, (cmd, args) in enumerate(schedule.pop(row["step"], [])):
            ids[f"{row['step']}.{i}"] = send_command(cfg.run_dir, cmd, **args)

    tr.on_step = on_step
    summary = tr.run(**run_kw)
    return tr, summary, ids


def constant(make_cfg, **over):
    base = {"recipe": {"schedule": "constant", "warmup_steps": 0, "steps": 6}}
    over = {**over, "recipe": {**base["recipe"], **over.get("recipe", {})}}
    return RunConfig.parse(make_cfg(**over))


def test_set_recipe_changes_lr_from_the_next_step(make_cfg):
    cfg = constant(make_cfg)
    _, summary, ids = run_with_commands(cfg, {2: [("set_recipe", {"fields": {"lr": 1e-3, "steps": 5}})]})
    ack = acks(cfg.run_dir)[ids["2.0"]]
    assert ack["status"] == "applied" and ack["step"] == 2 and ack["cmd"] == "set_recipe"
    assert ack["result"] == {"recipe": {"lr": 1e-3, "steps": 5}}
    rows = step_rows(cfg.run_dir)
    assert [r["lr"] for r in rows] == [1e-2, 1e-2, 1e-3, 1e-3, 1e-3]
    assert summary["step"] == 5  # the new step budget is obeyed


def test_set_harness_inline_and_by_version(make_cfg):
    cfg = constant(make_cfg)
    original = cfg.harness.version
    new = cfg.harness.model_copy(update={"template": "{question}?"})
    _, _, ids = run_with_commands(cfg, {
        2: [("set_harness", {"harness": new.model_dump(mode="json")})],
        4: [("set_harness", {"version": original})],
    })
    a = acks(cfg.run_dir)
    assert a[ids["2.0"]]["status"] == "applied" and a[ids["2.0"]]["result"] == {"harness_version": new.version}
    assert a[ids["4.0"]]["status"] == "applied" and a[ids["4.0"]]["result"] == {"harness_version": original}
    versions = [r["harness_version"] for r in step_rows(cfg.run_dir)]
    assert versions == [original, original, new.version, new.version, original, original]
    stored = cfg.run_dir / "harnesses" / f"{new.version}.yaml"
    assert HarnessSpec.model_validate(yaml.safe_load(stored.read_text())) == new
    prompts = {s["step"]: s["prompt"] for s in read_jsonl(cfg.run_dir / "samples.jsonl")}
    assert prompts[1].endswith("=") and prompts[2].endswith("?") and prompts[4].endswith("=")


def test_checkpoint_command_and_rollback(make_cfg):
    cfg = constant(make_cfg)
    tr, summary, ids = run_with_commands(cfg, {
        2: [("checkpoint", {"name": "mark"})],
        4: [("rollback", {"name": "mark"})],
    })
    a = acks(cfg.run_dir)
    assert a[ids["2.0"]]["result"] == {"checkpoint": "mark"}
    assert a[ids["4.0"]]["status"] == "applied" and a[ids["4.0"]]["result"] == {"rolled_back_to": "mark", "step": 2}
    manifest = [m for m in tr.ckpt.manifests() if m["name"] == "mark"][0]
    assert manifest["kind"] == "named" and manifest["step"] == 2
    rows = step_rows(cfg.run_dir)
    assert [(r["step"], r["segment"]) for r in rows] == [(1, 0), (2, 0), (3, 0), (4, 0),
                                                         (3, 1), (4, 1), (5, 1), (6, 1)]
    # the rollback restored everything (weights, optimiser, RNG, data cursor): steps 3–4 replay exactly
    assert [r["loss"] for r in rows[2:4]] == [r["loss"] for r in rows[4:6]]
    assert summary["step"] == 6
    assert any(e["event"] == "checkpoint" and e["name"] == "mark" for e in read_jsonl(cfg.run_dir / "events.jsonl"))


def test_checkpoint_command_without_name_saves_a_periodic_one(make_cfg):
    cfg = constant(make_cfg, recipe={"steps": 3})
    tr, _, ids = run_with_commands(cfg, {1: [("checkpoint", {})]})
    assert acks(cfg.run_dir)[ids["1.0"]]["result"] == {"checkpoint": "step_0000001"}


def _background(tr: Trainer) -> tuple[threading.Thread, dict]:
    box: dict = {}
    th = threading.Thread(target=lambda: box.update(summary=tr.run()), daemon=True)
    th.start()
    return th, box


def _wait(pred, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_pause_resume_stop_from_outside(make_cfg):
    cfg = constant(make_cfg, recipe={"steps": 100_000, "batch_size": 2}, samples_per_step=0)
    tr = Trainer(cfg)
    th, box = _background(tr)
    try:
        _wait(lambda: len(step_rows(cfg.run_dir)) >= 2)
        pause = wait_for_ack(cfg.run_dir, send_command(cfg.run_dir, "pause"), timeout=30)
        assert pause["status"] == "applied" and pause["result"] == {"paused": True}
        _wait(lambda: (read_heartbeat(cfg.run_dir) or {}).get("state") == "paused")
        n = len(step_rows(cfg.run_dir))
        time.sleep(0.6)
        assert len(step_rows(cfg.run_dir)) == n, "steps ran while paused"
        hb = read_heartbeat(cfg.run_dir)
        assert hb["state"] == "paused" and hb["step"] == pause["step"] == n
        assert time.time() - hb["time"] < 3.0  # the heartbeat keeps beating (every 0.2 s) while paused
        res = wait_for_ack(cfg.run_dir, send_command(cfg.run_dir, "resume"), timeout=30)
        assert res["status"] == "applied" and res["result"] == {"paused": False}
        _wait(lambda: len(step_rows(cfg.run_dir)) >= n + 2)
        assert read_heartbeat(cfg.run_dir)["state"] == "running"
        stop = wait_for_ack(cfg.run_dir, send_command(cfg.run_dir, "stop"), timeout=30)
        assert stop["status"] == "applied" and stop["result"] == {"stopping": True}
        th.join(60)
        assert not th.is_alive()
    finally:
        if th.is_alive():
            send_command(cfg.run_dir, "stop")
            th.join(60)
    assert box["summary"]["status"] == "stopped_by_command"
    assert box["summary"]["step"] == stop["step"]
    assert read_heartbeat(cfg.run_dir)["state"] == "stopped_by_command"
    # stopping saves a checkpoint at the stop step, so the run can be resumed
    assert tr.ckpt.manifests()[-1]["step"] == stop["step"]


def test_stop_while_paused(make_cfg):
    cfg = constant(make_cfg, recipe={"steps": 100_000, "batch_size": 2}, samples_per_step=0)
    tr = Trainer(cfg)
    th, box = _background(tr)
    try:
        wait_for_ack(cfg.run_dir, send_command(cfg.run_dir, "pause"), timeout=30)
        stop = wait_for_ack(cfg.run_dir, send_command(cfg.run_dir, "stop"), timeout=30)
        assert stop["status"] == "applied"
        th.join(60)
    finally:
        if th.is_alive():
            send_command(cfg.run_dir, "resume")
            send_command(cfg.run_dir, "stop")
            th.join(60)
    assert box["summary"]["status"] == "stopped_by_command"


def test_invalid_commands_are_rejected_and_training_goes_on(make_cfg):
    cfg = constant(make_cfg, recipe={"steps": 3})
    tr = Trainer(cfg)
    bad = {
        "unknown": {"cmd": "explode"},
        "neg_lr": {"cmd": "set_recipe", "fields": {"lr": -1}},
        "mixed": {"cmd": "set_recipe", "fields": {"lr": 5e-3, "batch_size": 0}},
        "bad_field": {"cmd": "set_recipe", "fields": {"lrr": 0.1}},
        "bad_algo": {"cmd": "set_recipe", "fields": {"algorithm": "ppo"}},
        "no_fields": {"cmd": "set_recipe"},
        "ghost": {"cmd": "rollback", "name": "nope"},
        "no_name": {"cmd": "rollback"},
        "bad_template": {"cmd": "set_harness", "harness": {"template": "no placeholder"}},
        "too_hard": {"cmd": "set_harness", "harness": {"curriculum": {"start": 40}}},
        "no_version": {"cmd": "set_harness", "version": "0123456789ab"},
        "empty_harness": {"cmd": "set_harness"},
        "bad_ckpt": {"cmd": "checkpoint", "name": "../escape"},
        "extra": {"cmd": "stop", "force": True},
    }
    import json

    with open(cfg.run_dir / "commands.jsonl", "a") as f:
        f.write("{not json\n")
        f.write("[1, 2]\n")
        for cid, row in bad.items():
            f.write(json.dumps({"id": cid, **row}) + "\n")
    summary = tr.run()
    assert summary["status"] == "completed" and summary["step"] == 3
    a = acks(cfg.run_dir)
    assert set(a) == set(bad) | {"line1", "line2"}
    assert all(x["status"] == "rejected" and x["reason"] and x["step"] == 0 for x in a.values())
    assert "not JSON" in a["line1"]["reason"] and "JSON object" in a["line2"]["reason"]
    assert "explode" in a["unknown"]["reason"]
    assert "recipe.lr=-1" in a["neg_lr"]["reason"]
    assert "recipe.batch_size=0" in a["mixed"]["reason"]
    assert "recipe.lrr" in a["bad_field"]["reason"] and "unknown" in a["bad_field"]["reason"]
    assert "ppo" in a["bad_algo"]["reason"]
    assert "fields" in a["no_fields"]["reason"]
    assert "nope" in a["ghost"]["reason"]
    assert "name" in a["no_name"]["reason"]
    assert "no placeholder" in a["bad_template"]["reason"]
    assert "difficulty=40" in a["too_hard"]["reason"]
    assert "0123456789ab" in a["no_version"]["reason"]
    assert "../escape" in a["bad_ckpt"]["reason"]
    assert "force" in a["extra"]["reason"]
    # nothing was half-applied: lr stays at its configured value on every step
    assert {r["lr"] for r in step_rows(cfg.run_dir)} == {1e-2}


def test_acknowledged_commands_are_not_reapplied_after_resume(make_cfg):
    cfg = constant(make_cfg, recipe={"steps": 6}, checkpoint={"interval": 3})
    tr = Trainer(cfg)
    send_command(cfg.run_dir, "set_recipe", id="lr", fields={"lr": 2e-3})
    send_command(cfg.run_dir, "checkpoint", id="named", name="early")
    with open(cfg.run_dir / "commands.jsonl", "a") as f:
        f.write("{broken\n")
    send_command(cfg.run_dir, "set_recipe", id="bad", fields={"lr": -5})
    tr.run(until=3)
    first = read_jsonl(cfg.run_dir / "command_log.jsonl")
    assert [(a["id"], a["status"]) for a in first] == [("lr", "applied"), ("named", "applied"),
                                                        ("line3", "rejected"), ("bad", "rejected")]
    Trainer(cfg).run()  # resumes from step 3 and sees the same inbox
    log = read_jsonl(cfg.run_dir / "command_log.jsonl")
    assert log == first, "a command was acknowledged twice"
    ckpt_events = [e for e in read_jsonl(cfg.run_dir / "events.jsonl") if e.get("name") == "early"]
    assert len(ckpt_events) == 1
    assert {r["lr"] for r in step_rows(cfg.run_dir)} == {2e-3}  # recipe change survived the resume
    # a new command sent after the resume is still applied
    tr3 = Trainer(cfg)
    cid = send_command(cfg.run_dir, "checkpoint", name="late")
    tr3.run()
    assert acks(cfg.run_dir)[cid]["status"] == "applied"


def test_rollback_to_a_periodic_checkpoint(make_cfg):
    cfg = constant(make_cfg, recipe={"steps": 5}, checkpoint={"interval": 2})
    _, summary, ids = run_with_commands(cfg, {3: [("rollback", {"name": "step_0000002"})]})
    assert acks(cfg.run_dir)[ids["3.0"]]["result"]["step"] == 2
    assert [r["step"] for r in step_rows(cfg.run_dir)] == [1, 2, 3, 3, 4, 5]


def test_set_fields_changes_recipe_and_harness_together(make_cfg):
    cfg = constant(make_cfg, recipe={"steps": 4})
    _, _, ids = run_with_commands(cfg, {
        1: [("set_fields", {"fields": {"recipe.lr": 2e-3, "harness.sampling.max_new_tokens": 2}})],
        2: [("set_fields", {"fields": {"harness.curriculum.start": 40}}),
            ("set_fields", {"fields": {"model.d_model": 64}})],
    })
    a = acks(cfg.run_dir)
    assert a[ids["1.0"]]["status"] == "applied"
    new_version = a[ids["1.0"]]["result"]["harness_version"]
    assert a[ids["2.0"]]["status"] == "rejected" and "difficulty=40" in a[ids["2.0"]]["reason"]
    assert a[ids["2.1"]]["status"] == "rejected" and "model.d_model" in a[ids["2.1"]]["reason"]
    rows = step_rows(cfg.run_dir)
    assert [r["lr"] for r in rows] == [1e-2, 2e-3, 2e-3, 2e-3]
    assert [r["harness_version"] for r in rows][1:] == [new_version] * 3  # the rejected start=40 left no trace
    assert all(r["response_len"] <= 2 for r in rows[1:])
    assert (cfg.run_dir / "harnesses" / f"{new_version}.yaml").exists()
