"""Private files: the state untrusted code must never read or change, created 0600 (files) and
0700 (directories) whatever the process's umask.

What is private: a workspace's `.swarm/` (the goal with its perturbations in `private/`, the state
database, the graph checkpoints, logs), LLM records, the memory library, skill folders, and the
Ray head's auth token. Directory modes are what protect the files inside them from other local
users (and from the sandbox uid of the plain fallback); file modes keep a file private when it is
copied or its directory is opened up.

    from sandboxes.private import private_dir, write_private, touch_private
    d = private_dir(ws / ".swarm" / "private")       # 0700, parents created as needed
    write_private(d / "goal.yaml", text)              # 0600, atomic
    touch_private(ws / ".swarm" / "state.db")         # 0600 before sqlite opens it
"""
from __future__ import annotations

import os
import pathlib
import stat
import tempfile

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: str | os.PathLike) -> pathlib.Path:
    """Create `path` (and missing parents) and make it 0700. Only the leaf is tightened: parents
    that already exist keep their modes (a home or a project folder is not ours to change)."""
    p = pathlib.Path(path)
    p.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    _tighten(p, DIR_MODE)
    return p


def _tighten(p: pathlib.Path, mode: int) -> None:
    # ours and looser than `mode`: tighten it; someone else's (root reading a user's workspace,
    # say) is left as it is rather than failing the read
    st = os.stat(p)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
        os.chmod(p, mode)


def touch_private(path: str | os.PathLike) -> pathlib.Path:
    """Make sure the file exists and is 0600 (an existing file keeps its content)."""
    p = pathlib.Path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        _tighten(p, FILE_MODE)
    else:
        os.fchmod(fd, FILE_MODE)
        os.close(fd)
    return p


def open_private(path: str | os.PathLike, mode: str = "a", encoding: str | None = "utf-8"):
    """Open a file for writing ("w", "a", "wb", "ab"), created 0600 if it is new and made 0600 if not."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, mode, encoding=None if "b" in mode else encoding)


def write_private(path: str | os.PathLike, data: str | bytes) -> pathlib.Path:
    """Write `data` to `path` atomically (a temp file in the same directory, then rename), 0600."""
    p = pathlib.Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)  # mkstemp: 0600
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), FILE_MODE)
            f.write(raw)
        os.replace(tmp, p)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return p
