"""Atomic, checksummed checkpoints with retention.

A checkpoint is `CKPT_DIR/<name>.pt` (torch.save of the full training state) plus a manifest
`CKPT_DIR/<name>.json` holding its SHA-256, step and kind. Both are written to a temp file,
fsync'd and renamed, the manifest last: a checkpoint without a manifest was never complete.
Loading verifies the checksum; `latest_good` walks back from the newest (the last written:
after a rollback, a later checkpoint of the abandoned timeline is older) to the first checkpoint
that verifies, so a corrupt file costs progress, never the run. `choose_resume` is that walk over
one listing, as a `ResumeChoice` that names what it picked and what it skipped: where a trainer
starts (`Trainer._start`), and what rank 0 of a data-parallel run sends the other ranks
(`trainer.distributed.agree_resume`).

Periodic checkpoints (`step_000050`) are pruned to the newest `keep_last`; named ones (saved on a
command, `name=…`) are kept until deleted.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import time
from typing import Any

import torch

from sandboxes.errors import SwarmlabError


class CheckpointError(SwarmlabError, RuntimeError):
    pass


def _fsync_write(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class CheckpointManager:
    def __init__(self, ckpt_dir: pathlib.Path, keep_last: int = 3) -> None:
        self.dir = ckpt_dir
        self.keep_last = keep_last
        ckpt_dir.mkdir(parents=True, exist_ok=True)

    def save(self, state: dict[str, Any], step: int, name: str | None = None) -> pathlib.Path:
        kind = "named" if name else "periodic"
        name = name or f"step_{step:07d}"
        if not name.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ValueError(f"checkpoint name {name!r} may only hold letters, digits, '_', '-', '.'")
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        path = self.dir / f"{name}.pt"
        _fsync_write(path, data)
        manifest = {"name": name, "step": step, "kind": kind, "sha256": hashlib.sha256(data).hexdigest(),
                    "bytes": len(data), "time": time.time()}
        _fsync_write(self.dir / f"{name}.json", json.dumps(manifest).encode())
        if kind == "periodic":
            self._prune()
        return path

    def manifests(self) -> list[dict[str, Any]]:
        out = []
        for m in self.dir.glob("*.json"):
            try:
                out.append(json.loads(m.read_text()))
            except (json.JSONDecodeError, OSError):
                continue
        # in the order they were written: after a rollback the newest state is the one saved last,
        # not the one with the highest step (that belongs to the abandoned timeline)
        return sorted(out, key=lambda m: (m["time"], m["step"]))

    def _prune(self) -> None:
        periodic = [m for m in self.manifests() if m["kind"] == "periodic"]
        for m in periodic[: -self.keep_last]:
            for suffix in (".json", ".pt"):
                (self.dir / f"{m['name']}{suffix}").unlink(missing_ok=True)

    def load(self, name: str, sha256: str | None = None) -> dict[str, Any]:
        """The state saved as `name`, its weights' hash checked against `sha256` (default: its
        manifest's; another rank's data-parallel start passes the hash rank 0 read)."""
        mpath, ppath = self.dir / f"{name}.json", self.dir / f"{name}.pt"
        if not mpath.exists() or not ppath.exists():
            known = ", ".join(m["name"] for m in self.manifests()) or "none"
            raise CheckpointError(f"no checkpoint named {name!r} (known: {known})")
        expected = sha256 or json.loads(mpath.read_text())["sha256"]
        data = ppath.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest != expected:
            whose = "manifest" if sha256 is None else "expected"
            raise CheckpointError(f"checkpoint {name!r} is corrupt: sha256 {digest[:12]} != {whose} {expected[:12]}")
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)

    def load_latest_good(self, on_corrupt=None) -> dict[str, Any] | None:
        """The newest checkpoint that verifies; `on_corrupt(name, error)` is called for each one skipped."""
        return self.latest_good(on_corrupt)[1]

    def latest_good(self, on_corrupt=None, manifests: list[dict[str, Any]] | None = None
                    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """(manifest, state) of the newest checkpoint of `manifests` (default: this folder's, in the
        order written) that loads and verifies; (None, None) when none does."""
        for m in reversed(self.manifests() if manifests is None else manifests):
            try:   # against the hash listed: a file written again since the listing is not what was chosen
                return m, self.load(m["name"], sha256=m.get("sha256"))
            except (CheckpointError, OSError, RuntimeError, EOFError, ValueError) as e:
                if on_corrupt:
                    on_corrupt(m["name"], str(e))
        return None, None

    def newest_path(self) -> pathlib.Path | None:
        ms = self.manifests()
        return self.dir / f"{ms[-1]['name']}.pt" if ms else None


@dataclasses.dataclass(frozen=True)
class ResumeChoice:
    """Where a trainer starts, as one walk of its checkpoints decided it (rank 0's, data-parallel)."""

    name: str | None                              # the checkpoint to load; None: none verifies, or none exists
    sha256: str                                   # its weights' hash ("" when name is None)
    listing: tuple[dict[str, Any], ...]           # the manifests listed, oldest first (empty: a fresh run, or a fork)
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
