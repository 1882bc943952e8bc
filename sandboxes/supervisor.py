"""In-sandbox supervisor: run one command under hard limits and report what happened as JSON.

This file runs *inside* every sandbox (bubblewrap, Docker, and the plain fallback) as
`python3 -I -c <this source>`, so it uses the standard library only and runs on Python >= 3.8.
It is never imported by the host except to read its source (`sandboxes.protocol`).

Protocol: one JSON request on stdin (argv, files in base64, env, limits, collect patterns, nonce);
one line on stdout, `<nonce> <JSON result>`. The untrusted command never sees the supervisor's
stdin or stdout: it gets fresh pipes, and the supervisor marks itself non-dumpable, so
/proc/<supervisor>/fd is closed to it.

Why a supervisor inside the sandbox rather than supervising from the host: Docker's root is
read-only and the work dir is a tmpfs that `docker cp` cannot write, so files have to travel
through a process inside anyway; running the same code for every backend means a stop reason
means the same thing everywhere.

What it does:
- writes the files into the work dir and starts the command in a new session with rlimits (CPU,
  address space, file size, open files, no core dumps, and processes where the host asks for it);
- reads stdout/stderr, keeping at most `output_bytes` of each; one byte more kills the run;
- kills the run at the wall-clock deadline;
- when the main process ends, kills everything it left behind: as PID 1 of a PID namespace
  (bubblewrap --as-pid-1, Docker) with kill(-1); otherwise as a child subreaper, by killing its
  process group and every orphan re-parented to the supervisor;
- hands back the files matching the collect patterns without following symlinks (a symlink, a
  hard link, a FIFO or a device is skipped and named in `files_skipped`);
- reports rusage of everything it reaped (CPU seconds, max RSS) and the wall time.
"""
import binascii
import json
import os
import resource
import select
import signal
import stat
import sys
import time

# Imports are kept to what every run needs (no subprocess, no threading, no base64/re beyond
# json's): the supervisor's start-up is part of every run's latency.

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
MEMORY_MARKERS = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"out of memory")
WALK_LIMIT = 10000  # directory entries examined when collecting files


def _prctl(option, value):
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)
    except Exception:
        pass


def _raise_oom_score():
    # The kernel's OOM killer should pick the sandbox before anything on the host.
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


def _oom_kills():
    """OOM kills recorded for our cgroup (Docker: v2 memory.events, v1 memory.oom_control)."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    key, _, val = line.partition(" ")
                    if key == "oom_kill":
                        return int(val)
        except (OSError, ValueError):
            continue
    return 0


def _set_limit(res, soft, hard=None):
    hard = soft if hard is None else hard
    _, cur_hard = resource.getrlimit(res)
    if cur_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, cur_hard), min(hard, cur_hard)
    resource.setrlimit(res, (soft, hard))


def _apply_limits(limits):
    cpu = max(1, int(limits["cpu_seconds"] + 0.999))
    _set_limit(resource.RLIMIT_CPU, cpu, cpu + 1)
    _set_limit(resource.RLIMIT_AS, limits["memory_bytes"])
    _set_limit(resource.RLIMIT_FSIZE, limits["file_bytes"])
    _set_limit(resource.RLIMIT_NOFILE, limits["open_files"])
    _set_limit(resource.RLIMIT_CORE, 0)
    if limits.get("nproc"):
        _set_limit(resource.RLIMIT_NPROC, limits["nproc"])


def _spawn(argv, env, cwd, limits, fds):
    """fork + exec `argv` in a new session with `fds` as its stdin/stdout/stderr and the rlimits
    applied; raises OSError (with the child's errno) if the exec fails."""
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the child: only async-signal-safe-enough work until exec
        try:
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            os.closerange(3, err_w)
            os.closerange(err_w + 1, 1 << 16)
            os.chdir(cwd)
            # Python ignores SIGPIPE and SIGXFSZ and an exec keeps ignored signals ignored.
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGXCPU):
                signal.signal(sig, signal.SIG_DFL)
            _apply_limits(limits)
            os.execvpe(argv[0], argv, env)
        except BaseException as e:
            msg = "%d:%s" % (getattr(e, "errno", 0) or 0, getattr(e, "strerror", None) or e)
            os.write(err_w, msg.encode("utf-8", "replace")[:500])
        finally:
            os._exit(127)
    os.close(err_w)
    data = os.read(err_r, 512)
    os.close(err_r)
    if data:
        os.waitpid(pid, 0)
        code, _, msg = data.decode("utf-8", "replace").partition(":")
        raise OSError(int(code or 0), msg)
    return pid


