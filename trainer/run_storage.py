"""A run's folder on storage that is not the controller's disk: the job mirrors to it, the
controller keeps a replica of it, and neither opens the other's local path.

    python -m trainer.run_storage run.yaml       # the job's entrypoint when SWARMLAB_RUN_STORAGE is set
    bind(local_run_dir, uri)                     # controller side: this folder is a replica of that run
    sync_run(local_run_dir)                      # push commands, pull streams / heartbeat / manifests

Why a mirror and a replica, not a new reader API: the trainer and every reader of a run folder
(evidence, reports, the UI, retention, `swarm status`) already speak the run-folder format of
`trainer.runlog`; keeping each side's folder local and making storage the only meeting point leaves
the trainer's hot loop and every reader as they are, and a run without storage pays nothing (one
`stat` of a marker file per sync call). The cost is latency: what the trainer writes reaches the
controller after a mirror pass and a replica pass (`MIRROR_EVERY_S` plus the controller's tick).

Layout of a run on storage (only whole-object put/get/list/delete, so an object store serves):

    index.json                      what the mirror has stored, put last in each pass that changed
                                    anything: per stream the chunks stored, per file (heartbeat,
                                    config, harnesses) the sha256 of its bytes, per complete
                                    checkpoint the sha256 of its weights
    streams/<stream>/<seq:012d>     append-only rows (metrics, samples, events, command_log) as
                                    chunks of complete JSONL lines numbered from 0 without a gap
    heartbeat.json, config.yaml, harnesses/<version>.yaml
    inbox/<seq:09d>-<id>.json       commands, one object each (the controller's local line number:
                                    re-pushing after a crash writes the same key)
    checkpoints/<name>.pt, <name>.json   the manifest last: a checkpoint without one is incomplete
    private/perturb.json            the injected faults' state (evaluation only; the controller never
                                    pulls it; a fork's trainer reads its data faults: the source now)

The job (`main`): its run folder is on the node's scratch (`$SWARMLAB_SCRATCH_DIR`, default the
temp dir); it first restores from storage what a resumed trainer reads (checkpoints, the command
log and inbox, stored harnesses), then `JobMirror` pushes each `MIRROR_EVERY_S` — the streams'
newly completed lines, the heartbeat, new checkpoints (and deletions of pruned ones), then the index
when it changed — and pulls new commands into the local inbox. A checkpoint is pushed before the
stream rows read in the same pass, and everything before the index that names it, so an
acknowledgement the controller sees names a checkpoint already on storage. A fork
(`$SWARMLAB_FORK_STORAGE`: the source run on storage) fetches its checkpoint first, and for a full
fork the source's untrained `init` beside it (`Trainer.inherit_init` keeps it). The scratch
folder is removed when the job ends.

A data-parallel job (`num_workers > 1`): `trainer.rank_storage`. Each Ray Train rank works in its
own folder on its node's scratch; rank 0 restores the run, chooses the checkpoint every rank
resumes from and runs the mirror; the other ranks fetch that one checkpoint.

The controller (`Replica`): its run folder (`.swarm/runs/train`, an arm's under `backtests/`) holds
the rows pulled from storage (written by `RunLog`, so rotation and the long-run summary work as for
a local run), the heartbeat, config, harnesses and checkpoint manifests (never the weights); a
command appended to its `commands.jsonl` is pushed to the inbox; a manifest deleted locally
(retention) is deleted on storage with its weights. A pass gets the index and then only what it
says changed: the chunks past the replica's progress, a file whose hash differs from the one
pulled, a checkpoint's manifest not pulled yet: an idle pass is one `get`, whatever the run's
length (never a listing, which grows by a chunk per stream per mirror pass for the run's whole
life). A run with no index yet (a job before its first pass, or one mirrored before the index
existed) pulls nothing. Its progress is `.replica.json`: per stream the next chunk's number and
where its copy of the stream ended after that chunk. The progress is saved at most every
`SAVE_EVERY_S` (and at each roll of a copy, a failed pass, `close`); a replica started after a
controller was killed first cuts its copies back to where the saved progress ends, so the chunks
it pulls again leave every row once.

A chunk is put under its number once its lines are read; a put that fails past its retries is made
again with the same bytes (it may have landed, and a replica listing the stream could have read it;
the index counts it only once a put of it reported success), and lines written since go in the next.

Every storage request is retried within `trainer.storage.RetryPolicy`; a pass that still fails is
counted and tried again at the next pass (never fatal), except the job's last push, which must land.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from trainer.perturb import SOURCE_FAULTS
from trainer.runlog import INIT_CHECKPOINT, SUMMARY, JsonlWriter, Rotation, RunLog, atomic_write_text, rotated_parts
from trainer.storage import Storage, StorageError, join_uri, open_storage

STORAGE_ENV = "SWARMLAB_RUN_STORAGE"        # the job's run folder on storage (a URI or a path)
FORK_ENV = "SWARMLAB_FORK_STORAGE"          # the run on storage whose checkpoint a fork starts from
SCRATCH_ENV = "SWARMLAB_SCRATCH_DIR"        # the node's local scratch folder
MARKER = ".storage.json"                    # in a controller-side run folder: the run it replicates
STATE = ".replica.json"
INDEX = "index.json"
MIRROR_EVERY_S = 0.5
FORK_WAIT_S = 60.0    # how long a fork waits for its checkpoint to appear on storage (a mirror pass behind)
SAVE_EVERY_S = 5.0    # the replica's progress is saved at most this often (and at a roll, a failure, close)

STREAMS = ("metrics.jsonl", "samples.jsonl", "events.jsonl", "command_log.jsonl")
FILES = ("heartbeat.json", "config.yaml")


def _chunk(seq: int) -> str:
    return f"{seq:012d}"


def _seqs(store: Storage, stream: str) -> list[int]:
    return [int(n) for n in store.list(f"streams/{stream}") if n.isdigit()]


# ---- the job's side -------------------------------------------------------------------------------
class _Tail:
    """New complete lines of a local stream that its writer may roll (`trainer.runlog`): the rest of
    the file last read (the newest rolled part once rolled), then the live file."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path, self.ino, self.off = path, 0, 0

    def skip_to_end(self) -> None:
        try:
            st = self.path.stat()
            self.ino, self.off = st.st_ino, st.st_size
        except FileNotFoundError:
            pass

    def _read(self, q: pathlib.Path, off: int) -> bytes:
        with open(q, "rb") as f:
            f.seek(off)
            data = f.read()
        return data[: data.rfind(b"\n") + 1]

    def read(self) -> tuple[bytes, tuple[int, int]]:
        """The new complete lines and the position after them (`commit` it once they are stored)."""
        try:
            ino = self.path.stat().st_ino
        except FileNotFoundError:
            return b"", (self.ino, self.off)
        out, off = b"", self.off
        if self.ino and ino != self.ino:   # rolled since: finish the part we were reading
            old = next((q for q in reversed(rotated_parts(self.path))
                        if q.suffix != ".gz" and q.stat().st_ino == self.ino), None)
            if old is not None:
                out += self._read(old, off)
            off = 0
        new = self._read(self.path, off)
        return out + new, (ino, off + len(new))

    def commit(self, pos: tuple[int, int]) -> None:
        self.ino, self.off = pos


