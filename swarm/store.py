"""The swarm's durable state: interventions, controller runs and an append-only timeline, in sqlite.

    store = Store(workspace_dir)            # or Store("path/to/state.db")
    store.put(iv)
    store.transition(iv.id, Status.VALIDATED, "backtest passed: +0.12, p=0.01")
    store.log("diagnosis", name="loss_spike", step=120)
    lock = acquire_lock(workspace_dir)      # one controller per workspace

The database lives in the workspace's `.swarm/state.db` (not in git). It runs in WAL mode with a
busy timeout, so the controller and CLI commands in other terminals (`swarm approve`,
`swarm interventions`) read and write it concurrently. An intervention is stored whole, as the
JSON of its pydantic model, beside indexed columns (id, status, kind) for listing. Every status
change goes through `Intervention.move` inside one `BEGIN IMMEDIATE` transaction that also
appends a timeline row, so a transition is either fully recorded or not at all.

A state database that is a symbolic link, a FIFO, a folder or not a database (or whose `.swarm`
or -wal/-shm/-journal is a link) raises `StateDbError`, one line naming the file and what is
wrong, before anything is written (`state_db_problem`).

JSON here keeps non-finite floats (`NaN`, `Infinity`): diagnosis evidence often holds a NaN loss,
and pydantic's own JSON would turn it into `null`.

The controller lock is an `fcntl.flock` on `.swarm/controller.lock`: the kernel drops it when
the holding process dies, SIGKILL included, so a killed controller never leaves a stale lock.
The lock file's descriptor is not inherited by child processes (Ray workers, trainers), so a
child that outlives the controller does not keep the workspace locked.
"""
from __future__ import annotations

import contextlib
import enum
import fcntl
import json
import logging
import os
import pathlib
import sqlite3
import stat
import threading
import time
from typing import Any, Callable, Iterator

from agents.domain import Intervention, Status
from sandboxes.errors import SwarmlabError

log = logging.getLogger(__name__)

