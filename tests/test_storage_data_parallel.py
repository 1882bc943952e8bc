"""A data-parallel run with run storage (`trainer.rank_storage.run_data_parallel`) as a real Ray job
on a private head (127.0.0.1, token auth on): two Ray Train ranks, each in its own scratch folder,
resume from a checkpoint that exists only on the storage — the one rank 0 chose (the newest stored
is torn: both skip it), which is the only checkpoint rank 1 fetches; rank 0 mirrors the run, and the
controller's replica sees it resume, obeys its commands (a rollback to a checkpoint and a switch to
a harness version that only rank 0's folder held reach both ranks: a command one rank applied and
the other refused would stop the run) and finish. About a minute here, most of it Ray Train's
start-up.

    .venv/bin/python -m pytest tests/test_storage_data_parallel.py -q -m slow
"""
from __future__ import annotations

import shutil

import pytest
from test_storage import _ack, _until

from harness.spec import HarnessSpec
from trainer import run_storage
from trainer.config import RunConfig
from trainer.control import send_command
from trainer.launch import start_head, stop_head, submit_job, wait_job
from trainer.loop import Trainer
from trainer.rank_storage import rank_dir
from trainer.run_storage import bind, put_checkpoint_file, sync_run
from trainer.runlog import read_heartbeat, read_jsonl
from trainer.storage import open_storage

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("one_thread")]




def test_two_ranks_resume_from_a_checkpoint_only_on_the_storage(tmp_path, monkeypatch, make_cfg):
    uri = f"file://{tmp_path / 'store' / 'key' / 'train'}"
    monkeypatch.setenv(run_storage.SCRATCH_ENV, str(tmp_path / "scratch"))   # the head, and so every rank, has it
    recipe = {"batch_size": 8, "schedule": "constant", "warmup_steps": 0, "eval_interval": 0, "eval_size": 4}
    # steps 2 and 4 of this run (of 6), trained elsewhere and left on the storage only, step 4 torn
    elsewhere = tmp_path / "elsewhere"
    Trainer(RunConfig.parse(make_cfg(name="train", out_dir=str(elsewhere), recipe={**recipe, "steps": 6},
                                     checkpoint={"interval": 2, "keep_last": 2}))).run(until=4)
    for step in (2, 4):
        put_checkpoint_file(elsewhere / "train" / "checkpoints" / f"step_000000{step}.pt", uri)
    shutil.rmtree(elsewhere)
    torn = open_storage(uri).get("checkpoints/step_0000004.pt")
    open_storage(uri).put("checkpoints/step_0000004.pt", torn[: len(torn) // 2])
    stored = open_storage(uri).get("checkpoints/step_0000002.pt")

    replica = tmp_path / "ctrl" / "runs" / "train"          # the controller's folder: out_dir/name
    bind(replica, uri)
    sync = lambda: sync_run(replica)                        # noqa: E731
    pause = send_command(replica, "pause")                  # on the storage before the job starts
    sync()
    cfg = RunConfig.parse(make_cfg(name="train", out_dir=str(replica.parent), num_workers=2,
                                   recipe={**recipe, "steps": 6}, checkpoint={"interval": 0}))
    path = tmp_path / "ctrl" / "train.yaml"
    path.write_text(cfg.to_yaml())
    head = start_head(num_cpus=3)
    try:
        job = submit_job(head, path, storage_uri=uri)
        _until(lambda: (_ack(replica, pause) or {}).get("status") == "applied", 300, "the queued pause", sync)
        # paused at the step it resumed from: rank 0 restored the run into its folder and chose step 2,
        # rank 1 fetched that checkpoint and no other
        folders = [rank_dir(uri, r) / "train" for r in (0, 1)]
        for d in folders:
            assert (d / "checkpoints" / "step_0000002.pt").read_bytes() == stored, d
        assert sorted(p.name for p in (folders[1] / "checkpoints").glob("*.pt")) == ["step_0000002.pt"]
        assert {"init.pt", "step_0000004.pt"} <= {p.name for p in (folders[0] / "checkpoints").glob("*.pt")}
        assert not (folders[1] / "metrics.jsonl").exists() and (folders[0] / "metrics.jsonl").exists()
        resume = [e for e in read_jsonl(replica / "events.jsonl") if e["event"] in ("start", "resume")]
        assert [(e["event"], e["step"], e["world"]) for e in resume] == [("resume", 2, 2)]
        assert [e["name"] for e in read_jsonl(replica / "events.jsonl") if e["event"] == "checkpoint_corrupt"] == ["step_0000004"]
        # what only rank 0's folder holds, and commands that every rank applies from it: a rollback
        # to a checkpoint saved now, a switch to a harness version stored now
        spec = cfg.harness.model_dump(mode="json")
        spec["sampling"]["temperature"] = 0.7
        version = HarnessSpec.model_validate(spec).version
        cids = [send_command(replica, "checkpoint", name="mid"), send_command(replica, "set_harness", harness=spec),
                send_command(replica, "rollback", name="mid"), send_command(replica, "set_harness", version=version),
                send_command(replica, "resume")]
        sync()
        status = wait_job(head, job, timeout=300)
        logs = head.client().get_job_logs(job)
    finally:
        stop_head(head)
    assert status == "SUCCEEDED", logs[-4000:]
    sync()
    assert [_ack(replica, c)["status"] for c in cids] == ["applied"] * 5
    assert _ack(replica, cids[3])["result"] == {"harness_version": version}
    assert "mid.pt" in open_storage(uri).list("checkpoints") and f"{version}.yaml" in open_storage(uri).list("harnesses")
    rows = [r for r in read_jsonl(replica / "metrics.jsonl") if not r.get("final")]
    assert [r["step"] for r in rows] == [3, 4, 5, 6]
    assert read_heartbeat(replica)["step"] == 6
    assert [e["status"] for e in read_jsonl(replica / "events.jsonl") if e["event"] == "end"] == ["completed"]
    assert not any(d.exists() for d in folders) and not run_storage.scratch_dir(uri).exists()   # gone with the job