class JobMirror:
    """The job's side (see the module docstring). `sync` is one pass; `start` runs passes every
    `interval` seconds on a thread until `close`, which makes the last one."""

    def __init__(self, run_dir: pathlib.Path, store: Storage, private: pathlib.Path | None = None,
                 interval: float = MIRROR_EVERY_S) -> None:
        self.dir, self.store, self.private, self.interval = run_dir, store, private, interval
        self.tails = {s: _Tail(run_dir / s) for s in STREAMS}
        self.next_seq = {s: 0 for s in STREAMS}
        self.unsent: dict[str, bytes] = {}               # stream -> the chunk read but not yet stored
        self.pushed_files: dict[str, float] = {}         # local name -> mtime pushed
        self.versions: dict[str, str] = {}               # stored name -> sha256 of its bytes (the index's)
        self.pushed_ckpts: dict[str, str] = {}           # checkpoint name -> sha256 pushed
        self.indexed = ""                                # the index last stored
        self.seen_cmds: set[str] = set()
        self.failed_passes = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def restore(self) -> dict[str, int]:
        """Start the local run folder afresh from storage: checkpoints, the command log and inbox,
        stored harnesses, the faults' private state. Returns what was fetched."""
        shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "checkpoints").mkdir(parents=True)
        names = self.store.list("checkpoints")
        n = 0
        for m in (x for x in names if x.endswith(".json")):
            stem = m[: -len(".json")]
            if f"{stem}.pt" not in names:
                continue
            manifest = self.store.get(f"checkpoints/{m}")
            (self.dir / "checkpoints" / f"{stem}.pt").write_bytes(self.store.get(f"checkpoints/{stem}.pt"))
            (self.dir / "checkpoints" / m).write_bytes(manifest)
            self.pushed_ckpts[stem] = json.loads(manifest).get("sha256", "")
            n += 1
        for s in STREAMS:
            seqs = _seqs(self.store, s)
            self.next_seq[s] = max(seqs) + 1 if seqs else 0
        with open(self.dir / "command_log.jsonl", "wb") as f:
            for q in sorted(_seqs(self.store, "command_log.jsonl")):
                f.write(self.store.get(f"streams/command_log.jsonl/{_chunk(q)}"))
        self.tails["command_log.jsonl"].skip_to_end()
        for h in self.store.list("harnesses"):
            (self.dir / "harnesses").mkdir(exist_ok=True)
            data = self.store.get(f"harnesses/{h}")
            (self.dir / "harnesses" / h).write_bytes(data)
            self.pushed_files[f"harnesses/{h}"] = (self.dir / "harnesses" / h).stat().st_mtime
            self.versions[f"harnesses/{h}"] = hashlib.sha256(data).hexdigest()
        self.restore_private()
        self.pull_commands()
        return {"checkpoints": n}

    def restore_private(self) -> None:
        """The injected faults' private state, when the run has one (every data-parallel rank reads it)."""
        if self.private is None:
            return
        try:
            data = self.store.get("private/perturb.json")
        except FileNotFoundError:
            return
        self.private.parent.mkdir(parents=True, exist_ok=True)
        self.private.write_bytes(data)

    def pull_commands(self) -> int:
        """Append commands new on storage to the local inbox, each line whole in one write."""
        new = [k for k in self.store.list("inbox") if k not in self.seen_cmds]
        if not new:
            return 0
        with open(self.dir / "commands.jsonl", "ab") as f:
            for k in new:
                row = self.store.get(f"inbox/{k}").rstrip(b"\n")
                f.write(row + b"\n")
                f.flush()
                self.seen_cmds.add(k)
        return len(new)

    def _push_checkpoints(self) -> None:
        ck = self.dir / "checkpoints"
        local: dict[str, dict[str, Any]] = {}
        for m in ck.glob("*.json"):
            try:
                local[m.stem] = json.loads(m.read_text())
            except (OSError, json.JSONDecodeError):   # being written: next pass
                continue
        for name, man in local.items():
            if self.pushed_ckpts.get(name) == man.get("sha256"):
                continue
            try:
                data = (ck / f"{name}.pt").read_bytes()
            except FileNotFoundError:   # pruned since it was listed
                continue
            if hashlib.sha256(data).hexdigest() != man.get("sha256"):
                continue   # rewritten since it was listed: next pass
            self.store.put(f"checkpoints/{name}.pt", data)
            self.store.put(f"checkpoints/{name}.json", json.dumps(man).encode())
            self.pushed_ckpts[name] = man["sha256"]
        for name in [n for n in self.pushed_ckpts if n not in local]:   # the trainer pruned it
            self.store.delete(f"checkpoints/{name}.json")
            self.store.delete(f"checkpoints/{name}.pt")
            del self.pushed_ckpts[name]

    def _push_file(self, rel: str, local: pathlib.Path) -> None:
        try:
            mtime = local.stat().st_mtime
            if self.pushed_files.get(rel) == mtime:
                return
            data = local.read_bytes()
        except FileNotFoundError:
            return
        digest = hashlib.sha256(data).hexdigest()
        if self.versions.get(rel) != digest:   # rewritten unchanged: nothing to store
            self.store.put(rel, data)
            self.versions[rel] = digest
        self.pushed_files[rel] = mtime

    def _put_index(self) -> None:
        """Store what this mirror has stored, last: a reader of the index finds every object it names."""
        text = json.dumps({"streams": self.next_seq, "files": {k: v for k, v in sorted(self.versions.items())
                                                                if not k.startswith("private/")},
                           "checkpoints": dict(sorted(self.pushed_ckpts.items()))}, sort_keys=True)
        if text != self.indexed:
            self.store.put(INDEX, text.encode())
            self.indexed = text

    def sync(self) -> None:
        with self._lock:
            # rows first read, then checkpoints pushed, then the rows: an ack read here was written
            # after its checkpoint, so the checkpoint goes up before it does
            for s, t in self.tails.items():
                if s not in self.unsent:
                    data, pos = t.read()
                    t.commit(pos)
                    if data:
                        self.unsent[s] = data
            self._push_checkpoints()
            for s in STREAMS:
                data = self.unsent.get(s)
                if data is not None:
                    # a put that failed is made again with the same bytes under the same key: one
                    # that landed after all (and may have been read) is rewritten unchanged
                    self.store.put(f"streams/{s}/{_chunk(self.next_seq[s])}", data)
                    self.next_seq[s] += 1
                    del self.unsent[s]
            for f in FILES:
                self._push_file(f, self.dir / f)
            for h in sorted((self.dir / "harnesses").glob("*.yaml")):
                self._push_file(f"harnesses/{h.name}", h)
            if self.private is not None:
                self._push_file("private/perturb.json", self.private)
            self._put_index()      # after all it names
            self.pull_commands()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except (StorageError, OSError) as e:   # retried inside; a pass that still failed is tried again next time
                self.failed_passes += 1
                self.last_error = f"{type(e).__name__}: {e}"
                print(f"run storage: pass failed ({self.failed_passes}): {self.last_error}", file=sys.stderr, flush=True)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="run-storage-mirror", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sync()   # the last pass must land: the run's end is on storage or the job fails


