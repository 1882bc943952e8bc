"""Private files are never written through a link, a damaged state database is one line, and a
workspace's own files are private whatever the umask.

A link planted where a private file belongs (`.swarm/state.db`, `stop`, `controller.lock`) points at
a file outside the workspace; each operation that writes there (`swarm interventions`, the
cockpit's discovery under `--root`, `swarm stop` and the cockpit's and MCP's stop, `swarm resume`'s
lock) must refuse in one line and leave the outside file's content and mode as they were. A state
database that is a text file, a FIFO, a folder or a truncated database is one line naming the file
and what is wrong (exit code 2), and nothing is written (no nested database in a folder, no
blocking on a FIFO). Under umask 000 the workspace's `.git`, goal, recipe, harness and reports are
0700 / 0600, through a PR's merge and rollback. Everything is written in tmp_path; no Ray.

    .venv/bin/python -m pytest tests/test_private_paths.py -q
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import stat

import pytest
import yaml
from typer.testing import CliRunner

from sandboxes.private import (PrivatePathError, open_private, open_private_fd, private_dir, touch_private,
                               write_private)
from swarm.cli import app, request_stop
from swarm.store import Store, StateDbError, acquire_lock

ROOT = pathlib.Path(__file__).resolve().parent.parent
runner = CliRunner()
SECRET = "outside: must stay as it is\n"


@pytest.fixture(autouse=True)
def _git_home(clean_git_home):
    """A clean git HOME for every test (conftest.clean_git_home)."""


@contextlib.contextmanager
def no_hang(seconds: int = 10):
    """Fail (instead of hanging the suite) if an open blocks, e.g. on a FIFO."""
    def boom(*_):
        raise TimeoutError(f"blocked for {seconds} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def outside(tmp_path: pathlib.Path) -> pathlib.Path:
    """A file outside every workspace, 0644 with known content: what a planted link points at."""
    p = tmp_path / "outside" / "precious.txt"
    p.parent.mkdir(exist_ok=True)
    p.write_text(SECRET)
    os.chmod(p, 0o644)
    return p


def assert_untouched(p: pathlib.Path) -> None:
    assert p.read_text() == SECRET and stat.S_IMODE(p.stat().st_mode) == 0o644, (p.read_text(), oct(p.stat().st_mode))


def assert_one_line(result, *needles: str) -> str:
    out = result.output
    assert result.exit_code == 2, (result.exit_code, out)
    assert "Traceback" not in out, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def run_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A workspace folder with a live state database (one intervention-free run)."""
    ws = tmp_path / "runs" / "ws"
    Store(ws / ".swarm" / "state.db").close()   # creates .swarm/ (0700) and the database (0600)
    return ws


# ---- the shared mechanism -------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["touch_private", "open_private_w", "open_private_a", "open_private_fd", "write_private"])
def test_private_files_are_never_written_through_a_link(op, tmp_path):
    target = outside(tmp_path)
    d = private_dir(tmp_path / "private")
    link = d / "file"
    link.symlink_to(target)
    calls = {"touch_private": lambda: touch_private(link), "open_private_w": lambda: open_private(link, "w").close(),
             "open_private_a": lambda: open_private(link, "a").close(), "write_private": lambda: write_private(link, "x"),
             "open_private_fd": lambda: os.close(open_private_fd(link))}
    with pytest.raises(PrivatePathError, match="symbolic link") as e:
        calls[op]()
    assert str(link) in str(e.value) and "\n" not in str(e.value)
    assert_untouched(target)
    assert link.is_symlink()


def test_a_private_folder_that_is_a_link_is_refused_and_its_target_keeps_its_mode(tmp_path):
    target = tmp_path / "outside-dir"
    target.mkdir()
    os.chmod(target, 0o755)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(PrivatePathError, match="symbolic link"):
        private_dir(tmp_path / "link")
    assert stat.S_IMODE(target.stat().st_mode) == 0o755


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_fifo_or_folder_where_a_private_file_belongs_is_refused_without_blocking(kind, tmp_path):
    p = tmp_path / "file"
    os.mkfifo(p) if kind == "fifo" else p.mkdir()
    with no_hang():
        for call in (lambda: touch_private(p), lambda: os.close(open_private_fd(p)), lambda: open_private(p, "w"),
                     lambda: write_private(p, "x")):
            with pytest.raises(PrivatePathError, match="FIFO" if kind == "fifo" else "folder"):
                call()


