"""Where a data-parallel run resumes (trainer/distributed.py `agree_resume`, called by
`Trainer._start`): rank 0 chooses, every rank loads its choice. Two gloo ranks on loopback, each a
process with its own folder, each shown its own view of the run (so each rank can be shown a
different storage or shared folder, as two ranks listing at different moments would see it).

With run storage (trainer/rank_storage.py), each rank reading the storage through its own folder
of a hand-built run:

- the newest checkpoint on the storage is corrupt, and the storage as rank 1 sees it also holds a
  newer valid one (landed after rank 0 listed): both ranks resume from the one before the corrupt
  one, with its weights; rank 1's folder holds that checkpoint's weights and nothing else;
- the chosen checkpoint was written again under its name before rank 1 fetched it: both ranks
  raise `ResumeError` (none is left waiting in a collective);
- no checkpoint: both ranks start fresh, with the same weights;
- a full fork (`run_rank`, trained to its end): rank 0 alone fetches the source's `init` beside
  the fork's checkpoint, and the run's `init` on the storage holds the source's untrained weights.

On a shared folder (no run storage: `trainer.launch.run_ray_train`, a plain `Trainer` per rank):

- the newest checkpoint torn for rank 0 only: both resume from the one before it;
- a newer checkpoint that only rank 1 lists: both resume from rank 0's newest;
- the newest checkpoint torn for rank 1 only: both raise `ResumeError`;
- one real shared folder, with checkpoints and without: both start at the same step;
- a fresh fork whose source reads torn on rank 1 only: both raise `ResumeError`.

The workers run this file as a script: `python tests/test_rank_resume.py RANK WORLD PORT SPEC OUT`.
About a minute (three pairs of processes importing torch).

    .venv/bin/python -m pytest tests/test_rank_resume.py -q
"""
from __future__ import annotations

import hashlib
import io
import json
import pathlib
import shutil
import sys
from typing import Any

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script by the workers
    sys.path.insert(0, str(REPO))

import gloo_ranks  # noqa: E402
from trainer.config import RunConfig  # noqa: E402
from trainer.distributed import Dist, init_gloo  # noqa: E402
from trainer.storage import FolderStorage  # noqa: E402

CKPTS = ["init", "step_0000001", "step_0000002", "step_0000003", "step_0000004"]


