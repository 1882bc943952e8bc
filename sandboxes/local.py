"""Local backend: bubblewrap where it works, else util-linux `unshare` namespaces; a plain
subprocess with rlimits only where the caller opts in, with a loud warning.

With bubblewrap (`Isolation.BWRAP`) each run gets new user, PID, network, IPC, UTS and cgroup
namespaces; a root made of read-only binds of /usr (and the /bin, /lib... links), a few files of
/etc the dynamic linker and Python need, nothing else of the host (no /home, /root, /work, /var);
a private tmpfs /tmp and a tmpfs work dir /work of `disk_bytes` each; no network but a loopback
of its own; `--die-with-parent`, `--new-session`, and the supervisor as PID 1, so when it exits the
kernel kills whatever the code left behind. When the host runs as root, bubblewrap itself is
started as an unprivileged uid (65534 by default): the kernel ignores RLIMIT_NPROC for root, and
an unprivileged uid cannot read root's files even if a path to them leaked in. RLIMIT_NPROC is set
inside the new user namespace, so it counts this run's processes only.

Without bubblewrap, `Isolation.UNSHARE` builds the same kind of sandbox from util-linux
(`unshare`, `mount`, `pivot_root`, `setpriv`; see `sandboxes/unshare.py`): new user, mount,
network, PID, IPC, UTS and cgroup namespaces, a fresh uid mapping, a minimal read-only root, no
network, every capability dropped. As with bubblewrap, a root host starts it as the unprivileged uid.

`isolation="auto"` tries bubblewrap, then unshare; when neither works it raises
`SandboxUnavailable` naming both reasons, unless plain is allowed (`allow_plain=True`, or the
process opted in through `sandboxes.base.PLAIN_OPT_IN_ENV`, which a goal's `sandbox: unsafe_plain`
sets). The plain subprocess (`Isolation.PLAIN`) runs the supervisor in a host temp dir with
rlimits, as the unprivileged uid when the host is root. Files, network and other processes of that
uid are NOT isolated; every result carries `warning`, and constructing the sandbox logs it.
RLIMIT_NPROC there counts all processes of the uid, so it is set to `pids` plus what the uid
already runs.

Limits not enforced here (use Docker for them): `cpus` (CPU share), and memory in aggregate —
`memory_bytes` is per process (RLIMIT_AS), so a run can hold up to `pids * memory_bytes`.

    from sandboxes.local import LocalSandbox
    sb = LocalSandbox(isolation="auto")        # "bwrap" | "unshare" (required) | "plain" (forced) | "auto"
    sb.run_python("print('hi')").stdout         # b"hi\\n"
"""
from __future__ import annotations

import functools
import glob
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Literal

from sandboxes import unshare as ns
from sandboxes.base import (
    PLAIN_OPT_IN_ENV, ExecRequest, ExecResult, Isolation, Limits, ResourceUsage, Sandbox, SandboxUnavailable,
    StopReason, error_result, plain_opted_in,
)
from sandboxes.protocol import SUPERVISOR_SOURCE, encode_request, find_result, max_result_bytes, new_nonce, to_result

log = logging.getLogger(__name__)

LocalIsolation = Literal["auto", "bwrap", "unshare", "plain"]
ISOLATIONS = ("auto", "bwrap", "unshare", "plain")
PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
ETC_BINDS = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")
HOST_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
PLAIN_WARNING = (
    "REDUCED ISOLATION: plain subprocess with rlimits only (no bubblewrap); the code shares the "
    "host's filesystem, network and process table with the sandbox uid"
)
OPT_IN_HINT = (f"untrusted code is not run unisolated unless the goal opts in with `sandbox: unsafe_plain` "
               f"({PLAIN_OPT_IN_ENV}=unsafe_plain); install bubblewrap (scripts/ci_sandbox.sh does, as root) "
               f"or allow unprivileged user namespaces")

_probe_cache: dict[tuple, tuple[bool, str]] = {}
_probe_lock = threading.Lock()


def default_python() -> str:
    """A system interpreter the unprivileged sandbox uid can run (a venv or pyenv Python under
    /root is not reachable by it); the code gets the standard library only."""
    for cand in PYTHON_CANDIDATES:
        if os.access(cand, os.X_OK):
            return cand
    return shutil.which("python3") or sys.executable


def _root_binds(python: str) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for p in (*ETC_BINDS, *sorted(glob.glob("/etc/python3*"))):
        if os.path.exists(p):
            args += ["--ro-bind", p, p]
    real = os.path.realpath(python)
    if not real.startswith(("/usr/", "/bin/", "/lib")):
        # An interpreter installed elsewhere: expose its prefix, read-only, and nothing around it.
        prefix = os.path.dirname(os.path.dirname(real))
        args += ["--ro-bind", prefix, prefix]
    return args


@functools.lru_cache(maxsize=None)
def _bwrap_options(bwrap: str) -> frozenset[str]:
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(w for w in text.split() if w.startswith("--"))


