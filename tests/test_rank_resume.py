"""Where a data-parallel run with run storage resumes (trainer/rank_storage.py): rank 0 chooses,
every rank loads its choice. Two gloo ranks on loopback, each a process with its own folder, each
reading the storage through its own folder of a hand-built run (so each rank can be shown a
different storage, as two ranks listing at different moments would see it):

- the newest checkpoint on the storage is corrupt, and the storage as rank 1 sees it also holds a
  newer valid one (landed after rank 0 listed): both ranks resume from the one before the corrupt
  one, with its weights; rank 1's folder holds that checkpoint's weights and nothing else;
- the chosen checkpoint was written again under its name before rank 1 fetched it: both ranks
  raise `ResumeError` (none is left waiting in a collective);
- no checkpoint: both ranks start fresh, with the same weights.

The workers run this file as a script: `python tests/test_rank_resume.py RANK WORLD PORT SPEC OUT`.
About 15 s (two processes importing torch).

    .venv/bin/python -m pytest tests/test_rank_resume.py -q
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
from typing import Any

import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script by the workers
    sys.path.insert(0, str(REPO))

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


def _worker(rank: int, world: int, port: int, spec: str, out: str) -> None:
    torch.set_num_threads(1)
    init_gloo(rank, world, port, timeout_s=180)
    s = json.loads(pathlib.Path(spec).read_text())
    dist = Dist()
    res = {name: run_scenario(s["cfg"], uris[rank], pathlib.Path(out) / f"rank{rank}" / name / "train", dist)
           for name, uris in s["scenarios"].items()}
    pathlib.Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _store(root: pathlib.Path, src: pathlib.Path, names: list[str]) -> FolderStorage:
    store = FolderStorage(root)
    root.mkdir(parents=True, exist_ok=True)
    for n in names:
        store.put(f"checkpoints/{n}.pt", (src / f"{n}.pt").read_bytes())
        store.put(f"checkpoints/{n}.json", (src / f"{n}.json").read_bytes())
    return store


def test_rank_0_chooses_and_every_rank_resumes_from_its_choice(tmp_path, make_cfg):
    from trainer.loop import Trainer

    cfg = make_cfg(name="train", out_dir=str(tmp_path / "elsewhere"), samples_per_step=0,
                   recipe={"steps": 6, "batch_size": 4, "schedule": "constant", "warmup_steps": 0, "eval_size": 4},
                   checkpoint={"interval": 1, "keep_last": 10})
    torch.set_num_threads(1)
    Trainer(RunConfig.parse(cfg)).run(until=4)       # trained elsewhere: init, step 1..4
    src = tmp_path / "elsewhere" / "train" / "checkpoints"
    assert sorted(p.stem for p in src.glob("*.pt")) == CKPTS
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

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"cfg": RunConfig.parse(cfg).model_dump(mode="json"), "scenarios": {
        "corrupt_newest": [str(shared.root), str(later)],
        "rewritten": [str(shared.root), str(rewritten)],
        "fresh": [str(tmp_path / "empty")] * 2}}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(REPO)}
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, __file__, str(r), "2", str(port), str(spec), str(tmp_path / "out")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    for p in procs:
        try:
            _, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("a rank hung (a collective one rank never joined?)") from None
        assert p.returncode == 0, err[-3000:]
    r0, r1 = (json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in (0, 1))

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


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