# ---- each writer of .swarm ---------------------------------------------------------------------


def test_interventions_refuses_a_linked_state_db_and_leaves_its_target_alone(tmp_path):
    target = outside(tmp_path)
    ws = tmp_path / "ws"
    (ws / ".swarm").mkdir(parents=True)
    (ws / ".swarm" / "state.db").symlink_to(target)
    assert_one_line(runner.invoke(app, ["interventions", "--workspace", str(ws)]), "state.db", "symbolic link")
    assert_untouched(target)
    with pytest.raises(StateDbError, match="symbolic link"):
        Store(ws)


def test_the_cockpit_under_root_skips_a_linked_state_db_without_touching_its_target(tmp_path):
    from swarm.ui.app import Runs

    target = outside(tmp_path)
    good = run_dir(tmp_path)
    bad = tmp_path / "runs" / "linked"
    (bad / ".swarm").mkdir(parents=True)
    (bad / ".swarm" / "state.db").symlink_to(target)
    damage(tmp_path / "runs" / "text" / ".swarm" / "state.db", "text")
    runs = Runs(root=tmp_path / "runs")
    try:
        assert [v.root for v in runs.views()] == [good]     # the linked and the damaged ones are left out
    finally:
        runs.close()
    assert_untouched(target)
    assert_one_line(runner.invoke(app, ["ui", "--workspace", str(bad), "--port", "0"]), "state.db", "symbolic link")
    assert_untouched(target)


def test_stop_refuses_a_linked_stop_file_from_the_cli_the_cockpit_and_mcp(tmp_path):
    import anyio
    from mcp import Client

    from swarm.mcp_server import build_server

    target = outside(tmp_path)
    ws = run_dir(tmp_path)
    (ws / ".swarm" / "stop").symlink_to(target)
    assert_one_line(runner.invoke(app, ["stop", "--workspace", str(ws)]), "stop", "symbolic link")
    with pytest.raises(ValueError, match="symbolic link"):
        request_stop(ws, by="ui:test")     # what the cockpit's POST /r/<run>/stop calls

    async def mcp_stop():
        async with Client(build_server(workspace=ws, allow_actions=True)) as c:
            return await c.call_tool("stop", {})
    res = anyio.run(mcp_stop)
    assert res.is_error and "symbolic link" in res.content[0].text
    assert_untouched(target)
    with Store(ws) as st:
        assert not st.timeline("human_stop")   # refused before anything was recorded


def test_stop_writes_a_private_file_when_nothing_is_planted(tmp_path):
    ws = run_dir(tmp_path)
    old = os.umask(0)
    try:
        assert request_stop(ws, by="cli:test") == "stop requested"
    finally:
        os.umask(old)
    assert stat.S_IMODE((ws / ".swarm" / "stop").stat().st_mode) == 0o600


def test_resume_refuses_a_linked_controller_lock_and_leaves_its_target_alone(tmp_path):
    target = outside(tmp_path)
    ws = tmp_path / "ws"
    (ws / ".swarm" / "private").mkdir(parents=True)
    goal = yaml.safe_load((ROOT / "examples" / "goals" / "truncation.yaml").read_text())
    (ws / ".swarm" / "private" / "goal.yaml").write_text(yaml.safe_dump(goal))
    (ws / ".swarm" / "controller.lock").symlink_to(target)
    assert_one_line(runner.invoke(app, ["resume", "--workspace", str(ws), "--jobs", "process"]),
                    "controller.lock", "symbolic link")
    with pytest.raises(PrivatePathError):
        acquire_lock(ws)
    assert_untouched(target)


def test_a_workspace_whose_swarm_folder_is_a_link_is_refused(tmp_path):
    other = run_dir(tmp_path) / ".swarm"          # another run's private folder
    os.chmod(other, 0o755)
    os.chmod(other / "state.db", 0o644)
    before = sorted(p.name for p in other.iterdir())
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".swarm").symlink_to(other)
    for args in (["stop"], ["interventions"], ["ui", "--port", "0"]):
        assert_one_line(runner.invoke(app, [*args, "--workspace", str(ws)]), ".swarm", "symbolic link")
    with pytest.raises(PrivatePathError):
        acquire_lock(ws)
    assert sorted(p.name for p in other.iterdir()) == before       # no stop file, no lock written there
    assert stat.S_IMODE(other.stat().st_mode) == 0o755 and stat.S_IMODE((other / "state.db").stat().st_mode) == 0o644


