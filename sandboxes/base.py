"""Sandbox interface: run untrusted code under hard limits and get everything back as data.

The product runs code it does not trust in two places: programs the policy being trained writes
(code tasks, rewarded by running tests) and programs agents write (skill programs, data filters).
Both go through a `Sandbox`:

    from sandboxes import Limits, make_sandbox
    sb = make_sandbox("auto")                      # Docker if an engine answers, else local
    res = sb.run_python("print(sum(range(10)))", limits=Limits(wall_seconds=2))
    res.reason, res.exit_code, res.stdout          # StopReason.EXIT, 0, b"45\\n"

A run never raises for anything the code did: a syntax error, a crash, a fork bomb, a timeout or
a sandbox that could not start all come back as an `ExecResult` whose `reason` says why it stopped.
`ValueError` is raised only for a malformed request (bad limits, a file path escaping the work
dir), at the boundary, before anything runs.

Backends: `sandboxes.docker_backend.DockerSandbox` (container per run) and
`sandboxes.local.LocalSandbox` (bubblewrap, else util-linux `unshare` namespaces; the plain
subprocess with rlimits only where the caller opts in, with a loud warning);
`sandboxes.fake.FakeSandbox` is a scripted stand-in for tests of code that uses a sandbox.
"""
from __future__ import annotations

import abc
import dataclasses
import enum
import logging
import math
import os
import posixpath
import time
from typing import Any, ClassVar, Mapping, Sequence

from sandboxes.errors import SwarmlabError

log = logging.getLogger(__name__)

MiB = 1 << 20
DEFAULT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
MAIN_SCRIPT = "main.py"
DEFAULT_IMAGE = "swarmlab-sandbox:bookworm"  # the Docker backend's image (built by sandboxes.image)


class StopReason(str, enum.Enum):
    EXIT = "exit"              # the process exited on its own (any exit code)
    TIMEOUT = "timeout"        # wall-clock or CPU-time limit (detail says which)
    MEMORY = "memory"          # memory limit: MemoryError / failed allocation / OOM kill
    OUTPUT_CAP = "output_cap"  # stdout or stderr passed Limits.output_bytes; the run was killed
    KILLED = "killed"          # ended by a signal none of our limits explains (segfault, abort...)
    ERROR = "error"            # the sandbox itself could not run it (engine down, no image, exec failed)


class Isolation(str, enum.Enum):
    DOCKER = "docker"  # a container: own namespaces and cgroup limits
    BWRAP = "bwrap"    # bubblewrap: own user/pid/net/ipc namespaces, minimal read-only root
    UNSHARE = "unshare"  # util-linux unshare: own user/mount/net/pid/ipc namespaces, minimal read-only root
    PLAIN = "plain"    # a subprocess with rlimits only: reduced isolation, always warned about
    FAKE = "fake"      # scripted results, nothing runs


PLAIN_OPT_IN_ENV = "SWARMLAB_SANDBOX"  # "unsafe_plain": where nothing isolates, run plain (a goal's opt-in)


def plain_opted_in() -> bool:
    """Whether this process (and the jobs it starts, which inherit the variable) may fall back to
    the plain subprocess when no backend isolates: set from a goal's `sandbox: unsafe_plain`."""
    return os.environ.get(PLAIN_OPT_IN_ENV) == "unsafe_plain"


class SandboxError(SwarmlabError):
    """Base of the sandbox package's own errors (not raised for anything the sandboxed code does)."""


class SandboxUnavailable(SandboxError):
    """A backend cannot be used here (no engine, no image, no bubblewrap); the message says why."""


