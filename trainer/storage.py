"""Run storage backends: blobs under a root, addressed by '/'-separated keys, behind one small ABC.

    store = open_storage("file:///mnt/runs/key/train")    # any pyarrow.fs URI: file://, s3://, gs://, hdfs://
    store = open_storage("/mnt/runs/key/train")           # a plain folder
    store.put("heartbeat.json", b"{...}"); store.get("heartbeat.json"); store.list("checkpoints")

Two real implementations: `FolderStorage` (a local folder, plain `os` calls) and `ArrowStorage` (any
`pyarrow.fs` filesystem, named by URI). `open_storage` wraps either in `Retrying`, which retries a
transient failure (any `OSError` but a missing object or a refused permission) with exponential
backoff within a budget (`RetryPolicy`, about 6 s by default) and only then raises `StorageError`:
one failed request never ends a run (Ray's own `train.report` has no such retry, ray #47939).

Only what an object store can do is asked for: whole-object put, get, list and delete. A put is
atomic for a reader (a folder: a temp file renamed; an object store: a PUT is). There is no append:
append-only streams are written as numbered chunks by `trainer.run_storage`.
"""
from __future__ import annotations

import abc
import dataclasses
import os
import pathlib
import time
from typing import Callable

from sandboxes.errors import SwarmlabError


class StorageError(SwarmlabError, OSError):
    """A storage request that failed on every attempt its retry budget allowed."""


# errors that no retry can fix: the object is not there, or we may not touch it
PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def _clean_key(key: str) -> str:
    parts = [p for p in str(key).split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ValueError(f"storage key {key!r} may not contain '..'")
    return "/".join(parts)


class Storage(abc.ABC):
    """Blobs under one root. Keys are relative, '/'-separated; `list` names the objects directly
    under a prefix (not folders), sorted."""

    uri: str

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; `FileNotFoundError` when there is none."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]: ...

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object (nothing happens when it is not there)."""

    @abc.abstractmethod
    def delete_tree(self, prefix: str = "") -> None:
        """Remove every object under `prefix`."""

    def child(self, prefix: str) -> "Storage":
        """The same storage rooted at `prefix`."""
        return _Child(self, _clean_key(prefix))


class _Child(Storage):
    def __init__(self, parent: Storage, prefix: str) -> None:
        self.parent, self.prefix = parent, prefix
        self.uri = join_uri(parent.uri, prefix)

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{_clean_key(key)}".rstrip("/")

    def put(self, key: str, data: bytes) -> None:
        self.parent.put(self._k(key), data)

    def get(self, key: str) -> bytes:
        return self.parent.get(self._k(key))

    def list(self, prefix: str = "") -> list[str]:
        return self.parent.list(self._k(prefix))

    def delete(self, key: str) -> None:
        self.parent.delete(self._k(key))

    def delete_tree(self, prefix: str = "") -> None:
        self.parent.delete_tree(self._k(prefix))


class FolderStorage(Storage):
    """A local folder (or a mounted one: NFS, a ReadWriteMany volume)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = pathlib.Path(root)
        self.uri = str(self.root)

    def _p(self, key: str) -> pathlib.Path:
        return self.root / _clean_key(key)

    def put(self, key: str, data: bytes) -> None:
        p = self._p(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, p)

    def get(self, key: str) -> bytes:
        return self._p(key).read_bytes()

    def list(self, prefix: str = "") -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self._p(prefix)) if e.is_file() and not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def delete(self, key: str) -> None:
        self._p(key).unlink(missing_ok=True)

    def delete_tree(self, prefix: str = "") -> None:
        import shutil

        shutil.rmtree(self._p(prefix), ignore_errors=True)


