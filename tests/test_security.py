"""Hostile input against the job system and the private state, from inside every sandbox here.

A program run the way the product runs untrusted code (skill programs, code-task rewards) tries to
(a) reach the Jobs API and the GCS of a real private Ray head started with the project's code and
submit a job, and (b) read a real workspace's `.swarm/private/goal.yaml`, its state database and
the head's token file. Every isolating backend available here must stop all of it: `unshare` runs
wherever user namespaces work (the default suite on a machine with neither bubblewrap nor Docker),
`bwrap` and `docker` skip with the reason when they cannot run. The plain subprocess, which only a
goal's `sandbox: unsafe_plain` allows, shares the network: there the token is what still refuses
the job. Also: the Jobs API refuses a request without the token (401) and accepts the project's
client; private files are 0600/0700 under umask 000; model text with escape sequences reaches
neither commit messages, reports nor the terminal; the opt-in is validated and named in the report.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import urllib.error
import urllib.request

import pytest
import yaml

from sandboxes import Isolation, Limits, SandboxUnavailable
from sandboxes.local import LocalSandbox
from trainer.launch import start_head, stop_head

pytestmark = pytest.mark.ray
ROOT = pathlib.Path(__file__).resolve().parent.parent
HOSTILE = "ok\x1b[2J\x1b[31mred\x1b[0m\x1b]0;pwned\x07\x1b]52;c;ZWNobyBoaQ==\x07 \rback\x08\x9b1m\x00\u202e end"

ATTACK = r"""
import json, socket, sys, urllib.error, urllib.request
ports, paths = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {"connect": {}, "submit": None, "read": {}}
for port in ports:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        out["connect"][str(port)] = "connected"
    except OSError as e:
        out["connect"][str(port)] = type(e).__name__
body = json.dumps({"entrypoint": "echo pwned"}).encode()
req = urllib.request.Request("http://127.0.0.1:%d/api/jobs/" % ports[0], data=body,
                             headers={"Content-Type": "application/json"})
try:
    out["submit"] = urllib.request.urlopen(req, timeout=5).status
except urllib.error.HTTPError as e:
    out["submit"] = e.code
except Exception as e:
    out["submit"] = type(e).__name__
for path in paths:
    try:
        with open(path, "rb") as f:
            out["read"][path] = "READ %r" % f.read(80)
    except OSError as e:
        out["read"][path] = type(e).__name__
print(json.dumps(out))
"""


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def head():
    h = start_head(num_cpus=1)
    yield h
    stop_head(h)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A real workspace made by `Controller.create` (the goal in .swarm/private, the state db)."""
    from swarm.controller import Controller
    from swarm.goal import Goal

    tmp = tmp_path_factory.mktemp("ws")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(tmp / "home"))
        mp.setenv("GIT_CONFIG_NOSYSTEM", "1")
        mp.delenv("SWARMLAB_LIBRARY", raising=False)
        goal = yaml.safe_load((ROOT / "examples" / "goals" / "truncation.yaml").read_text())
        ctrl = Controller.create(tmp / "w", Goal.parse(goal), jobs="process")
        ctrl._conn.close()
        ctrl.knowledge.close()
    ws = tmp / "w"
    assert (ws / ".swarm" / "private" / "goal.yaml").is_file() and (ws / ".swarm" / "state.db").is_file()
    return ws


def _backend(kind: str):
    if kind == "docker":
        from sandboxes.docker_backend import DockerSandbox, docker_status

        ok, why = docker_status()
        if not ok:
            pytest.skip(f"docker: {why}")
        return DockerSandbox()
    try:
        return LocalSandbox(isolation=kind)
    except SandboxUnavailable as e:
        pytest.skip(f"{kind}: {e}")


def _attack(sb, head, workspace) -> dict:
    ports = [int(head.dashboard_url.rsplit(":", 1)[1]), int(head.gcs_address.rsplit(":", 1)[1])]
    paths = [str(workspace / ".swarm" / "private" / "goal.yaml"), str(workspace / ".swarm" / "state.db"),
             str(head.token_path)]
    res = sb.run_python(ATTACK, args=[json.dumps(ports), json.dumps(paths)], limits=Limits(wall_seconds=30))
    assert res.ok, res
    return json.loads(res.stdout_text.strip().splitlines()[-1])


# --------------------------------------------------------------------------- the attack


