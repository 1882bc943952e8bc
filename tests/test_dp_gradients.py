"""Data-parallel correctness: two gloo ranks on loopback take the step one process takes on the
same global batch — the same averaged gradient (up to float32 reduction order), the same logged
loss, the same weights after the step — for SFT and for GRPO.

Each rank is a separate process with its own run directory (no shared filesystem: rank 0 writes
the run's files in its own folder; rank 1 reads nothing of it). Sampled GRPO completions are
scripted (`ScriptedSampling`, a stand-in for `Policy.generate`): completion k of a prompt is a pure
function of (prompt, k), so one process and two ranks — whose sampling streams differ by design —
score identical completions and the comparison is exact. The scripts are chosen to catch what a
naive split gets wrong: shards of different sizes (batch 5 and 3 over 2 ranks), completions of
different lengths (a rank normalising by its own token count weighs its tokens wrongly), a rank
whose every group is filtered out while the other learns (with two updates per batch it must still
join every all-reduce), and a step with nothing to learn anywhere (no optimiser step at all, as
with one process: AdamW's weight decay would otherwise move every weight).

The workers run this file as a script: `python tests/test_dp_gradients.py RANK WORLD PORT SPEC OUT`.
About 15 s (two processes importing torch, four short scenarios).
"""
from __future__ import annotations

import collections
import copy
import json
import pathlib
import random
import sys
import zlib
from typing import Any

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script by the workers
    sys.path.insert(0, str(REPO))

import gloo_ranks  # noqa: E402
from trainer.config import RunConfig  # noqa: E402
from trainer.distributed import Dist, init_gloo  # noqa: E402
from trainer.tasks.base import Split  # noqa: E402

BASE: dict[str, Any] = {
    "name": "dp", "seed": 3, "threads": 1, "samples_per_step": 0,
    "task": {"name": "addition"},          # answers of 2 to 4 digits: completions of different lengths
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 48},
    "harness": {"curriculum": {"start": 3}, "sampling": {"max_new_tokens": 6}},
    "recipe": {"algorithm": "sft", "lr": 1e-2, "steps": 10, "warmup_steps": 0, "schedule": "constant",
               "weight_decay": 0.1, "eval_interval": 0, "eval_size": 4},
    "checkpoint": {"interval": 0},
}

SCENARIOS: dict[str, dict[str, Any]] = {
    # 5 examples over 2 ranks: shards of 2 and 3, answers of different lengths
    "sft": {"recipe": {"algorithm": "sft", "batch_size": 5}},
    # prompt 0 (rank 0's whole shard) has every completion right and is filtered out (pass rate above
    # 0.9): rank 0 has no token to learn from while rank 1 learns, for two updates per batch
    "grpo_token_mean": {"recipe": {"algorithm": "grpo", "batch_size": 3, "group_size": 4, "kl_coef": 0.05,
                                   "updates_per_batch": 2, "loss_agg": "token_mean"},
                        "harness": {"curriculum": {"pass_rate_max": 0.9}}},
    "grpo_seq_mean": {"recipe": {"algorithm": "grpo", "batch_size": 4, "group_size": 3,
                                 "loss_agg": "seq_mean_token_mean"}},
    "grpo_token_sum": {"recipe": {"algorithm": "grpo", "batch_size": 3, "group_size": 4, "kl_coef": 0.05,
                                  "loss_agg": "token_sum", "lr": 1e-3}},
    # every completion right and every group filtered out: nothing to learn on any rank
    "grpo_nothing": {"recipe": {"algorithm": "grpo", "batch_size": 2, "group_size": 2},
                     "harness": {"curriculum": {"pass_rate_max": 0.9}}, "all_right": True},
}
STEPS = 2


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class RecordingDist(Dist):
    """The real `Dist`, keeping a copy of the averaged gradients of every update."""

    def __init__(self) -> None:
        super().__init__()
        self.grads: list[list[torch.Tensor]] = []
        self.contributors: list[int] = []
        self.local: list[dict[str, float]] = []   # this rank's step metrics before averaging

    def mean_grads(self, params, contributes: bool = True) -> int:
        n = super().mean_grads(params, contributes)
        self.grads.append([torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params])
        self.contributors.append(n)
        return n

    def mean_dict(self, d: dict[str, float]) -> dict[str, float]:
        self.local.append(dict(d))
        return super().mean_dict(d)


class ScriptedSampling:
    """Stands in for `Policy.generate`: completion k of a prompt is a pure function of the prompt and
    k. Prompt i of the train stream gets the right answer first, then a wrong one of the same length,
    then right, wrong (random length) or truncated at random; prompt 0 — or every prompt, with
    `all_right` — gets only right answers."""

    def __init__(self, tr, all_right: bool) -> None:
        diff = min(max(tr.harness.curriculum.difficulty_at(0), tr.task.min_difficulty), tr.task.max_difficulty)
        draw = tr.perturber.stream(tr.task)
        self.tok, self.max_new = tr.policy.tok, tr.harness.sampling.max_new_tokens
        self.script: dict[tuple[int, ...], tuple[int, list[int]]] = {}
        for i in range(64):
            ex = draw(i, diff)
            right = tr.target_ids(tr.harness.answer.render(ex.solution or ex.answer))
            self.script.setdefault(tuple(tr.prompt_ids(ex)), (0 if all_right else i, right))
        assert len(self.script) > 16, "the train stream repeats: pick another difficulty"

    def completion(self, prompt: tuple[int, ...], k: int) -> list[int]:
        i, right = self.script[prompt]
        rng = random.Random(zlib.crc32(repr((prompt, k)).encode()))
        kind = "right" if i == 0 or k == 0 else "wrong" if k == 1 else rng.choice(["right", "wrong", "truncated"])
        if kind == "right":
            return list(right)
        if kind == "truncated":
            return self.tok.encode("".join(rng.choice("0123456789") for _ in range(self.max_new)))
        n = len(right) - 1 if k == 1 else rng.randint(1, self.max_new - 1)
        digits = "".join(rng.choice("0123456789") for _ in range(n))
        wrong = self.tok.encode(digits) + [self.tok.eos_id]
        return wrong if wrong != list(right) else self.tok.encode("9" * (n + 1)) + [self.tok.eos_id]

    def __call__(self, prompts, max_new_tokens, temperature=1.0, top_p=1.0, stop_ids=None, generator=None):
        seen: collections.Counter = collections.Counter()
        comps = []
        for p in prompts:
            key = tuple(p)
            comps.append(self.completion(key, seen[key]))
            seen[key] += 1
        stops = set(stop_ids or ()) | {self.tok.eos_id}
        return comps, [not (c and c[-1] in stops) and len(c) >= max_new_tokens for c in comps]


