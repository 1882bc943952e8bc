"""Control commands on a data-parallel run (trainer/loop.py `Trainer.apply_agreed`,
trainer/distributed.py `agree_checkpoint`, `Dist.on_main`): rank 0 reads what a command names
and every rank applies the command, or every rank refuses it. Two gloo ranks on loopback, each a
process shown its own view of the run (as in tests/test_rank_resume.py, whose helpers these are),
each command written to rank 0's inbox and handled by both ranks at the same safe point.

On a shared folder (a plain `Trainer` per rank), the ranks resumed at step 3:

- a rollback to a checkpoint rank 1 reads torn once (its view settles by the next read): both
  ranks end on the checkpoint's weights;
- a rollback to a checkpoint that stays torn for rank 1: every rank refuses it with the same
  message, naming rank 1's hash mismatch, and both keep their weights;
- a rollback to a checkpoint rank 0 cannot verify (torn for rank 0 only), and to an unknown name:
  every rank refuses it, both keep their weights;
- a checkpoint command with a name rank 0 refuses to save: every rank refuses it;
- a switch to a harness version only rank 0's folder holds: both ranks switch;
- a command rank 0 applied and rank 1 failed after applying (scripted): both ranks stop, with the
  same `DivergedError`, and rank 0 acknowledges the command as rejected with it.

With run storage (`RankTrainer`, each rank its own folder, rank 1 holding only the checkpoint it
resumed from): a rollback fetches the checkpoint into rank 1's folder; a checkpoint saved by a
command (on rank 0's disk only, no mirror running) is put on the storage by the rollback to it, and
rank 1 fetches it.

The workers run this file as a script: `python tests/test_rank_commands.py RANK WORLD PORT SPEC OUT`.
One pair of processes for the whole module (about half a minute here, most of it importing torch).

    .venv/bin/python -m pytest tests/test_rank_commands.py -q
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
from typing import Any

import pytest
import torch
import yaml

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script by the workers
    sys.path.insert(0, str(REPO))

import gloo_ranks  # noqa: E402
from test_rank_resume import CKPTS, _store, _tear, _train_elsewhere, _view, weights_digest  # noqa: E402

from harness.spec import HarnessSpec  # noqa: E402
from trainer.config import RunConfig  # noqa: E402
from trainer.distributed import DivergedError, Dist, init_gloo  # noqa: E402

SHARED = [  # (id, command, arguments): the shared-folder scenario, in order
    ("rb1", "rollback", {"name": "step_0000001"}),   # torn for rank 1 at its first read
    ("rb2", "rollback", {"name": "step_0000002"}),   # torn for rank 1 at every read
    ("rb4", "rollback", {"name": "step_0000004"}),   # torn for rank 0
    ("rbx", "rollback", {"name": "nope"}),
    ("ckx", "checkpoint", {"name": "bad name!"}),    # rank 0 refuses to save it
    ("hv", "set_harness", {}),                       # the version only rank 0's folder holds
    ("split", "resume", {}),                         # applied by rank 0, failed on rank 1 (scripted)
]
STORED = [  # the run-storage scenario
    ("rb1", "rollback", {"name": "step_0000001"}),
    ("mid", "checkpoint", {"name": "mid"}),
    ("rb2", "rollback", {"name": "step_0000002"}),
    ("rbmid", "rollback", {"name": "mid"}),
]


# ---- the workers -----------------------------------------------------------------------------------
def _recording(base: type) -> type:
    """`base` recording each command's outcome on this rank (rank 0 alone acknowledges it); rank 1
    fails the command `split` after applying it, as a rank that ran out of memory would."""

    class Recording(base):
        outcomes: dict[str, str]   # set by `_drive`

        def apply_command(self, cmd):
            out = super().apply_command(cmd)
            if cmd.id == "split" and self.dist.rank == 1:
                raise RuntimeError("scripted: rank 1 failed after applying it")
            return out

        def apply_agreed(self, cmd):
            try:
                out = super().apply_agreed(cmd)
            except Exception as e:
                self.outcomes[cmd.id] = f"{type(e).__name__}: {e}"
                raise
            self.outcomes[cmd.id] = "applied"
            return out

    return Recording


def _settles_on_second_read(path: str, good: str) -> None:
    """This process's view of `path` while the file settles (a network filesystem's cache): it
    reads torn once, then whole (`good` moved over it as the file is opened the second time)."""
    opens = []

    def hook(event: str, args: tuple) -> None:
        if event == "open" and args and str(args[0]) == path and args[1] in (None, "r", "rb"):
            opens.append(path)
            if len(opens) == 2:
                os.replace(good, path)

    sys.addaudithook(hook)


def _drive(tr, commands: list, dist: Dist) -> dict[str, Any]:
    """Start `tr`, then each command in turn, written to rank 0's inbox and handled by every rank."""
    from trainer.control import send_command
    from trainer.runlog import read_jsonl

    def now() -> dict[str, Any]:
        return {"step": tr.step, "weights": weights_digest(tr.policy.model.state_dict()),
                "harness": tr.harness.version, "pt": sorted(p.name for p in tr.ckpt.dir.glob("*.pt"))}

    tr.outcomes = {}
    tr._start()
    out: dict[str, Any] = {"start": now()}
    for cid, cmd, args in commands:
        if dist.is_main:
            send_command(tr.run_dir, cmd, id=cid, **args)
        try:
            tr.handle_commands()
        except DivergedError as e:   # the run would stop here
            out["stopped"] = str(e)
        out[cid] = {**now(), "outcome": tr.outcomes.get(cid)}
        if "stopped" in out:
            break
    tr.close()
    if dist.is_main:
        out["acks"] = {a["id"]: a for a in read_jsonl(tr.run_dir / "command_log.jsonl")}
    return out


