"""Multi-turn GRPO over whole trajectories (and the masked SFT of agent demonstrations).

A trajectory is a list of policy calls, each with the exact prompt and completion token ids the
generator saw and produced (`trainer.agent_rollout.Step`, or a record of the policy endpoint's
log). Training rows are built from those ids only, never from re-tokenized text:

    rows = []
    for call in trajectory:
        if the call's prompt starts with the current row's ids (previous prompt + completion + ...):
            append the new prompt tokens (template, tool output: mask 0), then the completion (mask 1)
        else:
            start a new row at this call (a "drift": the context policy dropped or trimmed
            something, or an external harness re-rendered the conversation); count it

so a trajectory whose prompts extend each other is one row `[first prompt][turn 1, T:..., turn 2, ...]`
with mask 1 exactly on the policy's tokens, and one that drifted is several rows (agent-lightning's
per-call fallback) that all belong to it.

The learning signal, per group of G trajectories of one episode prompt:

    A_i = advantage(R_1..R_G)_i          one advantage per trajectory (core.ADVANTAGES, "grpo": group-normalised)
    a_t = A_i · turn_discount**(n-1-turn(t))     per policy token (turn_discount = 1: A_i everywhere)
    L   = mean over trajectories i of  Σ_{t ∈ policy tokens of i} ℓ_t / |policy tokens of i|

with ℓ_t the per-token policy loss of `core.LOSSES` ("grpo_clip": the clipped surrogate, + β·k3 KL
to a reference when given). Tool-output and template tokens are never scored (mask 0). A
trajectory is normalised by its own token count, so a long trajectory does not outweigh a short
one (the per-sequence mean of the original GRPO, over whole trajectories).

SFT on demonstrations is the same rows with the loss `-log p` on the policy tokens, token-mean
over the batch.

Deviation: as in `trainer.algorithms.grpo`, the first update's "old" log-probs are the detached
current ones (ratio ≡ 1); the generator's own log-probs (the endpoint records them) are not used
as the behaviour policy.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import torch

from trainer.algorithms.core import get_advantage, get_loss
from trainer.logprobs import batch_logprobs
from trainer.policy import Batch, build_batch


@dataclasses.dataclass(frozen=True)
class Call:
    """One policy call as generated: the exact ids, nothing re-encoded."""

    prompt_ids: list[int]
    completion_ids: list[int]


@dataclasses.dataclass
class Row:
    """One training row: a prompt and everything after it, `turn[t]` the policy turn that produced
    completion token t (-1: template or tool output, not trained on)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    turn: list[int]
    trajectory: int          # index of the trajectory the row belongs to

    @property
    def mask(self) -> list[int]:
        return [int(t >= 0) for t in self.turn]


def merge_calls(calls: Sequence[Call], trajectory: int = 0) -> tuple[list[Row], int]:
    """The rows of one trajectory and how many calls could not be merged into the row before them
    (the drift count). A call is merged only when its prompt ids start with the current row's ids
    (prompt + every completion and observation so far) exactly."""
    rows: list[Row] = []
    drift = 0
    for k, c in enumerate(calls):
        if rows:
            cur = rows[-1]
            seq = cur.prompt_ids + cur.completion_ids
            if c.prompt_ids[: len(seq)] == seq and len(c.prompt_ids) >= len(seq):
                gap = c.prompt_ids[len(seq):]
                cur.completion_ids += gap + list(c.completion_ids)
                cur.turn += [-1] * len(gap) + [k] * len(c.completion_ids)
                continue
            drift += 1
        rows.append(Row(list(c.prompt_ids), list(c.completion_ids), [k] * len(c.completion_ids), trajectory))
    return rows, drift


def trajectory_calls(trajectory: Any) -> list[Call]:
    """The calls of a `trainer.agent_rollout.Trajectory`."""
    return [Call(s.prompt_ids, s.completion_ids) for s in trajectory.steps]


