"""`Memory`: one memory root folder — append-only JSONL logs (the source of truth) plus a vector
index over them (chromadb in `chroma/`, rebuilt from the logs whenever it cannot be trusted).

    root/episodes.jsonl     one Episode per line; a changed episode is appended again, latest wins
    root/reports.jsonl      {"id", "text", "metadata", "time"} per line, latest per id wins
    root/retrievals.jsonl   {"time", "skills", "context"}: which skills were handed to an agent
    root/chroma/            the index: collections "episodes", "reports", "skills"

Skills are not logged here (they live as SKILL.md files in the skills library, which indexes them
through `index_skills`); after a rebuild (`memory.rebuilt` is set) the caller re-indexes them.

On open (chroma backend) the index is checked: if the client cannot open it, a collection cannot
be read back, or it lacks episodes or reports that the logs hold (the folder was deleted or
emptied), `chroma/` is moved aside to `chroma.corrupt-<timestamp>/` (never deleted) and a fresh
index is built from the logs. A corrupt log line (a half-written last line after a crash) is
skipped with a warning naming file and line; the next append starts on a fresh line.

One process at a time: a Memory may be opened by one process after another (`close()` releases
the index), but two processes writing at once is not supported — chromadb's sqlite and HNSW files
are not safe for concurrent writers, and the logs take no lock.

    mem = Memory.open(library_root(workspace))
    mem.record_episode(ep)
    for ep, dist in mem.similar_episodes("completions truncated at max tokens", where={"task": "addition"}):
        ...
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from memory.episodes import Episode, dumps
from memory.store import (ChromaStore, Embedder, Hit, InMemoryStore, MemoryStoreError, VectorStore,
                          check_metadata, matches, normalize_where)

log = logging.getLogger(__name__)

EPISODES, REPORTS, SKILLS = "episodes", "reports", "skills"


def library_root(workspace: str | Path, shared: str | Path | None = None) -> Path:
    """Where a workspace's memory lives: `shared` if given (a user-level library shared across
    workspaces), else $SWARMLAB_LIBRARY if set, else <workspace>/.swarm/memory."""
    if shared is not None:
        return Path(shared).expanduser()
    env = os.environ.get("SWARMLAB_LIBRARY")
    if env:
        return Path(env).expanduser()
    return Path(workspace) / ".swarm" / "memory"


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each readable line; bad lines are skipped with a warning."""
    if not path.exists():
        return
    with path.open("rb") as f:
        for no, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
                if not isinstance(obj, dict):
                    raise ValueError(f"a JSON {type(obj).__name__}, not an object")
            except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                log.warning("%s line %d: skipped, not a JSON object (%s)", path, no, e)
                continue
            yield no, obj