def scratch_dir(run_uri: str) -> pathlib.Path:
    """The job's local folder on this node for the run stored at `run_uri`."""
    root = pathlib.Path(os.environ.get(SCRATCH_ENV) or pathlib.Path(tempfile.gettempdir()) / "swarmlab-scratch")
    return root / hashlib.sha256(run_uri.encode()).hexdigest()[:16]


def fetch_checkpoint(source_uri: str, name: str, dest: pathlib.Path, wait_s: float = FORK_WAIT_S,
                     with_init: bool = False) -> pathlib.Path:
    """Copy checkpoint `name` (.pt and its manifest) of the run at `source_uri` into `dest`,
    waiting up to `wait_s` for it to appear (a mirror pass behind the acknowledgement); `with_init`:
    the source's untrained start (`init`) too, when it has one, beside it (what a full fork's
    `Trainer.inherit_init` reads). `init` is written before any other checkpoint: no wait for it."""
    src = open_storage(source_uri)
    deadline = time.time() + wait_s
    while True:
        try:
            manifest = src.get(f"checkpoints/{name}.json")
            data = src.get(f"checkpoints/{name}.pt")
            break
        except FileNotFoundError:
            if time.time() > deadline:
                raise FileNotFoundError(f"checkpoint {name!r} not on storage at {source_uri} after {wait_s:.0f}s") from None
            time.sleep(0.5)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{name}.pt").write_bytes(data)
    (dest / f"{name}.json").write_bytes(manifest)
    if with_init and name != INIT_CHECKPOINT:
        try:
            init = src.get(f"checkpoints/{INIT_CHECKPOINT}.json"), src.get(f"checkpoints/{INIT_CHECKPOINT}.pt")
        except FileNotFoundError:   # the source kept none (or retention deleted it)
            init = None
        if init is not None:
            (dest / f"{INIT_CHECKPOINT}.pt").write_bytes(init[1])
            (dest / f"{INIT_CHECKPOINT}.json").write_bytes(init[0])
    try:   # the source's injected data faults as they are now, for the fork (trainer.perturb.read_source)
        (dest / SOURCE_FAULTS).write_bytes(src.get("private/perturb.json"))
    except FileNotFoundError:
        (dest / SOURCE_FAULTS).unlink(missing_ok=True)
    return dest / f"{name}.pt"