def _count_procs(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                n += os.stat(f"/proc/{name}").st_uid == uid
            except OSError:
                pass
    return n


def _communicate(proc: subprocess.Popen, data: bytes, timeout: float, max_out: int,
                 max_err: int = 1 << 16) -> tuple[bytes, bytes, bool, bool]:
    """Feed `data`, read stdout/stderr up to their caps until EOF or `timeout`.
    Returns (stdout, stderr, timed_out, overflowed)."""

    def feed() -> None:
        try:
            proc.stdin.write(data)
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass

    threading.Thread(target=feed, daemon=True).start()
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    caps = {proc.stdout.fileno(): max_out, proc.stderr.fileno(): max_err}
    deadline = time.monotonic() + timeout
    timed_out = overflow = False
    with selectors.DefaultSelector() as sel:
        for f in (proc.stdout, proc.stderr):
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map() and not (timed_out or overflow):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(remaining):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                if len(bufs[key.fd]) + len(chunk) > caps[key.fd]:
                    overflow = True
                    break
                bufs[key.fd] += chunk
    if not (timed_out or overflow):
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), timed_out, overflow


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        log.error("sandbox process %d did not die after SIGKILL", proc.pid)
    for f in (proc.stdin, proc.stdout, proc.stderr):
        try:
            f.close()
        except (OSError, ValueError):
            pass


