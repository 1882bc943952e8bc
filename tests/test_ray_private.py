"""The private head's own files under umask 000: Ray's sockets and job logs out of every other uid's reach.

Ray makes its session folder 0777 and creates its unix sockets and logs under the process umask;
one of those sockets (`sockets/dash_JobHead`) is an HTTP server of the Jobs API that does not ask for
the token. `start_head` therefore puts Ray's whole temp dir inside a 0700 folder. Here a head is
started under umask 000, a job writes a log line, and a program run as another uid (a bare
subprocess with uid 65533) and the plain sandbox (`sandbox: unsafe_plain`, uid 65534) try every
socket the head created, an HTTP submit over each, and every log file. Nothing may connect or be
read, and every unix socket the head's processes listen on lies inside the private folder (or, for
Python's multiprocessing listeners, in a 0700 folder of its own).
"""
from __future__ import annotations

import json
import os
import pathlib
import stat
import subprocess
import time

import psutil
import pytest

from sandboxes.local import LocalSandbox, default_python
from sandboxes import Limits
from trainer.launch import _head_processes, start_head, stop_head

pytestmark = pytest.mark.ray

ATTACK = r"""
import json, os, socket, sys
socks, files = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {"uid": os.getuid(), "sockets": {}, "files": {}}
body = json.dumps({"entrypoint": "id > /tmp/pwned"}).encode()
for path in socks:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect(path)
    except OSError as e:
        out["sockets"][path] = type(e).__name__
        continue
    try:
        s.sendall(b"POST /api/jobs/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        out["sockets"][path] = "CONNECTED " + s.recv(200).decode("latin-1").split("\r\n")[0]
    except OSError as e:
        out["sockets"][path] = "CONNECTED " + type(e).__name__
    finally:
        s.close()
for path in files:
    try:
        with open(path, "rb") as f:
            out["files"][path] = "READ %r" % f.read(60)
    except OSError as e:
        out["files"][path] = type(e).__name__
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def open_head():
    """A head started, and a job run, under umask 000."""
    old = os.umask(0)
    try:
        h = start_head(num_cpus=1)
        try:
            client = h.client()
            job = client.submit_job(entrypoint="echo the-job-log-line", runtime_env={"env_vars": h.auth_env()})
            deadline = time.time() + 120
            while str(client.get_job_status(job).value) not in ("SUCCEEDED", "FAILED", "STOPPED"):
                assert time.time() < deadline, "the job did not finish"
                time.sleep(0.5)
        except BaseException:
            stop_head(h)
            raise
    finally:
        os.umask(old)
    yield h
    stop_head(h)


def _targets(head) -> tuple[list[str], list[str]]:
    root = pathlib.Path(head.temp_dir)
    socks, logs = [], []
    for p in root.rglob("*"):
        try:
            mode = p.lstat().st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(mode):
            socks.append(str(p))
        elif stat.S_ISREG(mode) and p.parent.name == "logs" and p.name.startswith("job-driver"):
            logs.append(str(p))
    return socks, logs


def _check(got: dict) -> None:
    assert not [p for p, v in got["sockets"].items() if v.startswith("CONNECTED")], got
    assert not [p for p, v in got["files"].items() if v.startswith("READ")], got


def test_the_premise_ray_left_its_files_open_inside(open_head):
    """What the 0700 folder has to protect: under umask 000 Ray's own files are open to everyone."""
    socks, logs = _targets(open_head)
    assert any(p.endswith("dash_JobHead") for p in socks), socks
    assert logs and "the-job-log-line" in pathlib.Path(logs[0]).read_text()
    assert any(stat.S_IMODE(os.stat(p).st_mode) & 0o007 for p in socks + logs)   # world-accessible modes
    home = pathlib.Path(open_head.temp_dir).parent
    assert stat.S_IMODE(home.stat().st_mode) == 0o700 and home.stat().st_uid == os.geteuid()


def test_every_unix_socket_of_the_head_is_inside_its_private_folder(open_head):
    home = str(pathlib.Path(open_head.temp_dir).parent) + os.sep
    paths = set()
    for p in _head_processes(open_head):
        try:
            paths |= {c.laddr for c in p.net_connections(kind="unix") if isinstance(c.laddr, str) and c.laddr}
        except psutil.Error:
            pass
    named = {p for p in paths if not p.startswith("\0") and not p.startswith("@")}
    assert any(p.startswith(home) for p in named), "the head listens on no named unix socket: nothing was checked"
    # elsewhere only in a folder no other uid can enter (multiprocessing's own listeners: mkdtemp, 0700)
    for p in sorted(x for x in named if not x.startswith(home)):
        st = os.stat(os.path.dirname(p))
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0, (p, oct(st.st_mode))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run a program as another uid")
def test_another_uid_reaches_neither_the_sockets_nor_the_logs(open_head):
    socks, logs = _targets(open_head)
    proc = subprocess.run([default_python(), "-I", "-S", "-c", ATTACK, json.dumps(socks), json.dumps(logs)],
                          capture_output=True, text=True, timeout=60, user=65533, group=65533, extra_groups=[],
                          cwd="/")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["uid"] == 65533
    _check(got)
    assert len(open_head.client().list_jobs()) == 1


def test_the_plain_sandbox_reaches_neither_the_sockets_nor_the_logs(open_head):
    socks, logs = _targets(open_head)
    sb = LocalSandbox(isolation="plain")
    res = sb.run_python(ATTACK, args=[json.dumps(socks), json.dumps(logs)], limits=Limits(wall_seconds=60))
    assert res.ok, res
    got = json.loads(res.stdout_text.strip().splitlines()[-1])
    if os.geteuid() == 0:
        assert got["uid"] == 65534
        _check(got)
    else:   # the plain sandbox runs as this user: only the token stands; the socket must still refuse a job
        for v in got["sockets"].values():
            assert "200" not in v, got
    assert len(open_head.client().list_jobs()) == 1