SWARM_DIR = ".swarm"
DB_NAME = "state.db"
LOCK_NAME = "controller.lock"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS interventions (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    kind TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS interventions_status ON interventions(status);
CREATE INDEX IF NOT EXISTS interventions_kind ON interventions(kind);
CREATE TABLE IF NOT EXISTS controller_runs (
    run_id TEXT PRIMARY KEY,
    goal TEXT NOT NULL,
    started REAL NOT NULL,
    ended REAL,
    status TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS timeline (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS timeline_kind ON timeline(kind);
CREATE TABLE IF NOT EXISTS looks (
    n INTEGER PRIMARY KEY,
    step INTEGER NOT NULL,
    time REAL NOT NULL,
    findings TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS onsets (
    finding TEXT PRIMARY KEY,
    step INTEGER NOT NULL
);
"""


def _default(o: Any) -> Any:
    if isinstance(o, enum.Enum):
        return o.value
    if hasattr(o, "item"):          # numpy / torch scalars
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, pathlib.PurePath):
        return str(o)
    return repr(o)


def dumps(obj: Any) -> str:
    """JSON that keeps NaN/Infinity (Python's json reads them back)."""
    return json.dumps(obj, default=_default, allow_nan=True, separators=(",", ":"))


def intervention_json(iv: Intervention) -> str:
    return dumps(iv.model_dump(mode="python"))


def intervention_from_json(text: str) -> Intervention:
    return Intervention.model_validate(json.loads(text))


def state_db_path(workspace: str | os.PathLike) -> pathlib.Path:
    return pathlib.Path(workspace) / SWARM_DIR / DB_NAME


class StateDbError(SwarmlabError, ValueError):
    """The workspace's state database cannot be used: not a regular file, a symbolic link, or not
    an sqlite database."""


def state_db_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with the state database at `path`, as one sentence naming the file, or None
    when nothing is visibly wrong or it is absent (a new one is created). Only `lstat`: a FIFO
    never blocks, a link is never followed, and the file is not opened (closing a descriptor of it
    would drop the POSIX locks this process's sqlite connections hold on it). The `.swarm` folder
    holding it and its -wal, -shm and -journal files must not be links either (sqlite would write
    through them). A regular file that is not a database is found when sqlite opens it (`Store`)."""
    from sandboxes.private import describe

    p = pathlib.Path(path)
    if p.parent.name == SWARM_DIR and os.path.islink(p.parent):
        return f"{str(p.parent)!r} is a symbolic link where the workspace's private folder belongs; refusing to follow it"
    for q in (p, *(p.with_name(p.name + s) for s in ("-wal", "-shm", "-journal"))):
        try:
            st = os.lstat(q)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            return f"the state database file {str(q)!r} is a symbolic link; refusing to follow it (remove the link)"
        if not stat.S_ISREG(st.st_mode):
            return (f"the state database file {str(q)!r} is {describe(st.st_mode)}, "
                    f"not {'an sqlite database' if q == p else 'a regular file'}")
    return None


def check_state_db(path: str | os.PathLike) -> None:
    """Raise `StateDbError` (one line naming the file and what is wrong) unless `path` is usable."""
    problem = state_db_problem(path)
    if problem:
        raise StateDbError(problem)


class Store:
    """sqlite state of one workspace. `path` is the database file, or a workspace directory (then
    the database is `<dir>/.swarm/state.db`). Safe to open from several processes at once and to
    share between threads (calls on one `Store` are serialised)."""

    def __init__(self, path: str | os.PathLike, timeout_s: float = 30.0) -> None:
        p = pathlib.Path(path)
        if p.is_dir() and not (p.name == DB_NAME and p.parent.name == SWARM_DIR):   # a workspace, not a damaged db
            p = state_db_path(p)
        from sandboxes.private import private_dir, touch_private

        check_state_db(p)       # a link, a FIFO or a folder: one line, nothing written
        private_dir(p.parent)   # .swarm/: 0700, and the database (its -wal/-shm follow its mode) 0600
        touch_private(p)
        self.path = p
        # isolation_level=None: autocommit, transactions are explicit (BEGIN IMMEDIATE below)
        self._lock = threading.RLock()
        self._subscribers: list[Callable[[Intervention], None]] = []
        self._db = sqlite3.connect(str(p), timeout=timeout_s, isolation_level=None, check_same_thread=False)
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            with self._tx():
                for stmt in filter(str.strip, _SCHEMA.split(";")):
                    self._db.execute(stmt)
        except sqlite3.DatabaseError as e:   # "file is not a database", "database disk image is malformed"
            self._db.close()
            if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
                raise
            if getattr(e, "sqlite_errorname", "") == "SQLITE_NOTADB":
                raise StateDbError(f"the state database {str(p)!r} is not an sqlite database "
                                   f"(damaged, or another file in its place)") from None
            raise StateDbError(f"the state database {str(p)!r} cannot be used: {e}") from None

    # ---- plumbing -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; the write lock is taken up front so read-modify-write is atomic
        against other processes."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, sql: str, args: tuple | list = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- interventions ------------------------------------------------------------------------
    def put(self, iv: Intervention) -> None:
        """Insert or replace the intervention, stored whole."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO interventions(id, status, kind, created, updated, data) VALUES (?,?,?,?,?,?) "
                "ON CONFLICT(id) DO UPDATE SET status=excluded.status, kind=excluded.kind, "
                "updated=excluded.updated, data=excluded.data",
                (iv.id, iv.status.value, iv.kind.value, iv.created, now, intervention_json(iv)),
            )

    def get(self, id: str) -> Intervention:
        rows = self._rows("SELECT data FROM interventions WHERE id=?", (id,))
        if not rows:
            raise KeyError(f"unknown intervention {id!r} (in {self.path})")
        return intervention_from_json(rows[0]["data"])

    def __contains__(self, id: str) -> bool:
        return bool(self._rows("SELECT 1 FROM interventions WHERE id=?", (id,)))

    def list(self, status: Status | str | None = None) -> list[Intervention]:
        """Interventions, oldest first; only those in `status` if given."""
        if status is None:
            rows = self._rows("SELECT data FROM interventions ORDER BY created, id")
        else:
            st = Status(status).value
            rows = self._rows("SELECT data FROM interventions WHERE status=? ORDER BY created, id", (st,))
        return [intervention_from_json(r["data"]) for r in rows]

    def transition(self, id: str, to: Status | str, note: str = "", **updates: Any) -> Intervention:
        """Move intervention `id` to status `to` (lifecycle rules in `agents.domain.TRANSITIONS`) and
        append a timeline row, atomically. `updates` set other fields in the same write
        (e.g. `applied_step=120`, `branch=...`). An invalid move raises ValueError and writes
        nothing; an unknown id raises KeyError."""
        to = Status(to)
        with self._tx() as db:
            row = db.execute("SELECT data FROM interventions WHERE id=?", (id,)).fetchone()
            if row is None:
                raise KeyError(f"unknown intervention {id!r} (in {self.path})")
            iv = intervention_from_json(row["data"])
            frm = iv.status
            iv.move(to, note)
            if updates:
                iv = Intervention.model_validate({**iv.model_dump(mode="python"), **updates})
            now = time.time()
            db.execute("UPDATE interventions SET status=?, updated=?, data=? WHERE id=?",
                       (iv.status.value, now, intervention_json(iv), id))
            db.execute("INSERT INTO timeline(time, kind, data) VALUES (?,?,?)",
                       (now, "transition", dumps({"id": id, "from": frm.value, "to": to.value, "note": note})))
        for fn in list(self._subscribers):
            try:
                fn(iv)
            except Exception as e:  # the boundary: the transition is recorded; a follower's failure is logged
                log.warning("after intervention %s became %s: %s failed: %s: %s", id, to.value,
                            getattr(fn, "__name__", type(fn).__name__), type(e).__name__, e)
        return iv

    def subscribe(self, fn: Callable[[Intervention], None]) -> None:
        """Call `fn(iv)` after every status change this Store records (in the recording thread,
        after the commit), e.g. to rewrite the intervention's report. An exception in `fn` is
        logged and never undoes the transition."""
        self._subscribers.append(fn)

    # ---- controller runs ----------------------------------------------------------------------
    def start_run(self, run_id: str, goal: str, status: str = "running") -> None:
        """Record a controller run (idempotent: a resumed run keeps its start time)."""
        with self._tx() as db:
            db.execute("INSERT INTO controller_runs(run_id, goal, started, ended, status) VALUES (?,?,?,NULL,?) "
                       "ON CONFLICT(run_id) DO UPDATE SET status=excluded.status, ended=NULL",
                       (run_id, goal, time.time(), status))

    def end_run(self, run_id: str, status: str) -> None:
        with self._tx() as db:
            cur = db.execute("UPDATE controller_runs SET ended=?, status=? WHERE run_id=?",
                             (time.time(), status, run_id))
            if cur.rowcount == 0:
                raise KeyError(f"unknown controller run {run_id!r} (in {self.path})")

    def runs(self) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM controller_runs ORDER BY started")
        return [dict(r) for r in rows]

    def get_run(self, run_id: str) -> dict[str, Any]:
        rows = self._rows("SELECT * FROM controller_runs WHERE run_id=?", (run_id,))
        if not rows:
            raise KeyError(f"unknown controller run {run_id!r} (in {self.path})")
        return dict(rows[0])

    # ---- the controller's looks -------------------------------------------------------------
    def record_look(self, n: int, step: int, findings: list[str], keep: int) -> None:
        """Record the controller's look number `n` at the run (the findings it saw at `step`; a look
        that saw none is not written), keeping the looks of the newest `keep`. How long a finding
        has held gates decisions (swarm.decisions.persistence), so it survives a controller restart."""
        if not findings:
            return
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO looks(n, step, time, findings) VALUES (?,?,?,?)",
                       (int(n), int(step), time.time(), dumps(sorted(set(findings)))))
            db.execute("DELETE FROM looks WHERE n <= ?", (int(n) - keep,))

    def last_look(self) -> int:
        """The newest recorded look's number (0 before the first)."""
        return int(self._rows("SELECT COALESCE(MAX(n), 0) AS n FROM looks")[0]["n"])

    def onsets(self, seen: dict[str, int | None]) -> dict[str, int]:
        """The step each finding of a look names as the first whose data changed, kept over the
        looks while the finding holds: `seen` maps this look's findings to the step its evidence
        names (None where it names none). A finding this look does not see is forgotten; of two
        steps named for one finding the earlier is kept. Returns finding -> step, for this look's."""
        with self._tx() as db:
            db.execute(f"DELETE FROM onsets WHERE finding NOT IN ({','.join('?' * len(seen))})", list(seen))
            for finding, step in seen.items():
                if step is not None:
                    db.execute("INSERT INTO onsets(finding, step) VALUES (?, ?) ON CONFLICT(finding) "
                               "DO UPDATE SET step = MIN(step, excluded.step)", (finding, int(step)))
        return {r["finding"]: int(r["step"]) for r in self._rows("SELECT * FROM onsets")}

    def newest_look(self) -> tuple[int, list[str]] | None:
        """(look, findings) of the newest recorded look (looks that saw nothing are not recorded)."""
        rows = self._rows("SELECT n, findings FROM looks ORDER BY n DESC LIMIT 1")
        return (int(rows[0]["n"]), json.loads(rows[0]["findings"])) if rows else None

    def sightings(self, finding: str) -> list[tuple[int, int, float]]:
        """(look, step, time) of the kept looks that saw `finding`, oldest first."""
        return [(int(r["n"]), int(r["step"]), float(r["time"])) for r in self._rows("SELECT * FROM looks ORDER BY n")
                if finding in json.loads(r["findings"])]

    # ---- timeline -----------------------------------------------------------------------------
    def log(self, kind: str, **data: Any) -> int:
        """Append a decision/event to the timeline; returns its sequence number."""
        with self._tx() as db:
            cur = db.execute("INSERT INTO timeline(time, kind, data) VALUES (?,?,?)",
                             (time.time(), kind, dumps(data)))
        return int(cur.lastrowid)

    def last_seq(self) -> int:
        """The newest timeline row's sequence number (0 for an empty timeline)."""
        return int(self._rows("SELECT COALESCE(MAX(seq), 0) AS n FROM timeline")[0]["n"])

    def timeline(self, kind: str | None = None, since: int = 0) -> list[dict[str, Any]]:
        """Timeline rows oldest first, each `{"seq", "time", "kind", **data}`; `since` = only rows
        with a larger sequence number (for tailing)."""
        q, args = "SELECT * FROM timeline WHERE seq > ?", [since]
        if kind is not None:
            q += " AND kind = ?"
            args.append(kind)
        rows = self._rows(q + " ORDER BY seq", args)
        return [{**json.loads(r["data"]), "seq": r["seq"], "time": r["time"], "kind": r["kind"]} for r in rows]


# ---- the controller lock ------------------------------------------------------------------------
class WorkspaceLocked(SwarmlabError, RuntimeError):
    """Another live controller holds this workspace."""

    def __init__(self, workspace: pathlib.Path, pid: int | None) -> None:
        self.workspace, self.pid = workspace, pid
        who = f"pid {pid}" if pid is not None else "another process (pid not yet written)"
        super().__init__(f"workspace {str(workspace)!r} is locked by a running controller ({who}); "
                         f"stop it with `swarm stop` or wait for it to finish")


class ControllerLock:
    """An exclusive flock held for the life of this object (or the process)."""

    def __init__(self, path: pathlib.Path, fd: int) -> None:
        self.path, self._fd = path, fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> "ControllerLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def lock_holder(workspace: str | os.PathLike) -> int | None:
    """The pid written by the controller that holds (or last held) the lock, if any."""
    path = pathlib.Path(_ws_dir(workspace)) / SWARM_DIR / LOCK_NAME
    try:   # not through a link, never blocking on a FIFO
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    finally:
        os.close(fd)
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _ws_dir(workspace: Any) -> pathlib.Path:
    if isinstance(workspace, (str, os.PathLike)):
        return pathlib.Path(workspace)
    return pathlib.Path(workspace.root)   # a Workspace


def acquire_lock(workspace: str | os.PathLike | Any) -> ControllerLock:
    """Take the workspace's controller lock without blocking. `workspace` is a directory or a
    `Workspace`. Raises `WorkspaceLocked` naming the holder's pid if another controller has it."""
    ws = _ws_dir(workspace)
    path = ws / SWARM_DIR / LOCK_NAME
    from sandboxes.private import open_private_fd, private_dir

    private_dir(path.parent)
    fd = open_private_fd(path, os.O_RDWR)   # 0600, never a link's target: the truncation below stays here
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise WorkspaceLocked(ws, lock_holder(ws)) from None
    # holding the lock: record who we are (readers tolerate the brief empty file)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return ControllerLock(path, fd)