def _append(path: Path, lines: list[str]) -> None:
    """Append whole lines and fsync. If a crash left the file without a final newline, start on a
    new line so the torn record does not swallow this one."""
    if not lines:
        return
    with path.open("ab") as f:
        if f.tell() > 0:
            with path.open("rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    f.write(b"\n")
        f.write("".join(line + "\n" for line in lines).encode())
        f.flush()
        os.fsync(f.fileno())


class Memory:
    """A memory root folder: episodes.jsonl and reports.jsonl (append-only logs, the source of
    truth), chroma/ (the index)."""

    root: Path
    store: VectorStore
    rebuilt: str | None

    def __init__(self, root: Path, store: VectorStore, backend: str, embedder: Embedder | None) -> None:
        self.root, self.store, self.rebuilt = root, store, None
        self._backend, self._embedder = backend, embedder
        self._made_index = False  # chroma/ was created by this open: nothing of the user's in it
        self._episodes: dict[str, Episode] = {}
        self._episode_lines: dict[str, str] = {}
        self._reports: dict[str, dict[str, Any]] = {}
        self._report_lines: dict[str, str] = {}

    # -- files ---------------------------------------------------------------------------------
    @property
    def episodes_path(self) -> Path:
        return self.root / "episodes.jsonl"

    @property
    def reports_path(self) -> Path:
        return self.root / "reports.jsonl"

    @property
    def retrievals_path(self) -> Path:
        return self.root / "retrievals.jsonl"

    @property
    def index_path(self) -> Path:
        return self.root / "chroma"

    # -- open / rebuild --------------------------------------------------------------------------
    @classmethod
    def open(cls, root: str | Path, backend: Literal["chroma", "memory"] = "chroma",
             embedder: Embedder | None = None) -> Memory:
        if backend not in ("chroma", "memory"):
            raise ValueError(f"Memory.open: backend={backend!r}; expected 'chroma' or 'memory'")
        root = Path(root)
        from sandboxes.private import private_dir

        private_dir(root)   # episodes, reports and skills: 0700 whatever the umask
        mem = cls(root, None, backend, embedder)  # type: ignore[arg-type]
        mem._load_logs()
        if backend == "memory":
            mem.store = InMemoryStore(embedder)
            mem._reindex()
            return mem
        reason = None
        mem._made_index = not mem.index_path.exists()
        try:
            mem.store = ChromaStore(mem.index_path, embedder)
            reason = mem._index_problem()
        except MemoryStoreError as e:
            reason = str(e)
        if reason:
            mem.rebuild(reason)
        mem._made_index = False
        return mem

    def _index_problem(self) -> str | None:
        """Why the index cannot be trusted, or None. Raises MemoryStoreError if it cannot be read."""
        for col, held in ((EPISODES, self._episodes), (REPORTS, self._reports)):
            self.store.check(col)
            ids = set(self.store.ids(col))
            missing = held.keys() - ids
            if missing:
                return (f"the index lacks {len(missing)} of the {len(held)} {col} in {col}.jsonl "
                        f"(it holds {len(ids)})")
            if ids - held.keys():
                log.warning("memory %s: the index holds %d %s that %s.jsonl lacks (log truncated?); "
                            "keeping them", self.root, len(ids - held.keys()), col, col)
        self.store.check(SKILLS)
        return None

    def rebuild(self, reason: str) -> None:
        """Move the index aside (chroma.corrupt-<timestamp>/, never deleted), build a fresh one from
        the logs. Skills are re-indexed by the caller (`index_skills`)."""
        log.warning("memory %s: rebuilding the index from the logs: %s", self.root, reason)
        old = getattr(self, "store", None)
        if old is not None:
            old.close()
        if self._backend == "memory":
            self.store = InMemoryStore(self._embedder)
        else:
            if self.index_path.exists() and self._made_index:
                shutil.rmtree(self.index_path)
            elif self.index_path.exists():
                stamp = time.strftime("%Y%m%d-%H%M%S")
                aside = self.root / f"chroma.corrupt-{stamp}"
                k = 1
                while aside.exists():
                    k += 1
                    aside = self.root / f"chroma.corrupt-{stamp}-{k}"
                shutil.move(str(self.index_path), str(aside))
                log.warning("memory %s: the old index is kept at %s", self.root, aside)
            self.store = ChromaStore(self.index_path, self._embedder)
        self._made_index = False
        self._reindex()
        self.rebuilt = reason

    def _reindex(self) -> None:
        eps = list(self._episodes.values())
        self.store.upsert(EPISODES, [e.id for e in eps], [e.document() for e in eps],
                          [e.metadata() for e in eps])
        reps = list(self._reports.values())
        self.store.upsert(REPORTS, [r["id"] for r in reps], [r["text"] for r in reps],
                          [r["metadata"] for r in reps])

    def _load_logs(self) -> None:
        for no, obj in _read_jsonl(self.episodes_path):
            try:
                ep = Episode.model_validate(obj)
            except ValidationError as e:
                log.warning("%s line %d: skipped, not a valid episode (%s)", self.episodes_path, no,
                            str(e).splitlines()[0])
                continue
            self._episodes.pop(ep.id, None)  # re-insert: order = latest write
            self._episodes[ep.id] = ep
            self._episode_lines[ep.id] = ep.dump()
        for no, obj in _read_jsonl(self.reports_path):
            try:
                rep = self._report(obj.get("id"), obj.get("text"), obj.get("metadata"), obj.get("time"))
            except ValueError as e:
                log.warning("%s line %d: skipped, not a valid report (%s)", self.reports_path, no, e)
                continue
            self._reports[rep["id"]] = rep
            self._report_lines[rep["id"]] = self._report_key(rep)

    # -- episodes ------------------------------------------------------------------------------
    def record_episode(self, ep: Episode) -> bool:
        """Log and index an episode. Idempotent by id: recording identical content again is a
        no-op (False); changed content is appended and replaces the old version (True)."""
        return self.record_episodes([ep]) == 1

    def record_episodes(self, eps: list[Episode]) -> int:
        """`record_episode` for many at once (one log append, batched embedding); returns how many
        were new or changed. The log is written first: if indexing then fails, the error propagates
        and the next `open` finds the index short of the log and rebuilds it."""
        fresh: dict[str, tuple[Episode, str]] = {}
        for ep in eps:
            if not isinstance(ep, Episode):
                raise TypeError(f"record_episode needs an Episode, got {type(ep).__name__}")
            line = ep.dump()
            if self._episode_lines.get(ep.id) != line:
                fresh[ep.id] = (ep, line)
        if not fresh:
            return 0
        todo = list(fresh.values())
        _append(self.episodes_path, [line for _, line in todo])
        for ep, line in todo:
            self._episodes.pop(ep.id, None)
            self._episodes[ep.id] = ep
            self._episode_lines[ep.id] = line
        self.store.upsert(EPISODES, [e.id for e, _ in todo], [e.document() for e, _ in todo],
                          [e.metadata() for e, _ in todo])
        return len(todo)

    def episodes(self, where: dict | None = None) -> list[Episode]:
        """Episodes from the log (latest version per id) passing `where` on `metadata()`, oldest
        first by `time` (ties in log order)."""
        w = normalize_where(where)
        out = [e for e in self._episodes.values() if matches(w, e.metadata())]
        return sorted(out, key=lambda e: e.time)

    def episode(self, id: str) -> Episode | None:
        return self._episodes.get(id)

    def similar_episodes(self, text: str, n: int = 5, where: dict | None = None) -> list[tuple[Episode, float]]:
        """The `n` episodes nearest to `text` in the index, with cosine distance, nearest first."""
        out = []
        for hit in self.store.query(EPISODES, text, n, where):
            ep = self._episodes.get(hit.id)
            if ep is None:
                log.warning("memory %s: index hit %r is not in %s; skipped", self.root, hit.id,
                            self.episodes_path.name)
                continue
            out.append((ep, hit.distance))
        return out

    # -- reports -------------------------------------------------------------------------------
    @staticmethod
    def _report(id: Any, text: Any, metadata: Any, t: Any = None) -> dict[str, Any]:
        if not isinstance(id, str) or not id:
            raise ValueError(f"report id must be a non-empty str, got {id!r}")
        if not isinstance(text, str):
            raise ValueError(f"report {id!r}: text must be a str, got {type(text).__name__}")
        check_metadata(metadata, f"report {id!r} metadata")
        return {"id": id, "text": text, "metadata": dict(metadata),
                "time": float(t) if isinstance(t, (int, float)) else time.time()}

    @staticmethod
    def _report_key(rep: dict[str, Any]) -> str:
        return dumps({"id": rep["id"], "text": rep["text"], "metadata": rep["metadata"]})

    def record_report(self, id: str, text: str, metadata: dict) -> None:
        """Log and index a report; the same id with identical text and metadata is a no-op."""
        rep = self._report(id, text, metadata)
        key = self._report_key(rep)
        if self._report_lines.get(id) == key:
            return
        _append(self.reports_path, [dumps(rep)])
        self._reports[id], self._report_lines[id] = rep, key
        self.store.upsert(REPORTS, [id], [text], [rep["metadata"]])

    def search_reports(self, text: str, n: int = 5, where: dict | None = None) -> list[Hit]:
        return self.store.query(REPORTS, text, n, where)

    # -- skills (indexed here, owned by the skills library) ------------------------------------
    def index_skills(self, items: list[tuple[str, str, dict]]) -> None:
        """Upsert (skill name, document, metadata) into the "skills" collection."""
        if items:
            names, docs, metas = zip(*items)
            self.store.upsert(SKILLS, list(names), list(docs), list(metas))

    def drop_skills(self, names: list[str]) -> None:
        self.store.delete(SKILLS, list(names))

    def search_skills(self, text: str, n: int = 5, where: dict | None = None) -> list[Hit]:
        return self.store.query(SKILLS, text, n, where)

    def skill_names(self) -> set[str]:
        return set(self.store.ids(SKILLS))

    def log_retrieval(self, names: list[str], context: str) -> None:
        """Note that these skills were handed to an agent (for usage counts)."""
        _append(self.retrievals_path, [dumps({"time": time.time(), "skills": list(names),
                                              "context": context})])

    def retrievals(self) -> dict[str, int]:
        """How many times each skill was retrieved."""
        counts: dict[str, int] = {}
        for no, obj in _read_jsonl(self.retrievals_path):
            names = obj.get("skills")
            if not isinstance(names, list):
                log.warning("%s line %d: skipped, no skills list", self.retrievals_path, no)
                continue
            for name in names:
                if isinstance(name, str):
                    counts[name] = counts.get(name, 0) + 1
        return counts

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "store", None) is not None:
            self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