class ImageBuildError(SandboxError):
    """Building the Docker base image failed; the message names the failing step."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Hard limits for one run. Every field is enforced by every backend unless its help says
    otherwise; `ValueError` names the field and the value."""

    wall_seconds: float = 10.0   # wall-clock time from start to kill (the whole process tree)
    cpu_seconds: float = 10.0    # CPU time per process (RLIMIT_CPU, rounded up to whole seconds)
    memory_bytes: int = 256 * MiB  # address space per process (RLIMIT_AS); Docker: also the cgroup limit
    pids: int = 32               # processes+threads: Docker pids cgroup; local: RLIMIT_NPROC
    output_bytes: int = 1 * MiB  # kept per stream (stdout, stderr); one byte more kills the run
    file_bytes: int = 16 * MiB   # largest file the code may write (RLIMIT_FSIZE) or hand back
    disk_bytes: int = 64 * MiB   # size of each writable tmpfs (work dir, /tmp); plain fallback: not enforced
    collect_bytes: int = 16 * MiB  # total bytes of files handed back
    open_files: int = 256        # RLIMIT_NOFILE
    cpus: float = 1.0            # CPU share (Docker --cpus); local backends: not enforced

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "cpus"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"limits.{name}={v!r} must be a positive finite number")
        for name in ("memory_bytes", "pids", "output_bytes", "file_bytes", "disk_bytes",
                     "collect_bytes", "open_files"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"limits.{name}={v!r} must be a positive integer")
        if self.memory_bytes < 16 * MiB:
            raise ValueError(f"limits.memory_bytes={self.memory_bytes} is below 16 MiB; no interpreter starts in that")
        if self.open_files < 16:
            raise ValueError(f"limits.open_files={self.open_files} must be >= 16")

    def replace(self, **changes: Any) -> "Limits":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_rel_path(path: str) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError(f"file path {path!r} must be a non-empty string")
    if "\0" in path or path.startswith("/") or "\\" in path:
        raise ValueError(f"file path {path!r} must be relative, without NUL or backslashes")
    norm = posixpath.normpath(path)
    if norm == "." or norm.startswith("../") or norm == "..":
        raise ValueError(f"file path {path!r} escapes the work dir")
    return norm


@dataclasses.dataclass(frozen=True)
class ExecRequest:
    """One run: `argv` executed in the work dir holding `files`. `collect` are fnmatch patterns
    over work-dir-relative paths (`*` also matches `/`) naming the files to hand back. `limits`
    None means the sandbox's defaults. `env` is added to a minimal environment; nothing of the
    host's environment is passed in."""

    argv: tuple[str, ...]
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    stdin: bytes = b""
    limits: Limits | None = None
    collect: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        argv = tuple(self.argv)
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv) or not argv[0]:
            raise ValueError(f"argv={list(argv)!r} must be a non-empty list of strings without NUL")
        files: dict[str, bytes] = {}
        for path, data in dict(self.files).items():
            norm = _check_rel_path(path)
            if isinstance(data, str):
                data = data.encode("utf-8")
            if not isinstance(data, (bytes, bytearray)):
                raise ValueError(f"file {path!r}: content must be bytes or str, got {type(data).__name__}")
            files[norm] = bytes(data)
        for k, v in dict(self.env).items():
            key_ok = isinstance(k, str) and k and "=" not in k and "\0" not in k
            if not (key_ok and isinstance(v, str) and "\0" not in v):
                raise ValueError(f"env entry {k!r}={v!r} is not a valid environment variable")
        if isinstance(self.collect, str):
            raise ValueError(f"collect={self.collect!r} must be a list of patterns, not one string")
        if self.limits is not None and not isinstance(self.limits, Limits):
            raise ValueError(f"limits={self.limits!r} must be a sandboxes.Limits")
        object.__setattr__(self, "argv", argv)
        object.__setattr__(self, "files", files)
        object.__setattr__(self, "stdin", bytes(self.stdin or b""))
        object.__setattr__(self, "collect", tuple(self.collect))
        object.__setattr__(self, "env", dict(self.env))


@dataclasses.dataclass(frozen=True)
class ResourceUsage:
    wall_seconds: float                # from start to the main process's end (host-measured on error)
    cpu_seconds: float | None = None   # user+system of every process reaped in the sandbox
    max_rss_bytes: int | None = None   # largest resident set of any one of them


