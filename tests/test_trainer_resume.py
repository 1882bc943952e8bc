"""Checkpoints: a run resumed from step k matches an uninterrupted run bit for bit on CPU (weights,
and every logged loss after the resume), for SFT and GRPO; a corrupt checkpoint is detected by its
checksum and the previous good one is used; retention keeps the newest periodic checkpoints and
every named one; writes are atomic (no temp files left, an incomplete checkpoint is ignored)."""
from __future__ import annotations

import json

import pytest
import torch

from trainer.checkpoint import CheckpointError, CheckpointManager
from trainer.config import RunConfig
from trainer.loop import Trainer
from trainer.runlog import read_jsonl

N, K = 8, 4


def step_rows(run_dir):
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if not r.get("final")]


def _trainer(cfg: RunConfig, warm) -> Trainer:
    tr = Trainer(cfg)
    if warm is not None:
        tr.policy.model.load_state_dict(warm)
    return tr


def _resume_matches(make_cfg, warm, **over):
    full = RunConfig.parse(make_cfg(name="full", **over))
    a = _trainer(full, warm)
    init = {k: v.clone() for k, v in a.policy.model.state_dict().items()}
    a.run()
    assert any(not torch.equal(v, init[k]) for k, v in a.policy.model.state_dict().items()), "nothing trained"
    split = RunConfig.parse(make_cfg(name="split", **over))
    b1 = _trainer(split, warm)
    s1 = b1.run(until=K)
    assert s1["status"] == "completed" and s1["step"] == K
    # run(until) saves no final checkpoint: the resume below uses the periodic one at step K
    assert (split.run_dir / "checkpoints" / f"step_{K:07d}.pt").exists()
    b2 = Trainer(split)  # a fresh process would build exactly this
    s2 = b2.run()
    assert s2["status"] == "completed" and s2["step"] == N
    resume = [e for e in read_jsonl(split.run_dir / "events.jsonl") if e["event"] == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == K
    sa, sb = a.policy.model.state_dict(), b2.policy.model.state_dict()
    assert sa.keys() == sb.keys()
    differ = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not differ, f"weights differ after resume: {differ}"
    ra = [r for r in step_rows(full.run_dir) if r["step"] > K]
    rb = [r for r in step_rows(split.run_dir) if r["segment"] == 1]
    assert [r["step"] for r in rb] == list(range(K + 1, N + 1))
    for x, y in zip(ra, rb):
        for key in ("loss", "grad_norm", "lr", "entropy", "reward_mean", "pass_rate", "response_len"):
            assert x.get(key) == y.get(key), (x["step"], key, x.get(key), y.get(key))
    samples_a = [(s["step"], s["completion"]) for s in read_jsonl(full.run_dir / "samples.jsonl") if s["step"] >= K]
    samples_b = [(s["step"], s["completion"]) for s in read_jsonl(split.run_dir / "samples.jsonl")
                 if s["segment"] == 1]
    assert samples_a == samples_b
    # the final held-out evaluations agree too
    assert read_jsonl(full.run_dir / "metrics.jsonl")[-1] | {"time": 0} == \
        read_jsonl(split.run_dir / "metrics.jsonl")[-1] | {"time": 0, "segment": 0}


def test_sft_resume_is_bit_exact(make_cfg):
    _resume_matches(make_cfg, None, recipe={"steps": N, "eval_interval": 3},
                    checkpoint={"interval": 2}, harness={"filters": {"dedupe": True}})


def test_grpo_resume_is_bit_exact(make_cfg, warm_state):
    _resume_matches(make_cfg, warm_state,
                    recipe={"algorithm": "grpo", "steps": N, "batch_size": 4, "group_size": 4, "kl_coef": 0.05,
                            "updates_per_batch": 2, "lr": 3e-3, "eval_interval": 3},
                    checkpoint={"interval": 2}, harness={"sampling": {"temperature": 1.5, "top_p": 0.95}})


def test_corrupt_checkpoint_falls_back_to_the_previous_good_one(make_cfg):
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 6}, checkpoint={"interval": 2, "keep_last": 5}))
    Trainer(cfg).run()
    ckdir = cfg.run_dir / "checkpoints"
    newest = ckdir / "step_0000006.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # damage in the middle: the sha256 no longer matches
    newest.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        CheckpointManager(ckdir).load("step_0000006")
    summary = Trainer(cfg).run()  # a restart of the same run
    assert summary["status"] == "completed" and summary["step"] == 6
    events = read_jsonl(cfg.run_dir / "events.jsonl")
    bad = [e for e in events if e["event"] == "checkpoint_corrupt"]
    assert [e["name"] for e in bad] == ["step_0000006"] and "sha256" in bad[0]["error"]
    resume = [e for e in events if e["event"] == "resume"]
    assert resume[0]["step"] == 4
    assert [r["step"] for r in step_rows(cfg.run_dir) if r["segment"] == 1] == [5, 6]


