"""The policy being trained, behind one interface for the built-in model and HF causal LMs.

Sequences are laid out as `[left-padded prompt][completion, right-padded]` both when sampling and
when scoring, so the rotary positions and attention masks seen at generation time are exactly
those used for the log-probs (positions count real tokens only).
"""
from __future__ import annotations

import dataclasses
import pathlib

import torch
import torch.nn.functional as F

from trainer.config import ModelConfig
from trainer.model import TinyLM
from trainer.tokenizer import CharTokenizer, HFTokenizer, Tokenizer


@dataclasses.dataclass
class Batch:
    ids: torch.Tensor        # (B, T) prompt + completion, left-padded prompt, right-padded completion
    attn: torch.Tensor       # (B, T) 1 on real tokens
    positions: torch.Tensor  # (B, T) rotary positions
    loss_mask: torch.Tensor  # (B, T) 1 on completion tokens (the ones scored)
    prompt_len: int          # width of the prompt block


def positions_from_mask(attn: torch.Tensor) -> torch.Tensor:
    return (attn.long().cumsum(-1) - 1).clamp_min(0)


def build_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> Batch:
    assert len(prompts) == len(completions), "one completion per prompt"
    P = max(len(p) for p in prompts)
    C = max(1, max(len(c) for c in completions))
    B = len(prompts)
    ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + C), dtype=torch.long)
    lmask = torch.zeros((B, P + C), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) : P] = 1
        if c:
            ids[i, P : P + len(c)] = torch.tensor(c, dtype=torch.long)
            attn[i, P : P + len(c)] = 1
            lmask[i, P : P + len(c)] = 1.0
    return Batch(ids, attn, positions_from_mask(attn), lmask, P)


