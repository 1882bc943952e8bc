"""Data parallelism without DDP wrappers: each rank computes gradients on its shard of the batch,
then gradients are all-reduced (mean) before the optimiser step. Rank 0 owns the run's files and
the control channel and broadcasts commands, so every rank applies them at the same step.
Works with the gloo process group that Ray Train sets up on CPU; a single process needs none.

The mean of the ranks' gradients equals the single-process gradient on the global batch only if
each rank's loss is normalised by the global batch's counts (completion tokens, rows), not its
own: a rank whose shard holds fewer tokens would otherwise weigh each of them more. The losses
therefore ask `sum` for the global counts and scale by `world` (see `algorithms.core.aggregate`);
`tests/test_dp_gradients.py` checks the equality for SFT and GRPO on two gloo ranks.

Where a data-parallel run starts is rank 0's decision (`agree_resume`, called by `Trainer._start`):
rank 0 walks its checkpoints (`trainer.checkpoint.choose_resume`, the single-process walk) and
broadcasts its choice (the name, its file's hash, the manifests it listed); every other rank
loads that checkpoint by name (`load_chosen`: read up to three times), its hash checked against
rank 0's, and never lists the folder itself. So a newest file that one rank would read torn (NFS while it is written) or a checkpoint
that lands between two ranks' listings cannot start the ranks from different steps, whether the
ranks share the run folder or each fetches the choice into its own (`trainer.rank_storage`). A
rank that cannot take the choice makes every rank raise `ResumeError` (`Dist.agree`): none is
left waiting in a collective, and the job's restart chooses again.

Control commands are read by rank 0 alone too (`Trainer.handle_commands` broadcasts its inbox),
and so is what a command names. A rollback (`agree_checkpoint`) is a resume in the middle of the
run: rank 0 loads the named checkpoint, verified against its manifest's hash, and sends its name,
hash and manifest; every other rank loads it by name with that hash (`load_chosen`, after
fetching it when the ranks share no folder). A harness version is read and validated by rank 0,
which sends the spec itself, and a checkpoint command is rank 0's save (`Dist.on_main`). A rank
that cannot take its part makes every rank raise `CommandError` with the same message before any
rank changed its state: the command is refused and the run goes on from where it was, on every
rank. A command that some ranks applied and others refused would leave them training different
models: every rank raises `DivergedError` instead, and the run stops (`Trainer.apply_agreed`).

`init_gloo` starts a process group on one host without Ray (tests, a plain multi-process run):
torch's TCPStore would listen on every interface, so the store's socket is bound here, to the
host given, and handed over.
"""
from __future__ import annotations

import datetime
import socket
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from sandboxes.errors import SwarmlabError
from trainer.checkpoint import CheckpointError, CheckpointManager, ResumeChoice, choose_resume


class ResumeError(SwarmlabError, RuntimeError):
    """A rank of a data-parallel run could not take its part of the start (the checkpoint rank 0
    chose, a fork's checkpoint, the run restored from storage): every rank raises it, with the count."""


class CommandError(SwarmlabError, RuntimeError):
    """A control command of a data-parallel run that some rank could not take its part of (rank 0
    could not read what it names, another rank could not load it): every rank raises it, with the
    same message, before any rank changed its state; the command is refused."""


class DivergedError(SwarmlabError, RuntimeError):
    """A control command that some ranks of a data-parallel run applied and others did not: their
    models would differ from here on, so every rank raises it and the run stops."""


def init_gloo(rank: int, world: int, port: int, host: str = "127.0.0.1", timeout_s: float = 60.0) -> None:
    """Join a gloo process group whose store (rank 0) listens on `host`:`port` only. Set
    `GLOO_SOCKET_IFNAME` (e.g. `lo`) in the environment so gloo's own pair sockets bind there too."""
    kw: dict[str, Any] = {}
    if rank == 0:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(max(16, world))
        kw["master_listen_fd"] = s.detach()   # the store owns the socket from here on
    store = dist.TCPStore(host, port, world, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=timeout_s), use_libuv=False, **kw)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