@dataclasses.dataclass(frozen=True)
class ExecResult:
    reason: StopReason
    exit_code: int | None              # negative: killed by that signal; None: it never ran
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    files_skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # path -> why not handed back
    usage: ResourceUsage = dataclasses.field(default_factory=lambda: ResourceUsage(0.0))
    isolation: Isolation = Isolation.PLAIN
    warning: str | None = None         # set when isolation is reduced (plain fallback)
    detail: str = ""                   # which limit, which signal, what failed

    @property
    def ok(self) -> bool:
        return self.reason is StopReason.EXIT and self.exit_code == 0

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    def summary(self) -> str:
        bits = [self.reason.value, f"exit={self.exit_code}", f"wall={self.usage.wall_seconds:.3f}s"]
        if self.detail:
            bits.append(self.detail)
        return " ".join(bits)


def error_result(detail: str, isolation: Isolation, started: float, warning: str | None = None) -> ExecResult:
    return ExecResult(StopReason.ERROR, None, usage=ResourceUsage(time.monotonic() - started),
                      isolation=isolation, warning=warning, detail=detail)


class Sandbox(abc.ABC):
    """A place to run untrusted code. Subclasses implement `_execute`; everything else is shared.

    `execute` is the boundary where errors become data: an exception inside a backend (an engine
    that went away mid-run, say) is logged and returned as a `StopReason.ERROR` result."""

    isolation: ClassVar[Isolation]
    python: str = "python3"  # the interpreter inside the sandbox, for run_python

    def __init__(self, limits: Limits | None = None) -> None:
        if limits is not None and not isinstance(limits, Limits):
            raise ValueError(f"limits={limits!r} must be a sandboxes.Limits")
        self.limits = limits or Limits()

    # ----------------------------------------------------------------- building requests
    def request(self, argv: Sequence[str], *, files: Mapping[str, bytes | str] | None = None,
                stdin: bytes = b"", limits: Limits | None = None, collect: Sequence[str] = (),
                env: Mapping[str, str] | None = None) -> ExecRequest:
        return ExecRequest(tuple(argv), dict(files or {}), stdin, limits, tuple(collect), dict(env or {}))

    def python_request(self, code: str, *, files: Mapping[str, bytes | str] | None = None,
                       args: Sequence[str] = (), stdin: bytes = b"", limits: Limits | None = None,
                       collect: Sequence[str] = (), env: Mapping[str, str] | None = None) -> ExecRequest:
        """`code` saved as main.py in the work dir and run with the sandbox's Python (`-B -E -s`:
        no bytecode files, no PYTHON* variables, no user site; the work dir is on sys.path)."""
        files = dict(files or {})
        if MAIN_SCRIPT in files:
            raise ValueError(f"files may not contain {MAIN_SCRIPT!r}: run_python writes the code there")
        files[MAIN_SCRIPT] = code
        return self.request([self.python, "-B", "-E", "-s", MAIN_SCRIPT, *args], files=files, stdin=stdin,
                            limits=limits, collect=collect, env=env)

    # ----------------------------------------------------------------- running
    def run(self, argv: Sequence[str], **kw: Any) -> ExecResult:
        return self.execute(self.request(argv, **kw))

    def run_python(self, code: str, **kw: Any) -> ExecResult:
        return self.execute(self.python_request(code, **kw))

    def execute(self, request: ExecRequest) -> ExecResult:
        limits = request.limits or self.limits
        started = time.monotonic()
        try:
            return self._execute(request, limits)
        except Exception as e:  # boundary: a backend failure becomes an ERROR result
            log.exception("sandbox %s failed to run %r", type(self).__name__, request.argv[:3])
            return error_result(f"{type(e).__name__}: {e}", self.isolation, started)

    @abc.abstractmethod
    def _execute(self, request: ExecRequest, limits: Limits) -> ExecResult:
        """Run `request` under `limits`; return a result for anything the code does."""

    def describe(self) -> dict[str, Any]:
        """The resolved configuration, for run logs."""
        return {"backend": type(self).__name__, "isolation": self.isolation.value, "python": self.python,
                "limits": self.limits.to_dict()}

    def close(self) -> None:
        pass

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