class Policy:
    """Wraps a model + tokenizer: hidden states, token log-probs, sampling."""

    def __init__(self, cfg: ModelConfig, tokenizer: Tokenizer, model: torch.nn.Module) -> None:
        self.cfg, self.tok, self.model = cfg, tokenizer, model
        self.is_hf = cfg.kind == "hf"

    @classmethod
    def build(cls, cfg: ModelConfig, seed: int = 0) -> "Policy":
        if cfg.kind == "builtin":
            tok = CharTokenizer()
            torch.manual_seed(seed)
            return cls(cfg, tok, TinyLM(cfg, tok.vocab_size))
        path = pathlib.Path(cfg.path or "")
        if not path.is_dir():
            raise ValueError(f"model.path={cfg.path!r}: directory not found")
        if not (path / "config.json").is_file():
            raise ValueError(f"model.path={cfg.path!r}: no config.json (not a Hugging Face model directory)")
        from transformers import AutoModelForCausalLM

        tok = HFTokenizer(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
        return cls(cfg, tok, model)

    # ---- scoring -------------------------------------------------------------------------
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.lm_head.weight if not self.is_hf else self.model.get_output_embeddings().weight

    def hidden(self, ids: torch.Tensor, attn: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not self.is_hf:
            return self.model(ids, attention_mask=attn, positions=positions)
        out = self.model.model(input_ids=ids, attention_mask=attn, position_ids=positions)
        return out.last_hidden_state

    def score_inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Hidden states for predicting tokens 1..T-1, their targets and mask:
        (B, T-1, D), (B, T-1), (B, T-1)."""
        h = self.hidden(batch.ids[:, :-1], batch.attn[:, :-1], batch.positions[:, :-1])
        return h, batch.ids[:, 1:], batch.loss_mask[:, 1:]

    # ---- sampling ------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_ids: set[int] | None = None,
                 generator: torch.Generator | None = None) -> tuple[list[list[int]], list[bool]]:
        """Sample completions. Returns token lists (ending with the stop/eos token when one was
        emitted) and a truncated flag per row (True = hit max_new_tokens without stopping)."""
        was_training = self.model.training
        self.model.eval()
        stops = set(stop_ids or ()) | {self.tok.eos_id}
        B = len(prompts)
        P = max(len(p) for p in prompts)
        ids = torch.full((B, P), self.tok.pad_id, dtype=torch.long)
        attn = torch.zeros((B, P + max_new_tokens), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, P - len(p) : P] = 1
        pos = positions_from_mask(attn[:, :P])
        max_new_tokens = min(max_new_tokens, self._max_len() - P)
        if max_new_tokens <= 0:
            raise ValueError(f"prompt length {P} leaves no room to generate (model max length {self._max_len()})")
        out = torch.full((B, max_new_tokens), self.tok.pad_id, dtype=torch.long)
        done = torch.zeros(B, dtype=torch.bool)
        lengths = torch.full((B,), max_new_tokens, dtype=torch.long)
        state = self._prefill(ids, attn[:, :P], pos)
        logits = state["logits"]
        next_pos = pos[:, -1] + 1
        stop_t = torch.tensor(sorted(stops), dtype=torch.long)
        # Finished rows leave the decode batch (and the KV cache) once they are an eighth of it, so
        # the remaining steps spend no compute on them. `rows`: the prompt index of each batch row.
        rows = torch.arange(B)
        for t in range(max_new_tokens):
            tok = sample_token(logits, temperature, top_p, generator)  # (b,) for the b batch rows
            live = ~done[rows]  # (b,) still generating before this token
            tok = torch.where(live, tok, torch.full_like(tok, self.tok.pad_id))
            out[rows, t] = tok
            newly = live & torch.isin(tok, stop_t)
            lengths[rows[newly]] = t + 1
            done[rows[newly]] = True
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            if 8 * int((~live | newly).sum()) >= len(rows):
                keep = (live & ~newly).nonzero().squeeze(-1)
                rows, tok, attn, next_pos, live = rows[keep], tok[keep], attn[keep], next_pos[keep], live[keep]
                self._select_rows(state, keep)
            attn[:, P + t] = live.long()  # the token just sampled is real for rows live before it
            logits = self._decode(state, tok, attn[:, : P + t + 1], next_pos)
            next_pos = next_pos + 1
        if was_training:
            self.model.train()
        comps = [out[i, : lengths[i]].tolist() for i in range(B)]
        return comps, (~done).tolist()

    def _max_len(self) -> int:
        if not self.is_hf:
            return self.cfg.max_seq_len
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    def _prefill(self, ids, attn, pos) -> dict:
        if not self.is_hf:
            cache = self.model.new_cache(ids.shape[0])
            h = self.model(ids, attention_mask=attn, cache=cache, positions=pos)
            return {"cache": cache, "logits": self.model.lm_head(h[:, -1])}
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        return {"past": out.past_key_values, "logits": out.logits[:, -1]}

    def _select_rows(self, state: dict, keep: torch.Tensor) -> None:
        """Keep only batch rows `keep` (1-D indices) of the KV cache."""
        if not self.is_hf:
            cache = state["cache"]
            cache.k = [k[keep] for k in cache.k]
            cache.v = [v[keep] for v in cache.v]
        elif isinstance(state["past"], tuple):  # legacy per-layer (key, value) tuples
            state["past"] = tuple(tuple(x[keep] for x in layer) for layer in state["past"])
        else:
            state["past"].reorder_cache(keep)

    def _decode(self, state: dict, tok: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        if not self.is_hf:
            cache = state["cache"]
            full = torch.zeros((attn.shape[0], cache.k[0].shape[2]), dtype=torch.long)
            full[:, : attn.shape[1]] = attn
            h = self.model(tok[:, None], attention_mask=full, cache=cache, positions=pos[:, None])
            return self.model.lm_head(h[:, -1])
        out = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=pos[:, None],
                         past_key_values=state["past"], use_cache=True)
        state["past"] = out.past_key_values
        return out.logits[:, -1]


def sample_token(logits: torch.Tensor, temperature: float, top_p: float,
                 generator: torch.Generator | None) -> torch.Tensor:
    """(B, V) logits → (B,) tokens. temperature 0 = greedy; nucleus sampling when top_p < 1."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = F.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        keep = sp.cumsum(-1) - sp < top_p  # always keeps the top token
        sp = sp * keep
        choice = torch.multinomial(sp / sp.sum(-1, keepdim=True), 1, generator=generator)
        return si.gather(-1, choice).squeeze(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