def _worker(rank: int, world: int, port: int, spec: str, out: str) -> None:
    from trainer.loop import Trainer
    from trainer.rank_storage import RankTrainer, restore_rank
    from trainer.storage import open_storage

    torch.set_num_threads(1)
    init_gloo(rank, world, port, timeout_s=60)
    s = json.loads(pathlib.Path(spec).read_text())
    dist = Dist()
    if rank == 1:
        _settles_on_second_read(**s["settles"])
    shared = [(c, k, {**a, "version": s["version"]} if k == "set_harness" else a) for c, k, a in SHARED]
    tr = _recording(Trainer)(RunConfig.model_validate({**s["cfg"], "out_dir": s["views"][rank]}), dist=dist)
    res = {"shared": _drive(tr, shared, dist)}
    cfg = RunConfig.model_validate({**s["cfg"], "out_dir": str(pathlib.Path(out) / f"rank{rank}")})
    restored = restore_rank(cfg.run_dir, open_storage(s["uri"]), dist, cfg.checkpoint.keep_last)
    res["stored"] = _drive(_recording(RankTrainer)(cfg, dist, restored), STORED, dist)
    res["on_storage"] = sorted(open_storage(s["uri"]).list("checkpoints"))
    pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    pathlib.Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    gloo_ranks.end_rank()


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])


