"""The relauncher (`trainer.steer.relaunch`) with the real example script
(`examples/steer/sft_addition.py`: a plain `transformers.Trainer` on a tiny random Qwen2, CPU).

Commands reach the script as the swarm sends them (`trainer.control.send_command`) while it runs
under `python -m trainer.steer.relaunch`. The decision (`decide`) and the argv it builds are
tested on tables. The two end-to-end cases are: a restart-required change relaunches the script
from the checkpoint with the new value in force; a SIGKILLed script resumes from its newest
checkpoint, with every command applied once and its hot changes still in force.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

from trainer.control import send_command
from trainer.runlog import read_heartbeat, read_jsonl
from trainer.steer.relaunch import Done, Launch, decide, launch_argv, newest_checkpoint, restart_changes

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "steer" / "sft_addition.py"
CKPT = {"path": "/o/checkpoint-20", "step": 20}
REQ = {"id": "bs", "checkpoint": "/o/checkpoint-7", "status": "pending"}


# ---- the decision, on a table ---------------------------------------------------------------------

@pytest.mark.parametrize("rc, restart, relaunched, ckpt, crashes, want", [
    (None, None, set(), None, 0, Launch("start")),
    (None, None, set(), CKPT, 0, Launch("resume", "/o/checkpoint-20")),          # a new job on an old run
    (None, REQ, set(), CKPT, 0, Launch("restart", "/o/checkpoint-7", "bs")),     # the old job stopped for a restart
    (0, REQ, set(), CKPT, 0, Launch("restart", "/o/checkpoint-7", "bs")),
    (0, REQ, {"bs"}, CKPT, 0, Done(0, "the script finished")),                  # already relaunched once
    (0, None, set(), CKPT, 0, Done(0, "the script finished")),
    (-9, None, set(), CKPT, 0, Launch("crash", "/o/checkpoint-20")),
    (1, None, set(), None, 2, Launch("crash")),
    (1, None, set(), CKPT, 3, Launch("crash", "/o/checkpoint-20")),
    (1, None, set(), CKPT, 4, Done(1, "the script crashed 4 times in a row without progress (last exit 1)")),
    (-9, REQ, set(), CKPT, 4, Launch("restart", "/o/checkpoint-7", "bs")),     # killed after it saved for the restart
])
def test_decide(rc, restart, relaunched, ckpt, crashes, want):
    assert decide(rc, restart, relaunched, ckpt, crashes, max_crashes=3) == want


def test_changes_are_appended_as_flags_the_last_of_which_wins():
    acks = [{"id": "a", "status": "restart", "result": {"restart": {"per_device_train_batch_size": 16, "seed": 1}}},
            {"id": "b", "status": "applied", "result": {"values": {"learning_rate": 0.1}}},
            {"id": "c", "status": "restart", "result": {"restart": {"seed": 2, "adam_beta2": 0.95, "packing": True}}}]
    changes = restart_changes(acks)
    assert changes == {"per_device_train_batch_size": 16, "seed": 2, "adam_beta2": 0.95, "packing": True}
    assert launch_argv(["python", "t.py", "--seed", "0"], changes, "/o/checkpoint-7") == [
        "python", "t.py", "--seed", "0", "--per_device_train_batch_size", "16", "--seed", "2", "--adam_beta2", "0.95",
        "--packing", "true", "--resume_from_checkpoint", "/o/checkpoint-7"]
    assert launch_argv(["t"], {}, None) == ["t"]


def test_a_script_that_keeps_crashing_is_given_up(tmp_path):
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "trainer.steer.relaunch", "--run-dir", str(run), "--max-crashes", "2", "--",
                        sys.executable, "-c", "import sys; sys.exit(3)"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 3, p.stderr
    rows = read_jsonl(run / "launches.jsonl")
    assert [r["reason"] for r in rows if r["event"] == "launch"] == ["start", "crash", "crash"]
    assert rows[-1] == {**rows[-1], "event": "done", "rc": 3}
    assert "crashed 3 times in a row" in p.stderr


def test_no_command_is_one_line_and_exit_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "trainer.steer.relaunch", "--run-dir", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no command" in p.stderr and "Traceback" not in p.stderr


# ---- the real script under the relauncher ------------------------------------------------------------

def relaunch(tmp: pathlib.Path, *args: str, size: tuple[str, str] = ("32", "1")) -> tuple[subprocess.Popen, pathlib.Path]:
    run = tmp / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "trainer.steer.relaunch", "--run-dir", str(run), "--",
           sys.executable, str(SCRIPT), "--output_dir", str(tmp / "out"), "--d_model", size[0], "--n_layers", size[1],
           "--train_size", "512", "--eval_size", "64", "--eval_strategy", "no", *args]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p, run


def wait_for(what, p: subprocess.Popen, timeout: float = 240.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = what()
        if got:
            return got
        if p.poll() is not None:
            pytest.fail(f"the relauncher ended ({p.returncode}) before the wait was over:\n{p.stdout.read()[-3000:]}")
        time.sleep(0.05)
    p.kill()
    pytest.fail(f"timed out:\n{p.stdout.read()[-3000:]}")


def finish(p: subprocess.Popen, timeout: float = 300.0) -> str:
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        pytest.fail(f"the relauncher did not finish:\n{out[-3000:]}")
    assert p.returncode == 0, out[-3000:]
    return out


def step_at_least(run: pathlib.Path, n: int):
    return lambda: (read_heartbeat(run) or {}).get("step", 0) >= n and (read_heartbeat(run) or {}).get("state") == "running"


def ack(run: pathlib.Path, cid: str):
    return lambda: next((r for r in read_jsonl(run / "command_log.jsonl") if r["id"] == cid), None)


def acks_once(run: pathlib.Path) -> dict[str, dict]:
    rows = read_jsonl(run / "command_log.jsonl")
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"an id was acknowledged twice: {ids}"
    return {r["id"]: r for r in rows}


def test_a_restart_setting_relaunches_from_its_checkpoint_with_the_change_in_force(tmp_path):
    # the default model size (tens of ms a step): the command lands while the run is going
    p, run = relaunch(tmp_path, "--max_steps", "300", "--per_device_train_batch_size", "8", "--save_strategy", "no",
                      "--lr_scheduler_type", "constant", "--warmup_steps", "0", "--learning_rate", "1e-3",
                      size=("64", "2"))
    wait_for(step_at_least(run, 1), p)
    send_command(run, "set_fields", id="bs", fields={"per_device_train_batch_size": 16})
    send_command(run, "set_fields", id="lr", fields={"learning_rate": 2e-3})   # applied by the relaunched process
    finish(p)

    got = acks_once(run)
    s = got["bs"]["step"]
    ckpt = tmp_path / "out" / f"checkpoint-{s}"
    assert got["bs"]["status"] == "restart" and got["bs"]["result"] == {"restart": {"per_device_train_batch_size": 16},
                                                                       "checkpoint": str(ckpt)}
    assert got["lr"]["status"] == "applied" and got["lr"]["step"] > s

    launches = [r for r in read_jsonl(run / "launches.jsonl") if r["event"] == "launch"]
    assert [r["reason"] for r in launches] == ["start", "restart"]
    assert launches[1]["resume_from"] == str(ckpt) and launches[1]["restart_id"] == "bs"
    assert launches[1]["argv"][-4:] == ["--per_device_train_batch_size", "16", "--resume_from_checkpoint", str(ckpt)]
    req = json.loads((run / "restart.json").read_text())
    assert req["status"] == "applied" and req["live"] == {"per_device_train_batch_size": 16}
    assert json.loads((run / "trainer_args.json").read_text())["per_device_train_batch_size"] == 16

    # the batch in force, measured: within a process the epoch advances by batch / 512 examples per step
    # (the Trainer recomputes the epoch from the step at a resume, so the jump between the two is not one)
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 301)) and s < 300 and {r["segment"] for r in rows if r["step"] > s} == {1}
    for a, b in zip(rows, rows[1:]):
        if a["segment"] != b["segment"]:
            continue
        assert b["epoch"] - a["epoch"] == pytest.approx((16 if b["step"] > s else 8) / 512), (a, b)
    # the row of step t holds the lr its update used: the new one from the update after the ack on
    assert all(r["lr"] == pytest.approx(1e-3 if r["step"] <= got["lr"]["step"] else 2e-3) for r in rows)
    events = [e["event"] for e in read_jsonl(run / "events.jsonl")]
    assert events.count("restart_requested") == 1 and events.count("relaunch") == 1
    assert events.index("restart_requested") < events.index("relaunch") < events.index("restart_applied")
    assert read_heartbeat(run)["state"] == "completed"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_sigkilled_script_resumes_from_its_newest_checkpoint_with_its_commands_intact(tmp_path):
    p, run = relaunch(tmp_path, "--max_steps", "100000", "--save_steps", "10", "--lr_scheduler_type", "constant",
                      "--warmup_steps", "0", "--learning_rate", "1e-3", "--weight_decay", "0.0")
    wait_for(step_at_least(run, 3), p)
    send_command(run, "set_fields", id="lr", fields={"learning_rate": 4e-3})
    applied = wait_for(ack(run, "lr"), p)
    assert applied["status"] == "applied"
    first_pid = wait_for(lambda: (hb := read_heartbeat(run)) and hb["step"] >= 23 and hb["pid"], p)
    assert first_pid != p.pid
    os.kill(first_pid, signal.SIGKILL)
    wait_for(lambda: not alive(first_pid), p)
    # the newest checkpoint in the index when the script died (the heartbeat, written every 0.5 s,
    # may lag the steps by more than a save interval)
    newest_at_kill = newest_checkpoint(run)
    # sent while nothing runs: a replay of an applied id with another value, and a new command
    send_command(run, "set_fields", id="lr", fields={"learning_rate": 9e-3})
    send_command(run, "set_fields", id="wd", fields={"weight_decay": 0.05})
    wd = wait_for(ack(run, "wd"), p)
    send_command(run, "stop", id="halt")
    finish(p)

    launches = [r for r in read_jsonl(run / "launches.jsonl") if r["event"] in ("launch", "exit")]
    assert [(r["event"], r.get("reason"), r.get("rc")) for r in launches] == [
        ("launch", "start", None), ("exit", None, -signal.SIGKILL), ("launch", "crash", None), ("exit", None, 0)]
    resumed_from = launches[2]["resume_from"]
    k = int(pathlib.Path(resumed_from).name.removeprefix("checkpoint-"))
    assert k % 10 == 0 and 20 <= k and resumed_from == newest_at_kill["path"], (k, newest_at_kill)
    assert launches[2]["argv"][-2:] == ["--resume_from_checkpoint", resumed_from]

    got = acks_once(run)
    assert got["lr"] == applied                       # the replayed id was neither applied nor acked again
    assert wd["status"] == "applied" and wd["result"]["values"] == {"weight_decay": 0.05} and wd["step"] > k
    assert got["halt"]["status"] == "applied" and read_heartbeat(run)["state"] == "stopped_by_command"

    events = read_jsonl(run / "events.jsonl")
    restored = [e for e in events if e["event"] == "settings_restored"]
    assert len(restored) == 1 and restored[0]["step"] == k and restored[0]["values"] == {"learning_rate": pytest.approx(4e-3)}
    assert [e["event"] for e in events].count("settings_changed") == 2   # lr, then wd: once each
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    resumed = [r for r in rows if r["segment"] == 1]
    assert resumed[0]["step"] == k + 1
    assert all(r["lr"] == pytest.approx(4e-3) for r in resumed)      # the hot change outlived the kill
    assert all(r["lr"] == pytest.approx(1e-3) for r in rows if r["segment"] == 0 and r["step"] <= applied["step"])
    assert read_declared_overrides(run) == {"learning_rate": pytest.approx(4e-3), "weight_decay": 0.05}


def read_declared_overrides(run: pathlib.Path) -> dict:
    return json.loads((run / "settings.json").read_text())["overrides"]
