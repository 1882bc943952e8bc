"""A data-parallel run with run storage: each Ray Train rank works in its own folder on its node's
scratch, and rank 0 alone decides where the run resumes.

    python -m trainer.run_storage run.yaml      # with num_workers > 1 it calls run_data_parallel

The driver (`run_data_parallel`) keeps no run folder; each rank (`run_rank`) restores into its
folder (`rank_dir`) what its trainer reads, then rank 0 runs the mirror (`trainer.run_storage`).

Resume (`restore_rank`): rank 0 restores the run as a single-process job does (every checkpoint,
the command log and inbox, stored harnesses), then the ranks agree where they start as every
data-parallel run does (`trainer.distributed.agree_resume`): rank 0 loads the newest checkpoint
that verifies in its folder and broadcasts its choice; every other rank fetches that checkpoint
by name (`fetch_chosen`, its hash checked) and nothing else of the run but the faults' private
state. It never lists the storage, so a checkpoint that lands after rank 0 listed, or a newest
file that one rank would read torn, cannot make it resume elsewhere. Each trainer starts from
that agreement (`RankTrainer.choose_start`); a rank that fails its part (a fetch, a hash that
changed since rank 0 chose) makes every rank raise `ResumeError`: none is left waiting in a
collective, and the job's restart tries again.

Commands (`RankTrainer`): rank 0 reads what a command names, as every data-parallel run does
(`Trainer.apply_agreed`): only its folder holds what the run wrote since the start, and the other
ranks hold one checkpoint. A harness version comes from rank 0 as a spec. A rollback is a resume in
the middle of the run (`trainer.distributed.agree_checkpoint`): rank 0 verifies the checkpoint and
makes sure it is on the storage (a mirror pass, for one saved since the last), and every other
rank fetches that checkpoint by name, its hash checked (`fetch_chosen`, the fetch and the read
tried as `load_chosen` tries them). A rank that cannot take its part makes every rank refuse the
command; a command applied by some ranks and refused by others stops the run rather than let the
ranks train different models.

Tested in tests/test_rank_resume.py (the choice on two gloo ranks, hand-built storage) and
tests/test_storage_data_parallel.py (a real Ray job, `-m slow`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import shutil
from typing import Any

from trainer.checkpoint import CheckpointError, CheckpointManager, ResumeChoice
from trainer.config import RunConfig
from trainer.distributed import Dist, ResumeError, agree_checkpoint, agree_resume
from trainer.loop import Trainer
from trainer.run_storage import JobMirror, fetch_checkpoint, scratch_dir
from trainer.storage import Storage, open_storage


def fetch_chosen(store: Storage, ckpt_dir: pathlib.Path, choice: ResumeChoice) -> None:
    """Put the chosen checkpoint's weights and manifest (the one rank 0 listed) in `ckpt_dir`,
    its hash checked: a checkpoint written again under the name since rank 0 chose is refused."""
    assert choice.name is not None, "only a chosen checkpoint is fetched"
    data = store.get(f"checkpoints/{choice.name}.pt")
    digest = hashlib.sha256(data).hexdigest()
    if digest != choice.sha256:
        raise ResumeError(f"checkpoint {choice.name!r} on the storage has sha256 {digest[:12]}, not the "
                          f"{choice.sha256[:12]} rank 0 chose (written again since?)")
    manifest = next(m for m in choice.listing if m["name"] == choice.name)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    (ckpt_dir / f"{choice.name}.pt").write_bytes(data)
    (ckpt_dir / f"{choice.name}.json").write_text(json.dumps(manifest))


@dataclasses.dataclass
class Restored:
    """A rank's folder, ready for its trainer: rank 0's mirror (None on the other ranks), the
    choice every rank agreed on, the chosen checkpoint's state (None: none to resume from), and the
    run's storage (where the other ranks fetch a checkpoint to roll back to)."""

    choice: ResumeChoice
    state: dict[str, Any] | None
    mirror: JobMirror | None
    store: Storage | None = None


def restore_rank(run_dir: pathlib.Path, store: Storage, dist: Dist, keep_last: int,
                 private: pathlib.Path | None = None) -> Restored:
    """Start `run_dir` afresh for this rank (see the module docstring): rank 0 restores the run,
    then the ranks agree where they start (`agree_resume`), each other rank fetching the choice
    into its emptied folder. Every rank must call it."""
    mirror, err = None, None
    if dist.is_main:
        try:
            mirror = JobMirror(run_dir, store, private=private)
            mirror.restore()
        except Exception as e:   # counted below, on every rank
            err = e
    dist.agree(err, f"restoring the run from {store.uri}")

    def fetch(choice: ResumeChoice) -> None:   # on every rank but rank 0
        shutil.rmtree(run_dir, ignore_errors=True)
        (run_dir / "checkpoints").mkdir(parents=True)
        JobMirror(run_dir, store, private=private).restore_private()
        if choice.name is not None:
            fetch_chosen(store, run_dir / "checkpoints", choice)

    choice, state = agree_resume(CheckpointManager(run_dir / "checkpoints", keep_last), dist, fetch)
    return Restored(choice, state, mirror, store)


def rank_dir(uri: str, rank: int) -> pathlib.Path:
    """Ray Train rank `rank`'s local folder for the run stored at `uri`: its node's scratch, one
    folder per rank, so two ranks that share a node share no folder either."""
    return scratch_dir(uri) / f"rank{rank}"


