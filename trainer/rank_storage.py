"""A data-parallel run with run storage: each Ray Train rank works in its own folder on its node's
scratch, and rank 0 alone decides where the run resumes.

    python -m trainer.run_storage run.yaml      # with num_workers > 1 it calls run_data_parallel

The driver (`run_data_parallel`) keeps no run folder; each rank (`run_rank`) restores into its
folder (`rank_dir`) what its trainer reads, then rank 0 runs the mirror (`trainer.run_storage`).

Resume (`restore_rank`): rank 0 restores the run as a single-process job does (every checkpoint,
the command log and inbox, stored harnesses), loads the newest checkpoint that verifies there
(`choose_resume`: the trainer's own walk, newest first, a corrupt or torn one skipped) and
broadcasts its choice: the name, the hash of its weights, and the manifests it listed. Every
other rank fetches that checkpoint by name, checks its hash, and nothing else of the run but the
faults' private state: it never lists the storage, so a checkpoint that lands after rank 0 listed,
or a newest file that one rank would read torn, cannot make it resume elsewhere. Each trainer
starts through `AgreedCheckpoints`, which shows it rank 0's listing and hands it the chosen state,
so every rank takes the same branch of `Trainer._start` and loads the same step. A rank that fails
its part (a fetch, a hash that changed since rank 0 chose) makes every rank raise `ResumeError`:
none is left waiting in a collective, and the job's restart tries again.

Commands (`RankTrainer`): a rollback or a switch to a stored harness version reads what rank 0 has
(only its folder holds what the run wrote since the start, and the other ranks hold one
checkpoint) and rank 0 sends it to the others; a command applied by some ranks and refused by
others stops the run rather than let the ranks train different models.

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

from sandboxes.errors import SwarmlabError
from trainer.checkpoint import CheckpointError, CheckpointManager
from trainer.config import RunConfig
from trainer.control import Command
from trainer.distributed import Dist
from trainer.loop import Trainer
from trainer.run_storage import JobMirror, fetch_checkpoint, scratch_dir
from trainer.storage import Storage, open_storage


class ResumeError(SwarmlabError, RuntimeError):
    """A rank could not take the checkpoint rank 0 chose (every rank raises it, with the count)."""


@dataclasses.dataclass(frozen=True)
class ResumeChoice:
    """Where every rank of a data-parallel run starts, as rank 0 decided it."""

    name: str | None                              # the checkpoint to load; None: none verifies, or none exists
    sha256: str                                   # its weights' hash ("" when name is None)
    listing: tuple[dict[str, Any], ...]           # rank 0's manifests, oldest first: what each trainer's start sees
    skipped: tuple[tuple[str, str], ...] = ()     # newer checkpoints that did not verify: (name, why)


def choose_resume(ckpt: CheckpointManager) -> tuple[ResumeChoice, dict[str, Any] | None]:
    """The newest checkpoint in `ckpt` that loads and verifies, with its state
    (`CheckpointManager.latest_good` over one listing), naming what it picks and what it skipped."""
    listing = ckpt.manifests()
    skipped: list[tuple[str, str]] = []
    m, state = ckpt.latest_good(lambda name, why: skipped.append((name, why)), listing)
    if m is None:
        return ResumeChoice(None, "", tuple(listing), tuple(skipped)), None
    return ResumeChoice(m["name"], m["sha256"], tuple(listing), tuple(skipped)), state


def fetch_chosen(store: Storage, ckpt_dir: pathlib.Path, choice: ResumeChoice) -> None:
    """Put the chosen checkpoint's weights and manifest (the one rank 0 listed) in `ckpt_dir`,
    its hash checked: a checkpoint written again under the name since rank 0 chose is refused."""
    assert choice.name is not None, "only a chosen checkpoint is fetched"
    data = store.get(f"checkpoints/{choice.name}.pt")
    digest = hashlib.sha256(data).hexdigest()
    if digest != choice.sha256:
        raise ResumeError(f"checkpoint {choice.name!r} on the storage has sha256 {digest[:12]}, not the "
                          f"{choice.sha256[:12]} rank 0 resumes from (written again since rank 0 chose?)")
    manifest = next(m for m in choice.listing if m["name"] == choice.name)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    (ckpt_dir / f"{choice.name}.pt").write_bytes(data)
    (ckpt_dir / f"{choice.name}.json").write_text(json.dumps(manifest))


def _agree(dist: Dist, err: BaseException | None, what: str) -> None:
    """Every rank returns, or every rank raises: the failure of one is counted in an all-reduce."""
    ok = int(dist.sum([err is None])[0])
    if ok != dist.world:
        why = f"{type(err).__name__}: {err}" if err is not None else "done here"
        raise ResumeError(f"{what} failed on {dist.world - ok} of {dist.world} ranks (rank {dist.rank}: {why})") from err


@dataclasses.dataclass
class Restored:
    """A rank's folder, ready for its trainer: rank 0's mirror (None on the other ranks), the
    choice, and on rank 0 the chosen checkpoint's state, already loaded while choosing."""

    choice: ResumeChoice
    state: dict[str, Any] | None
    mirror: JobMirror | None