def episodes_from_records(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Episodes of a policy endpoint's log (`trainer.endpoint.read_log`), by episode id: its calls
    in order (`Call`s), the first call's prompt ids (`prompt`, the episode prompt for grouping) and
    its reward (the last reward record; None when the client sent none). An episode retried under
    another attempt (the `X-Attempt` header) keeps the calls of its last attempt only."""
    calls: dict[str, list[tuple[Any, int, Call]]] = {}
    rewards: dict[str, float] = {}
    for r in records:
        if r.get("type") == "call":
            calls.setdefault(r["episode"], []).append((r.get("attempt"), r["call"],
                                                       Call(list(r["prompt_ids"]), list(r["completion_ids"]))))
        elif r.get("type") == "reward":
            rewards[r["episode"]] = float(r["reward"])
    out: dict[str, dict[str, Any]] = {}
    for ep, cs in calls.items():
        last = cs[-1][0]
        kept = [c for a, _, c in sorted((x for x in cs if x[0] == last), key=lambda x: x[1])]
        out[ep] = {"calls": kept, "prompt": tuple(kept[0].prompt_ids), "reward": rewards.get(ep), "attempt": last}
    return out


def group_advantages(groups: Sequence[Sequence[float]], estimator: str = "grpo") -> list[list[float]]:
    """One advantage per trajectory, each group normalised on its own (groups may differ in size)."""
    fn = get_advantage(estimator)
    return [fn(torch.tensor([list(g)], dtype=torch.float32))[0].tolist() if len(g) else [] for g in groups]


def rows_batch(rows: Sequence[Row], pad_id: int) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """The `Batch` of `rows` and, aligned with its completion block, the (B, C) loss mask and
    (B, C) turn index (-1 off the policy's tokens)."""
    batch = build_batch([r.prompt_ids for r in rows], [r.completion_ids for r in rows], pad_id)
    C = batch.ids.shape[1] - batch.prompt_len
    turn = torch.full((len(rows), C), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        turn[i, : len(r.turn)] = torch.tensor(r.turn, dtype=torch.long)
    return batch, (turn >= 0).float(), turn


def fit_batches(rows: Sequence[Row], max_len: int) -> list[list[int]]:
    """Row indices in batches whose padded width (longest prompt + longest completion, the layout
    of `build_batch`) the policy can take; rows of one prompt stay together (their prompt is run
    once). Each row must fit on its own."""
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i].prompt_ids), rows[i].prompt_ids))
    out: list[list[int]] = []
    cur: list[int] = []
    P = C = 0
    for i in order:
        p, c = len(rows[i].prompt_ids), max(1, len(rows[i].completion_ids))
        if p + c - 1 > max_len:
            raise ValueError(f"a row of {p} prompt and {c} completion tokens is longer than the policy's {max_len}")
        if cur and max(P, p) + max(C, c) - 1 > max_len:
            out.append(cur)
            cur, P, C = [], 0, 0
        cur.append(i)
        P, C = max(P, p), max(C, c)
    return out + [cur] if cur else out


def _max_len(policy: Any) -> int:
    return policy._max_len() if hasattr(policy, "_max_len") else 1 << 30


def trajectory_mean(row_sum: torch.Tensor, row_tokens: torch.Tensor, row_traj: torch.Tensor,
                    n_traj: int) -> torch.Tensor:
    """Mean over the `n_traj` trajectories of each one's (Σ row_sum) / (Σ row_tokens) over its
    rows; a trajectory without tokens counts as 0. All (B,), `row_traj` the trajectory of each row."""
    tok = torch.zeros(n_traj, dtype=row_sum.dtype).index_add(0, row_traj, row_tokens)  # (N,)
    tot = torch.zeros(n_traj, dtype=row_sum.dtype).index_add(0, row_traj, row_sum)     # (N,)
    return (tot / tok.clamp_min(1.0)).sum() / max(1, n_traj)


def per_trajectory_mean(per_token: torch.Tensor, mask: torch.Tensor, row_traj: torch.Tensor,
                        n_traj: int) -> torch.Tensor:
    """`trajectory_mean` of a (B, T) per-token loss over its (B, T) mask."""
    return trajectory_mean((per_token * mask).sum(-1), mask.sum(-1), row_traj, n_traj)


@torch.no_grad()
def row_logprobs(policy: Any, rows: Sequence[Row], backend: str = "torch") -> list[torch.Tensor]:
    """Per row, the (len(completion),) log-probs of its completion tokens under `policy` (the old
    policy of a batch's later updates, or a reference)."""
    out: list[torch.Tensor] = [torch.zeros(0)] * len(rows)
    for idx in fit_batches(rows, _max_len(policy)):
        batch, _, _ = rows_batch([rows[i] for i in idx], policy.tok.pad_id)
        logp, _, _ = batch_logprobs(policy, batch, backend)
        for k, i in enumerate(idx):
            out[i] = logp[k, : len(rows[i].completion_ids)].detach()
    return out


