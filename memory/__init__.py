"""The swarm's memory: past episodes (diagnosis → intervention → measured outcome), reports and
the skills index, searchable by meaning.

Why: an operator facing "answers cut off at max_new_tokens" should see what fixed (or failed to
fix) that before, in this workspace or another; the skills library needs the same retrieval.

How: `Memory.open(library_root(workspace))` opens a root folder whose append-only JSONL logs are
the source of truth and whose `chroma/` folder is a chromadb index over them (rebuilt from the
logs if it is corrupt or incomplete). Embeddings come from the offline all-MiniLM-L6-v2 wheel
(`minilm_embedder`), never from chromadb's downloading default. `InMemoryStore` (hashed bag of
words) stands in for chromadb in unit tests. One process at a time per root.
"""
from memory.episodes import Episode
from memory.memory import Memory, library_root
from memory.store import (ChromaStore, Embedder, Hit, InMemoryStore, MemoryCorrupt, MemoryStoreError,
                          VectorStore, hashed_embedder, minilm_embedder)

__all__ = ["Memory", "Episode", "Hit", "VectorStore", "InMemoryStore", "ChromaStore", "Embedder",
           "minilm_embedder", "hashed_embedder", "library_root", "MemoryStoreError", "MemoryCorrupt"]