def run_scenario(name: str, out_dir: pathlib.Path) -> dict[str, Any]:
    """`STEPS` steps of scenario `name` in this process (one rank of a process group, or alone)."""
    from trainer.loop import Trainer

    spec = dict(SCENARIOS[name])
    all_right = spec.pop("all_right", False)
    cfg = RunConfig.parse(_merge(BASE, {**spec, "name": name, "out_dir": str(out_dir)}))
    rows: list[dict[str, Any]] = []
    d = RecordingDist()
    tr = Trainer(cfg, dist=d, on_step=rows.append)
    tr.policy.generate = ScriptedSampling(tr, all_right)
    start = [p.detach().clone() for p in tr.params]
    tr._start()
    for _ in range(STEPS):
        tr.train_one_step()
    tr.close()
    return {"grads": d.grads, "contributors": d.contributors, "start": start, "params": [p.detach().clone() for p in tr.params],
            "loss": [r["loss"] for r in rows], "skipped": [r["skipped"] for r in rows],
            "tokens": [m.get("tokens", 0.0) for m in d.local]}


def _worker(rank: int, world: int, port: int, spec: str, out: str) -> None:
    import psutil

    torch.set_num_threads(1)
    init_gloo(rank, world, port)
    listening = [c.laddr.ip for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN]
    names = json.loads(spec)
    res = {n: run_scenario(n, pathlib.Path(out) / f"rank{rank}" / "runs") for n in names}
    torch.save({"results": res, "listening": listening}, pathlib.Path(out) / f"rank{rank}.pt")
    gloo_ranks.end_rank()


def _close(a: list[torch.Tensor], b: list[torch.Tensor], what: str, rtol: float = 1e-4, atol: float = 1e-6) -> None:
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol, msg=lambda m: f"{what}, tensor {i}: {m}")


def test_two_ranks_take_the_single_process_step(tmp_path):
    names = list(SCENARIOS)
    procs = gloo_ranks.start(__file__, [json.dumps(names), str(tmp_path)])
    torch.set_num_threads(1)
    single = {n: run_scenario(n, tmp_path / "single" / "runs") for n in names}   # meanwhile, one process
    gloo_ranks.wait(procs, timeout=240)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for r in ranks:
        assert r["listening"] and set(r["listening"]) == {"127.0.0.1"}, r["listening"]

    for n in names:
        one, r0, r1 = single[n], ranks[0]["results"][n], ranks[1]["results"][n]
        _close(one["start"], r0["start"], f"{n}: same initial weights")
        # every update: the averaged gradient is the single process's, on both ranks
        assert len(one["grads"]) == len(r0["grads"]) == len(r1["grads"]), n
        for u, (g, g0, g1) in enumerate(zip(one["grads"], r0["grads"], r1["grads"])):
            _close(g0, g1, f"{n}: ranks agree at update {u}", rtol=0, atol=0)
            _close(g, g0, f"{n}: averaged gradient = single-process gradient at update {u}")
        assert one["loss"] == pytest.approx(r0["loss"], rel=1e-5, abs=1e-7), n
        assert one["skipped"] == r0["skipped"], n
        _close(one["params"], r0["params"], f"{n}: weights after {STEPS} steps")
        _close(r0["params"], r1["params"], f"{n}: ranks hold the same weights", rtol=0, atol=0)

    # the scenarios exercise what they claim: shards of different token counts, a rank with
    # nothing to learn, a step with nothing anywhere (no weight moved despite weight decay)
    sft = [ranks[r]["results"]["sft"] for r in (0, 1)]
    assert sft[0]["tokens"][0] != sft[1]["tokens"][0]
    assert ranks[0]["results"]["grpo_token_mean"]["contributors"][:2] == [1, 1]   # step 1's two updates
    assert ranks[0]["results"]["grpo_nothing"]["contributors"] == [0] * STEPS
    nothing = single["grpo_nothing"]
    assert nothing["skipped"] == [1.0, 1.0]
    _close(nothing["start"], nothing["params"], "no step: weights unchanged", rtol=0, atol=0)
    _close(ranks[1]["results"]["grpo_nothing"]["start"], ranks[1]["results"]["grpo_nothing"]["params"],
           "no step on any rank", rtol=0, atol=0)

    # no shared filesystem: rank 0 wrote the run's files in its own folder, rank 1 none of them
    for n in names:
        assert (tmp_path / "rank0" / "runs" / n / "config.yaml").is_file()
        assert not (tmp_path / "rank1" / "runs" / n / "config.yaml").exists()
        assert not (tmp_path / "rank1" / "runs" / n / "metrics.jsonl").exists()


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