def put_checkpoint_file(path: str | os.PathLike, uri: str) -> str:
    """Put a checkpoint file of this machine (`NAME.pt` and its manifest `NAME.json` beside it) on
    the storage at `uri` as a run's checkpoint, and the `init` checkpoint beside it when there is one
    (a full fork keeps it: `Trainer.inherit_init`); returns `uri`, the run a fork fetches it from."""
    p = pathlib.Path(path)
    store = open_storage(uri)
    init = p.with_name(f"{INIT_CHECKPOINT}.pt")
    if p.stem != INIT_CHECKPOINT and init.is_file() and init.with_suffix(".json").is_file():
        store.put(f"checkpoints/{INIT_CHECKPOINT}.pt", init.read_bytes())
        store.put(f"checkpoints/{INIT_CHECKPOINT}.json", init.with_suffix(".json").read_bytes())
    store.put(f"checkpoints/{p.stem}.pt", p.read_bytes())
    store.put(f"checkpoints/{p.stem}.json", p.with_suffix(".json").read_bytes())
    return uri


def main(argv: list[str]) -> int:
    """The job's entrypoint with run storage: restore, mirror, run `trainer.entry`, push the end."""
    from trainer.entry import main as entry_main
    from trainer.entry import read_config

    cfg = read_config(argv, "trainer.run_storage")
    if cfg is None:
        return 2
    uri = os.environ.get(STORAGE_ENV)
    if not uri:
        print(f"error: {STORAGE_ENV} is not set (the run's folder on storage)", file=sys.stderr)
        return 2
    fork_src = os.environ.get(FORK_ENV)
    if cfg.num_workers > 1:
        from trainer.rank_storage import run_data_parallel

        return run_data_parallel(cfg, uri, fork_src)
    scratch = scratch_dir(uri)
    upd: dict[str, Any] = {"out_dir": str(scratch)}
    if fork_src and cfg.fork_from:
        name = pathlib.PurePath(cfg.fork_from).stem
        upd["fork_from"] = str(fetch_checkpoint(fork_src, name, scratch / ".fork", with_init=cfg.keeps_fork_init))
    cfg = cfg.model_copy(update=upd)
    mirror = JobMirror(cfg.run_dir, open_storage(uri), private=scratch / ".perturb" / f"{cfg.name}.json")
    got = mirror.restore()
    # the log names where the run is (a URI's query, which may carry options, is left out)
    print(json.dumps({"run_storage": uri.partition("?")[0], "scratch": str(cfg.run_dir), **got}), flush=True)
    local_cfg = scratch / "run.yaml"
    local_cfg.write_text(cfg.to_yaml())
    mirror.start()
    try:
        rc = entry_main([str(local_cfg)])
    finally:
        mirror.close()
    shutil.rmtree(scratch, ignore_errors=True)
    return rc