# ---- a damaged state database ---------------------------------------------------------------------


def damage(db: pathlib.Path, kind: str) -> str:
    """Put `kind` where the database belongs; returns the words the error must hold."""
    db.parent.mkdir(parents=True, exist_ok=True)
    if kind == "text":
        db.write_text("these are my notes, not a database\n")
        return "not an sqlite database"
    if kind == "truncated":
        db.write_bytes(b"SQLite for")
        return "not an sqlite database"
    if kind == "fifo":
        os.mkfifo(db)
        return "is a FIFO"
    db.mkdir()
    return "is a folder"


@pytest.mark.parametrize("kind", ["text", "truncated", "fifo", "folder"])
def test_a_damaged_state_db_is_one_line_naming_it_and_writes_nothing(kind, tmp_path):
    ws = tmp_path / "ws"
    db = ws / ".swarm" / "state.db"
    words = damage(db, kind)
    before = sorted(str(p.relative_to(ws)) for p in ws.rglob("*"))
    with no_hang(60):
        for args in (["interventions"], ["status"], ["stop"], ["approve", "iv-1"],
                     ["tensorboard", "--logdir", str(tmp_path / "tb")], ["ui", "--port", "0"], ["mcp"]):
            assert_one_line(runner.invoke(app, [*args, "--workspace", str(ws)]), str(db), words)
        with pytest.raises(StateDbError, match=words):
            Store(db)
        with pytest.raises(StateDbError, match=words):
            Store(ws)
    assert sorted(str(p.relative_to(ws)) for p in ws.rglob("*")) == before   # no nested .swarm/state.db/.swarm
    if kind == "text":
        assert db.read_text() == "these are my notes, not a database\n"


def test_resume_on_a_damaged_state_db_is_one_line(tmp_path):
    ws = tmp_path / "ws"
    (ws / ".swarm" / "private").mkdir(parents=True)
    goal = yaml.safe_load((ROOT / "examples" / "goals" / "truncation.yaml").read_text())
    (ws / ".swarm" / "private" / "goal.yaml").write_text(yaml.safe_dump(goal))
    damage(ws / ".swarm" / "state.db", "text")
    assert_one_line(runner.invoke(app, ["resume", "--workspace", str(ws), "--jobs", "process"]), "state.db",
                    "not an sqlite database")


# ---- the workspace's own files under umask 000 ------------------------------------------------------


def loose_modes(root: pathlib.Path) -> list[str]:
    """Every path under `root` (itself included) with a group or other permission bit."""
    bad = []
    for dirpath, dirs, files in os.walk(root):
        for p in [pathlib.Path(dirpath)] + [pathlib.Path(dirpath) / n for n in dirs + files]:
            st = os.lstat(p)
            if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
                bad.append(f"{oct(stat.S_IMODE(st.st_mode))} {p.relative_to(root)}")
    return sorted(set(bad))


def test_a_workspaces_own_files_are_private_whatever_the_umask(tmp_path):
    from test_workspace import GOAL, HARNESS, RECIPE, make_iv

    from swarm.workspace import Workspace

    old = os.umask(0)
    try:
        ws = Workspace.init(tmp_path / "w", GOAL, RECIPE, HARNESS)
        iv = make_iv({"recipe.lr": 0.001})
        ws.open_pr(iv, "# report\n", {"metrics.png": b"\x89PNG\r\n\x1a\n"})
        ws.approve(iv.id)                    # a merge: git checks files out into the work tree
        ws.commit_files({"reports/final/REPORT.md": b"# final\n"}, "final report")
        ws.rollback(iv.id)                   # a revert: recipe.yaml is rewritten
    finally:
        os.umask(old)
    root = tmp_path / "w"
    for d in (root, root / ".git", root / "reports", root / f"reports/{iv.id}", root / "skills", root / ".swarm"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for f in ("goal.yaml", "recipe.yaml", "harness.yaml", ".gitignore", f"reports/{iv.id}/REPORT.md", "reports/final/REPORT.md"):
        assert stat.S_IMODE((root / f).stat().st_mode) == 0o600, f
    assert loose_modes(root) == []
    assert ws.current_recipe()["lr"] == RECIPE["lr"] and ws.repo.git.status("--porcelain") == ""