def _padded(values: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros(len(values), width)
    for i, v in enumerate(values):
        out[i, : len(v)] = v
    return out


def agent_grpo_loss(policy: Any, rows: Sequence[Row], advantages: Sequence[float], turns: Sequence[int],
                    *, loss: str = "grpo_clip", clip_eps: float = 0.2, kl_coef: float = 0.0,
                    turn_discount: float = 1.0, ref_policy: Any = None, old_logp: list[torch.Tensor] | None = None,
                    backend: str = "torch") -> tuple[torch.Tensor, dict[str, float]]:
    """The multi-turn GRPO loss of `rows` (see the module docstring). `advantages[i]` and
    `turns[i]` (its number of policy turns) belong to trajectory i, the one `Row.trajectory` names;
    `old_logp` (from `row_logprobs`) per row, None = the current log-probs detached (ratio 1).
    Rows are scored in batches the policy's length takes (`fit_batches`)."""
    n = len(advantages)
    loss_fn = get_loss(loss)
    ref_rows = row_logprobs(ref_policy, rows, backend) if ref_policy is not None and kl_coef > 0 else None
    sums, counts, trajs = [], [], []
    acc = {"entropy": 0.0, "policy_tokens": 0.0, "row_tokens": 0.0}
    extra: dict[str, float] = {}
    for idx in fit_batches(rows, _max_len(policy)):
        sub = [rows[i] for i in idx]
        batch, mask, turn = rows_batch(sub, policy.tok.pad_id)
        C = mask.shape[1]
        row_traj = torch.tensor([r.trajectory for r in sub], dtype=torch.long)  # (b,)
        adv = torch.tensor(advantages, dtype=torch.float32)[row_traj]           # (b,)
        n_turns = torch.tensor(turns, dtype=torch.float32)[row_traj]             # (b,)
        steps_back = (n_turns[:, None] - 1 - turn.clamp_min(0).float()).clamp_min(0)  # (b, C)
        tok_adv = adv[:, None] * turn_discount ** steps_back * mask               # (b, C)
        logp, ent, _ = batch_logprobs(policy, batch, backend)                     # (b, C)
        old = logp.detach() if old_logp is None else _padded([old_logp[i] for i in idx], C)
        ref = _padded([ref_rows[i] for i in idx], C) if ref_rows is not None else None
        per_tok, lstats = loss_fn(logp, old, ref, tok_adv, mask, clip_eps, kl_coef)
        sums.append((per_tok * mask).sum(-1))
        counts.append(mask.sum(-1))
        trajs.append(row_traj)
        m = float(mask.sum())
        acc["entropy"] += float((ent.detach() * mask).sum())
        acc["policy_tokens"] += m
        acc["row_tokens"] += float(batch.attn.sum())
        for k, v in lstats.items():   # token means per batch -> token means over all rows
            extra[k] = extra.get(k, 0.0) + float(torch.as_tensor(v).detach()) * m
    value = trajectory_mean(torch.cat(sums), torch.cat(counts), torch.cat(trajs), n)
    tokens = max(1.0, acc["policy_tokens"])
    stats = {"entropy": acc["entropy"] / tokens, "policy_tokens": acc["policy_tokens"],
             "row_tokens": acc["row_tokens"], "rows": float(len(rows)),
             **{k: v / tokens for k, v in extra.items()}}
    return value, stats


def sft_rows_loss(policy: Any, rows: Sequence[Row], backend: str = "torch") -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood of the policy tokens of `rows` (demonstrations), token-mean."""
    total: torch.Tensor | float = 0.0
    tokens = ent = width = 0.0
    for idx in fit_batches(rows, _max_len(policy)):
        batch, mask, _ = rows_batch([rows[i] for i in idx], policy.tok.pad_id)
        logp, e, _ = batch_logprobs(policy, batch, backend)  # (b, C)
        total = total + -(logp * mask).sum()
        tokens += float(mask.sum())
        ent += float((e.detach() * mask).sum())
        width += float(batch.attn.sum())
    n = max(1.0, tokens)
    return total / n, {"entropy": ent / n, "policy_tokens": tokens, "row_tokens": width}  # type: ignore[return-value]