# ---- the tests -------------------------------------------------------------------------------------
def _run_ranks(tmp: pathlib.Path, spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the workers on `spec` (two gloo ranks on loopback); their results, rank 0's first."""
    path = tmp / "spec.json"
    path.write_text(json.dumps(spec))
    gloo_ranks.wait(gloo_ranks.start(__file__, [str(path), str(tmp / "out")]), timeout=150)
    r0, r1 = (json.loads((tmp / "out" / f"rank{r}.json").read_text()) for r in (0, 1))
    return r0, r1


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, Any]:
    """Both scenarios on one pair of ranks: each rank's results, the checkpoints' weights, the version."""
    from conftest import BASE, deep_merge   # the suite's tiny model (the `make_cfg` fixture's)

    tmp = tmp_path_factory.mktemp("rank_commands")
    cfg, src = _train_elsewhere(tmp, lambda **over: deep_merge({**BASE, "out_dir": str(tmp / "runs")}, over))
    run_cfg = RunConfig.parse(cfg)
    digest = {n: weights_digest(torch.load(src / f"{n}.pt", weights_only=False)["model"]) for n in CKPTS}
    v = tmp / "views"
    views = [_view(v / "r0", src, CKPTS, torn="step_0000004"), _view(v / "r1", src, CKPTS, torn="step_0000002")]
    settling = v / "r1" / "train" / "checkpoints" / "step_0000001.pt"
    good = tmp / "settled.pt"
    shutil.copy(settling, good)
    _tear(settling)
    spec = run_cfg.harness.model_dump(mode="json")
    spec["sampling"]["temperature"] = 0.7
    version = HarnessSpec.model_validate(spec).version
    (v / "r0" / "train" / "harnesses").mkdir(parents=True)
    (v / "r0" / "train" / "harnesses" / f"{version}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    _store(tmp / "store", src, CKPTS[:4])
    r0, r1 = _run_ranks(tmp, {"cfg": run_cfg.model_dump(mode="json"), "views": views, "version": version,
                              "settles": {"path": str(settling), "good": str(good)}, "uri": str(tmp / "store")})
    return {"r0": r0, "r1": r1, "digest": digest, "version": version}


def _both(ranks: dict[str, Any], scenario: str, cid: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return ranks["r0"][scenario][cid], ranks["r1"][scenario][cid]


def test_a_rollback_rank_1_reads_torn_once_takes_rank_0s_checkpoint_on_every_rank(ranks):
    d = ranks["digest"]
    s0, s1 = _both(ranks, "shared", "start")
    assert s0["step"] == s1["step"] == 3 and s0["weights"] == s1["weights"] == d["step_0000003"]
    a0, a1 = _both(ranks, "shared", "rb1")
    assert a0["step"] == a1["step"] == 1, (a0, a1)
    assert a0["weights"] == a1["weights"] == d["step_0000001"]
    assert a0["outcome"] == a1["outcome"] == "applied", (a0, a1)
    ack = ranks["r0"]["shared"]["acks"]["rb1"]
    assert ack["status"] == "applied" and ack["result"] == {"rolled_back_to": "step_0000001", "step": 1}


def test_a_rollback_rank_1_cannot_read_is_refused_on_every_rank(ranks):
    d = ranks["digest"]
    b0, b1 = _both(ranks, "shared", "rb2")
    assert b0["step"] == b1["step"] == 1 and b0["weights"] == b1["weights"] == d["step_0000001"], (b0, b1)
    assert b0["outcome"] == b1["outcome"], (b0, b1)   # one message, on every rank
    assert b0["outcome"].startswith("CommandError: rolling back to checkpoint 'step_0000002' failed on 1 of 2 ranks "
                                    "(rank 1: CheckpointError: checkpoint 'step_0000002' is corrupt: sha256"), b0
    ack = ranks["r0"]["shared"]["acks"]["rb2"]
    assert ack["status"] == "rejected" and ack["reason"] == b0["outcome"].removeprefix("CommandError: ")


def test_a_rollback_rank_0_cannot_verify_is_refused_on_every_rank(ranks):
    d = ranks["digest"]
    for cid, why in (("rb4", "checkpoint 'step_0000004' is corrupt: sha256"), ("rbx", "no checkpoint named 'nope'")):
        c0, c1 = _both(ranks, "shared", cid)
        # rank 1's whole copy of step 4 is not read: it keeps its weights, as rank 0 does
        assert c0["step"] == c1["step"] == 1 and c0["weights"] == c1["weights"] == d["step_0000001"], (cid, c0, c1)
        assert c0["outcome"] == c1["outcome"], (cid, c0, c1)
        assert c0["outcome"].startswith(f"CommandError: {why}"), (cid, c0)
        ack = ranks["r0"]["shared"]["acks"][cid]
        assert ack["status"] == "rejected" and ack["reason"].startswith(why), ack


def test_a_harness_version_only_rank_0_holds_reaches_every_rank(ranks):
    h0, h1 = _both(ranks, "shared", "hv")
    assert h0["harness"] == h1["harness"] == ranks["version"], (h0, h1)
    assert h0["outcome"] == h1["outcome"] == "applied", (h0, h1)
    assert ranks["r0"]["shared"]["acks"]["hv"]["result"] == {"harness_version": ranks["version"]}


def test_with_run_storage_rank_1_fetches_the_checkpoint_it_rolls_back_to(ranks):
    d = ranks["digest"]
    s0, s1 = _both(ranks, "stored", "start")
    assert s0["step"] == s1["step"] == 3 and s1["pt"] == ["step_0000003.pt"]   # rank 1 holds its start only
    a0, a1 = _both(ranks, "stored", "rb1")
    assert a0["weights"] == a1["weights"] == d["step_0000001"] and a1["step"] == 1, (a0, a1)
    assert a1["pt"] == ["step_0000001.pt", "step_0000003.pt"]                  # fetched from the storage
    assert a0["outcome"] == a1["outcome"] == "applied", (a0, a1)
    b0, b1 = _both(ranks, "stored", "rb2")
    assert b0["weights"] == b1["weights"] == d["step_0000002"]
    # `mid` was saved on rank 0's disk at step 1 (no mirror ran): the rollback put it on the storage
    m0, m1 = _both(ranks, "stored", "rbmid")
    assert m0["weights"] == m1["weights"] == d["step_0000001"] and m0["step"] == m1["step"] == 1, (m0, m1)
    assert "mid.pt" in m1["pt"] and "mid.pt" in ranks["r0"]["on_storage"]
    assert m0["outcome"] == m1["outcome"] == "applied", (m0, m1)
    acks = ranks["r0"]["stored"]["acks"]
    assert [acks[c]["status"] for c, _, _ in STORED] == ["applied"] * len(STORED)


def test_a_checkpoint_rank_0_cannot_save_is_refused_on_every_rank(ranks):
    k0, k1 = _both(ranks, "shared", "ckx")
    assert k0["outcome"] == k1["outcome"], (k0, k1)
    assert k0["outcome"].startswith("CommandError: checkpoint name 'bad name!' may only hold"), k0
    ack = ranks["r0"]["shared"]["acks"]["ckx"]
    assert ack["status"] == "rejected" and ack["reason"] == k0["outcome"].removeprefix("CommandError: ")


def test_a_command_applied_on_some_ranks_only_stops_every_rank(ranks):
    r0, r1 = ranks["r0"]["shared"], ranks["r1"]["shared"]
    why = ("command 'resume' (split) was applied by 1 of 2 ranks (rank 1: RuntimeError: scripted: rank 1 failed "
           "after applying it): the ranks would train different models, the run stops")
    assert r0.get("stopped") == r1.get("stopped") == why, (r0.get("stopped"), r1.get("stopped"))
    assert r0["acks"]["split"]["status"] == "rejected" and r0["acks"]["split"]["reason"] == why
