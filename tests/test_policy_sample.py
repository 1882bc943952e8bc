"""`Policy.sample`'s log-probs (trainer/policy.py) against the trainer's own scoring.

The endpoint reports the log-probs `Policy.sample` reads off the logits each token was sampled
from; the agent trainer takes GRPO's old log-probs from `row_logprobs` (a separate forward through
`batch_logprobs`, temperature 1). On the same seed both must give the same numbers — whatever
temperature / top_p sampled the tokens, over rows of different prompt lengths, shared prompts
and rows that stop early (the decode batch drops them) — and asking for log-probs must not change
what is sampled.
"""
from __future__ import annotations

import pytest
import torch

from trainer.algorithms.agent_grpo import Row, row_logprobs
from trainer.config import ModelConfig
from trainer.policy import Policy


def _prompts(tok) -> list[list[int]]:
    texts = ["What is abc?", "q", "What is abc?", "a longer question, what is 1234?", "zz", "What is abc?"]
    return [[tok.bos_id] + tok.encode(t) for t in texts]


@pytest.fixture(scope="module")
def builtin() -> Policy:
    return Policy.build(ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=256), seed=0)


@pytest.fixture(scope="module")
def hf(tiny_hf_dir) -> Policy:
    return Policy.build(ModelConfig(kind="hf", path=str(tiny_hf_dir)))


@pytest.mark.parametrize("kind", ["builtin", "hf"])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8), (0.0, 1.0)])
@pytest.mark.parametrize("share", [True, False])
def test_sampled_logprobs_equal_the_trainers(kind, temperature, top_p, share, request):
    policy: Policy = request.getfixturevalue(kind)
    policy.share_prompts = share
    prompts = _prompts(policy.tok)
    stop = {policy.tok.encode("?")[0]}   # some rows stop early and leave the decode batch
    if temperature == 0:   # greedy on random weights repeats itself: stop on a token one row emits
        stop.add(policy.generate(prompts[1:2], 3, 0.0)[0][0][-1])
    plain = policy.generate(prompts, 12, temperature, top_p, stop, torch.Generator().manual_seed(3))
    got = policy.sample(prompts, 12, temperature, top_p, stop, torch.Generator().manual_seed(3), logprobs=True)
    assert (got.completions, got.truncated) == plain, "asking for log-probs changed what was sampled"
    assert [len(x) for x in got.logprobs] == [len(c) for c in got.completions]
    assert len({len(c) for c in got.completions}) > 1, "rows of different lengths"
    rows = [Row(p, c, [0] * len(c), i) for i, (p, c) in enumerate(zip(prompts, got.completions))]
    ref = row_logprobs(policy, rows)   # the agent trainer's old log-probs: temperature 1
    for lp, r in zip(got.logprobs, ref):
        assert torch.allclose(torch.tensor(lp), r, atol=1e-5), (lp, r.tolist())


def test_sample_without_logprobs_returns_none(builtin):
    got = builtin.sample(_prompts(builtin.tok), 4, generator=torch.Generator().manual_seed(0))
    assert got.logprobs is None and len(got.completions) == 6