class Dist:
    def __init__(self) -> None:
        self.enabled = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.enabled else 0
        self.world = dist.get_world_size() if self.enabled else 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        """Wait until every rank is here."""
        if self.enabled:
            dist.barrier()

    def agree(self, err: BaseException | None, what: str, raising: type[Exception] = ResumeError,
              tell: bool = False) -> None:
        """Every rank returns, or every rank raises `raising`: the failure (`err`) of one is counted
        in an all-reduce. The message names this rank's error, or with `tell` every failing rank's
        (`why_failed`: the same message on every rank). Every rank must call it, with the same `tell`."""
        ok = int(self.sum([err is None])[0])
        if ok == self.world:
            return
        if tell:
            why = self.why_failed(err)
        else:
            why = f"rank {self.rank}: " + (f"{type(err).__name__}: {err}" if err is not None else "done here")
        raise raising(f"{what} failed on {self.world - ok} of {self.world} ranks ({why})") from err

    def why_failed(self, err: BaseException | None) -> str:
        """Each failing rank's error (`rank R: Type: message`, `; `-joined), the same text on every
        rank (one all-gather). Every rank must call it."""
        mine = None if err is None else f"{type(err).__name__}: {err}"
        whys = [mine]
        if self.enabled:
            whys = [None] * self.world
            dist.all_gather_object(whys, mine)
        return "; ".join(f"rank {r}: {w}" for r, w in enumerate(whys) if w is not None)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (which must pickle), by rank, on every rank; `[obj]` in one process.
        Every rank must call it."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def on_main(self, work: Callable[[], Any]) -> Any:
        """What `work()` returns on rank 0, on every rank: rank 0 alone calls it (reads a file the
        run wrote, saves a checkpoint) and broadcasts the result (which must pickle). Where it
        raises, rank 0 broadcasts its message instead and every rank raises `CommandError` with it,
        so none is left waiting. In one process: `work()`. Every rank must call it."""
        if not self.enabled:
            return work()
        got, why, err = None, None, None
        if self.is_main:
            try:
                got = work()
            except Exception as e:   # rank 0 must reach the broadcast whatever failed
                why, err = str(e) or type(e).__name__, e
        got, why = self.broadcast((got, why))
        if why is not None:
            raise CommandError(why) from err
        return got

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (float64; one all-reduce for the list). Every rank
        must call it, with the same number of values."""
        if not self.enabled:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def max(self, values: list[float]) -> list[float]:
        """Each value's largest over the ranks (one all-reduce for the list). Every rank must call
        it, with the same number of values."""
        if not self.enabled:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def mean_grads(self, params: list[torch.nn.Parameter], contributes: bool = True) -> int:
        """Average the gradients over the ranks, in place; returns how many ranks `contributes`
        (had a loss to learn from this step), counted in the same all-reduce, so every rank can
        take the same decision (no rank contributed: no optimiser step anywhere, as with one
        process). A parameter with no gradient yet (a rank that had no loss at the first step)
        takes part as zeros, so every rank reduces tensors of the same layout."""
        if not self.enabled:
            return int(contributes)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [torch.ones(1, dtype=grads[0].dtype) * float(contributes)])
        dist.all_reduce(flat)
        contributors = int(round(float(flat[-1])))
        flat /= self.world
        off = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[off : off + n].view_as(g))
            off += n
        return contributors

    def mean_dict(self, d: dict[str, float]) -> dict[str, float]:
        """Average scalar metrics across ranks (keys must match on every rank)."""
        if not self.enabled or not d:
            return d
        keys = sorted(d)
        t = torch.tensor([float(d[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(t)
        t /= self.world
        return dict(zip(keys, t.tolist()))


def agree_resume(ckpt: CheckpointManager, dist: Dist,
                 fetch: Callable[[ResumeChoice], None] | None = None) -> tuple[ResumeChoice, dict[str, Any] | None]:
    """Where this rank starts, and the state it loads (None: no checkpoint verifies): in one process,
    the newest checkpoint of `ckpt` that verifies (`choose_resume`); data-parallel, the one rank 0
    chose in its `ckpt`, which every other rank loads from its own `ckpt` folder by name, its hash
    checked against rank 0's, after `fetch(choice)` (when the ranks share no folder: put the chosen
    checkpoint there). A rank that fails its part makes every rank raise `ResumeError`. Every rank
    must call it."""
    if not dist.enabled:
        return choose_resume(ckpt)
    choice: Any = None
    state, err = None, None
    if dist.is_main:
        try:
            choice, state = choose_resume(ckpt)
        except Exception as e:   # rank 0 must reach the broadcast whatever failed
            err = e
    got = dist.broadcast(choice if err is None else f"{type(err).__name__}: {err}")
    if isinstance(got, str):
        raise ResumeError(f"rank 0 could not choose a checkpoint in {ckpt.dir}: {got}") from err
    choice = got
    if not dist.is_main:
        try:
            if fetch is not None:
                fetch(choice)
            if choice.name is not None:
                state = load_chosen(ckpt, choice)
        except Exception as e:   # counted below, on every rank
            err = e
    dist.agree(err, f"resuming from checkpoint {choice.name!r}")
    return choice, state


LOAD_TRIES = 3          # reads of the chosen checkpoint by a rank > 0 before its failure counts
LOAD_BACKOFF_S = 0.2    # the wait before the second read, doubled before each next one


def load_chosen(ckpt: CheckpointManager, choice: ResumeChoice,
                sleep: Callable[[float], None] = time.sleep,
                fetch: Callable[[ResumeChoice], None] | None = None) -> dict[str, Any]:
    """The state of the checkpoint rank 0 chose, read from this rank's `ckpt` with its hash checked,
    tried LOAD_TRIES times: rank 0 verified that file, so a read that fails here may be a stale
    view of it (a network filesystem's cache while it settles, a storage a mirror pass behind)
    rather than a bad file, and one failed read should not fail every rank. `fetch(choice)` puts it
    in `ckpt` before each read (the ranks share no folder). A file that stays wrong raises its last
    error."""
    for attempt in range(LOAD_TRIES):
        try:
            if fetch is not None:
                fetch(choice)
            return ckpt.load(choice.name, sha256=choice.sha256)
        except (CheckpointError, OSError, RuntimeError, EOFError) as e:
            if attempt == LOAD_TRIES - 1:
                raise
            sleep(LOAD_BACKOFF_S * 2 ** attempt)
    raise AssertionError("unreachable")


def agree_checkpoint(ckpt: CheckpointManager, name: str, dist: Dist,
                     publish: Callable[[ResumeChoice], None] | None = None,
                     fetch: Callable[[ResumeChoice], None] | None = None) -> dict[str, Any]:
    """The state saved as `name` in `ckpt`, for a rollback: in one process, `ckpt.load(name)`;
    data-parallel, rank 0 loads it, verified against the hash its manifest lists, calls
    `publish(choice)` (put it where the others fetch it) and sends its name, hash and manifest;
    every other rank loads it by name from its own `ckpt` with that hash (`load_chosen`, with
    `fetch`). Rank 0's failure makes every rank raise `CommandError` with its message, another
    rank's makes every rank raise it naming each failing rank's error: no rank has changed its
    state then. Every rank must call it."""
    if not dist.enabled:
        return ckpt.load(name)
    mine: dict[str, Any] = {}

    def verify() -> ResumeChoice:   # rank 0
        listed = next((m for m in ckpt.manifests() if m.get("name") == name), None)
        if listed is None:
            ckpt.load(name)   # raises what one process would: no such checkpoint (and the known ones)
            raise CheckpointError(f"checkpoint {name!r} is not among the manifests listed (written since?)")
        mine["state"] = ckpt.load(name, sha256=listed["sha256"])
        choice = ResumeChoice(name, listed["sha256"], (listed,))
        if publish is not None:
            publish(choice)
        return choice

    choice = dist.on_main(verify)
    err = None
    if not dist.is_main:
        try:
            mine["state"] = load_chosen(ckpt, choice, fetch=fetch)
        except Exception as e:   # counted below, on every rank
            err = e
    dist.agree(err, f"rolling back to checkpoint {name!r}", raising=CommandError, tell=True)
    return mine["state"]