@pytest.mark.parametrize("kind", ["unshare", "bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_isolated_code_reaches_neither_the_job_system_nor_the_private_state(kind, head, workspace):
    sb = _backend(kind)
    try:
        got = _attack(sb, head, workspace)
    finally:
        sb.close()
    assert sb.isolation is Isolation(kind)
    assert "connected" not in got["connect"].values(), got
    assert got["submit"] not in (200, 401, 403), got       # not even an answer: nothing to talk to
    assert not any(v.startswith("READ") for v in got["read"].values()), got
    assert head.client().list_jobs() == []


SKILL_PROGRAM = r"""
import socket


def trigger(e):
    # True if any attack got through: the skill would then fire
    for port in e["ports"]:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return True
        except OSError:
            pass
    for path in e["paths"]:
        try:
            open(path, "rb").read(1)
            return True
        except OSError:
            pass
    return False
"""


def test_skill_programs_and_code_rewards_run_isolated_through_the_products_own_paths(head, workspace, tmp_path):
    """The callers, not a sandbox built by the test: `skills.run_program` (what a tick and the
    miner's verification call) with its default sandbox, and the code task's reward sandbox."""
    from skills import parse_skill, run_program
    from trainer.tasks.code import CodeTask

    d = tmp_path / "hostile"
    d.mkdir()
    (d / "SKILL.md").write_text("---\nname: hostile\ndescription: Tries to reach the job system.\nswarmlab:\n"
                                "  diagnosis: truncation\n  intervention: {kind: harness_edit, fields: "
                                "[harness.sampling.max_new_tokens]}\n  program: skill.py\n---\n## When\n\nNever.\n")
    (d / "skill.py").write_text(SKILL_PROGRAM)
    ports = [int(head.dashboard_url.rsplit(":", 1)[1]), int(head.gcs_address.rsplit(":", 1)[1])]
    paths = [str(workspace / ".swarm" / "private" / "goal.yaml"), str(workspace / ".swarm" / "state.db")]
    (got,) = run_program(parse_skill(d), [{"ports": ports, "paths": paths}], timeout_s=20)
    assert got.error is None and got.fired is False, got
    task = CodeTask(seed=0, sandbox="local")
    try:
        assert task.sandbox.isolation in (Isolation.BWRAP, Isolation.UNSHARE) and task.sandbox.warning is None
    finally:
        task.close()


def test_plain_subprocess_shares_the_network_but_the_token_refuses_the_job(head, workspace):
    sb = LocalSandbox(isolation="plain")
    got = _attack(sb, head, workspace)
    assert got["submit"] == 401, got                       # it reaches the port: only the token stops it
    if os.geteuid() == 0:  # run as the sandbox uid: the 0700 folders keep the private files out of reach
        assert not any(v.startswith("READ") for v in got["read"].values()), got
    assert head.client().list_jobs() == []


def test_jobs_api_refuses_requests_without_the_token(head):
    url = head.dashboard_url + "/api/jobs/"
    for headers in ({}, {"Authorization": "Bearer " + "0" * 64}, {"x-ray-authorization": "Bearer nope"}):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)
        assert e.value.code in (401, 403), headers
    with urllib.request.urlopen(urllib.request.Request(url, headers=head.headers()), timeout=10) as r:
        assert r.status == 200 and json.loads(r.read()) == []
    assert head.client().list_jobs() == []                 # the project's client sends it


def test_auto_sandbox_refuses_without_isolation_unless_the_goal_opts_in(monkeypatch):
    from sandboxes import make_sandbox
    from sandboxes.base import PLAIN_OPT_IN_ENV
    from swarm.goal import Goal
    from trainer.config import ConfigError

    monkeypatch.delenv(PLAIN_OPT_IN_ENV, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")             # no bwrap, no unshare, no docker CLI
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    import sandboxes.local as local

    monkeypatch.setattr(local, "_probe_cache", {})
    with pytest.raises(SandboxUnavailable) as e:
        make_sandbox("auto")
    msg = str(e.value)
    assert msg.startswith("docker: ") and "bwrap:" in msg and "unshare:" in msg and "sandbox: unsafe_plain" in msg
    monkeypatch.setenv(PLAIN_OPT_IN_ENV, "unsafe_plain")
    assert make_sandbox("auto").isolation is Isolation.PLAIN
    with pytest.raises(ConfigError, match="sandbox='plain'"):
        Goal.parse({"goal": "x", "sandbox": "plain"})
    assert Goal.parse({"goal": "x", "sandbox": "unsafe_plain"}).public()["sandbox"] == "unsafe_plain"


# --------------------------------------------------------------------------- private files


def _mode(p: pathlib.Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_private_files_are_private_whatever_the_umask(tmp_path, monkeypatch):
    from agents.llm import ExchangeLog
    from memory.memory import Memory
    from swarm.controller import Controller
    from swarm.goal import Goal
    from trainer.launch import AUTH_DIR_ENV, new_token, token_path_for

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.delenv("SWARMLAB_LIBRARY", raising=False)
    monkeypatch.setenv(AUTH_DIR_ENV, str(tmp_path / "ray-auth"))
    old = os.umask(0)
    try:
        goal = yaml.safe_load((ROOT / "examples" / "goals" / "truncation.yaml").read_text())
        ctrl = Controller.create(tmp_path / "w", Goal.parse(goal), jobs="process")
        cfg = ctrl.write_job_config()
        ctrl._conn.close()
        ctrl.knowledge.close()
        log = ExchangeLog(tmp_path / "llm")
        log.append({"prompt": "p", "answer": "a"})
        mem = Memory.open(tmp_path / "library", backend="memory")
        mem.close()
        token = new_token(token_path_for("http://127.0.0.1:8265"))
    finally:
        os.umask(old)
    ws = tmp_path / "w" / ".swarm"
    for d in (ws, ws / "private", tmp_path / "w" / "skills", tmp_path / "llm", tmp_path / "library", token.parent):
        assert _mode(d) == 0o700, d
    for f in (ws / "private" / "goal.yaml", cfg, ws / "state.db", ws / "graph.db", log.path, token):
        assert _mode(f) == 0o600, f


# --------------------------------------------------------------------------- escape sequences


def test_clean_text_strips_escapes_and_controls():
    from sandboxes.text import clean_text

    assert clean_text(HOSTILE) == "okred back end"
    assert clean_text("a\tb\r\nc") == "a\tb\nc"
    assert clean_text("a\nb", newlines=False) == "a b"


def _no_escapes(text: str) -> None:
    bad = [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f or c == "\u202e"]
    assert not bad, repr(text)


def test_model_text_never_reaches_commits_reports_or_the_terminal(tmp_path, clean_git_home):
    from typer.testing import CliRunner

    from swarm.cli import app
    from swarm.report import final_report
    from swarm.workspace import Workspace

    ws = Workspace.init(tmp_path / "w", f"goal: {json.dumps(HOSTILE)}\n", {}, {})
    sha = ws.commit_files({"notes.txt": b"x"}, f"Skill from a model: {HOSTILE}")
    _no_escapes(ws.repo.commit(sha).message)

    md, _ = final_report({"goal": HOSTILE, "sandbox": "unsafe_plain"}, [{"time": 0.0, "kind": HOSTILE}], [], [], {})
    _no_escapes(md)
    assert "sandbox: unsafe_plain" in md                   # the opt-in is named in the report

    final = tmp_path / "w" / "reports" / "final"
    final.mkdir(parents=True)
    (final / "REPORT.md").write_text(f"# report\n{HOSTILE}\n")
    res = CliRunner().invoke(app, ["report", "--workspace", str(tmp_path / "w")])
    assert res.exit_code == 0 and "okred" in res.output
    _no_escapes(res.output)


# --------------------------------------------------------------------------- the CLI


def _swarm(tmp_path, *args, env):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "swarm.cli", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=env)


def test_swarm_run_refuses_where_nothing_isolates_and_warns_on_the_opt_in(tmp_path, clean_git_home):
    from sandboxes.base import PLAIN_OPT_IN_ENV

    goal = yaml.safe_load((ROOT / "examples" / "goals" / "truncation.yaml").read_text())
    (tmp_path / "goal.yaml").write_text(yaml.safe_dump(goal))
    bare = {k: v for k, v in os.environ.items() if k != PLAIN_OPT_IN_ENV}
    bin_dir = tmp_path / "bin"      # git only: no bwrap, no unshare, and no engine at DOCKER_HOST
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(shutil.which("git"))
    bare.update(PATH=str(bin_dir), DOCKER_HOST="unix:///nonexistent/docker.sock")
    res = _swarm(tmp_path, "run", "goal.yaml", "--workspace", "ws", "--jobs", "process", env=bare)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no sandbox for untrusted code" in lines[0] and "sandbox: unsafe_plain" in lines[0]
    assert "Traceback" not in res.stderr and not (tmp_path / "ws").exists()   # nothing created

    (tmp_path / "goal.yaml").write_text(yaml.safe_dump({**goal, "sandbox": "unsafe_plain"}))
    (tmp_path / "ws" / ".swarm").mkdir(parents=True)
    (tmp_path / "ws" / ".swarm" / "graph.db").touch()    # a workspace holding a run: refused right after
    res = _swarm(tmp_path, "run", "goal.yaml", "--workspace", "ws", "--jobs", "process", env=bare)
    assert res.returncode == 2 and "already holds a run" in res.stderr
    assert "WARNING: sandbox: unsafe_plain" in res.stderr and "plain subprocess" in res.stderr