# ---- the controller's side ---------------------------------------------------------------------------
def bind(local_dir: str | os.PathLike, uri: str, fresh: bool = False) -> None:
    """Make `local_dir` the controller's replica of the run stored at `uri`; `fresh`: clear what
    storage holds there first (a backtest arm started anew)."""
    d = pathlib.Path(local_dir)
    d.mkdir(parents=True, exist_ok=True)
    if fresh:
        open_storage(uri).delete_tree()
    marker = d / MARKER
    if not marker.is_file() or json.loads(marker.read_text()).get("uri") != uri:
        atomic_write_text(marker, json.dumps({"uri": uri}))
    release(d)


def release(local_dir: str | os.PathLike) -> None:
    """Close the replica of `local_dir` held by this process (its stream writers); the next
    `sync_run` opens it again."""
    rep = _REPLICAS.pop(str(pathlib.Path(local_dir).resolve()), None)
    if rep is not None:
        rep.close()


def bound_uri(local_dir: str | os.PathLike) -> str | None:
    """The storage URI a controller-side run folder replicates, or None for a local run."""
    try:
        return json.loads((pathlib.Path(local_dir) / MARKER).read_text())["uri"]
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, KeyError):
        return None


def storage_ref(path: str | os.PathLike) -> tuple[str, str] | None:
    """For a checkpoint file in a replica (`RUN/checkpoints/NAME.pt`): (the run's URI, NAME)."""
    p = pathlib.Path(path)
    uri = bound_uri(p.parent.parent) if p.parent.name == "checkpoints" else None
    return (uri, p.stem) if uri else None


