"""Data parallelism without DDP wrappers: each rank computes gradients on its shard of the batch,
then gradients are all-reduced (mean) before the optimiser step. Rank 0 owns the run's files and
the control channel and broadcasts commands, so every rank applies them at the same step.
Works with the gloo process group that Ray Train sets up on CPU; a single process needs none."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class Dist:
    def __init__(self) -> None:
        self.enabled = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.enabled else 0
        self.world = dist.get_world_size() if self.enabled else 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def mean_grads(self, params: list[torch.nn.Parameter]) -> None:
        if not self.enabled:
            return
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world
        off = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[off : off + n].view_as(g))
            off += n

    def mean_dict(self, d: dict[str, float]) -> dict[str, float]:
        """Average scalar metrics across ranks (keys must match on every rank)."""
        if not self.enabled or not d:
            return d
        keys = sorted(d)
        t = torch.tensor([float(d[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(t)
        t /= self.world
        return dict(zip(keys, t.tolist()))