class LocalSandbox(Sandbox):
    """Runs on this machine; see the module docstring for what `bwrap` and `plain` isolate.

    `uid`/`gid`: the unprivileged identity the sandbox runs as when the host is root (ignored
    otherwise: an unprivileged host runs it as itself, in a user namespace of its own).
    `allow_plain`: whether `isolation="auto"` may end on the plain subprocess when neither
    bubblewrap nor unshare works (None: the process's opt-in, `PLAIN_OPT_IN_ENV`); if not, it
    raises `SandboxUnavailable` saying what was tried and why it failed.
    `host_grace_seconds`: time beyond `wall_seconds` the host waits for the supervisor's report
    before killing the whole sandbox itself."""

    def __init__(self, limits: Limits | None = None, *, isolation: LocalIsolation = "auto",
                 python: str | None = None, uid: int = 65534, gid: int = 65534, bwrap: str = "bwrap",
                 unshare: str = "unshare", allow_plain: bool | None = None,
                 host_grace_seconds: float = 5.0) -> None:
        super().__init__(limits)
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation={isolation!r} must be one of {', '.join(ISOLATIONS)}")
        if host_grace_seconds <= 0:
            raise ValueError(f"host_grace_seconds={host_grace_seconds!r} must be > 0")
        self.python = python or default_python()
        self.uid, self.gid = uid, gid
        self.as_root = os.geteuid() == 0
        self.host_grace_seconds = host_grace_seconds
        self.bwrap = shutil.which(bwrap) or bwrap
        self.unshare = shutil.which(unshare) or unshare
        self.requested = isolation
        self.warning: str | None = None
        self.isolation: Isolation  # type: ignore[misc]
        if isolation == "plain":
            self.isolation, self.warning = Isolation.PLAIN, PLAIN_WARNING + " (isolation='plain' requested)"
        else:
            tried: list[str] = []
            for kind, probe in (("bwrap", self._probe), ("unshare", self._probe_unshare)):
                if isolation not in ("auto", kind):
                    continue
                ok, why = probe()
                if ok:
                    self.isolation = Isolation(kind)
                    break
                if isolation == kind:
                    raise SandboxUnavailable(f"{kind} does not work here: {why}")
                tried.append(f"{kind}: {why}")
            else:
                if not (plain_opted_in() if allow_plain is None else allow_plain):
                    raise SandboxUnavailable(f"no isolating sandbox works here ({'; '.join(tried)}); {OPT_IN_HINT}")
                self.isolation = Isolation.PLAIN
                self.warning = f"{PLAIN_WARNING} (opted in; {'; '.join(tried)})"
        if self.warning:
            log.warning("sandboxes.local: %s", self.warning)
        self._binds = _root_binds(self.python) if self.isolation is Isolation.BWRAP else []
        self._paths = ns.root_paths(self.python) if self.isolation is Isolation.UNSHARE else []

    # ----------------------------------------------------------------- helpers
    def _popen_kw(self) -> dict:
        kw = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(HOST_ENV),
                  start_new_session=True, close_fds=True, cwd="/")
        if self.as_root:
            kw.update(user=self.uid, group=self.gid, extra_groups=[])
        return kw

    def _bwrap_argv(self, limits: Limits, binds: list[str]) -> list[str]:
        # Older bubblewraps lack --size (0.9-ish) and --disable-userns (0.8): use what this one has.
        opts = _bwrap_options(self.bwrap)
        size = ["--size", str(limits.disk_bytes)] if "--size" in opts else []
        no_userns = ["--disable-userns"] if "--disable-userns" in opts else []
        return [
            self.bwrap, "--unshare-all", "--unshare-user", *no_userns, "--die-with-parent",
            "--new-session", "--as-pid-1", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
            *binds, "--dev", "/dev", "--proc", "/proc",
            *size, "--tmpfs", "/tmp", *size, "--tmpfs", "/work", "--chdir", "/work",
            "--remount-ro", "/",  # bubblewrap's own root tmpfs: read-only once the mount points exist
            "--",
        ]

    def _probe(self) -> tuple[bool, str]:
        key = (self.bwrap, self.python, self.uid, self.gid, self.as_root)
        with _probe_lock:
            if key in _probe_cache:
                return _probe_cache[key]
            if not os.path.exists(self.bwrap):
                result = (False, f"{self.bwrap!r} not found (Debian package: bubblewrap)")
            else:
                argv = self._bwrap_argv(Limits(), _root_binds(self.python)) + [self.python, "-I", "-c", "pass"]
                try:
                    p = subprocess.run(argv, capture_output=True, timeout=20,
                                       **{k: v for k, v in self._popen_kw().items()
                                          if k not in ("stdin", "stdout", "stderr")})
                    err = p.stderr.decode("utf-8", "replace").strip()
                    result = (p.returncode == 0, err or f"exit status {p.returncode}")
                except (OSError, subprocess.SubprocessError) as e:
                    result = (False, f"{type(e).__name__}: {e}")
            _probe_cache[key] = result
            return result

    def _probe_unshare(self) -> tuple[bool, str]:
        key = ("unshare", self.unshare, self.python, self.uid, self.gid, self.as_root)
        with _probe_lock:
            if key in _probe_cache:
                return _probe_cache[key]
            missing = ns.missing_tools(self.unshare)
            if missing:
                result = (False, f"{', '.join(missing)} not found (Debian package: util-linux)")
            else:
                argv = ns.unshare_argv(self.unshare, 1 << 20, ns.root_paths(self.python)) + [self.python, "-I", "-c", "pass"]
                try:
                    p = subprocess.run(argv, capture_output=True, timeout=20,
                                       **{k: v for k, v in self._popen_kw().items()
                                          if k not in ("stdin", "stdout", "stderr")})
                    err = p.stderr.decode("utf-8", "replace").strip()
                    result = (p.returncode == 0, err[-500:] or f"exit status {p.returncode}")
                except (OSError, subprocess.SubprocessError) as e:
                    result = (False, f"{type(e).__name__}: {e}")
            _probe_cache[key] = result
            return result

    # ----------------------------------------------------------------- running
    def _execute(self, request: ExecRequest, limits: Limits) -> ExecResult:
        started = time.monotonic()
        nonce = new_nonce()
        tmp = None
        try:
            if self.isolation is Isolation.BWRAP:
                workdir, nproc = "/work", limits.pids
                argv = self._bwrap_argv(limits, self._binds)
            elif self.isolation is Isolation.UNSHARE:  # RLIMIT_NPROC counts the new user namespace's processes
                workdir, nproc = "/work", limits.pids
                argv = ns.unshare_argv(self.unshare, limits.disk_bytes, self._paths)
            else:
                tmp = tempfile.mkdtemp(prefix="swarm-sandbox-")
                os.chmod(tmp, 0o700)
                if self.as_root:
                    os.chown(tmp, self.uid, self.gid)
                workdir, argv = tmp, []
                nproc = limits.pids + _count_procs(self.uid if self.as_root else os.getuid())
            argv = argv + [self.python, "-I", "-S", "-c", SUPERVISOR_SOURCE]
            payload = encode_request(request, limits, workdir=workdir, nonce=nonce, nproc=nproc)
            try:
                proc = subprocess.Popen(argv, **self._popen_kw())
            except OSError as e:
                return error_result(f"cannot start the sandbox: {e}", self.isolation, started, self.warning)
            try:
                out, err, timed_out, overflow = _communicate(
                    proc, payload, limits.wall_seconds + self.host_grace_seconds, max_result_bytes(limits))
            finally:
                _kill_group(proc)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        host_wall = time.monotonic() - started
        result = find_result(out, nonce)
        if result is not None:
            return to_result(result, self.isolation, self.warning, host_wall)
        if timed_out:
            return ExecResult(StopReason.TIMEOUT, None, usage=ResourceUsage(host_wall), isolation=self.isolation,
                              warning=self.warning,
                              detail="no report within wall_seconds + host grace; the host killed the sandbox")
        why = "result larger than its bound" if overflow else f"exit status {proc.returncode}"
        tail = err.decode("utf-8", "replace").strip()[-500:]
        return error_result(f"sandbox ended without a result ({why}): {tail}", self.isolation, started, self.warning)

    def describe(self) -> dict:
        d = super().describe()
        d.update(requested=self.requested, uid=self.uid if self.as_root else os.getuid(), warning=self.warning)
        if self.isolation is Isolation.BWRAP:
            d["tmpfs_sized"] = "--size" in _bwrap_options(self.bwrap)
        return d
