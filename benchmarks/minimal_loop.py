"""A minimal plain-torch training loop for 3-digit addition (answers with reversed digits): the
baseline the trainer's machinery is measured against in `time_to_accuracy.py`.

Deliberately bare: a GPT-style decoder (learned positions, GELU MLP, LayerNorm), fixed-width
sequences "abc+def=" + reversed sum (zero-padded to 4 digits) + "\n", cross-entropy on the answer
tokens only, AdamW, greedy held-out eval every `eval_every` steps. No metrics files, no
checkpoints, no control channel.

    python benchmarks/minimal_loop.py --target 0.95
"""
from __future__ import annotations

import argparse
import json
import random
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = "0123456789+=\n"
STOI = {c: i for i, c in enumerate(VOCAB)}


def sample(rng: random.Random, n: int) -> tuple[torch.Tensor, int]:
    rows = []
    for _ in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        s = f"{a}+{b}=" + f"{a + b:04d}"[::-1] + "\n"
        rows.append([STOI[c] for c in s])
    return torch.tensor(rows), 8  # prompt length


class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, d: int = 128, layers: int = 4, heads: int = 4, T: int = 16) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(len(VOCAB), d), nn.Embedding(T, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, len(VOCAB), bias=False)

    def forward(self, ids):
        T = ids.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        x = self.tok(ids) + self.pos(torch.arange(T))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


@torch.no_grad()
def evaluate(model: GPT, n: int = 500) -> float:
    ids, P = sample(random.Random(12345), n)
    x = ids[:, :P]
    for _ in range(ids.shape[1] - P):
        nxt = model(x)[:, -1].argmax(-1, keepdim=True)
        x = torch.cat([x, nxt], 1)
    return float((x[:, P:] == ids[:, P:]).all(-1).float().mean())


def main(target: float = 0.95, batch: int = 128, lr: float = 3e-3, max_steps: int = 5000,
         eval_every: int = 100, seed: int = 0, threads: int = 1) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95))
    t0, tokens, acc, curve = time.perf_counter(), 0, 0.0, []
    for step in range(1, max_steps + 1):
        ids, P = sample(rng, batch)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits[:, P - 1 :].reshape(-1, len(VOCAB)), ids[:, P:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        tokens += ids.numel()
        if step % eval_every == 0:
            acc = evaluate(model)
            curve.append((step, time.perf_counter() - t0, acc))
            if acc >= target:
                break
    return {"steps": step, "wall_s": time.perf_counter() - t0, "tokens": tokens, "heldout_acc": acc,
            "params": sum(p.numel() for p in model.parameters()), "curve": curve}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=128)
    a = ap.parse_args()
    print(json.dumps(main(a.target, a.batch, a.lr)))