class ArrowStorage(Storage):
    """Any `pyarrow.fs` filesystem, by URI (`file:///…`, `s3://bucket/prefix?endpoint_override=…`,
    `gs://…`, `hdfs://…`), or a filesystem object and a base path."""

    def __init__(self, uri: str, filesystem=None) -> None:
        import pyarrow.fs as pafs

        if filesystem is None:
            filesystem, base = pafs.FileSystem.from_uri(uri)
        else:
            base = uri
        self.fs, self.base, self.uri = filesystem, base.rstrip("/"), uri
        # a local filesystem has no atomic PUT: write a temp object and move it into place
        self._local = isinstance(filesystem, pafs.LocalFileSystem)
        # an object store has no folders: making a key's parents there costs a HEAD of the bucket
        # and an empty marker object per level (4 of a chunk's 7 requests on S3), for nothing
        stores = tuple(getattr(pafs, n) for n in ("S3FileSystem", "GcsFileSystem") if hasattr(pafs, n))
        self._folders = not isinstance(filesystem, stores)

    def _p(self, key: str) -> str:
        k = _clean_key(key)
        return f"{self.base}/{k}" if k else self.base

    def put(self, key: str, data: bytes) -> None:
        path = self._p(key)
        parent = path.rsplit("/", 1)[0]
        if self._folders:
            self.fs.create_dir(parent, recursive=True)
        target = f"{parent}/.{path.rsplit('/', 1)[1]}.tmp{os.getpid()}" if self._local else path
        with self.fs.open_output_stream(target) as f:
            f.write(data)
        if self._local:
            self.fs.move(target, path)

    def get(self, key: str) -> bytes:
        with self.fs.open_input_stream(self._p(key)) as f:
            return f.read()

    def list(self, prefix: str = "") -> list[str]:
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(self._p(prefix), allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.File and not i.base_name.startswith("."))

    def delete(self, key: str) -> None:
        try:
            self.fs.delete_file(self._p(key))
        except FileNotFoundError:
            pass

    def delete_tree(self, prefix: str = "") -> None:
        try:
            self.fs.delete_dir(self._p(prefix))
        except FileNotFoundError:
            pass


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How hard a storage request is retried: `attempts` tries in all, waiting `first_wait_s`,
    then twice as long each time, at most `max_wait_s` (the defaults wait about 6 s in all)."""

    attempts: int = 6
    first_wait_s: float = 0.2
    max_wait_s: float = 3.2

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts={self.attempts} must be >= 1")
        if self.first_wait_s < 0 or self.max_wait_s < self.first_wait_s:
            raise ValueError(f"RetryPolicy waits first_wait_s={self.first_wait_s}, max_wait_s={self.max_wait_s}: "
                             "need 0 <= first_wait_s <= max_wait_s")

    def waits(self) -> list[float]:
        return [min(self.first_wait_s * 2 ** i, self.max_wait_s) for i in range(self.attempts - 1)]


class Retrying(Storage):
    """Another storage with each request retried on a transient error (see the module docstring).
    `retries` counts the failed attempts that a later one made good."""

    def __init__(self, inner: Storage, policy: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.inner, self.policy, self.sleep = inner, policy or RetryPolicy(), sleep
        self.uri = inner.uri
        self.retries = 0

    def _call(self, what: str, key: str, fn: Callable, *args):
        waits = self.policy.waits()
        for i in range(self.policy.attempts):
            try:
                return fn(*args)
            except PERMANENT:
                raise
            except OSError as e:
                if i == len(waits):
                    raise StorageError(f"storage {what} {key!r} at {self.uri}: failed {self.policy.attempts} times; "
                                       f"last error: {type(e).__name__}: {e}") from e
                self.retries += 1
                self.sleep(waits[i])
        raise AssertionError("unreachable: the loop returns or raises")

    def put(self, key: str, data: bytes) -> None:
        self._call("put", key, self.inner.put, key, data)

    def get(self, key: str) -> bytes:
        return self._call("get", key, self.inner.get, key)

    def list(self, prefix: str = "") -> list[str]:
        return self._call("list", prefix, self.inner.list, prefix)

    def delete(self, key: str) -> None:
        self._call("delete", key, self.inner.delete, key)

    def delete_tree(self, prefix: str = "") -> None:
        self._call("delete", prefix, self.inner.delete_tree, prefix)


def open_storage(uri: str, policy: RetryPolicy | None = None) -> Storage:
    """The storage at `uri` with retries: a URI with a scheme through `pyarrow.fs`, a plain path as
    a folder."""
    if not uri or not str(uri).strip():
        raise ValueError("storage URI is empty")
    inner: Storage = ArrowStorage(uri) if "://" in uri else FolderStorage(uri)
    return Retrying(inner, policy)


def join_uri(root: str, *parts: str) -> str:
    """`root` with key parts appended ('/'-separated, whatever the scheme; a query string stays last)."""
    base, q, query = root.partition("?")
    tail = "/".join(_clean_key(p) for p in parts if _clean_key(p))
    out = base.rstrip("/") + ("/" + tail if tail else "")
    return out + (q + query if q else "")
