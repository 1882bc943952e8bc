"""The swarm's memory on a real chromadb with the real offline MiniLM embedder, in a temp dir.

Episodes round-trip whole (NaN evidence included) through the log and the index; a truncation
episode outranks a loss-spike one for "completions truncated at max tokens"; filters, reopening,
a garbage chroma.sqlite3, a deleted chroma/ folder and a lost HNSW segment all end with every
episode back and `rebuilt` naming why. One `where` table runs against both stores (chroma with the
hashed embedder there: filters do not depend on the model). chromadb's downloading default
embedding function is booby-trapped for the whole module.
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from memory import (ChromaStore, Episode, Hit, InMemoryStore, Memory, MemoryCorrupt, MemoryStoreError,
                    hashed_embedder, library_root, minilm_embedder)
from memory.episodes import signature

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_chroma_default_embedder(monkeypatch):
    from chromadb.api.types import DefaultEmbeddingFunction
    from chromadb.utils.embedding_functions import ONNXMiniLM_L6_V2

    def refuse(*a, **k):
        raise AssertionError("chromadb's default embedding function was called (it downloads)")

    monkeypatch.setattr(DefaultEmbeddingFunction, "__call__", refuse)
    monkeypatch.setattr(ONNXMiniLM_L6_V2, "__call__", refuse)


@pytest.fixture(scope="module")
def minilm():
    emb = minilm_embedder()
    assert len(emb(["warm up"])[0]) == 384  # loads the model once for the module (~5 s)
    return emb


def make_ep(n: int = 1, **over) -> Episode:
    base = dict(
        id=f"ws/iv-{n}", workspace="ws", task="addition", operator="diagnostics", policy="builtin",
        diagnosis="truncation", diagnosis_summary="answers cut off, truncation_rate 1.0",
        kind="harness_edit", changes={"harness.sampling.max_new_tokens": 16}, outcome="kept",
        effect=0.4, p_value=0.01, window={"loss": [0.9, float("nan")], "truncation_rate": 1.0},
        skills_used=["raise-max-tokens"], step=10 * n, time=1000.0 + n,
    )
    base.update(over)
    base.setdefault("signature", signature(base["diagnosis"], base["kind"], base["changes"]))
    return Episode(**base)


LOSS_SPIKE = dict(diagnosis="loss_spike", diagnosis_summary="loss spiked 40x at step 120",
                  kind="recipe_edit", changes={"recipe.lr": 1e-4}, outcome="rolled_back", effect=-0.1)


def same(a: Episode, b: Episode) -> bool:
    return a.dump() == b.dump()  # NaN != NaN, so compare the canonical JSON


# ---------------------------------------------------------------------------------------------
# The real index: chromadb + MiniLM.


def test_round_trip_and_semantic_ranking(tmp_path, minilm):
    mem = Memory.open(tmp_path / "mem", embedder=minilm)
    assert isinstance(mem.store, ChromaStore) and mem.rebuilt is None
    trunc, spike = make_ep(1), make_ep(2, **LOSS_SPIKE)
    assert mem.record_episode(trunc) and mem.record_episode(spike)
    hits = mem.similar_episodes("completions truncated at max tokens", n=5)
    assert [e.id for e, _ in hits] == [trunc.id, spike.id]
    assert 0.0 <= hits[0][1] < hits[1][1] <= 2.0
    assert same(hits[0][0], trunc) and math.isnan(hits[0][0].window["loss"][1])
    # the index holds the document and flat metadata
    (hit,) = mem.store.get("episodes", [trunc.id])
    assert hit.document == trunc.document() and hit.metadata == trunc.metadata() and hit.distance == 0.0
    # metadata filters on the index
    assert [e.id for e, _ in mem.similar_episodes("truncated", where={"outcome": "rolled_back"})] == [spike.id]
    assert [e.id for e, _ in mem.similar_episodes("truncated", where={"effect": {"$gt": 0}, "task": "addition"})] == [trunc.id]
    assert mem.similar_episodes("truncated", where={"task": "countdown"}) == []
    mem.close()
    # persistence across reopen: nothing rebuilt, same answers
    mem = Memory.open(tmp_path / "mem", embedder=minilm)
    assert mem.rebuilt is None and mem.store.count("episodes") == 2
    assert [e.id for e, _ in mem.similar_episodes("completions truncated at max tokens")] == [trunc.id, spike.id]
    assert [e.id for e in mem.episodes()] == [trunc.id, spike.id]
    mem.close()


def test_reports_and_skills_on_chroma(tmp_path, minilm):
    with Memory.open(tmp_path / "mem", embedder=minilm) as mem:
        mem.record_report("ws/report-1", "Raising max_new_tokens to 16 fixed truncated answers.", {"workspace": "ws"})
        mem.record_report("ws/report-2", "The learning rate was too high; loss diverged.", {"workspace": "ws"})
        mem.index_skills([
            ("raise-max-tokens", "When completions are cut off at the token limit, raise max_new_tokens.", {"area": "harness"}),
            ("lower-lr", "When the loss spikes or diverges, lower the learning rate.", {"area": "recipe"}),
        ])
        assert mem.search_reports("answers were cut short")[0].id == "ws/report-1"
        assert [h.id for h in mem.search_skills("outputs truncated at the length limit", n=1)] == ["raise-max-tokens"]
        assert [h.id for h in mem.search_skills("anything", where={"area": "recipe"})] == ["lower-lr"]
        assert mem.skill_names() == {"raise-max-tokens", "lower-lr"}
        mem.drop_skills(["lower-lr"])
        assert mem.skill_names() == {"raise-max-tokens"}
    with Memory.open(tmp_path / "mem", embedder=minilm) as mem:
        assert mem.rebuilt is None and mem.skill_names() == {"raise-max-tokens"}
        assert mem.search_reports("loss diverged", n=1)[0].id == "ws/report-2"


def test_garbage_sqlite_is_moved_aside_and_rebuilt(tmp_path, minilm, caplog):
    root = tmp_path / "mem"
    with Memory.open(root, embedder=minilm) as mem:
        mem.record_episodes([make_ep(1), make_ep(2, **LOSS_SPIKE)])
        mem.record_report("ws/r", "a report", {"workspace": "ws"})
    (root / "chroma" / "chroma.sqlite3").write_bytes(b"this is not a database\n" * 2000)
    with caplog.at_level(logging.WARNING, logger="memory"):
        mem = Memory.open(root, embedder=minilm)
    assert mem.rebuilt and "not a database" in mem.rebuilt
    assert "rebuilding" in caplog.text and "not a database" in caplog.text
    (aside,) = root.glob("chroma.corrupt-*")
    assert (aside / "chroma.sqlite3").read_bytes().startswith(b"this is not")  # the user's bytes kept
    assert [e.id for e, _ in mem.similar_episodes("completions truncated at max tokens")] == ["ws/iv-1", "ws/iv-2"]
    assert [h.id for h in mem.search_reports("report")] == ["ws/r"]
    mem.close()
    with Memory.open(root, embedder=minilm) as mem:  # the rebuilt index is trusted next time
        assert mem.rebuilt is None and mem.store.count("episodes") == 2


def test_deleted_or_emptied_index_is_rebuilt_never_silently_empty(tmp_path, minilm):
    root = tmp_path / "mem"
    with Memory.open(root, embedder=minilm) as mem:
        mem.record_episodes([make_ep(i) for i in range(1, 4)])
    shutil.rmtree(root / "chroma")
    with Memory.open(root, embedder=minilm) as mem:
        assert mem.rebuilt and "lacks 3 of the 3 episodes" in mem.rebuilt
        assert mem.store.count("episodes") == 3 and len(mem.similar_episodes("truncation")) == 3
        assert not list(root.glob("chroma.corrupt-*"))  # only the folder this open created went
        mem.store.delete("episodes", ["ws/iv-2"])  # an index that lost a record
    with Memory.open(root, embedder=minilm) as mem:
        assert mem.rebuilt and "lacks 1 of the 3 episodes" in mem.rebuilt
        assert mem.store.count("episodes") == 3
        assert len(list(root.glob("chroma.corrupt-*"))) == 1


# ---------------------------------------------------------------------------------------------
# Chroma-specific failure modes, with the hashed embedder (fast; no model involved).


def test_lost_hnsw_segment_and_truncated_sqlite(tmp_path):
    root = tmp_path / "mem"
    eps = [make_ep(i, diagnosis_summary=f"summary {i}") for i in range(1200)]  # > chroma's 1000 sync threshold
    with Memory.open(root, embedder=hashed_embedder()) as mem:
        assert mem.record_episodes(eps) == 1200
    for seg in (root / "chroma").iterdir():
        if seg.is_dir():
            shutil.rmtree(seg)
    with Memory.open(root, embedder=hashed_embedder()) as mem:
        # chroma either errors reading it back or answers with too few neighbours; both rebuild
        assert mem.rebuilt and "'episodes'" in mem.rebuilt
        assert len(mem.similar_episodes("summary 7", n=10)) == 10
    db = root / "chroma" / "chroma.sqlite3"
    with db.open("r+b") as f:
        f.truncate(db.stat().st_size // 3)
    with Memory.open(root, embedder=hashed_embedder()) as mem:
        assert mem.rebuilt and "malformed" in mem.rebuilt
        assert mem.store.count("episodes") == 1200


def test_embedder_swap_rebuilds(tmp_path, minilm):
    root = tmp_path / "mem"
    with Memory.open(root, embedder=hashed_embedder()) as mem:
        mem.record_episode(make_ep(1))
    with Memory.open(root, embedder=minilm) as mem:
        assert mem.rebuilt and "hashed-bow-256" in mem.rebuilt and "all-MiniLM-L6-v2" in mem.rebuilt
        assert len(mem.store.query("episodes", "truncation")) == 1


def test_two_processes_one_after_the_other(tmp_path):
    root = tmp_path / "mem"
    with Memory.open(root, embedder=hashed_embedder()) as mem:
        mem.record_episode(make_ep(1))
    child = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        from memory import Memory, hashed_embedder
        from memory.episodes import Episode
        with Memory.open({str(root)!r}, embedder=hashed_embedder()) as mem:
            assert mem.rebuilt is None, mem.rebuilt
            ep = mem.episodes()[0].model_copy(update={{"id": "ws/iv-child", "outcome": "rejected"}})
            assert mem.record_episode(ep)
            print(len(mem.similar_episodes("truncation", n=10)))
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"
    with Memory.open(root, embedder=hashed_embedder()) as mem:
        assert mem.rebuilt is None
        assert {e.id for e, _ in mem.similar_episodes("truncation", n=10)} == {"ws/iv-1", "ws/iv-child"}


def test_chroma_store_basics(tmp_path):
    s = ChromaStore(tmp_path / "c", embedder=hashed_embedder())
    assert s.query("empty", "anything") == [] and s.count("empty") == 0
    s.upsert("docs", ["a", "b", "c"], ["red apple", "green apple", "blue sky"], [{"n": 1}, {}, {"n": 3}])
    assert [h.id for h in s.query("docs", "red apple", n=50)][0] == "a"  # n above the count is fine
    assert len(s.query("docs", "apple", n=50)) == 3
    assert [h.id for h in s.get("docs", ["c", "zz", "a"])] == ["c", "a"]  # asked order, missing skipped
    assert s.get("docs", ["b"])[0].metadata == {}
    s.delete("docs", ["a", "missing"])
    assert s.count("docs") == 2
    s.close()
    s.close()  # idempotent
    with pytest.raises(MemoryStoreError, match="closed"):
        s.count("docs")


# ---------------------------------------------------------------------------------------------
# `where` semantics: one table, both stores.

RECORDS = {
    "i1": {"k": 1, "s": "a", "n": 10},
    "f15": {"k": 1.5, "s": "b", "n": 11},
    "b": {"k": True, "s": "a"},
    "s1": {"k": "1"},
    "none": {"other": 1},
}

WHERE = [
    ({"k": 1}, {"i1"}),
    ({"k": 1.0}, {"i1"}),
    ({"k": True}, {"b"}),
    ({"k": "1"}, {"s1"}),
    ({"k": {"$eq": 1.5}}, {"f15"}),  # chromadb alone also matches k=1 here (truncates 1.5)
    ({"k": 1.5}, {"f15"}),
    ({"n": {"$lt": 10.5}}, {"i1"}),  # chromadb alone compares ints with 10 here
    ({"n": {"$gt": 10.5}}, {"f15"}),
    ({"n": {"$in": [11.0]}}, {"f15"}),
    ({"k": {"$ne": 1}}, {"f15", "b", "s1", "none"}),  # $ne matches records without the key
    ({"k": {"$in": [1, 1.5]}}, {"i1", "f15"}),  # mixed int/float list
    ({"k": {"$in": [True]}}, {"b"}),
    ({"k": {"$nin": [1]}}, {"f15", "b", "s1", "none"}),
    ({"k": {"$gt": 1}}, {"f15"}),
    ({"k": {"$gte": 1}}, {"i1", "f15"}),  # numbers only: not the bool, not the string
    ({"k": {"$lt": 1.5}}, {"i1"}),
    ({"k": {"$lte": 1.5}}, {"i1", "f15"}),
    ({"k": {"$gte": 1, "$lt": 1.5}}, {"i1"}),  # several operators -> $and
    ({"k": 1, "s": "a"}, {"i1"}),  # several keys -> $and
    ({"$and": [{"s": "a"}, {"k": {"$ne": 1}}]}, {"b"}),
    ({"$or": [{"k": 1}, {"other": 1}]}, {"i1", "none"}),
    ({"$or": [{"s": "b"}]}, {"f15"}),  # one clause
    ({"$or": [{"$and": [{"s": "a"}, {"k": True}]}, {"k": "1"}]}, {"b", "s1"}),
    ({}, set(RECORDS)),
    ({"missing": {"$eq": 1}}, set()),
]

BAD_WHERE = [
    {"k": None}, {"k": [1, 2]}, {"k": {"$in": []}}, {"k": {"$in": [1, "1"]}}, {"k": {"$gt": "a"}},
    {"k": {"$gt": True}}, {"k": {"$contains": "x"}}, {"$and": []}, {"$and": {"k": 1}}, {"$not": {"k": 1}},
    {"k": {}}, "k=1",
]


@pytest.fixture(scope="module", params=["memory", "chroma"])
def filled_store(request, tmp_path_factory):
    if request.param == "memory":
        s = InMemoryStore()
    else:
        s = ChromaStore(tmp_path_factory.mktemp("where") / "chroma", embedder=hashed_embedder())
    s.upsert("recs", list(RECORDS), [f"record {k}" for k in RECORDS], list(RECORDS.values()))
    yield s
    s.close()


@pytest.mark.parametrize("where,expected", WHERE, ids=[json.dumps(w) for w, _ in WHERE])
def test_where_semantics(filled_store, where, expected):
    got = filled_store.get("recs", where=where)
    assert {h.id for h in got} == expected
    for h in got:  # metadata comes back with its types (chroma stores numbers as floats)
        assert h.metadata == RECORDS[h.id]
        assert {k: type(v) for k, v in h.metadata.items()} == {k: type(v) for k, v in RECORDS[h.id].items()}
    assert {h.id for h in filled_store.query("recs", "record", n=10, where=where)} == expected


@pytest.mark.parametrize("where", BAD_WHERE, ids=[json.dumps(w) for w in BAD_WHERE])
def test_bad_where_is_a_value_error(filled_store, where):
    with pytest.raises(ValueError):
        filled_store.get("recs", where=where)
    with pytest.raises(ValueError):
        filled_store.query("recs", "record", where=where)


@pytest.mark.parametrize("meta,key", [({"k": [1]}, "k"), ({"x": None}, "x"), ({"e": float("nan")}, "e"),
                                      ({"d": {"a": 1}}, "d"), ({"i": float("inf")}, "i"),
                                      ({"_int_keys": "x"}, "_int_keys"), ({"big": 2**60}, "big")])
@pytest.mark.parametrize("kind", ["memory", "chroma"])
def test_bad_metadata_names_the_key(tmp_path, kind, meta, key):
    s = InMemoryStore() if kind == "memory" else ChromaStore(tmp_path / "c", embedder=hashed_embedder())
    with pytest.raises(ValueError, match=repr(key)):
        s.upsert("recs", ["a"], ["doc"], [meta])
    assert s.count("recs") == 0
    s.close()


def test_upsert_input_checks():
    s = InMemoryStore()
    with pytest.raises(ValueError, match="same length"):
        s.upsert("recs", ["a", "b"], ["x"], [{}])
    with pytest.raises(ValueError, match="twice"):
        s.upsert("recs", ["a", "a"], ["x", "y"], [{}, {}])
    with pytest.raises(ValueError, match="collection name"):
        s.upsert("a", ["a"], ["x"], [{}])
    with pytest.raises(ValueError, match="n=-1"):
        s.query("recs", "x", n=-1)
    s.upsert("recs", ["a"], ["x"], [{}])
    assert s.query("recs", "x", n=0) == []


# ---------------------------------------------------------------------------------------------
# Episodes and the log (in-memory index).


def test_numpy_in_the_window_is_logged_as_plain_json(tmp_path):
    np = pytest.importorskip("numpy")
    with Memory.open(tmp_path / "mem", backend="memory") as mem:
        assert mem.record_episode(make_ep(1, window={"acc": np.float32(0.5), "rows": np.arange(3), "n": np.int64(7)}))
        assert not mem.record_episode(make_ep(1, window={"acc": np.float32(0.5), "rows": np.arange(3), "n": np.int64(7)}))
    with Memory.open(tmp_path / "mem", backend="memory") as mem:
        assert mem.episodes()[0].window == {"acc": 0.5, "rows": [0, 1, 2], "n": 7}


def test_episode_validation_and_views():
    with pytest.raises(ValidationError):
        make_ep(step="ten")
    with pytest.raises(ValidationError):
        make_ep(outcome="won")
    with pytest.raises(ValidationError):
        make_ep(colour="red")  # extra="forbid"
    ep = make_ep(1, effect=None)
    meta = ep.metadata()
    assert "effect" not in meta and meta["skills_used"] == "raise-max-tokens"
    assert meta["signature"] == "truncation|harness_edit|harness.sampling.max_new_tokens"
    assert all(isinstance(v, (str, int, float, bool)) for v in meta.values())
    assert make_ep(1, effect=float("nan")).metadata().get("effect") is None
    doc = make_ep(1).document()
    for part in ("truncation", "answers cut off", "harness_edit", "max_new_tokens = 16", "kept", "+0.4", "addition"):
        assert part in doc


@pytest.mark.parametrize("outcome,effect,won,lost", [
    ("kept", 0.2, True, False), ("rolled_back", 0.2, False, True), ("rejected", None, False, True),
    ("rejected", -0.1, False, True), ("rejected", 0.0, False, True), ("rejected", 0.3, False, False),
    ("rejected", float("nan"), False, True),
])
def test_won_lost(outcome, effect, won, lost):
    ep = make_ep(outcome=outcome, effect=effect)
    assert (ep.won(), ep.lost()) == (won, lost)
    if outcome == "rejected":   # a backtest whose arms all measured the same value: no evidence either way
        assert not make_ep(outcome=outcome, effect=effect).model_copy(update={"measured_nothing": True}).lost()


def test_record_is_idempotent_and_latest_wins(tmp_path):
    root = tmp_path / "mem"
    mem = Memory.open(root, backend="memory")
    assert mem.record_episode(make_ep(1)) is True
    assert mem.record_episode(make_ep(1)) is False  # identical (NaN in the window included)
    assert mem.record_episode(make_ep(1, outcome="rolled_back", effect=-0.2)) is True
    assert mem.record_episode(make_ep(2, **LOSS_SPIKE)) is True
    assert len((root / "episodes.jsonl").read_text().splitlines()) == 3
    assert [(e.id, e.outcome) for e in mem.episodes()] == [("ws/iv-1", "rolled_back"), ("ws/iv-2", "rolled_back")]
    assert [e.id for e in mem.episodes(where={"diagnosis": "truncation"})] == ["ws/iv-1"]
    assert [e.id for e in mem.episodes(where={"step": {"$gte": 20}})] == ["ws/iv-2"]
    assert mem.store.count("episodes") == 2
    assert mem.store.get("episodes", ["ws/iv-1"])[0].metadata["outcome"] == "rolled_back"
    with pytest.raises(TypeError):
        mem.record_episode(make_ep(3).model_dump())
    mem.close()
    mem = Memory.open(root, backend="memory")
    assert [(e.id, e.outcome) for e in mem.episodes()] == [("ws/iv-1", "rolled_back"), ("ws/iv-2", "rolled_back")]
    assert mem.record_episode(make_ep(2, **LOSS_SPIKE)) is False
    mem.close()


def test_torn_log_line_is_skipped_and_the_next_append_is_safe(tmp_path, caplog):
    root = tmp_path / "mem"
    with Memory.open(root, backend="memory") as mem:
        mem.record_episodes([make_ep(1), make_ep(2)])
    log_path = root / "episodes.jsonl"
    with log_path.open("a") as f:
        f.write(make_ep(3).dump()[:57])  # a crash mid-write: no newline
    with caplog.at_level(logging.WARNING, logger="memory"):
        mem = Memory.open(root, backend="memory")
    assert f"{log_path} line 3" in caplog.text
    assert [e.id for e in mem.episodes()] == ["ws/iv-1", "ws/iv-2"]
    assert mem.record_episode(make_ep(4))
    mem.close()
    lines = log_path.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[3])["id"] == "ws/iv-4"
    with log_path.open("a") as f:
        f.write(json.dumps({"id": "ws/x", "task": 3}) + "\n")  # JSON, but not an episode
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memory"):
        mem = Memory.open(root, backend="memory")
    assert "line 3" in caplog.text and "line 5" in caplog.text
    assert [e.id for e in mem.episodes()] == ["ws/iv-1", "ws/iv-2", "ws/iv-4"]
    mem.close()


def test_reports_skills_and_retrievals_in_memory(tmp_path):
    root = tmp_path / "mem"
    with Memory.open(root, backend="memory") as mem:
        mem.record_report("r1", "truncation fixed by raising max_new_tokens", {"workspace": "ws", "step": 3})
        mem.record_report("r1", "truncation fixed by raising max_new_tokens", {"workspace": "ws", "step": 3})
        mem.record_report("r2", "loss spike fixed by lowering lr", {"workspace": "other"})
        assert len((root / "reports.jsonl").read_text().splitlines()) == 2
        assert mem.search_reports("max_new_tokens truncation")[0].id == "r1"
        assert [h.id for h in mem.search_reports("fixed", where={"workspace": "other"})] == ["r2"]
        with pytest.raises(ValueError, match="'tags'"):
            mem.record_report("r3", "text", {"tags": ["a"]})
        mem.index_skills([("raise-max-tokens", "raise max_new_tokens when truncated", {"uses": 0}),
                          ("lower-lr", "lower lr on loss spike", {"uses": 2})])
        assert isinstance(mem.search_skills("truncated")[0], Hit)
        assert mem.search_skills("truncated")[0].id == "raise-max-tokens"
        assert [h.id for h in mem.search_skills("x", where={"uses": {"$gt": 0}})] == ["lower-lr"]
        mem.log_retrieval(["raise-max-tokens", "lower-lr"], "truncation at step 10")
        mem.log_retrieval(["raise-max-tokens"], "truncation at step 20")
        assert mem.retrievals() == {"raise-max-tokens": 2, "lower-lr": 1}
    with Memory.open(root, backend="memory") as mem:  # reports come back from the log
        assert mem.search_reports("loss spike", n=1)[0].id == "r2"
        assert mem.skill_names() == set()  # skills are the skills library's to re-index
        assert mem.retrievals()["raise-max-tokens"] == 2


def test_library_root(tmp_path, monkeypatch):
    monkeypatch.delenv("SWARMLAB_LIBRARY", raising=False)
    assert library_root(tmp_path / "ws") == tmp_path / "ws" / ".swarm" / "memory"
    monkeypatch.setenv("SWARMLAB_LIBRARY", str(tmp_path / "lib"))
    assert library_root(tmp_path / "ws") == tmp_path / "lib"
    assert library_root(tmp_path / "ws", shared=tmp_path / "shared") == tmp_path / "shared"


def test_bad_backend_and_exceptions():
    with pytest.raises(ValueError, match="backend"):
        Memory.open("/nonexistent-never-created", backend="redis")  # type: ignore[arg-type]
    assert issubclass(MemoryCorrupt, MemoryStoreError) and issubclass(MemoryStoreError, RuntimeError)
    assert not os.path.exists("/nonexistent-never-created")
