"""The `swarm` CLI: bad input gives one line naming the field and the value, exit code 2 and no
run directory; `--json` rows parse; `control` and `status` work on a live run directory."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading
import time

import pytest
import yaml
from typer.testing import CliRunner

from swarm.cli import app
from trainer.config import RunConfig
from trainer.control import send_command, wait_for_ack
from trainer.loop import Trainer
from trainer.runlog import read_heartbeat, read_jsonl

runner = CliRunner()
SWARM = pathlib.Path(sys.executable).parent / "swarm"


def write_cfg(tmp_path: pathlib.Path, data) -> pathlib.Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr.strip()
    assert err.startswith("error:") and "\n" not in err, err
    assert "Traceback" not in result.output
    for n in needles:
        assert n in err, (n, err)


BAD = [
    ("malformed_yaml", "recipe: {lr: [1,\n", ["not valid YAML"]),
    ("not_mapping", "- 1\n- 2\n", ["must be a mapping"]),
    ("unknown_field", {"recipe": {"lrr": 0.1}}, ["recipe.lrr", "unknown field"]),
    ("bad_type", {"recipe": {"lr": "fast"}}, ["recipe.lr='fast'"]),
    ("negative_lr", {"recipe": {"lr": -1}}, ["recipe.lr=-1"]),
    ("unknown_algorithm", {"recipe": {"algorithm": "ppo"}}, ["recipe.algorithm='ppo'"]),
    ("grpo_group_1", {"recipe": {"algorithm": "grpo", "group_size": 1}}, ["recipe.group_size=1", "grpo"]),
    ("heads", {"model": {"d_model": 30, "n_heads": 4}}, ["model.d_model=30", "model.n_heads=4"]),
    ("pass_rate", {"harness": {"curriculum": {"pass_rate_min": 0.9, "pass_rate_max": 0.1}}},
     ["pass_rate_min=0.9", "pass_rate_max=0.1"]),
    ("template", {"harness": {"template": "no placeholder"}}, ["no placeholder"]),
    ("hf_without_path", {"model": {"kind": "hf"}}, ["model.path"]),
    ("hf_learned_positions", {"model": {"kind": "hf", "path": "/m", "learned_positions": True}},
     ["model.learned_positions", "built-in"]),
    ("hf_init", {"model": {"kind": "hf", "path": "/m", "init": "torch"}}, ["model.init", "built-in"]),
    ("unknown_init", {"model": {"init": "xavier"}}, ["model.init='xavier'"]),
    ("missing_model_dir", {"model": {"kind": "hf", "path": "/nonexistent/model"}}, ["/nonexistent/model", "not found"]),
    ("unknown_task", {"task": {"name": "juggling"}}, ["juggling"]),
    ("task_option", {"task": {"name": "addition", "options": {"base": 7}}}, ["base"]),
    ("difficulty", {"task": {"name": "addition"}, "harness": {"curriculum": {"start": 40}}}, ["difficulty=40"]),
    ("unknown_advantage", {"recipe": {"advantage": "magic"}}, ["recipe.advantage='magic'"]),
    ("unknown_loss", {"recipe": {"loss": "magic"}}, ["recipe.loss='magic'"]),
    ("bad_name", {"name": "../escape"}, ["name='../escape'"]),
    ("perturbation", {"perturbations": [{"shortcut": "meteor"}]}, ["meteor"]),
    ("perturbation_field", {"perturbations": [{"kind": "override", "set": {"recipe.lr": 0}}]}, ["recipe.lr=0"]),
]


@pytest.mark.parametrize("case,data,needles", BAD, ids=[b[0] for b in BAD])
def test_bad_config_is_one_line_exit_2_nothing_started(tmp_path, case, data, needles):
    if isinstance(data, dict):
        data = {"out_dir": str(tmp_path / "runs"), **data}
    path = write_cfg(tmp_path, data)
    result = runner.invoke(app, ["train", str(path)])
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "runs").exists()
    assert not (pathlib.Path.cwd() / "runs").exists()


def test_missing_config_file(tmp_path):
    assert_one_line_error(runner.invoke(app, ["train", str(tmp_path / "nope.yaml")]), "nope.yaml", "not found")


def test_bad_override_option(tmp_path, make_cfg):
    path = write_cfg(tmp_path, make_cfg())
    assert_one_line_error(runner.invoke(app, ["train", str(path), "--name", "a b"]), "name='a b'")
    assert not (tmp_path / "runs").exists()


def test_real_console_script_bad_config(tmp_path):
    """The installed `swarm` script: exit status 2, one line on stderr, no traceback."""
    path = write_cfg(tmp_path, {"out_dir": str(tmp_path / "runs"), "recipe": {"algorithm": "ppo"}})
    proc = subprocess.run([str(SWARM), "train", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "recipe.algorithm='ppo'" in lines[0], proc.stderr
    assert not (tmp_path / "runs").exists()


def test_train_json_rows_parse(tmp_path, make_cfg):
    path = write_cfg(tmp_path, make_cfg(recipe={"steps": 3, "eval_interval": 3}))
    result = runner.invoke(app, ["train", str(path), "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [r["step"] for r in rows[:-1]] == [1, 2, 3]
    assert all("loss" in r and "lr" in r for r in rows[:-1]) and "heldout_acc" in rows[2]
    summary = rows[-1]["summary"]
    assert summary["status"] == "completed" and summary["step"] == 3
    assert pathlib.Path(summary["run_dir"]) == tmp_path / "runs" / "run"


def test_train_live_progress(tmp_path, make_cfg):
    path = write_cfg(tmp_path, make_cfg(recipe={"steps": 2}))
    result = runner.invoke(app, ["train", str(path), "--name", "live", "--out-dir", str(tmp_path / "elsewhere")])
    assert result.exit_code == 0, result.output
    assert "completed at step 2" in result.stdout
    assert (tmp_path / "elsewhere" / "live" / "metrics.jsonl").exists()


def test_control_and_status_on_a_live_run(make_cfg):
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 100_000, "batch_size": 2, "schedule": "constant", "warmup_steps": 0},
                                   samples_per_step=0))
    tr = Trainer(cfg)
    box: dict = {}
    th = threading.Thread(target=lambda: box.update(s=tr.run()), daemon=True)
    th.start()
    rd = str(cfg.run_dir)
    try:
        r = runner.invoke(app, ["control", rd, "pause", "--wait", "30"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["status"] == "applied"
        deadline = time.time() + 10
        while (read_heartbeat(rd) or {}).get("state") != "paused" and time.time() < deadline:
            time.sleep(0.05)
        st = runner.invoke(app, ["status", rd])
        assert st.exit_code == 0 and "state: paused" in st.stdout and "pause: applied" in st.stdout
        r = runner.invoke(app, ["control", rd, "set_recipe", "lr=0.004", "batch_size=3", "--wait", "30"])
        assert r.exit_code == 0 and json.loads(r.stdout)["result"] == {"recipe": {"lr": 0.004, "batch_size": 3}}
        r = runner.invoke(app, ["control", rd, "set_recipe", "lr=-1", "--wait", "30"])
        ack = json.loads(r.stdout)
        assert r.exit_code == 1 and ack["status"] == "rejected" and "recipe.lr=-1" in ack["reason"]
        r = runner.invoke(app, ["control", rd, "checkpoint", "name=cli", "--wait", "30"])
        assert json.loads(r.stdout)["result"] == {"checkpoint": "cli"}
        r = runner.invoke(app, ["control", rd, "resume"])  # no wait: prints the command id
        cid = r.stdout.strip()
        assert r.exit_code == 0 and wait_for_ack(rd, cid, timeout=30)["status"] == "applied"
        r = runner.invoke(app, ["control", rd, "stop", "--wait", "30"])
        assert r.exit_code == 0
        th.join(60)
    finally:
        if th.is_alive():
            send_command(rd, "resume")
            send_command(rd, "stop")
            th.join(60)
    assert box["s"]["status"] == "stopped_by_command"
    rows = [x for x in read_jsonl(cfg.run_dir / "metrics.jsonl") if not x.get("final")]
    assert rows[-1]["lr"] == 0.004
    st = runner.invoke(app, ["status", rd])
    assert "state: stopped_by_command" in st.stdout and "loss=" in st.stdout


def test_control_bad_input(tmp_path, make_cfg):
    assert_one_line_error(runner.invoke(app, ["control", str(tmp_path / "nope"), "stop"]), "nope", "not found")
    assert_one_line_error(runner.invoke(app, ["status", str(tmp_path / "nope")]), "not found")
    (tmp_path / "run").mkdir()
    assert_one_line_error(runner.invoke(app, ["control", str(tmp_path / "run"), "set_recipe", "lr"]), "'lr'",
                          "key=value")
    # nobody is listening: --wait times out with exit 1 and one line
    r = runner.invoke(app, ["control", str(tmp_path / "run"), "stop", "--wait", "0.3"])
    assert r.exit_code == 1 and "no acknowledgement" in r.stderr


def test_status_of_a_finished_run(tmp_path, make_cfg):
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 2}))
    Trainer(cfg).run()
    r = runner.invoke(app, ["status", str(cfg.run_dir)])
    assert r.exit_code == 0 and "state: completed" in r.stdout and "step: 2" in r.stdout