def _write_files(workdir, files):
    for rel, b64 in files.items():
        path = os.path.join(workdir, rel)
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as f:
            f.write(binascii.a2b_base64(b64))


def _children_of(pid):
    """PIDs whose parent is `pid` (orphans re-parented to us as subreaper included)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                data = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces: parse after the last ')'.
        fields = data[data.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(name))
    return out


def _kill_everything(main_pid, budget=3.0):
    """Kill every process we started, directly or not, and reap them. Returns main's wait4."""
    if os.getpid() == 1:
        # PID 1 of a namespace: kill(-1) reaches every other process in it.
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    else:
        for kill in (os.killpg, os.kill):
            try:
                kill(main_pid, signal.SIGKILL)
            except OSError:
                pass
    main_status = os.wait4(main_pid, 0)
    deadline = time.monotonic() + budget
    me = os.getpid()
    while time.monotonic() < deadline:
        if os.getpid() == 1:
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        else:
            for pid in _children_of(me):
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        try:
            while True:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
        except ChildProcessError:
            break
        time.sleep(0.005)
    return main_status


def _exited(pid):
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _collect(workdir, patterns, max_file, max_total):
    files, skipped, total, seen = {}, {}, 0, 0
    if not patterns:
        return files, skipped
    import fnmatch
    for dirpath, dirnames, filenames in os.walk(workdir, followlinks=False):
        rel_dir = os.path.relpath(dirpath, workdir)
        for name in sorted(filenames + dirnames):
            seen += 1
            if seen > WALK_LIMIT:
                skipped["..."] = "more than %d entries in the work dir; stopped looking" % WALK_LIMIT
                return files, skipped
            rel = name if rel_dir == "." else rel_dir + "/" + name
            if not any(fnmatch.fnmatchcase(rel, p) for p in patterns):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError as e:
                skipped[rel] = "cannot stat: %s" % e.strerror
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            if stat.S_ISLNK(st.st_mode):
                skipped[rel] = "symlink (never followed)"
                continue
            if not stat.S_ISREG(st.st_mode):
                skipped[rel] = "not a regular file"
                continue
            if st.st_nlink != 1:
                skipped[rel] = "hard link (never followed)"
                continue
            if st.st_size > max_file:
                skipped[rel] = "larger than file_bytes=%d" % max_file
                continue
            if total + st.st_size > max_total:
                skipped[rel] = "collect_bytes=%d exhausted" % max_total
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:
                skipped[rel] = "cannot open: %s" % e.strerror
                continue
            try:
                st2 = os.fstat(fd)
                if not stat.S_ISREG(st2.st_mode) or (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
                    skipped[rel] = "changed while collecting"
                    continue
                chunks, got = [], 0
                while got <= max_file:
                    chunk = os.read(fd, min(1 << 20, max_file + 1 - got))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
                if got > max_file or total + got > max_total:
                    skipped[rel] = "grew past its limit while collecting"
                    continue
                files[rel] = _b64(b"".join(chunks))
                total += got
            finally:
                os.close(fd)
    return files, skipped


def _b64(data):
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _read_into(fd, buf, cap):
    """Read what is ready on `fd` into `buf`, keeping at most `cap` bytes.
    Returns (eof, overflowed)."""
    chunk = os.read(fd, 1 << 16)
    if not chunk:
        return True, False
    room = cap - len(buf)
    if len(chunk) > room:
        buf += chunk[:max(room, 0)]
        return False, True
    buf += chunk
    return False, False


def run(req):
    limits = req["limits"]
    workdir = req["workdir"]
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _raise_oom_score()
    _write_files(workdir, req["files"])
    stdin_data = binascii.a2b_base64(req.get("stdin") or "")
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    oom_before = _oom_kills()
    t0 = time.monotonic()
    try:
        pid = _spawn(req["argv"], req["env"], workdir, limits, (in_r, out_w, err_w))
    except OSError as e:
        return {"reason": "error", "exit_code": None,
                "detail": "cannot execute %r: %s" % (req["argv"][0], e.strerror or e),
                "usage": {"wall_seconds": time.monotonic() - t0}}
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    os.set_blocking(in_w, False)
    pending = memoryview(stdin_data)
    if not pending:
        os.close(in_w)
        in_w = None

    cap = limits["output_bytes"]
    bufs = {out_r: bytearray(), err_r: bytearray()}
    over = {out_r: False, err_r: False}
    open_fds = {out_r, err_r}
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    deadline = t0 + limits["wall_seconds"]
    reason, detail = None, ""
    exited = False
    while True:
        now = time.monotonic()
        if now >= deadline:
            reason, detail = "timeout", "wall-clock limit of %gs" % limits["wall_seconds"]
            break
        watch = list(open_fds) + ([pidfd] if pidfd is not None else [])
        wait = deadline - now if pidfd is not None else min(deadline - now, 0.01)
        ready, writable, _ = select.select(watch, [in_w] if in_w is not None else [], [], wait)
        if writable:
            try:
                n = os.write(in_w, pending[:1 << 16])
                pending = pending[n:]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:  # the command closed its stdin
                pending = pending[:0]
            if not pending:
                os.close(in_w)
                in_w = None
        for fd in ready:
            if fd == pidfd:
                exited = True
            elif fd in open_fds:
                eof, overflow = _read_into(fd, bufs[fd], cap)
                if eof:
                    open_fds.discard(fd)
                over[fd] = over[fd] or overflow
        if over[out_r] or over[err_r]:
            reason, detail = "output_cap", "%s passed output_bytes=%d" % ("stdout" if over[out_r] else "stderr", cap)
            break
        if exited or (pidfd is None and _exited(pid)):
            break
    wall = time.monotonic() - t0
    if in_w is not None:
        os.close(in_w)

    # The main process is done (or we are stopping it): stop everything, then read what is left.
    _, status, main_usage = _kill_everything(pid)
    drain_until = time.monotonic() + 1.0
    while open_fds and time.monotonic() < drain_until:
        ready, _, _ = select.select(list(open_fds), [], [], max(0.0, drain_until - time.monotonic()))
        for fd in ready:
            eof, overflow = _read_into(fd, bufs[fd], cap)
            if eof:
                open_fds.discard(fd)
            over[fd] = over[fd] or overflow
        if (over[out_r] or over[err_r]) and reason is None:
            reason, detail = "output_cap", "%s passed output_bytes=%d" % ("stdout" if over[out_r] else "stderr", cap)
    for fd in [out_r, err_r] + ([pidfd] if pidfd is not None else []):
        os.close(fd)

    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    code = -sig if sig is not None else os.WEXITSTATUS(status)
    main_cpu = main_usage.ru_utime + main_usage.ru_stime
    if reason is None:
        tail = bytes(bufs[err_r][-4096:])
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and main_cpu >= limits["cpu_seconds"] - 0.05):
            reason, detail = "timeout", "CPU-time limit of %gs" % limits["cpu_seconds"]
        elif _oom_kills() > oom_before or (code != 0 and any(m in tail for m in MEMORY_MARKERS)):
            reason, detail = "memory", "memory limit of %d bytes" % limits["memory_bytes"]
        elif sig is not None:
            reason = "killed"
            try:
                detail = "signal %s" % signal.Signals(sig).name
            except ValueError:
                detail = "signal %d" % sig
        else:
            reason = "exit"
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    files, skipped = _collect(workdir, req.get("collect") or [], limits["file_bytes"], limits["collect_bytes"])
    return {
        "reason": reason,
        "exit_code": code,
        "detail": detail,
        "stdout": _b64(bytes(bufs[out_r])),
        "stderr": _b64(bytes(bufs[err_r])),
        "stdout_truncated": over[out_r],
        "stderr_truncated": over[err_r],
        "files": files,
        "files_skipped": skipped,
        "usage": {
            "wall_seconds": wall,
            "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "max_rss_bytes": usage.ru_maxrss * 1024,
        },
    }


def main():
    req = json.loads(sys.stdin.buffer.read())
    try:
        res = run(req)
    except Exception as e:  # the boundary: a supervisor failure becomes a result, not silence
        res = {"reason": "error", "exit_code": None, "detail": "supervisor failed: %r" % (e,)}
    line = ("\n%s " % req["nonce"]).encode("ascii") + json.dumps(res).encode("ascii") + b"\n"
    out = sys.stdout.buffer
    out.write(line)
    out.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
