"""TensorBoard export (swarm.tensorboard): event files written from a real workspace's streams,
read back record by record (TFRecord framing, tensorboardX's Event protobuf)."""
from __future__ import annotations

import json
import pathlib
import struct
import time

import pytest
from typer.testing import CliRunner

from swarm.cli import app
from swarm.live import Follower
from swarm.store import Store
from swarm.tensorboard import TensorBoardSink, export
from test_ui import built, template, write_metrics  # noqa: F401  (fixtures: a copy of a built workspace)


def read_events(run_dir: pathlib.Path) -> list:
    """Every Event in the run directory's event files."""
    from tensorboardX.proto import event_pb2

    out = []
    for f in sorted(run_dir.glob("events.out.tfevents.*")):
        data = f.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            rec = data[i + 12:i + 12 + n]
            i += 12 + n + 4
            ev = event_pb2.Event()
            ev.ParseFromString(rec)
            out.append(ev)
    return out


def scalars(run_dir: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for ev in read_events(run_dir):
        for v in ev.summary.value:
            if v.HasField("simple_value"):
                out.setdefault(v.tag, []).append((ev.step, v.simple_value))
    return out


def texts(run_dir: pathlib.Path) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    for ev in read_events(run_dir):
        for v in ev.summary.value:
            if v.HasField("tensor") and v.tensor.string_val:
                out.setdefault(v.tag.removesuffix("/text_summary"), []).append((ev.step, v.tensor.string_val[0].decode()))
    return out


def add_arm(root: pathlib.Path, name: str, loss: float) -> None:
    d = root / ".swarm" / "backtests" / name
    d.mkdir(parents=True)
    d.joinpath("metrics.jsonl").write_text("".join(json.dumps({"step": 40 + s, "loss": loss, "time": time.time()}) + "\n"
                                                   for s in range(20)))


def test_export_reads_back(built, tmp_path):
    add_arm(built["root"], f"bt-{built['kept']}-candidate-s0", 0.5)
    add_arm(built["root"], f"bt-{built['kept']}-control-s0", 0.9)
    logdir = export(built["root"], tmp_path / "tb")
    train = scalars(logdir / "train")
    assert [s for s, _ in train["train/loss"]] == list(range(1, 120)), "every metric row at its step"
    assert train["train/loss"][0][1] == pytest.approx(2.0 / (1 + 1 / 20))
    assert len(train["train/heldout_acc"]) == 11 and "train/harness_version" not in train
    assert train["swarm/interventions_applied"] == [(60, 1.0)], "the applied intervention marked at its step"
    assert train["harness/version_changes"] == [(1, 1.0)]
    tx = texts(logdir / "train")
    kept = [t for _, t in tx[f"interventions/{built['kept']}"]]
    assert any("evaluating → kept" in t for t in kept) and any("proposed: recipe_edit" in t for t in kept)
    assert any("applied** at step 60" in t for t in kept)
    assert any("h-1a2b3c" in t for _, t in tx["harness/version"])
    arms = sorted(p.name for p in (logdir / "backtests").iterdir())
    assert arms == [f"bt-{built['kept']}-candidate-s0", f"bt-{built['kept']}-control-s0"], "each arm its own run"
    cand = scalars(logdir / "backtests" / arms[0])["backtest/loss"]
    ctrl = scalars(logdir / "backtests" / arms[1])["backtest/loss"]
    assert [s for s, _ in cand] == list(range(40, 60)) and {v for _, v in cand} == {0.5} and {round(v, 5) for _, v in ctrl} == {0.9}   # float32


def test_live_sink_writes_rows_as_they_land(built, tmp_path):
    sink = TensorBoardSink(tmp_path / "tb")
    f = Follower(built["root"], [sink], interval_s=0.05).start()
    try:
        time.sleep(0.3)
        write_metrics(built["run"], 120, 140)
        with Store(built["root"]) as st:
            st.log("human_approve", id=built["awaiting"], by="ui:alice")
        time.sleep(0.3)
    finally:
        f.stop()
    train = scalars(tmp_path / "tb" / "train")
    assert [s for s, _ in train["train/loss"]] == list(range(1, 140)), "each row once, the new ones too"
    tx = texts(tmp_path / "tb" / "train")
    assert any("approve requested by ui:alice" in t for _, t in tx[f"interventions/{built['awaiting']}"])


def test_cli_export(built, tmp_path):
    r = CliRunner().invoke(app, ["tensorboard", "--workspace", str(built["root"]), "--logdir", str(tmp_path / "tb")])
    assert r.exit_code == 0, r.output
    assert scalars(tmp_path / "tb" / "train")["train/loss"]
    r = CliRunner().invoke(app, ["tensorboard", "--workspace", str(tmp_path / "nope"), "--logdir", str(tmp_path / "x")])
    assert r.exit_code == 2 and "no swarm run" in r.output and not (tmp_path / "x").exists()