class Replica:
    """The controller's copy of a stored run (see the module docstring)."""

    def __init__(self, local_dir: pathlib.Path, store: Storage) -> None:
        self.dir, self.store = local_dir, store
        try:
            st = json.loads((local_dir / STATE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            st = {}
        self.next_seq: dict[str, int] = {s: int(st.get("next_seq", {}).get(s, 0)) for s in STREAMS}
        # where each local stream ended after the last chunk pulled: [inode, bytes] of the live file
        self.at: dict[str, list[int]] = {s: list(v) for s, v in st.get("at", {}).items() if s in STREAMS}
        self.pushed_lines = int(st.get("pushed_lines", 0))
        self.manifests: set[str] = set(st.get("manifests", []))
        # checkpoint name -> sha256 this replica deleted on storage (retention): the job's index
        # lists it until the job prunes it itself, and it is not pulled again
        self.deleted: dict[str, str] = dict(st.get("deleted", {}))
        self.files: dict[str, str] = dict(st.get("files", {}))     # name -> sha256 of what was pulled
        self.failed_passes = int(st.get("failed_passes", 0))
        self.last_error: str | None = st.get("last_error")
        self.log: RunLog | None = None
        self.acks: JsonlWriter | None = None
        self._saved = ""
        self._saved_at: float | None = None

    def _save(self, force: bool = False) -> None:
        """Write the progress if it changed, at most every SAVE_EVERY_S unless `force`: progress
        older than the rows costs a restarted replica only chunks pulled again (`_rewind`)."""
        now = time.monotonic()
        if not force and self._saved_at is not None and now - self._saved_at < SAVE_EVERY_S:
            return
        self._saved_at = now
        text = json.dumps({"next_seq": self.next_seq, "at": self.at, "pushed_lines": self.pushed_lines, "manifests": sorted(self.manifests),
                           "deleted": self.deleted, "files": self.files, "failed_passes": self.failed_passes, "last_error": self.last_error})
        if text != self._saved:
            self.dir.mkdir(parents=True, exist_ok=True)   # a pass before the job's first made no writer
            atomic_write_text(self.dir / STATE, text, durable=False)
            self._saved = text

    def _rewind(self) -> None:
        """Cut each local stream back to where it ended after the last chunk in the saved progress:
        a controller killed inside a pass wrote rows whose chunks the progress does not count, and
        they are pulled again. The rows past that point are in the live file, or, when the stream
        rolled since, also in the parts after the one that was live then."""
        cut_metrics = False
        for s, (ino, size) in self.at.items():
            path = self.dir / s
            parts = [*rotated_parts(path), path]
            for i, q in enumerate(parts):
                try:
                    st = q.stat()
                except FileNotFoundError:
                    continue
                if q.suffix == ".gz" or st.st_ino != ino:
                    continue
                cut = st.st_size > size
                if cut:
                    os.truncate(q, size)
                for later in parts[i + 1:]:
                    if later == path:
                        if path.exists() and path.stat().st_size:
                            os.truncate(path, 0)
                            cut = True
                    elif later.exists():
                        later.unlink()
                        cut = True
                cut_metrics |= cut and s == "metrics.jsonl"
                break
            # not found: the part was gzipped by two rolls since (progress is saved at every roll, so
            # only a chunk bigger than a part does that); its rows are pulled again (a row twice)
        if cut_metrics:   # a summary written past the cut counts rows that are pulled again: rebuild it
            try:
                pos = json.loads((self.dir / SUMMARY).read_text()).get("position", [0, 0])
            except (FileNotFoundError, json.JSONDecodeError, AttributeError):
                pos = None
            if pos is not None and not (pos[0] == self.at["metrics.jsonl"][0] and pos[1] <= self.at["metrics.jsonl"][1]):
                (self.dir / SUMMARY).unlink(missing_ok=True)

    def _writers(self) -> None:
        if self.log is None:
            self._rewind()
            rotation = Rotation.from_env()
            self.log = RunLog(self.dir, rotation)
            self.acks = JsonlWriter(self.dir / "command_log.jsonl", rotation)

    def push_commands(self) -> None:
        path = self.dir / "commands.jsonl"
        if not path.exists():
            return
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")[:-1]      # a line still being written has no newline yet
        for i in range(self.pushed_lines, len(lines)):
            try:
                cid = str(json.loads(lines[i]).get("id") or f"line{i + 1}")
            except (json.JSONDecodeError, AttributeError):
                cid = f"line{i + 1}"
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in cid)[:64]
            self.store.put(f"inbox/{i:09d}-{safe}.json", lines[i] + b"\n")
            self.pushed_lines = i + 1

    def pull_streams(self, stored: dict[str, int]) -> None:
        """Pull each stream's chunks from the replica's progress up to `stored` (the index's count)."""
        self._writers()
        assert self.log is not None and self.acks is not None, "writers are made above"
        writers = {"metrics.jsonl": self.log.metrics, "samples.jsonl": self.log.samples,
                   "events.jsonl": self.log.events, "command_log.jsonl": self.acks}
        for s in STREAMS:
            w = writers[s]
            while self.next_seq[s] < int(stored.get(s, 0)):   # each named by the index: no miss, no listing
                data = self.store.get(f"streams/{s}/{_chunk(self.next_seq[s])}")
                ino = w.position[0]
                if s != "metrics.jsonl":   # copied as they are; metrics rows also feed the run's summary
                    w.write_lines(data[: data.rfind(b"\n") + 1])
                else:
                    for line in filter(bytes.strip, data.split(b"\n")):
                        try:
                            row = json.loads(line)
                        except json.JSONDecodeError:
                            continue
                        w.write(row)
                self.next_seq[s] += 1
                self.at[s] = list(w.position)
                if w.position[0] != ino:   # rolled: saved now, so `_rewind` finds the part that was live
                    self._save(force=True)

    def _pull_file(self, rel: str, version: str) -> None:
        if self.files.get(rel) == version:   # what the index names is what was pulled: no request, no write
            return
        try:
            data = self.store.get(rel)
        except FileNotFoundError:
            return
        digest = hashlib.sha256(data).hexdigest()   # newer than the index read, maybe: the next pass pulls it again
        if self.files.get(rel) != digest:
            (self.dir / rel).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.dir / rel, data.decode("utf-8"), durable=False)
            self.files[rel] = digest

    def pull_checkpoints(self, stored_ckpts: dict[str, str]) -> None:
        """Pull the manifests of the complete checkpoints the index names (`stored_ckpts`: name -> sha256)."""
        ck = self.dir / "checkpoints"
        # a manifest pulled before and gone here now was deleted by the controller (retention)
        for name in [n for n in self.manifests if not (ck / n).exists()]:
            stem = name[: -len(".json")]
            self.store.delete(f"checkpoints/{name}")
            self.store.delete(f"checkpoints/{stem}.pt")
            self.manifests.discard(name)
            self.deleted[stem] = stored_ckpts.get(stem, "")
        # forgotten once the job prunes it too; one written again under its name (new weights) is pulled
        self.deleted = {k: v for k, v in self.deleted.items() if k in stored_ckpts}
        stored = {f"{k}.json" for k, v in stored_ckpts.items() if self.deleted.get(k) != v}
        for n in sorted(stored - self.manifests):
            try:
                data = self.store.get(f"checkpoints/{n}")
            except FileNotFoundError:   # pruned by the job since its index was read: the next index says so
                continue
            ck.mkdir(parents=True, exist_ok=True)
            atomic_write_text(ck / n, data.decode("utf-8"), durable=False)
            self.manifests.add(n)
        for n in sorted(self.manifests - stored):   # pruned by the trainer
            (ck / n).unlink(missing_ok=True)
            self.manifests.discard(n)

    def sync(self) -> None:
        try:
            self.push_commands()        # keys named by line: pushing one again after a crash rewrites it
            try:
                index = json.loads(self.store.get(INDEX))
            except FileNotFoundError:   # the job has made no pass yet: nothing to pull
                return
            except ValueError as e:     # a put is whole, so never seen; counted as a failed pass if it is
                raise StorageError(f"unreadable {INDEX} at {self.store.uri}: {e}") from e
            self.pull_checkpoints(index.get("checkpoints", {}))   # before the rows: an ack pulled now names a checkpoint pulled
            self.pull_streams(index.get("streams", {}))
            for rel, version in index.get("files", {}).items():
                if rel in FILES or (rel.startswith("harnesses/") and rel.count("/") == 1 and ".." not in rel):
                    self._pull_file(rel, version)
        finally:   # the progress is saved at most every SAVE_EVERY_S (and at a roll); `_rewind` undoes the rest
            self._save()

    def close(self) -> None:
        self._save(force=True)
        if self.log is not None:
            self.log.close()
        if self.acks is not None:
            self.acks.close()
        self.log = self.acks = None


_REPLICAS: dict[str, Replica] = {}


def sync_run(local_dir: str | os.PathLike) -> bool | None:
    """One replica pass for a controller-side run folder bound to storage (`bind`): True when it
    went through, False when storage failed past its retries (counted in `.replica.json`; the next
    call tries again), None for a local run (nothing to do: one `stat`)."""
    uri = bound_uri(local_dir)
    if uri is None:
        return None
    key = str(pathlib.Path(local_dir).resolve())
    rep = _REPLICAS.get(key)
    if rep is None:
        rep = _REPLICAS[key] = Replica(pathlib.Path(key), open_storage(uri))
    try:
        rep.sync()
        return True
    except (StorageError, OSError) as e:
        rep.failed_passes += 1
        rep.last_error = f"{type(e).__name__}: {e}"
        try:
            rep._save(force=True)
        except OSError:
            pass
        return False


def run_uri(root: str, run_key: str, name: str) -> str:
    """Where a swarm run keeps run `name` on the storage at `root`."""
    return join_uri(root, run_key or "run", name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