def restore_rank(run_dir: pathlib.Path, store: Storage, dist: Dist, keep_last: int,
                 private: pathlib.Path | None = None) -> Restored:
    """Start `run_dir` afresh for this rank (see the module docstring): rank 0 restores the run and
    chooses, every other rank fetches the choice. Every rank must call it."""
    mirror, choice, state, err = None, None, None, None
    if dist.is_main:
        try:
            mirror = JobMirror(run_dir, store, private=private)
            mirror.restore()
            choice, state = choose_resume(CheckpointManager(run_dir / "checkpoints", keep_last))
        except Exception as e:   # rank 0 must reach the broadcast whatever failed
            err = e
    got = dist.broadcast(choice if err is None else f"{type(err).__name__}: {err}")
    if isinstance(got, str):
        raise ResumeError(f"rank 0 could not restore the run from {store.uri}: {got}") from err
    choice = got
    if not dist.is_main:
        try:
            shutil.rmtree(run_dir, ignore_errors=True)
            (run_dir / "checkpoints").mkdir(parents=True)
            JobMirror(run_dir, store, private=private).restore_private()
            if choice.name is not None:
                fetch_chosen(store, run_dir / "checkpoints", choice)
        except Exception as e:   # counted below, on every rank
            err = e
    _agree(dist, err, f"resuming from checkpoint {choice.name!r}")
    return Restored(choice, state, mirror)


class AgreedCheckpoints(CheckpointManager):
    """A rank's checkpoints while its trainer starts: `manifests()` is rank 0's listing and
    `load_latest_good` hands over the chosen checkpoint (rank 0's state, loaded while choosing; the
    one fetched elsewhere), so `Trainer._start` takes the same branch and step on every rank."""

    def __init__(self, ckpt_dir: pathlib.Path, keep_last: int, restored: Restored) -> None:
        super().__init__(ckpt_dir, keep_last)
        self.choice, self._state = restored.choice, restored.state

    def manifests(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self.choice.listing]

    def load_latest_good(self, on_corrupt=None) -> dict[str, Any] | None:
        for name, why in self.choice.skipped:
            if on_corrupt:
                on_corrupt(name, why)
        if self.choice.name is None:
            return None
        state, self._state = self._state, None
        return state if state is not None else self.load(self.choice.name)


def rank_dir(uri: str, rank: int) -> pathlib.Path:
    """Ray Train rank `rank`'s local folder for the run stored at `uri`: its node's scratch, one
    folder per rank, so two ranks that share a node share no folder either."""
    return scratch_dir(uri) / f"rank{rank}"


class RankTrainer(Trainer):
    """The trainer of a data-parallel rank with run storage. It starts from the checkpoint rank 0
    chose (`restored`), then goes on with its own folder's checkpoints. A rollback or a
    `set_harness` by version, which every rank applies, reads what rank 0 has, and rank 0 sends it
    to the others. A command that one rank applied and another refused would leave the ranks
    training different models: the run stops instead (the job fails, and a restart resumes every
    rank from the storage)."""

    def __init__(self, cfg: RunConfig, dist: Dist, restored: Restored | None = None) -> None:
        super().__init__(cfg, dist=dist)
        if restored is not None:
            self.ckpt = AgreedCheckpoints(self.ckpt.dir, self.ckpt.keep_last, restored)

    def _start(self) -> None:
        try:
            super()._start()
        finally:   # from here on, the rank's own folder: what it saves, prunes, rolls back to
            self.ckpt = CheckpointManager(self.ckpt.dir, self.ckpt.keep_last)

    def apply_command(self, cmd: Command) -> Any:
        if not self.dist.enabled:
            return super().apply_command(cmd)
        try:
            out, err = self._apply_on_every_rank(cmd), None
        except Exception as e:   # any failure on one rank: the ranks agree first (no rank left in a collective)
            out, err = None, e
        applied = int(self.dist.sum([err is None])[0])
        if applied not in (0, self.dist.world):
            raise RuntimeError(f"command {cmd.cmd!r} ({cmd.id}) was applied by {applied} of {self.dist.world} "
                               f"ranks (rank {self.dist.rank}: {err or 'applied'}): the ranks would diverge")
        if err is not None:
            raise err
        return out

    def _apply_on_every_rank(self, cmd: Command) -> Any:
        if cmd.cmd == "rollback" and cmd.name:
            try:   # rank 0 loads it (or says why not); every rank takes the same state or the same error
                got: Any = self.ckpt.load(cmd.name) if self.dist.is_main else None
            except Exception as e:   # rank 0 must reach the broadcast whatever failed
                got = str(e) or type(e).__name__
            got = self.dist.broadcast(got)
            if isinstance(got, str):
                raise CheckpointError(got)
            self.load_state(got)
            self.segment += 1
            return {"rolled_back_to": cmd.name, "step": self.step}
        if cmd.cmd == "set_harness" and cmd.harness is None and cmd.version:
            p = self.run_dir / "harnesses" / f"{cmd.version}.yaml"
            try:
                mine = p.read_text() if self.dist.is_main and p.is_file() else None
            except OSError:   # rank 0 must reach the broadcast whatever failed
                mine = None
            text = self.dist.broadcast(mine)
            if text is None:
                raise ValueError(f"unknown harness version {cmd.version!r} (none stored under harnesses/)")
            import yaml

            cmd = cmd.model_copy(update={"harness": yaml.safe_load(text)})
        return super().apply_command(cmd)


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
    if fork_src and cfg.fork_from and not restored.choice.listing:   # `Trainer._start` forks only then
        err = None
        try:
            with_init = dist.is_main and cfg.fork_mode == "full" and bool(cfg.checkpoint.interval)
            path = fetch_checkpoint(fork_src, pathlib.PurePath(cfg.fork_from).stem, root / ".fork", with_init=with_init)
            cfg = cfg.model_copy(update={"fork_from": str(path)})
        except Exception as e:   # counted on every rank
            err = e
        _agree(dist, err, "fetching the fork's checkpoint")
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