def test_truncated_checkpoint_is_detected(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", keep_last=5)
    mgr.save({"w": torch.ones(3)}, 1)
    p = mgr.save({"w": torch.full((3,), 2.0)}, 2)
    p.write_bytes(p.read_bytes()[:20])
    seen = []
    st = mgr.load_latest_good(on_corrupt=lambda name, err: seen.append(name))
    assert seen == ["step_0000002"] and torch.equal(st["w"], torch.ones(3))
    # nothing good at all → None (the run starts fresh rather than crash)
    (tmp_path / "ck" / "step_0000001.pt").write_bytes(b"junk")
    assert mgr.load_latest_good() is None


def test_retention_keeps_newest_periodic_and_all_named(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", keep_last=2)
    for step in range(1, 6):
        mgr.save({"step": step}, step)
        if step == 2:
            mgr.save({"step": step}, step, name="best")
    names = sorted(m["name"] for m in mgr.manifests())
    assert names == ["best", "step_0000004", "step_0000005"]
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert files == ["best.json", "best.pt", "step_0000004.json", "step_0000004.pt",
                     "step_0000005.json", "step_0000005.pt"]
    assert mgr.load("best")["step"] == 2
    with pytest.raises(ValueError, match="may only hold"):
        mgr.save({}, 6, name="../escape")


def test_run_retention_and_atomic_writes_leave_no_temp_files(make_cfg):
    cfg = RunConfig.parse(make_cfg(recipe={"steps": 6}, checkpoint={"interval": 1, "keep_last": 2}))
    tr = Trainer(cfg)
    tr.on_step = lambda row: row["step"] == 1 and tr.save("first")
    tr.run()
    ck = cfg.run_dir / "checkpoints"
    kinds = {m["name"]: m["kind"] for m in tr.ckpt.manifests()}
    # "init": the untrained start of a fresh run (a run that never learnt can restart from it)
    assert kinds == {"init": "named", "first": "named", "step_0000005": "periodic", "step_0000006": "periodic"}
    assert tr.ckpt.load("init")["step"] == 0
    leftovers = [p for p in cfg.run_dir.rglob("*") if p.name.startswith(".") or ".tmp" in p.name]
    assert not leftovers, leftovers
    for m in tr.ckpt.manifests():
        manifest = json.loads((ck / f"{m['name']}.json").read_text())
        assert manifest["bytes"] == (ck / f"{m['name']}.pt").stat().st_size


def test_checkpoint_without_manifest_is_ignored(tmp_path):
    """A crash between writing the .pt and its manifest leaves a checkpoint that was never complete."""
    mgr = CheckpointManager(tmp_path / "ck")
    mgr.save({"step": 1}, 1)
    (tmp_path / "ck" / "step_0000009.pt").write_bytes(b"half-written")
    assert [m["name"] for m in mgr.manifests()] == ["step_0000001"]
    assert mgr.load_latest_good()["step"] == 1


def test_latest_checkpoint_is_the_last_written_not_the_highest_step(tmp_path):
    """After a rollback the run goes on from a lower step; a crash then must resume from what the
    new timeline saved, not from the abandoned timeline's higher-step checkpoint."""
    mgr = CheckpointManager(tmp_path / "ck", keep_last=5)
    mgr.save({"step": 6, "timeline": "abandoned"}, 6)
    mgr.save({"step": 2, "timeline": "after rollback"}, 2, name="pre-abc")
    mgr.save({"step": 3, "timeline": "after rollback"}, 3)
    assert mgr.load_latest_good()["timeline"] == "after rollback" and mgr.load_latest_good()["step"] == 3
    assert [m["name"] for m in mgr.manifests()][-1] == "step_0000003"


class RankDist:
    """What a data-parallel rank's Trainer reads of its process group when it loads a checkpoint
    (no collective runs in load_state)."""

    def __init__(self, rank: int) -> None:
        self.rank, self.world, self.enabled = rank, 2, False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def test_each_data_parallel_rank_resumes_with_its_own_sampling_stream(make_cfg):
    """A checkpoint holds rank 0's sampling generator: rank 0 takes it as saved, every other rank
    derives its own from it (deterministically), so the ranks do not sample alike after a resume."""
    cfg = RunConfig.parse(make_cfg(name="r"))
    st = Trainer(cfg).state()
    gens = {}
    for rank in (0, 1, 1, 2):
        tr = Trainer(cfg, dist=RankDist(rank))
        tr.load_state(st)
        draw = torch.rand(4, generator=tr.gen)
        assert gens.setdefault(rank, draw).equal(draw)                 # the same rank: the same stream
    saved = torch.Generator()
    saved.set_state(st["rng"]["gen"])
    assert gens[0].equal(torch.rand(4, generator=saved))               # rank 0: the stream as saved
    assert not gens[1].equal(gens[0]) and not gens[2].equal(gens[0]) and not gens[1].equal(gens[2])
