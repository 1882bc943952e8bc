"""Private files: the state untrusted code must never read or change, created 0600 (files) and
0700 (directories) whatever the process's umask.

What is private: a workspace's `.swarm/` (the goal with its perturbations in `private/`, the state
database, the graph checkpoints, logs), LLM records, the memory library, skill folders, and the
Ray head's auth token. Directory modes are what protect the files inside them from other local
users (and from the sandbox uid of the plain fallback); file modes keep a file private when it is
copied or its directory is opened up.

A private path is never followed through a symbolic link: every open here uses `O_NOFOLLOW`, every
check `lstat`, so a link planted where a private file or folder belongs (`.swarm/state.db` →
`~/.bashrc`, say) cannot make a chmod, a truncation or a write land on its target. Such a link, or
a FIFO, a device or a folder where a file belongs, raises `PrivatePathError`: one line naming the
path and what is wrong, nothing changed.

    from sandboxes.private import private_dir, write_private, touch_private
    d = private_dir(ws / ".swarm" / "private")       # 0700, parents created as needed
    write_private(d / "goal.yaml", text)              # 0600, atomic
    touch_private(ws / ".swarm" / "state.db")         # 0600 before sqlite opens it
    fd = open_private_fd(ws / ".swarm" / "controller.lock")   # O_RDWR, 0600, not a link
"""
from __future__ import annotations

import errno
import os
import pathlib
import stat
import tempfile

from sandboxes.errors import SwarmlabError

DIR_MODE = 0o700
FILE_MODE = 0o600
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class PrivatePathError(SwarmlabError, ValueError):
    """A private file or folder that is a symbolic link or not the kind of thing it should be."""


def describe(mode: int) -> str:
    """What an `st_mode` is, in words ("a symbolic link", "a FIFO", ...)."""
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


def _refuse(p: pathlib.Path, mode: int, want: str) -> PrivatePathError:
    if stat.S_ISLNK(mode):
        return PrivatePathError(f"{str(p)!r} is a symbolic link where a private {want} belongs; refusing to follow it "
                                f"(remove the link)")
    return PrivatePathError(f"{str(p)!r} is {describe(mode)}, not a {want}")


def _lstat(p: pathlib.Path) -> os.stat_result | None:
    try:
        return os.lstat(p)
    except FileNotFoundError:
        return None


def private_dir(path: str | os.PathLike) -> pathlib.Path:
    """Create `path` (and missing parents) and make it 0700. Only the leaf is tightened: parents
    that already exist keep their modes (a home or a project folder is not ours to change). A leaf
    that is a symbolic link or not a folder raises `PrivatePathError`."""
    p = pathlib.Path(path)
    st = _lstat(p)
    if st is None:
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(p, DIR_MODE)
        except FileExistsError:
            pass
        st = os.lstat(p)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(p, st.st_mode, "folder")
    _tighten_path(p, DIR_MODE, "folder")
    return p


def _tighten_fd(fd: int, mode: int) -> os.stat_result:
    # ours and looser than `mode`: tighten it; someone else's (root reading a user's workspace,
    # say) is left as it is rather than failing the read. On the descriptor: never a link's target.
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
        os.fchmod(fd, mode)
    return st


