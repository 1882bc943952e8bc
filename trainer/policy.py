"""The policy being trained, behind one interface for the built-in model and HF causal LMs.

Sequences are laid out as `[left-padded prompt][completion, right-padded]` both when sampling and
when scoring, so the rotary positions and attention masks seen at generation time are exactly
those used for the log-probs (positions count real tokens only).

Shared prompts: GRPO samples every prompt `group_size` times, so a batch holds each prompt G times.
With `model.share_prompts` (run config, on by default; `Policy.share_prompts`) each distinct prompt
goes through the model once — in the prefill of `generate` and in the scoring forward of
`score_inputs` — and its KV cache is repeated to the rows that share it before the completions run
against it (when scoring, in groups of rows of similar completion length, `plan_chunks`, so most of
the completion block's right padding is not computed either). The result is the same function: the
completion tokens see the same keys/values, and in the backward pass the gradient reaching a shared
prompt position is the sum over its rows (index_select's backward), i.e. what the G separate copies
would have received. Only the floating-point order of operations differs
(tests/test_group_prefix.py holds both paths to 1e-5 and every parameter gradient of the GRPO loss
to allclose).
"""
from __future__ import annotations

import dataclasses
import inspect
import pathlib

import torch
import torch.nn.functional as F

from trainer.config import ModelConfig
from trainer.model import KVCache, TinyLM
from trainer.tokenizer import CharTokenizer, HFTokenizer, Tokenizer


@dataclasses.dataclass
class Batch:
    ids: torch.Tensor        # (B, T) prompt + completion, left-padded prompt, right-padded completion
    attn: torch.Tensor       # (B, T) 1 on real tokens
    positions: torch.Tensor  # (B, T) rotary positions
    loss_mask: torch.Tensor  # (B, T) 1 on completion tokens (the ones scored)
    prompt_len: int          # width of the prompt block
    unique_rows: torch.Tensor | None = None   # (U,) first row holding each distinct prompt
    prompt_index: torch.Tensor | None = None  # (B,) which distinct prompt (0..U-1) each row holds

    @property
    def shares_prompts(self) -> bool:
        """Whether some rows hold the same prompt (so computing each prompt once saves work)."""
        return self.unique_rows is not None and len(self.unique_rows) < self.ids.shape[0]


def positions_from_mask(attn: torch.Tensor) -> torch.Tensor:
    return (attn.long().cumsum(-1) - 1).clamp_min(0)


