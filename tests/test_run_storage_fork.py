"""A full fork with run storage keeps the source run's untrained start (`Trainer.inherit_init`): a
run that goes on from a checkpoint of this machine (a pilot's winner) gets that checkpoint and the
source's `init` put on the storage (`put_checkpoint_file`), the job fetches both into its scratch
(`fetch_checkpoint`), and the run's own `init` on the storage holds the source's untrained weights
with the run's recipe. The job's entrypoint runs in this process, its folder a scratch folder the
test never reads: what is checked is on the storage, or in the controller's replica of it.

    .venv/bin/python -m pytest tests/test_run_storage_fork.py -q
"""
from __future__ import annotations

import io
import json

import pytest
import torch
import yaml

from trainer import run_storage
from trainer.config import RunConfig
from trainer.loop import Trainer
from trainer.run_storage import bind, put_checkpoint_file, sync_run
from trainer.runlog import read_jsonl
from trainer.storage import join_uri, open_storage

pytestmark = pytest.mark.usefixtures("one_thread")

RECIPE = {"steps": 4, "batch_size": 4, "schedule": "constant", "warmup_steps": 0, "eval_size": 4}


def _model_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_full_fork_with_run_storage_keeps_the_source_init(tmp_path, monkeypatch, make_cfg):
    pilot = make_cfg(name="pilot", out_dir=str(tmp_path / "pilot"), samples_per_step=0, recipe=RECIPE,
                     checkpoint={"interval": 2, "keep_last": 2})
    Trainer(RunConfig.parse(pilot)).run()
    src = tmp_path / "pilot" / "pilot" / "checkpoints"
    source_init = torch.load(src / "init.pt", weights_only=False)
    winner = torch.load(src / "step_0000004.pt", weights_only=False)
    assert not _model_equal(source_init["model"], winner["model"])   # it trained: the two differ

    uri = f"file://{tmp_path / 'store' / 'key' / 'train'}"
    fork = put_checkpoint_file(src / "step_0000004.pt", join_uri(uri, "fork-source"))
    assert {"init.pt", "step_0000004.pt"} <= set(open_storage(fork).list("checkpoints"))

    replica = tmp_path / "ctrl" / "runs" / "train"
    bind(replica, uri)
    recipe = {**RECIPE, "steps": 6, "lr": 3e-3}
    cfg = RunConfig.parse(make_cfg(name="train", out_dir=str(replica.parent), samples_per_step=0, recipe=recipe,
                                   fork_from=str(src / "step_0000004.pt"), fork_mode="full",
                                   checkpoint={"interval": 2, "keep_last": 2}))
    path = tmp_path / "ctrl" / "train.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    monkeypatch.setenv(run_storage.STORAGE_ENV, uri)
    monkeypatch.setenv(run_storage.FORK_ENV, fork)
    monkeypatch.setenv(run_storage.SCRATCH_ENV, str(tmp_path / "scratch"))
    assert run_storage.main([str(path)]) == 0

    store = open_storage(uri)
    init = torch.load(io.BytesIO(store.get("checkpoints/init.pt")), weights_only=False)
    assert _model_equal(init["model"], source_init["model"])       # the source's untrained weights
    assert init["step"] == 0 and init["recipe"]["lr"] == 3e-3       # with this run's recipe
    sync_run(replica)
    events = read_jsonl(replica / "events.jsonl")
    inherited = [e for e in events if e["event"] == "checkpoint" and e.get("name") == "init"]
    assert len(inherited) == 1 and "inherited_from" in inherited[0], inherited
    assert [(e["event"], e["step"]) for e in events if e["event"] in ("start", "resume", "end")] == [("start", 4), ("end", 6)]


def test_a_checkpoint_fetched_from_run_storage_brings_its_runs_data_faults_as_they_are_now(tmp_path):
    """A backtest arm forked from a run on storage reads that run's data source as it is now, as
    one forked on this machine does (`Perturber.read_source`): the faults' state travels with the
    fetched checkpoint; a source with none brings none."""
    from trainer.config import Perturbation
    from trainer.perturb import SOURCE_FAULTS, Perturber

    uri = f"file://{tmp_path / 'store' / 'run'}"
    store = open_storage(uri)
    store.put("checkpoints/step_0000002.json", b"{}")
    store.put("checkpoints/step_0000002.pt", b"weights")
    shift = {"kind": "data_shift", "levels": 2, "at_step": 5}
    store.put("private/perturb.json", json.dumps({"fired": [0], "data": [shift]}).encode())
    path = run_storage.fetch_checkpoint(uri, "step_0000002", tmp_path / "scratch" / ".fork", wait_s=0)
    p = Perturber([], tmp_path / "arm.json")
    p.read_source(path)
    assert p.data_faults() == [Perturbation.model_validate(shift)] and p.data_faults(as_of=5) == []
    store.delete("private/perturb.json")
    path = run_storage.fetch_checkpoint(uri, "step_0000002", tmp_path / "scratch" / ".fork", wait_s=0)
    assert not (path.parent / SOURCE_FAULTS).exists()
    q = Perturber([], tmp_path / "arm2.json")
    q.read_source(path)
    assert q.data_faults() == []
