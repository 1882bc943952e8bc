"""Every backend that can run here, for real: the basics, then hostile programs.

Backends: `bwrap` (LocalSandbox with bubblewrap), `unshare` (LocalSandbox with util-linux
namespaces: it works wherever unprivileged user namespaces do, so it runs in the default suite on
a machine with neither bubblewrap nor Docker), `plain` (the rlimit-only fallback, forced) and
`docker` (marker `docker`; skipped only when no engine answers, with the engine's error as the
reason; a missing base image is built). Hostile inputs are each run against every backend that
can contain them; the plain fallback does not isolate network or filesystem by design (its results
carry a warning), and those tests say so in their skip reason.

After each hostile run we check the host: no process carrying the run's marker is left, the host
can still start processes, and nothing appeared outside the temp dirs.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from sandboxes import ExecRequest, Isolation, Limits, SandboxPool, SandboxUnavailable, StopReason
from sandboxes.local import LocalSandbox

FAST = Limits(wall_seconds=2.0, cpu_seconds=2.0)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def docker_sandbox():
    from sandboxes.docker_backend import DockerSandbox, docker_status
    from sandboxes.image import DEFAULT_IMAGE, build_base_image, find_image

    ok, why = docker_status(image=None)
    if not ok:
        pytest.skip(f"docker: {why}")
    if find_image(DEFAULT_IMAGE) is None:
        build_base_image(DEFAULT_IMAGE)  # an engine but no image: build it (errors fail the test)
    sb = DockerSandbox()
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def bwrap_sandbox():
    try:
        return LocalSandbox(isolation="bwrap")
    except SandboxUnavailable as e:
        pytest.skip(f"bwrap: {e}")


@pytest.fixture(scope="module")
def unshare_sandbox():
    try:
        return LocalSandbox(isolation="unshare")
    except SandboxUnavailable as e:
        pytest.skip(f"unshare: {e}")


@pytest.fixture(scope="module")
def plain_sandbox():
    return LocalSandbox(isolation="plain")


BACKENDS = ["bwrap", "unshare", "plain", pytest.param("docker", marks=pytest.mark.docker)]
PLAIN_SKIP = pytest.mark.skip(
    reason="plain fallback: no network or filesystem isolation by design (its results carry `warning`)")
ISOLATING = ["bwrap", "unshare", pytest.param("plain", marks=PLAIN_SKIP),
             pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(params=BACKENDS)
def sb(request):
    return request.getfixturevalue(f"{request.param}_sandbox")


@pytest.fixture(params=ISOLATING)
def isolating_sb(request):
    return request.getfixturevalue(f"{request.param}_sandbox")


@pytest.fixture
def marker():
    return f"swarm-marker-{uuid.uuid4().hex}"


def procs_with(marker: str) -> list[int]:
    """Live (non-zombie) processes on the host whose command line holds `marker`."""
    found = []
    needle = marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def assert_no_leftovers(marker: str, wait: float = 3.0) -> None:
    deadline = time.monotonic() + wait
    while procs_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs_with(marker) == [], f"processes left behind: {procs_with(marker)}"


def assert_host_works() -> None:
    r = subprocess.run(["true"], timeout=10)
    assert r.returncode == 0


# --------------------------------------------------------------------------- basics


def test_hello_with_files_in_and_out(sb):
    code = (
        "import pathlib, sys\n"
        "data = pathlib.Path('data/in.txt').read_text()\n"
        "pathlib.Path('out').mkdir()\n"
        "pathlib.Path('out/result.txt').write_text(data.upper())\n"
        "pathlib.Path('scratch.bin').write_bytes(b'\\0' * 10)\n"
        "print('hello', sys.argv[1:]); print('warn', file=sys.stderr)\n"
    )
    res = sb.run_python(code, files={"data/in.txt": "abc"}, args=["x", "y"], collect=["out/*"], limits=FAST)
    assert res.ok, res
    assert res.stdout == b"hello ['x', 'y']\n" and res.stderr == b"warn\n"
    assert res.files == {"out/result.txt": b"ABC"}
    assert res.isolation is sb.isolation
    assert res.usage.wall_seconds > 0 and res.usage.cpu_seconds is not None and res.usage.max_rss_bytes > 1 << 20
    assert (res.warning is not None) == (sb.isolation is Isolation.PLAIN)


def test_exit_status_stdin_and_errors(sb):
    res = sb.run(["sh", "-c", "cat; exit 3"], stdin=b"piped", limits=FAST)
    assert (res.reason, res.exit_code, res.stdout) == (StopReason.EXIT, 3, b"piped")
    big = os.urandom(300_000)
    res = sb.run(["sh", "-c", "wc -c"], stdin=big, limits=FAST)
    assert res.ok and res.stdout.strip() == b"300000"
    res = sb.run_python("raise SystemExit('bad input')", limits=FAST)
    assert res.reason is StopReason.EXIT and res.exit_code == 1 and b"bad input" in res.stderr
    res = sb.run_python("def f(:\n  pass", limits=FAST)
    assert res.reason is StopReason.EXIT and b"SyntaxError" in res.stderr
    res = sb.run(["no-such-command-here"], limits=FAST)
    assert res.reason is StopReason.ERROR and "no-such-command-here" in res.detail


def test_killed_by_a_signal_is_killed(sb):
    res = sb.run_python("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", limits=FAST)
    assert res.reason is StopReason.KILLED and res.exit_code == -11 and "SIGSEGV" in res.detail


def test_pool_runs_concurrently(sb):
    with SandboxPool(sb, workers=4) as pool:
        reqs = [sb.python_request(f"import time; time.sleep(0.6); print({i})", limits=FAST) for i in range(8)]
        results = pool.map(reqs)
        stats = pool.last_stats
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(8)]
    assert stats.executions == 8 and stats.reasons == {"exit": 8}
    assert stats.seconds < 8 * 0.6, f"no overlap: {stats.line()}"
    assert stats.throughput == pytest.approx(8 / stats.seconds)
    assert 0.6 <= stats.latency_p50 <= stats.latency_p95


# --------------------------------------------------------------------------- hostile input


def test_infinite_loop_hits_the_wall_clock(sb, marker):
    t0 = time.monotonic()
    res = sb.run_python("while True: pass", args=[marker], limits=Limits(wall_seconds=1.0, cpu_seconds=30))
    took = time.monotonic() - t0
    assert res.reason is StopReason.TIMEOUT and "wall-clock" in res.detail, res
    assert res.exit_code == -9 and took < 1.0 + 5
    assert_no_leftovers(marker)


def test_sleeping_forever_hits_the_wall_clock(sb):
    res = sb.run(["sleep", "1000"], limits=Limits(wall_seconds=0.5))
    assert res.reason is StopReason.TIMEOUT and res.usage.wall_seconds < 1.5


def test_cpu_limit(sb, marker):
    res = sb.run_python("while True: pass", args=[marker], limits=Limits(wall_seconds=20, cpu_seconds=1))
    assert res.reason is StopReason.TIMEOUT and "CPU-time" in res.detail, res
    assert 0.5 <= res.usage.cpu_seconds < 4 and res.usage.wall_seconds < 10  # rusage is tick-sampled
    assert_no_leftovers(marker)


def test_fork_bomb_is_contained_and_the_host_keeps_working(sb, marker):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    with SandboxPool(sb, workers=1) as pool:
        fut = pool.submit(sb.python_request(bomb, args=[marker], limits=Limits(wall_seconds=2.0, pids=16)))
        time.sleep(0.5)
        for _ in range(5):  # the host still starts processes while the bomb runs
            assert_host_works()
        res = fut.result(timeout=60)
    assert res.reason is StopReason.TIMEOUT, res
    assert_no_leftovers(marker)
    assert_host_works()
    assert sb.run_python("print('after')", limits=FAST).stdout == b"after\n"


def test_memory_bomb(sb, marker):
    lim = Limits(wall_seconds=5, memory_bytes=128 << 20)
    res = sb.run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(8 << 20))\n", args=[marker], limits=lim)
    assert res.reason is StopReason.MEMORY, res
    assert res.usage.max_rss_bytes < (128 + 64) << 20
    res = sb.run_python("x = bytearray(4 << 30)", limits=lim)
    assert res.reason is StopReason.MEMORY and b"MemoryError" in res.stderr
    assert_no_leftovers(marker)


def test_busy_children_left_behind_are_killed(sb, marker):
    code = (
        "import subprocess, sys\n"
        "for _ in range(3):\n"
        "    subprocess.Popen([sys.executable, '-c', 'while True: pass', sys.argv[1]], start_new_session=True,\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "subprocess.Popen(['sh', '-c', 'sleep 1000 & sleep 1000', sys.argv[1]])\n"
        "print('parent done')\n"
    )
    t0 = time.monotonic()
    res = sb.run_python(code, args=[marker], limits=Limits(wall_seconds=10))
    assert res.ok and res.stdout == b"parent done\n", res
    assert time.monotonic() - t0 < 8, "the run waited for its orphans instead of killing them"
    assert_no_leftovers(marker)


def test_gigabytes_of_output_are_capped(sb, marker):
    lim = Limits(wall_seconds=20, output_bytes=64 << 10)
    t0 = time.monotonic()
    res = sb.run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", args=[marker], limits=lim)
    assert res.reason is StopReason.OUTPUT_CAP and res.stdout_truncated and len(res.stdout) == 64 << 10
    res = sb.run(["sh", "-c", f"yes {marker} >&2"], limits=lim)
    assert res.reason is StopReason.OUTPUT_CAP and res.stderr_truncated and len(res.stderr) == 64 << 10
    assert time.monotonic() - t0 < 15
    assert_no_leftovers(marker)


def test_file_size_and_disk_limits(sb):
    lim = Limits(wall_seconds=5, file_bytes=1 << 20, disk_bytes=4 << 20)
    res = sb.run_python("open('big', 'wb').write(b'x' * (2 << 20))", limits=lim, collect=["big"])
    assert res.exit_code != 0 and b"File too large" in res.stderr
    assert len(res.files.get("big", b"")) <= 1 << 20
    # The plain fallback's work dir is not a sized tmpfs (nor is an old bubblewrap's, without --size).
    if sb.isolation is not Isolation.PLAIN and sb.describe().get("tmpfs_sized", True):
        fill = "for i in range(8):\n    open(f'f{i}', 'wb').write(b'x' * (900 << 10))\n"
        res = sb.run_python(fill, limits=lim)
        assert res.exit_code != 0 and b"No space left on device" in res.stderr


def test_symlink_escape_in_files_handed_back(sb, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-VALUE")
    code = (
        "import os, sys\n"
        "secret, secret_dir = sys.argv[1], sys.argv[2]\n"
        "os.symlink(secret, 'leak.txt')\n"
        "os.symlink(secret_dir, 'leakdir')\n"
        "os.symlink('/etc/passwd', 'passwd')\n"
        "os.mkdir('sub'); os.symlink('../leak.txt', 'sub/again.txt')\n"
        "os.mkfifo('fifo')\n"
        "try:\n    os.link('/etc/passwd', 'hard')\nexcept OSError as e:\n    print('link refused', e.errno)\n"
        "open('ok.txt', 'w').write('fine')\n"
    )
    res = sb.run_python(code, args=[str(secret), str(tmp_path)], collect=["*"], limits=FAST)
    assert res.ok, res
    assert res.files["ok.txt"] == b"fine"
    assert not any(b"TOP-SECRET" in v or b"root:" in v for v in res.files.values()), res.files
    assert set(res.files) <= {"ok.txt", "main.py"}
    for name in ("leak.txt", "leakdir", "passwd", "sub/again.txt"):
        assert res.files_skipped[name].startswith("symlink"), res.files_skipped
    assert res.files_skipped["fifo"] == "not a regular file"


def test_network_is_unreachable_loopback_included(isolating_sb, marker):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(8)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        host_ip = _host_ip()
        code = (
            "import socket, sys\n"
            "port = int(sys.argv[1])\n"
            "for host in sys.argv[2:]:\n"
            "    try:\n"
            "        socket.create_connection((host, port), timeout=1).close(); print('CONNECTED', host)\n"
            "    except OSError as e:\n"
            "        print('blocked', host, type(e).__name__)\n"
            "try:\n    socket.getaddrinfo('example.com', 80); print('RESOLVED')\nexcept OSError:\n    print('no dns')\n"
            "for path in ['/var/run/docker.sock', '/run/docker.sock']:\n"
            "    try:\n"
            "        u = socket.socket(socket.AF_UNIX); u.settimeout(1); u.connect(path); print('CONNECTED', path)\n"
            "    except OSError:\n"
            "        print('no socket', path)\n"
        )
        targets = ["127.0.0.1", "localhost", host_ip, "1.1.1.1"]
        res = isolating_sb.run_python(code, args=[str(port), *targets], limits=Limits(wall_seconds=10))
    finally:
        stop.set()
        t.join(2)
        server.close()
    assert res.ok, res
    assert b"CONNECTED" not in res.stdout and b"RESOLVED" not in res.stdout, res.stdout
    assert res.stdout.count(b"blocked") == len(targets) and res.stdout.count(b"no socket") == 2
    assert accepted == []


def _host_ip() -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))  # no packet is sent; this only picks the outgoing interface
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()


def test_writes_outside_the_work_dir_stay_inside(isolating_sb, tmp_path, marker):
    code = (
        "import os, sys\n"
        "name, host_dir = sys.argv[1], sys.argv[2]\n"
        "for d in ['/', '/etc', '/usr', '/usr/lib', '/var', '/root', '/home', host_dir, '/tmp', '..']:\n"
        "    try:\n"
        "        with open(os.path.join(d, name), 'w') as f:\n"
        "            f.write('x')\n"
        "        print('WROTE', d)\n"
        "    except OSError as e:\n"
        "        print('refused', d, e.errno)\n"
    )
    res = isolating_sb.run_python(code, args=[marker, str(tmp_path)], limits=FAST)
    assert res.ok, res
    wrote = {line.split()[1] for line in res.stdout_text.splitlines() if line.startswith("WROTE")}
    # /tmp is the sandbox's private tmpfs and /work (..) its own: both vanish with it.
    assert wrote <= {"/tmp", ".."}, res.stdout_text
    for d in ("/", "/etc", "/usr", "/usr/lib", "/var", "/tmp", str(tmp_path), os.path.expanduser("~")):
        assert not os.path.exists(os.path.join(d, marker)), d


def test_host_environment_and_home_are_not_visible(sb, tmp_path, monkeypatch):
    if sb.isolation is Isolation.PLAIN and os.geteuid() != 0:
        pytest.skip("plain fallback as a non-root host runs as the host user: it can read that user's files")
    monkeypatch.setenv("SWARM_TEST_SECRET", "env-secret-value")
    secret = tmp_path / "home-secret.txt"
    secret.write_text("home-secret-value")
    home = os.path.expanduser("~")
    code = (
        "import os, sys\n"
        "print(sorted(os.environ))\n"
        "print(os.environ.get('HOME'))\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        print('READ', path, open(path).read() if os.path.isfile(path) else os.listdir(path))\n"
        "    except OSError as e:\n"
        "        print('refused', path, e.errno)\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try:\n"
        "            print('ENVIRON', pid, open(f'/proc/{pid}/environ', 'rb').read())\n"
        "        except OSError:\n"
        "            pass\n"
    )
    targets = [str(secret), home, "/root", f"/proc/{os.getpid()}/environ"]
    res = sb.run_python(code, args=targets, limits=FAST)
    assert res.ok, res
    out = res.stdout_text
    assert "SWARM_TEST_SECRET" not in out and "env-secret-value" not in out
    assert "home-secret-value" not in out
    assert not any(line.startswith("READ") for line in out.splitlines()), out
    assert out.splitlines()[1] != home


def test_plain_fallback_says_isolation_is_reduced(plain_sandbox, caplog):
    res = plain_sandbox.run_python("print(1)", limits=FAST)
    assert res.ok and res.isolation is Isolation.PLAIN
    assert res.warning and "REDUCED ISOLATION" in res.warning
    with caplog.at_level("WARNING"):
        LocalSandbox(isolation="plain")
    assert any("REDUCED ISOLATION" in r.message for r in caplog.records)


def test_auto_uses_unshare_when_bwrap_is_missing(unshare_sandbox):
    sb = LocalSandbox(isolation="auto", bwrap="/nonexistent/bwrap")
    assert sb.isolation is Isolation.UNSHARE and sb.warning is None
    res = sb.run_python("import os; print(os.getuid(), sorted(os.listdir('/')))", limits=FAST)
    assert res.ok and res.isolation is Isolation.UNSHARE and res.warning is None
    assert res.stdout_text.split()[0] == "0"  # a fresh mapping: root of its own user namespace only
    assert "root" not in res.stdout_text and "home" not in res.stdout_text


def test_auto_refuses_when_nothing_isolates_unless_plain_is_opted_in(monkeypatch, caplog):
    from sandboxes.base import PLAIN_OPT_IN_ENV

    monkeypatch.delenv(PLAIN_OPT_IN_ENV, raising=False)
    with pytest.raises(SandboxUnavailable) as e:
        LocalSandbox(isolation="auto", bwrap="/nonexistent/bwrap", unshare="/nonexistent/unshare")
    msg = str(e.value)
    assert "bwrap:" in msg and "not found" in msg and "unshare:" in msg and "sandbox: unsafe_plain" in msg
    monkeypatch.setenv(PLAIN_OPT_IN_ENV, "unsafe_plain")
    with caplog.at_level("WARNING"):
        sb = LocalSandbox(isolation="auto", bwrap="/nonexistent/bwrap", unshare="/nonexistent/unshare")
    assert sb.isolation is Isolation.PLAIN and "opted in" in sb.warning
    assert any("REDUCED ISOLATION" in r.message for r in caplog.records)
    monkeypatch.delenv(PLAIN_OPT_IN_ENV)
    sb = LocalSandbox(isolation="auto", bwrap="/nonexistent/bwrap", unshare="/nonexistent/unshare", allow_plain=True)
    assert sb.isolation is Isolation.PLAIN
    with pytest.raises(SandboxUnavailable, match="unshare does not work"):
        LocalSandbox(isolation="unshare", unshare="/nonexistent/unshare")
    with pytest.raises(SandboxUnavailable, match="not found"):
        LocalSandbox(isolation="bwrap", bwrap="/nonexistent/bwrap")


@pytest.mark.docker
def test_docker_containers_are_always_removed(docker_sandbox):
    from sandboxes.docker_backend import LABEL

    client = docker_sandbox.client
    before = {c.id for c in client.containers.list(all=True, filters={"label": LABEL})}
    docker_sandbox.run_python("print(1)", limits=FAST)
    docker_sandbox.run_python("while True: pass", limits=Limits(wall_seconds=0.5))
    docker_sandbox.run(["no-such-command"], limits=FAST)
    after = {c.id for c in client.containers.list(all=True, filters={"label": LABEL})}
    assert after <= before


@pytest.mark.docker
def test_docker_runs_as_non_root_on_a_read_only_root(docker_sandbox):
    code = (
        "import os\n"
        "print(os.getuid(), os.getgid())\n"
        "for p in ['/x', '/usr/x', '/etc/x']:\n"
        "    try:\n        open(p, 'w')\n        print('WROTE', p)\n"
        "    except OSError as e:\n        print('refused', e.errno)\n"
        "print(sorted(os.listdir('/sys/class/net')))\n"
    )
    res = docker_sandbox.run_python(code, limits=FAST)
    lines = res.stdout_text.splitlines()
    assert lines[0] == "65534 65534" and "WROTE" not in res.stdout_text
    assert lines[-1] == "['lo']"


@pytest.mark.docker
def test_docker_memory_cgroup_kills_a_many_process_bomb(docker_sandbox, marker):
    # Each process stays under RLIMIT_AS; together they pass the container's memory limit.
    code = (
        "import os, sys, time\n"
        "for _ in range(6):\n"
        "    if os.fork() == 0:\n"
        "        x = bytearray(100 << 20)\n"
        "        for i in range(0, len(x), 4096):\n            x[i] = 1\n"
        "        time.sleep(2)\n"
        "        os._exit(0)\n"
        "for _ in range(6):\n    os.wait()\n"
    )
    res = docker_sandbox.run_python(code, args=[marker], limits=Limits(wall_seconds=20, memory_bytes=200 << 20))
    assert res.reason is StopReason.MEMORY, res
    assert res.usage.wall_seconds < 15
    assert_no_leftovers(marker)


def test_request_validation_happens_before_anything_runs(sb):
    for bad in ("../x", "/etc/passwd", "a/../../b", ""):
        with pytest.raises(ValueError):
            sb.run(["true"], files={bad: "x"})
    with pytest.raises(ValueError, match="main.py"):
        sb.run_python("print(1)", files={"main.py": "x"})
    with pytest.raises(ValueError, match="argv"):
        sb.execute(ExecRequest(()))
    assert sys.executable  # the host interpreter is untouched