def unique_prompts(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(U,) index of the first occurrence of each distinct prompt, and (B,) the distinct prompt each
    row holds — `prompts[first[index[i]]] == prompts[i]`."""
    seen: dict[tuple[int, ...], int] = {}
    first, index = [], []
    for i, p in enumerate(prompts):
        k = seen.setdefault(tuple(p), len(seen))
        if k == len(first):
            first.append(i)
        index.append(k)
    return torch.tensor(first, dtype=torch.long), torch.tensor(index, dtype=torch.long)


# Default of Policy.chunk_overhead: what one more completion pass costs, in token positions of
# forward+backward (measured on CPU at hidden 192, 4 layers: a pass ~4 ms, a position ~0.15 ms).
CHUNK_OVERHEAD = 32


def plan_chunks(widths: list[int], overhead: float) -> list[list[int]]:
    """Rows grouped for the completion pass, each group padded to its widest row: contiguous runs
    of the distinct widths (ascending), chosen to minimise Σ rows × width + overhead × groups
    (exact, by dynamic programming over the distinct widths). Rows of width 0 need no pass and are
    left out."""
    ws = sorted({w for w in widths if w > 0})
    if not ws:
        return []
    count = [sum(1 for x in widths if x == w) for w in ws]
    cum = [0]
    for c in count:
        cum.append(cum[-1] + c)
    best, cut = [0.0] + [float("inf")] * len(ws), [0] * (len(ws) + 1)
    for j in range(1, len(ws) + 1):  # best[j]: the j narrowest widths grouped
        for i in range(j):
            c = best[i] + (cum[j] - cum[i]) * ws[j - 1] + overhead
            if c < best[j]:
                best[j], cut[j] = c, i
    bounds, j = [], len(ws)
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    chunks = []
    for i, j in reversed(bounds):
        lo, hi = ws[i], ws[j - 1]
        chunks.append([r for r, w in enumerate(widths) if lo <= w <= hi])
    return chunks


def build_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> Batch:
    assert len(prompts) == len(completions), "one completion per prompt"
    P = max(len(p) for p in prompts)
    C = max(1, max(len(c) for c in completions))
    # rows built as Python lists and converted once: a slice assignment per row cost ~70 µs a row
    ids, attn, lmask = [], [], []
    for p, c in zip(prompts, completions):
        lp, rp = P - len(p), C - len(c)
        ids.append([pad_id] * lp + list(p) + list(c) + [pad_id] * rp)
        attn.append([0] * lp + [1] * (len(p) + len(c)) + [0] * rp)
        lmask.append([0.0] * P + [1.0] * len(c) + [0.0] * rp)
    ids, attn = torch.tensor(ids, dtype=torch.long), torch.tensor(attn, dtype=torch.long)
    lmask = torch.tensor(lmask, dtype=torch.float32)
    first, index = unique_prompts(prompts)
    return Batch(ids, attn, positions_from_mask(attn), lmask, P, first, index)


@dataclasses.dataclass
class Samples:
    """What `Policy.sample` returns: per row its tokens (ending with the stop/eos token when one
    was emitted), whether it hit max_new_tokens without stopping, and (when asked for) each
    token's log-prob under the policy at temperature 1."""

    completions: list[list[int]]
    truncated: list[bool]
    logprobs: list[list[float]] | None = None


class Policy:
    """Wraps a model + tokenizer: hidden states, token log-probs, sampling."""

    def __init__(self, cfg: ModelConfig, tokenizer: Tokenizer, model: torch.nn.Module) -> None:
        self.cfg, self.tok, self.model = cfg, tokenizer, model
        self.is_hf = cfg.kind == "hf"
        self.share_prompts = cfg.share_prompts
        # transformers renamed `past_key_values` to `cache` (the old name warns, then goes away);
        # models written for older versions only know the old one
        self.cache_kw = ("cache" if self.is_hf and "cache" in inspect.signature(model.forward).parameters
                         else "past_key_values")
        self.chunk_overhead = CHUNK_OVERHEAD

    @classmethod
    def build(cls, cfg: ModelConfig, seed: int = 0) -> "Policy":
        if cfg.kind == "builtin":
            tok = CharTokenizer(cfg.charset) if cfg.charset is not None else CharTokenizer()
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

    def score_inputs(self, batch: Batch, shared: bool | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Hidden states at the positions that predict the completion block, their targets and
        mask: (B, C, D), (B, C), (B, C) for positions P-1 .. T-2 (prompt tokens are never scored,
        so the LM head never sees them). `shared` (default: `share_prompts` when rows share a
        prompt) runs each distinct prompt once and the completions against its repeated cache."""
        P = batch.prompt_len
        if shared is None:
            shared = self.share_prompts and batch.shares_prompts
        if shared:
            h = self._shared_prompt_hidden(batch)
        else:
            h = self.hidden(batch.ids[:, :-1], batch.attn[:, :-1], batch.positions[:, :-1])[:, P - 1 :]
        return h, batch.ids[:, P:], batch.loss_mask[:, P:]

    def _shared_prompt_hidden(self, batch: Batch) -> torch.Tensor:
        """(B, C, D) hidden states of positions P-1 .. T-2, each distinct prompt computed once.

        The completions then run against their prompt's cache, in groups of rows of similar length
        (`plan_chunks`), each group cut to its longest completion, so the right padding of the
        completion block is mostly not computed either. Hidden states of positions past a row's
        last completion input are zeros there (their targets are padding, masked out)."""
        P, T = batch.prompt_len, batch.ids.shape[1]
        if batch.unique_rows is None:
            raise ValueError("batch has no prompt grouping (build it with build_batch)")
        u, inv = batch.unique_rows, batch.prompt_index
        ids_p, attn_p, pos_p = batch.ids[u, :P], batch.attn[u, :P], batch.positions[u, :P]  # (U, P)
        if not self.is_hf:
            cache = self.model.new_cache(len(u), T - 1)
            h_p = self.model(ids_p, attention_mask=attn_p, cache=cache, positions=pos_p)  # (U, P, D)
            state = {"cache": cache}
        else:
            out = self.model.model(input_ids=ids_p, attention_mask=attn_p, position_ids=pos_p, use_cache=True)
            h_p, state = out.last_hidden_state, {"past": self._out_cache(out)}
        last = h_p[:, -1:].index_select(0, inv)  # (B, 1, D): predicts the first completion token
        W = T - 1 - P  # width of the completion inputs: every completion token but the last
        if W == 0:
            return last
        kv = self._kv_layers(state)
        if kv is None:  # the cache cannot be rebuilt per group: one pass, cache repeated in place
            self._select_rows(state, inv)
            h_c = self._forward_cached(state, batch.ids[:, P : T - 1], batch.attn[:, : T - 1],
                                       batch.positions[:, P : T - 1])  # (B, W, D)
            return torch.cat([last, h_c], 1)
        widths = (batch.attn[:, P:].sum(-1) - 1).clamp(0, W).tolist()  # (B,) completion inputs per row
        pieces, order = [], []
        for rows in plan_chunks(widths, self.chunk_overhead):
            idx = torch.tensor(rows, dtype=torch.long)
            w = max(widths[i] for i in rows)
            state = self._cache_rows(kv, inv[idx], P)
            h_c = self._forward_cached(state, batch.ids[idx, P : P + w], batch.attn[idx, : P + w],
                                       batch.positions[idx, P : P + w])  # (n, w, D)
            pieces.append(F.pad(h_c, (0, 0, 0, W - w)))
            order += rows
        zero = [i for i, w in enumerate(widths) if w == 0]  # completions of 0 or 1 token: no inputs
        if zero:
            pieces.append(last.new_zeros(len(zero), W, last.shape[-1]))
            order += zero
        h_c = torch.cat(pieces).index_select(0, torch.argsort(torch.tensor(order)))  # (B, W, D) in row order
        return torch.cat([last, h_c], 1)  # (B, C, D)

    def _forward_cached(self, state: dict, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Hidden states (n, w, D) of `ids` (n, w) after the cached prefix; `attn` covers both."""
        if not self.is_hf:
            return self.model(ids, attention_mask=attn, cache=state["cache"], positions=pos)
        return self.model.model(input_ids=ids, attention_mask=attn, position_ids=pos,
                                **{self.cache_kw: state["past"]}, use_cache=True).last_hidden_state

    def _kv_layers(self, state: dict) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Per-layer (keys, values) of a prefill cache, or None for a cache kind that cannot be
        rebuilt from them (then the completions run in one pass against the repeated cache)."""
        if not self.is_hf:
            return list(zip(state["cache"].k, state["cache"].v))
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        past = state["past"]
        layers = getattr(past, "layers", None)
        if type(past) is not DynamicCache or layers is None or any(type(x) is not DynamicLayer for x in layers):
            return None  # e.g. sliding-window layers or an older transformers
        return [(x.keys, x.values) for x in layers]

    def _cache_rows(self, kv: list[tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor, filled: int) -> dict:
        """A fresh cache holding prefix rows `rows` of `kv` (differentiable; `kv` is left as is)."""
        if not self.is_hf:
            return {"cache": KVCache.from_layers([k[rows] for k, _ in kv], [v[rows] for _, v in kv], filled)}
        from transformers import DynamicCache

        return {"past": DynamicCache([(k[rows], v[rows]) for k, v in kv])}

    # ---- sampling ------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_ids: set[int] | None = None,
                 generator: torch.Generator | None = None) -> tuple[list[list[int]], list[bool]]:
        """Sample completions. Returns token lists (ending with the stop/eos token when one was
        emitted) and a truncated flag per row (True = hit max_new_tokens without stopping)."""
        s = self.sample(prompts, max_new_tokens, temperature, top_p, stop_ids, generator)
        return s.completions, s.truncated

    @torch.inference_mode()   # no autograd bookkeeping at all: ~9% faster than no_grad for these small ops
    def sample(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 1.0,
               top_p: float = 1.0, stop_ids: set[int] | None = None, generator: torch.Generator | None = None,
               logprobs: bool = False) -> "Samples":
        """`generate`, and with `logprobs` each sampled token's log-prob taken from the logits it
        was sampled from: log_softmax(logits)[token] at temperature 1, i.e. the policy's own
        distribution, not the tempered / nucleus-truncated one actually sampled from. That is what
        the trainer scores (`trainer.logprobs.batch_logprobs`, the old log-probs of GRPO's
        importance ratio), so the two agree up to float rounding without a second forward. Extra
        work: one log_softmax over the vocabulary per step; the random stream is untouched."""
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
        first, index = unique_prompts(prompts)
        if self.share_prompts and len(first) < B:  # prefill each distinct prompt once, repeat its cache
            state = self._prefill(ids[first], attn[first, :P], pos[first])
            self._select_rows(state, index)
            logits = state["logits"][index]
        else:
            state = self._prefill(ids, attn[:, :P], pos)
            logits = state["logits"]
        next_pos = pos[:, -1] + 1
        stop_t = torch.tensor(sorted(stops), dtype=torch.long)
        # Finished rows leave the decode batch (and the KV cache) once they are an eighth of it, so
        # the remaining steps spend no compute on them. `rows`: the prompt index of each batch row.
        rows = torch.arange(B)
        out_lp = torch.zeros((B, max_new_tokens), dtype=torch.float32) if logprobs else None
        for t in range(max_new_tokens):
            tok = sample_token(logits, temperature, top_p, generator)  # (b,) for the b batch rows
            if out_lp is not None:
                out_lp[rows, t] = logits.float().log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1)
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
        lps = [out_lp[i, : lengths[i]].tolist() for i in range(B)] if out_lp is not None else None
        return Samples(comps, (~done).tolist(), lps)

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
        return {"past": self._out_cache(out), "logits": out.logits[:, -1]}

    @staticmethod
    def _out_cache(out):
        """The KV cache an HF forward returned (`cache`, or `past_key_values` before the rename)."""
        return out.cache if hasattr(out, "cache") else out.past_key_values

    def _select_rows(self, state: dict, keep: torch.Tensor) -> None:
        """Batch row i of the KV cache becomes old row `keep[i]` (1-D indices): drops rows, or
        repeats them (a shared prompt's cache to its group). Differentiable."""
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
                         **{self.cache_kw: state["past"]}, use_cache=True)
        state["past"] = self._out_cache(out)
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