def weights_digest(model_state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k, v in model_state.items():
        h.update(k.encode())
        h.update(v.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def run_scenario(cfg_dict: dict[str, Any], uri: str, run_dir: pathlib.Path, dist: Dist) -> dict[str, Any]:
    from trainer.rank_storage import RankTrainer, ResumeError, restore_rank
    from trainer.runlog import read_jsonl
    from trainer.storage import open_storage

    cfg = RunConfig.model_validate({**cfg_dict, "out_dir": str(run_dir.parent)})
    try:
        restored = restore_rank(cfg.run_dir, open_storage(uri), dist, cfg.checkpoint.keep_last)
    except ResumeError as e:
        return {"error": str(e)}
    tr = RankTrainer(cfg, dist, restored)
    tr._start()
    ck = cfg.run_dir / "checkpoints"
    out = {"choice": restored.choice.name, "skipped": [n for n, _ in restored.choice.skipped], "step": tr.step,
           "weights": weights_digest(tr.policy.model.state_dict()),
           "pt": sorted(p.name for p in ck.glob("*.pt")),
           "manifests_after": [m["name"] for m in tr.ckpt.manifests()]}
    tr.close()
    if dist.is_main:
        out["events"] = [(e["event"], e.get("name"), e["step"]) for e in read_jsonl(cfg.run_dir / "events.jsonl")
                         if e["event"] in ("checkpoint_corrupt", "resume", "start")]
    return out


def start_shared(cfg_dict: dict[str, Any], out_dir: pathlib.Path, dist: Dist) -> dict[str, Any]:
    """A plain trainer's start on the run folder at `out_dir` (this rank's view of the shared one)."""
    from trainer.distributed import ResumeError
    from trainer.loop import Trainer
    from trainer.runlog import read_jsonl

    tr = Trainer(RunConfig.model_validate({**cfg_dict, "out_dir": str(out_dir)}), dist=dist)
    try:
        tr._start()
    except ResumeError as e:
        tr.close()
        return {"error": str(e)}
    out = {"step": tr.step, "segment": tr.segment, "weights": weights_digest(tr.policy.model.state_dict())}
    tr.close()
    if dist.is_main:
        out["events"] = [(e["event"], e.get("name"), e["step"]) for e in read_jsonl(tr.run_dir / "events.jsonl")
                         if e["event"] in ("checkpoint_corrupt", "resume", "start", "checkpoint")]
    return out


def fork_rank(f: dict[str, Any], rank: int) -> dict[str, Any]:
    """`run_rank` of a fork to its end, recording what this rank fetched for the fork."""
    import trainer.rank_storage as rank_storage

    fetched: list[list[str]] = []
    fetch = rank_storage.fetch_checkpoint

    def recording(*a: Any, **kw: Any) -> pathlib.Path:
        path = fetch(*a, **kw)
        fetched.append(sorted(p.name for p in path.parent.iterdir()))
        return path

    rank_storage.fetch_checkpoint = recording
    try:
        summary = rank_storage.run_rank(f["cfg"], f["uri"], f["source"], rank)
    finally:
        rank_storage.fetch_checkpoint = fetch
    return {"summary": summary, "fetched": fetched}


def _worker(rank: int, world: int, port: int, spec: str, out: str) -> None:
    torch.set_num_threads(1)
    init_gloo(rank, world, port, timeout_s=180)
    s = json.loads(pathlib.Path(spec).read_text())
    dist = Dist()
    res = {name: run_scenario(s["cfg"], uris[rank], pathlib.Path(out) / f"rank{rank}" / name / "train", dist)
           for name, uris in s.get("storage", {}).items()}
    res.update({name: start_shared(s["cfg"], pathlib.Path(views[rank]), dist) for name, views in s.get("shared", {}).items()})
    res.update({name: start_shared({**s["cfg"], "fork_from": forks[rank][1], "fork_mode": "full"}, pathlib.Path(forks[rank][0]), dist)
                for name, forks in s.get("shared_fork", {}).items()})
    if "fork" in s:
        res["fork"] = fork_rank(s["fork"], rank)
    pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    pathlib.Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    gloo_ranks.end_rank()


def _run_ranks(tmp_path: pathlib.Path, spec: dict[str, Any], **env: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the workers on `spec` (two gloo ranks on loopback); their results, rank 0's first."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    gloo_ranks.wait(gloo_ranks.start(__file__, [str(path), str(tmp_path / "out")], **env), timeout=300)
    r0, r1 = (json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in (0, 1))
    return r0, r1


def _train_elsewhere(tmp_path: pathlib.Path, make_cfg) -> tuple[dict[str, Any], pathlib.Path]:
    """A run trained to step 4 with a checkpoint at every step (init, 1..4): its config and checkpoints."""
    from trainer.loop import Trainer

    cfg = make_cfg(name="train", out_dir=str(tmp_path / "elsewhere"), samples_per_step=0,
                   recipe={"steps": 6, "batch_size": 4, "schedule": "constant", "warmup_steps": 0, "eval_size": 4},
                   checkpoint={"interval": 1, "keep_last": 10})
    torch.set_num_threads(1)
    Trainer(RunConfig.parse(cfg)).run(until=4)
    src = tmp_path / "elsewhere" / "train" / "checkpoints"
    assert sorted(p.stem for p in src.glob("*.pt")) == CKPTS
    return cfg, src


def _tear(path: pathlib.Path) -> None:
    """Zero the second half of a file, as a reader that meets it half-written sees it."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2:] = b"\0" * (len(data) - len(data) // 2)
    path.write_bytes(bytes(data))


def _store(root: pathlib.Path, src: pathlib.Path, names: list[str]) -> FolderStorage:
    store = FolderStorage(root)
    root.mkdir(parents=True, exist_ok=True)
    for n in names:
        store.put(f"checkpoints/{n}.pt", (src / f"{n}.pt").read_bytes())
        store.put(f"checkpoints/{n}.json", (src / f"{n}.json").read_bytes())
    return store


def test_rank_0_chooses_and_every_rank_resumes_from_its_choice(tmp_path, make_cfg):
    cfg, src = _train_elsewhere(tmp_path, make_cfg)
    step2 = torch.load(src / "step_0000002.pt", weights_only=False)

    # the storage: init, steps 1-3, step 3's weights torn (its manifest's hash no longer matches)
    shared = _store(tmp_path / "shared", src, CKPTS[:4])
    torn = bytearray(shared.get("checkpoints/step_0000003.pt"))
    torn[len(torn) // 2:] = b"\0" * (len(torn) - len(torn) // 2)
    shared.put("checkpoints/step_0000003.pt", bytes(torn))
    # rank 1's view of it: a valid step 4 landed after rank 0 listed
    later = tmp_path / "later"
    shutil.copytree(shared.root, later)
    _store(later, src, CKPTS[4:])
    # rank 1's view of it: step 2 written again under its name (other weights) after rank 0 chose it
    rewritten = tmp_path / "rewritten"
    shutil.copytree(shared.root, rewritten)
    shutil.copy(src / "step_0000001.pt", rewritten / "checkpoints" / "step_0000002.pt")
    (tmp_path / "empty").mkdir()

    r0, r1 = _run_ranks(tmp_path, {"cfg": RunConfig.parse(cfg).model_dump(mode="json"), "storage": {
        "corrupt_newest": [str(shared.root), str(later)],
        "rewritten": [str(shared.root), str(rewritten)],
        "fresh": [str(tmp_path / "empty")] * 2}})

    a0, a1 = r0["corrupt_newest"], r1["corrupt_newest"]
    assert a0["choice"] == a1["choice"] == "step_0000002", (a0, a1)
    assert a0["skipped"] == ["step_0000003"]
    assert a0["step"] == a1["step"] == 2
    assert a0["weights"] == a1["weights"] == weights_digest(step2["model"])
    assert a1["pt"] == ["step_0000002.pt"]                   # fetched: the choice, nothing else
    assert a0["pt"] == [f"{n}.pt" for n in CKPTS[:4]]        # rank 0 restored the run (rollbacks read it)
    assert a1["manifests_after"] == ["step_0000002"]         # after the start: the rank's own folder
    assert a0["events"] == [["checkpoint_corrupt", "step_0000003", 0], ["resume", None, 2]]

    b0, b1 = r0["rewritten"], r1["rewritten"]
    for b in (b0, b1):
        assert "error" in b and "failed on 1 of 2 ranks" in b["error"], b
    assert "sha256" in b1["error"] and "sha256" not in b0["error"]   # each says why, rank 1 what it found

    c0, c1 = r0["fresh"], r1["fresh"]
    assert c0["choice"] is None and c1["choice"] is None
    assert c0["step"] == c1["step"] == 0 and c0["weights"] == c1["weights"]
    assert c1["pt"] == [] and c0["pt"] == ["init.pt"]         # rank 0 keeps the untrained start
    assert [e[0] for e in c0["events"]] == ["start"]



def _view(root: pathlib.Path, src: pathlib.Path, names: list[str], torn: str | None = None) -> str:
    """A rank's view of the shared run folder (`root`/train): checkpoints `names`, `torn` half-written."""
    ck = root / "train" / "checkpoints"
    ck.mkdir(parents=True)
    for n in names:
        shutil.copy(src / f"{n}.pt", ck / f"{n}.pt")
        shutil.copy(src / f"{n}.json", ck / f"{n}.json")
    if torn:
        _tear(ck / f"{torn}.pt")
    return str(root)


def test_on_a_shared_folder_every_rank_resumes_from_rank_0s_choice(tmp_path, make_cfg):
    """No run storage: each rank's plain `Trainer` starts on the shared folder (here each rank is
    shown its own copy of it where the two views must differ)."""
    cfg, src = _train_elsewhere(tmp_path, make_cfg)
    digest = {n: weights_digest(torch.load(src / f"{n}.pt", weights_only=False)["model"]) for n in CKPTS}
    v = tmp_path / "views"
    (v / "empty").mkdir(parents=True)
    torn_dir = tmp_path / "torn_src"
    torn_dir.mkdir()
    for suffix in (".pt", ".json"):
        shutil.copy(src / f"step_0000002{suffix}", torn_dir / f"step_0000002{suffix}")
    _tear(torn_dir / "step_0000002.pt")
    torn_src = str(torn_dir / "step_0000002.pt")
    r0, r1 = _run_ranks(tmp_path, {"cfg": RunConfig.parse(cfg).model_dump(mode="json"), "shared": {
        # step 3 half-written as rank 0 reads it, whole as rank 1 does (NFS while it is written)
        "torn_for_rank_0": [_view(v / "a0", src, CKPTS[:4], torn="step_0000003"), _view(v / "a1", src, CKPTS[:4])],
        # step 4 landed after rank 0 listed, before rank 1 would have
        "newer_for_rank_1": [_view(v / "b0", src, CKPTS[:4]), _view(v / "b1", src, CKPTS)],
        # the checkpoint rank 0 chose reads torn on rank 1
        "torn_for_rank_1": [_view(v / "c0", src, CKPTS[:4]), _view(v / "c1", src, CKPTS[:4], torn="step_0000003")],
        "one_folder": [_view(v / "d", src, CKPTS[:3])] * 2,
        "one_empty_folder": [str(v / "empty")] * 2},
        # a fresh fork whose source reads torn on rank 1 only
        "shared_fork": {"fork_torn_for_rank_1": [[str(v / "f0"), str(src / "step_0000002.pt")], [str(v / "f1"), torn_src]]}})

    a0, a1 = r0["torn_for_rank_0"], r1["torn_for_rank_0"]
    assert a0["step"] == a1["step"] == 2, (a0, a1)
    assert a0["weights"] == a1["weights"] == digest["step_0000002"]
    assert a0["segment"] == a1["segment"]
    assert a0["events"] == [["checkpoint_corrupt", "step_0000003", 0], ["resume", None, 2]]

    b0, b1 = r0["newer_for_rank_1"], r1["newer_for_rank_1"]
    assert b0["step"] == b1["step"] == 3, (b0, b1)
    assert b0["weights"] == b1["weights"] == digest["step_0000003"]

    c0, c1 = r0["torn_for_rank_1"], r1["torn_for_rank_1"]
    for c in (c0, c1):   # neither trains from another step, none waits in a collective
        assert "error" in c and "resuming from checkpoint 'step_0000003' failed on 1 of 2 ranks" in c["error"], c
    assert "sha256" in c1["error"] and "sha256" not in c0["error"]

    d0, d1 = r0["one_folder"], r1["one_folder"]
    assert d0["step"] == d1["step"] == 2 and d0["weights"] == d1["weights"] == digest["step_0000002"]

    f0, f1 = r0["fork_torn_for_rank_1"], r1["fork_torn_for_rank_1"]
    for f in (f0, f1):   # the rank whose fork failed does not leave the other waiting in a collective
        assert "error" in f and "loading the start state failed on 1 of 2 ranks" in f["error"], f

    e0, e1 = r0["one_empty_folder"], r1["one_empty_folder"]
    assert e0["step"] == e1["step"] == 0 and e0["segment"] == e1["segment"] == 0
    assert e0["weights"] == e1["weights"]
    assert e0["events"] == [["start", None, 0], ["checkpoint", "init", 0]]   # rank 0 keeps the untrained start


def test_a_full_fork_on_ranks_with_run_storage_keeps_the_source_init(tmp_path, make_cfg):
    """`run_rank` of a full fork from a checkpoint put on the storage (`put_checkpoint_file`, as the
    controller puts a pilot's winner), trained one step to its end on both ranks."""
    from trainer.run_storage import put_checkpoint_file
    from trainer.runlog import read_jsonl

    cfg, src = _train_elsewhere(tmp_path, make_cfg)
    source = put_checkpoint_file(src / "step_0000002.pt", str(tmp_path / "source"))
    (tmp_path / "run").mkdir()
    arm = RunConfig.parse({**cfg, "name": "arm", "fork_from": str(src / "step_0000002.pt"), "fork_mode": "full",
                           "recipe": {**cfg["recipe"], "steps": 3, "lr": 3e-3}})
    r0, r1 = _run_ranks(tmp_path, {"fork": {"cfg": arm.model_dump(mode="json"), "uri": str(tmp_path / "run"),
                                            "source": source}}, SWARMLAB_SCRATCH_DIR=str(tmp_path / "scratch"))

    for r in (r0, r1):
        assert r["fork"]["summary"]["status"] == "completed" and r["fork"]["summary"]["step"] == 3, r
    assert r0["fork"]["fetched"] == [["init.json", "init.pt", "step_0000002.json", "step_0000002.pt"]]
    assert r1["fork"]["fetched"] == [["step_0000002.json", "step_0000002.pt"]]   # only rank 0 keeps an init
    store = FolderStorage(tmp_path / "run")
    init = torch.load(io.BytesIO(store.get("checkpoints/init.pt")), weights_only=False)
    source_init = torch.load(src / "init.pt", weights_only=False)
    assert weights_digest(init["model"]) == weights_digest(source_init["model"])   # the source's untrained weights
    assert init["step"] == 0 and init["recipe"]["lr"] == 3e-3                        # with this run's recipe
    chunks = sorted(n for n in store.list("streams/events.jsonl") if n.isdigit())
    (tmp_path / "events.jsonl").write_bytes(b"".join(store.get(f"streams/events.jsonl/{n}") for n in chunks))
    events = read_jsonl(tmp_path / "events.jsonl")
    assert [e for e in events if e["event"] == "checkpoint" and e.get("name") == "init"][0]["inherited_from"]
    assert [(e["event"], e["step"]) for e in events if e["event"] in ("start", "resume", "end")] == [("start", 2), ("end", 3)]


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])


def test_a_rank_reads_the_chosen_checkpoint_again_before_its_failure_counts(tmp_path, monkeypatch):
    """Rank 0 verified the file, so a failed read on another rank may be a stale view of it: it is
    read LOAD_TRIES times, with a doubling wait, before the failure makes every rank raise."""
    from trainer.checkpoint import CheckpointError, CheckpointManager, choose_resume
    from trainer.distributed import LOAD_BACKOFF_S, LOAD_TRIES, load_chosen

    ckpt = CheckpointManager(tmp_path)
    ckpt.save({"step": 7, "w": torch.ones(2)}, 7)
    choice, _ = choose_resume(ckpt)
    real, calls, sleeps = ckpt.load, [], []

    def stale_twice(name, sha256=None):
        calls.append(name)
        if len(calls) < 3:
            raise CheckpointError(f"checkpoint {name!r} is corrupt")
        return real(name, sha256=sha256)

    monkeypatch.setattr(ckpt, "load", stale_twice)
    assert load_chosen(ckpt, choice, sleep=sleeps.append)["step"] == 7
    assert sleeps == [LOAD_BACKOFF_S, 2 * LOAD_BACKOFF_S] and LOAD_TRIES == 3
    monkeypatch.setattr(ckpt, "load", lambda name, sha256=None: (_ for _ in ()).throw(CheckpointError("torn")))
    sleeps.clear()
    with pytest.raises(CheckpointError, match="torn"):
        load_chosen(ckpt, choice, sleep=sleeps.append)
    assert len(sleeps) == LOAD_TRIES - 1