class RankTrainer(Trainer):
    """The trainer of a data-parallel rank with run storage. It starts from the checkpoint rank 0
    chose (`restored`), then goes on with its own folder's checkpoints. A rollback, which every rank
    applies, loads the checkpoint rank 0 verified: rank 0 puts it on the storage if its mirror has
    not yet, every other rank fetches it into its folder (`agree_checkpoint`)."""

    def __init__(self, cfg: RunConfig, dist: Dist, restored: Restored | None = None) -> None:
        super().__init__(cfg, dist=dist)
        self.restored = restored
        self.store = restored.store if restored is not None else None
        self.mirror = restored.mirror if restored is not None else None

    def choose_start(self) -> tuple[ResumeChoice, dict[str, Any] | None]:
        if self.restored is None:
            return super().choose_start()
        restored, self.restored = self.restored, None
        state, restored.state = restored.state, None   # kept nowhere past the start
        return restored.choice, state

    def read_checkpoint(self, name: str) -> dict[str, Any]:
        store = self.store
        if store is None or not self.dist.enabled:
            return super().read_checkpoint(name)
        return agree_checkpoint(self.ckpt, name, self.dist, publish=self._publish,
                                fetch=lambda choice: fetch_chosen(store, self.ckpt.dir, choice))

    def _publish(self, choice: ResumeChoice) -> None:
        """Rank 0: the checkpoint rank 0 verified is on the storage before the others fetch it (one
        saved since the mirror's last pass, a rollback to a `checkpoint` command of the same batch,
        is not yet)."""
        if self.mirror is None:
            return
        self.mirror.sync()
        if self.mirror.pushed_ckpts.get(choice.name) != choice.sha256:
            raise CheckpointError(f"checkpoint {choice.name!r} is not on the run's storage ({self.store.uri}) "
                                  f"as rank 0 verified it")


def run_rank(config: dict[str, Any], uri: str, fork_src: str | None, rank: int) -> dict[str, Any]:
    """One rank of a data-parallel run with run storage, inside its process group (a Ray Train
    worker): its run folder is `rank_dir`; `restore_rank` fills it, a fork's checkpoint is fetched
    when there is no checkpoint to resume from (rank 0 also fetches the source's `init` for a full
    fork: `Trainer.inherit_init`), then rank 0 mirrors its folder to the storage (the other ranks
    write no run file). Returns the trainer's summary."""
    cfg = RunConfig.model_validate(config)
    root = rank_dir(uri, rank)
    shutil.rmtree(root, ignore_errors=True)
    cfg = cfg.model_copy(update={"out_dir": str(root)})
    dist = Dist()
    restored = restore_rank(cfg.run_dir, open_storage(uri), dist, cfg.checkpoint.keep_last,
                            private=root / ".perturb" / f"{cfg.name}.json")
    if fork_src and cfg.fork_from and restored.choice.name is None:   # `Trainer._start` forks only then
        err = None
        try:
            with_init = dist.is_main and cfg.keeps_fork_init
            path = fetch_checkpoint(fork_src, pathlib.PurePath(cfg.fork_from).stem, root / ".fork", with_init=with_init)
            cfg = cfg.model_copy(update={"fork_from": str(path)})
        except Exception as e:   # counted on every rank
            err = e
        dist.agree(err, "fetching the fork's checkpoint")
    print(json.dumps({"run_storage": uri.partition("?")[0], "rank": rank, "scratch": str(cfg.run_dir),
                      "resume": restored.choice.name, "skipped": [n for n, _ in restored.choice.skipped]}), flush=True)
    trainer = RankTrainer(cfg, dist, restored)
    mirror = restored.mirror
    if mirror is not None:   # rank 0, once every rank has restored (`restore_rank` ends in an all-reduce)
        mirror.start()
    try:
        return trainer.run()
    finally:
        if mirror is not None:
            mirror.close()
        shutil.rmtree(root, ignore_errors=True)


def run_data_parallel(cfg: RunConfig, uri: str, fork_src: str | None) -> int:
    """The job's side of a data-parallel run with run storage: `cfg.num_workers` Ray Train workers
    (gloo on CPU), each running `run_rank`; this driver keeps no run folder."""
    import ray
    from ray.train import RunConfig as RayRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    def loop(config: dict[str, Any]) -> None:
        import ray.train

        summary = run_rank(config["run"], config["uri"], config["fork"], ray.train.get_context().get_world_rank())
        ok = summary.get("status", "completed") in ("completed", "stopped_by_command", "target_reached")
        ray.train.report({**{k: v for k, v in summary.items() if isinstance(v, (int, float))}, "ok": int(ok)})

    ray.init(address="auto", _node_ip_address="127.0.0.1", log_to_driver=False)
    print(json.dumps({"run_storage": uri.partition("?")[0], "world": cfg.num_workers}), flush=True)
    ray_dir = scratch_dir(uri) / "ray_train"   # Ray Train's own files (metrics only: no checkpoint goes there)
    trainer = TorchTrainer(
        loop, train_loop_config={"run": cfg.model_dump(mode="json"), "uri": uri, "fork": fork_src},
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=False, resources_per_worker={"CPU": 1}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RayRunConfig(name=cfg.name, storage_path=str(ray_dir)),
    )
    try:
        summary = dict(trainer.fit().metrics or {})
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
        try:
            scratch_dir(uri).rmdir()   # gone unless a rank of this node is still in it
        except OSError:
            pass
    print(json.dumps(summary))
    return 0 if summary.get("ok", 1) else 1