def open_private_fd(path: str | os.PathLike, flags: int = os.O_RDWR) -> int:
    """A descriptor on the private file `path` (opened with `flags`, e.g. `os.O_RDWR` or
    `os.O_WRONLY | os.O_APPEND`), created 0600 if missing and made 0600 if not. Never follows a
    symbolic link and never blocks on a FIFO: a link, a FIFO, a folder or a device at `path` raises
    `PrivatePathError` before anything is written. For lock files and logs, not for a database
    sqlite may hold open in this process (`touch_private` is for those)."""
    p = pathlib.Path(path)
    st = _lstat(p)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _refuse(p, st.st_mode, "file")
    # O_NONBLOCK: a FIFO slipped in after the lstat fails to open (ENXIO) or is refused below,
    # instead of blocking; it changes nothing for a regular file and is cleared once checked
    try:
        fd = os.open(p, flags | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | _NOFOLLOW, FILE_MODE)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise _refuse(p, os.lstat(p).st_mode, "file") from None
        raise
    try:
        st = _tighten_fd(fd, FILE_MODE)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(p, st.st_mode, "file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def touch_private(path: str | os.PathLike) -> pathlib.Path:
    """Make sure the file exists and is 0600 (an existing file keeps its content); a symbolic link
    or anything but a regular file there raises `PrivatePathError`. An existing file is never
    opened (only looked at through an `O_PATH` descriptor): this process may hold sqlite
    connections on it, and closing any ordinary descriptor of a file drops the process's POSIX
    locks on it, sqlite's included."""
    p = pathlib.Path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | _NOFOLLOW, FILE_MODE)
    except FileExistsError:
        _tighten_path(p, FILE_MODE, "file")
    else:
        os.fchmod(fd, FILE_MODE)
        os.close(fd)
    return p


def _tighten_path(p: pathlib.Path, mode: int, want: str) -> None:
    """`_tighten_fd` for an existing file or folder without opening it: an `O_PATH` descriptor of
    the path itself (never a link's target; no read permission needed) to look at, and a chmod
    through `/proc/self/fd`. Not opening it matters for a database: closing an ordinary descriptor
    of a file drops every POSIX lock this process holds on it, sqlite's included."""
    is_kind = stat.S_ISDIR if want == "folder" else stat.S_ISREG
    o_path = getattr(os, "O_PATH", 0)
    if not o_path or not os.path.isdir("/proc/self/fd"):   # not Linux: look, then chmod not following
        st = os.lstat(p)
        if not is_kind(st.st_mode):
            raise _refuse(p, st.st_mode, want)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
            nofollow = os.chmod in os.supports_follow_symlinks   # lchmod where there is one
            os.chmod(p, mode, follow_symlinks=not nofollow)
        return
    fd = os.open(p, o_path | os.O_CLOEXEC | _NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not is_kind(st.st_mode):
            raise _refuse(p, st.st_mode, want)
        # ours and looser than `mode`: tighten it; someone else's (root reading a user's workspace,
        # say) is left as it is rather than failing the read
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
            os.chmod(f"/proc/self/fd/{fd}", mode)   # the file this descriptor names, never a link's target
    finally:
        os.close(fd)   # an O_PATH descriptor holds no locks: closing it drops none


def open_private(path: str | os.PathLike, mode: str = "a", encoding: str | None = "utf-8"):
    """Open a file for writing ("w", "a", "wb", "ab"), created 0600 if it is new and made 0600 if not;
    never through a link (`open_private_fd`)."""
    fd = open_private_fd(path, os.O_WRONLY | (os.O_APPEND if mode.startswith("a") else 0))
    if not mode.startswith("a"):
        os.ftruncate(fd, 0)
    return os.fdopen(fd, mode, encoding=None if "b" in mode else encoding)


def write_private(path: str | os.PathLike, data: str | bytes) -> pathlib.Path:
    """Write `data` to `path` atomically (a temp file in the same directory, then rename), 0600.
    A symbolic link or anything but a regular file at `path` raises `PrivatePathError` (the
    rename would replace a link rather than write through it; refusing says what was there)."""
    p = pathlib.Path(path)
    st = _lstat(p)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _refuse(p, st.st_mode, "file")
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)  # mkstemp: 0600, O_EXCL
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), FILE_MODE)
            f.write(raw)
        os.replace(tmp, p)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return p


def check_private(path: str | os.PathLike, kind: str = "file") -> os.stat_result | None:
    """`lstat` of a private `path` that is there and is a `kind` ("file" or "folder"); None when
    nothing is there; `PrivatePathError` for a symbolic link or the wrong kind of thing. Reads
    nothing and changes nothing: for a look before a FIFO could block an open."""
    p = pathlib.Path(path)
    st = _lstat(p)
    if st is not None and not (stat.S_ISDIR if kind == "folder" else stat.S_ISREG)(st.st_mode):
        raise _refuse(p, st.st_mode, kind)
    return st
