"""Shared group prompts (`Policy.share_prompts`): each distinct prompt of a batch is computed once
and its KV cache repeated to the rows that share it, in generation (prefill) and in scoring
(forward + backward). The shared path must be the same function as the plain one: per-token
log-probs and entropies equal to 1e-5 (fp32), every parameter gradient of the GRPO loss allclose,
the same greedy and seeded-sampling completions — on the built-in model and on a Hugging Face
causal LM, with prompts of different lengths (left padding), completions of different lengths
(right padding, empty ones included), group size 1 and > 1, the completion pass in one group or
split by length (`plan_chunks`), and the fallback that repeats the cache in place for one pass.
Forward hooks on the input embedding count the tokens the model actually runs, so a path that
silently stopped sharing fails too."""
from __future__ import annotations

import pytest
import torch

from trainer.algorithms.core import aggregate, get_advantage, get_loss
from trainer.config import ModelConfig
from trainer.logprobs import batch_logprobs
from trainer.policy import Policy, build_batch, plan_chunks, unique_prompts


@pytest.fixture(scope="module")
def builtin_policy() -> Policy:
    return Policy.build(ModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=48), seed=3)


@pytest.fixture(scope="module")
def hf_policy(tiny_hf_dir) -> Policy:
    return Policy.build(ModelConfig(kind="hf", path=str(tiny_hf_dir)))


@pytest.fixture(params=["builtin", "hf"])
def policy(request) -> Policy:
    pol = request.getfixturevalue(f"{request.param}_policy")
    defaults = pol.share_prompts, pol.chunk_overhead
    yield pol
    pol.share_prompts, pol.chunk_overhead = defaults


class OnePassPolicy(Policy):
    """A policy whose prefill cache cannot be rebuilt per row group (as for a cache kind other than
    a plain DynamicCache): the completions run in one pass against the cache repeated in place."""

    def _kv_layers(self, state):
        return None


def computed_tokens(batch, overhead: float | None) -> int:
    """Positions the shared path runs: each distinct prompt once, then every group of completions
    cut to its widest row (overhead None: the one-pass fallback over the full block)."""
    P, T, B = batch.prompt_len, batch.ids.shape[1], batch.ids.shape[0]
    W = T - 1 - P
    n = batch.unique_rows.numel() * P
    if W == 0:
        return n
    if overhead is None:
        return n + B * W
    widths = (batch.attn[:, P:].sum(-1) - 1).clamp(0, W).tolist()
    return n + sum(len(rows) * max(widths[i] for i in rows) for rows in plan_chunks(widths, overhead))


def _embedding(pol: Policy) -> torch.nn.Module:
    return pol.model.get_input_embeddings() if pol.is_hf else pol.model.embed


class TokenCounter:
    """Counts the token positions that go through the model's input embedding."""

    def __init__(self, pol: Policy) -> None:
        self.n = 0
        self.handle = _embedding(pol).register_forward_hook(self._hook)

    def _hook(self, _mod, args, _out) -> None:
        self.n += args[0].numel()

    def __enter__(self) -> "TokenCounter":
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def make_group_batch(pol: Policy, prompt_lens: list[int], group: int, seed: int, max_comp: int = 8):
    """Prompts of the given lengths (BOS + random tokens), each repeated `group` times; completions of
    random lengths 0..max_comp (so some rows are all padding in the completion block)."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = 4, pol.tok.vocab_size
    prompts = [[pol.tok.bos_id] + torch.randint(lo, hi, (n,), generator=g).tolist() for n in prompt_lens]
    rows = [p for p in prompts for _ in range(group)]
    lens = torch.randint(0, max_comp + 1, (len(rows),), generator=g).tolist()
    lens[0] = max_comp  # the completion block is max_comp wide
    comps = [torch.randint(lo, hi, (n,), generator=g).tolist() for n in lens]
    return rows, comps


def grpo_loss_and_grads(pol: Policy, batch, group: int, shared: bool, seed: int):
    """The GRPO clipped loss with a k3 KL term on `batch`; returns (logp, entropy, loss, grads)."""
    g = torch.Generator().manual_seed(seed)
    B = batch.ids.shape[0]
    rewards = torch.rand(B // group, group, generator=g)
    adv = get_advantage("grpo")(rewards).reshape(-1)  # (B,)
    pol.model.zero_grad(set_to_none=True)
    logp, ent, mask = batch_logprobs(pol, batch, shared=shared)
    ref = logp.detach() + 0.1 * torch.randn(logp.shape, generator=g)
    old = logp.detach() + 0.05 * torch.randn(logp.shape, generator=g)  # some tokens clip
    per_tok, _ = get_loss("grpo_clip")(logp, old, ref, adv[:, None].expand_as(logp), mask, 0.2, 0.05)
    loss = aggregate(per_tok, mask, "token_mean")
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in pol.model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), mask, loss.detach(), grads


def test_unique_prompts_maps_rows_to_first_occurrence():
    first, index = unique_prompts([[1, 2], [1, 2], [3], [1, 2], [3], [4]])
    assert first.tolist() == [0, 2, 5]
    assert index.tolist() == [0, 0, 1, 0, 1, 2]
    b = build_batch([[5, 6], [5, 6], [7]], [[1], [2, 3], []], pad_id=0)
    assert b.shares_prompts and b.unique_rows.tolist() == [0, 2] and b.prompt_index.tolist() == [0, 0, 1]
    assert not build_batch([[5], [6]], [[1], [2]], pad_id=0).shares_prompts


def test_plan_chunks_groups_rows_by_width():
    widths = [3, 0, 7, 3, 1, 7, 2, 0]
    one = plan_chunks(widths, overhead=1000)
    assert one == [[0, 2, 3, 4, 5, 6]], "a large overhead: one pass over every row that has inputs"
    each = plan_chunks(widths, overhead=0)
    assert each == [[4], [6], [0, 3], [2, 5]], "no overhead: one pass per distinct width"
    # overhead 3: {1,2,3} padded to 3 (cost 12+3) beats {1},{2},{3} (1+2+6+9) and {1,2},{3} (4+6+6)
    assert plan_chunks(widths, overhead=3) == [[0, 3, 4, 6], [2, 5]]
    assert plan_chunks([0, 0], overhead=3) == []
    for overhead in (0, 2, 5, 50):
        rows = sorted(r for c in plan_chunks(widths, overhead) for r in c)
        assert rows == [i for i, w in enumerate(widths) if w > 0], "every row with inputs exactly once"


@pytest.mark.parametrize("overhead", [0, None, 1e9])
@pytest.mark.parametrize("prompt_lens,group", [([3, 9, 5], 4), ([6, 2], 1), ([4], 6), ([7, 7, 1, 5], 3)])
def test_shared_scoring_equals_plain(policy, prompt_lens, group, overhead):
    """overhead 0: a completion pass per distinct length; None: the default; 1e9: one pass."""
    policy.chunk_overhead = policy.chunk_overhead if overhead is None else overhead
    rows, comps = make_group_batch(policy, prompt_lens, group, seed=len(prompt_lens) * 10 + group)
    batch = build_batch(rows, comps, policy.tok.pad_id)
    assert batch.unique_rows.numel() == len(prompt_lens)
    lp0, ent0, mask0, loss0, g0 = grpo_loss_and_grads(policy, batch, group, shared=False, seed=1)
    with TokenCounter(policy) as count:
        lp1, ent1, mask1, loss1, g1 = grpo_loss_and_grads(policy, batch, group, shared=True, seed=1)
    assert count.n == computed_tokens(batch, policy.chunk_overhead), "each distinct prompt once"
    assert_same(policy, (lp0, ent0, mask0, loss0, g0), (lp1, ent1, mask1, loss1, g1))


def assert_same(policy, plain, shared) -> None:
    lp0, ent0, mask0, loss0, g0 = plain
    lp1, ent1, mask1, loss1, g1 = shared
    assert torch.equal(mask0, mask1) and mask0.sum() > 0
    torch.testing.assert_close(lp1 * mask1, lp0 * mask0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent1 * mask1, ent0 * mask0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-6)
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert set(g0) == set(g1) == trainable, "every trainable parameter gets a gradient on both paths"
    for name in g0:
        assert g0[name].abs().sum() > 0, f"{name}: zero gradient, the comparison would be vacuous"
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("kind", ["builtin", "hf"])
def test_one_pass_fallback_equals_plain(request, kind):
    base = request.getfixturevalue(f"{kind}_policy")
    pol = OnePassPolicy(base.cfg, base.tok, base.model)
    rows, comps = make_group_batch(pol, [5, 8, 2], 3, seed=21)
    batch = build_batch(rows, comps, pol.tok.pad_id)
    plain = grpo_loss_and_grads(pol, batch, 3, shared=False, seed=4)
    with TokenCounter(pol) as count:
        shared = grpo_loss_and_grads(pol, batch, 3, shared=True, seed=4)
    assert count.n == computed_tokens(batch, None)
    assert_same(pol, plain, shared)


def test_default_shares_only_when_rows_share_a_prompt(policy):
    rows, comps = make_group_batch(policy, [5, 3], group=4, seed=7)
    batch = build_batch(rows, comps, policy.tok.pad_id)
    P, T, B = batch.prompt_len, batch.ids.shape[1], batch.ids.shape[0]
    with torch.no_grad(), TokenCounter(policy) as count:
        batch_logprobs(policy, batch)
    assert count.n == computed_tokens(batch, policy.chunk_overhead), "default: each prompt once"
    assert count.n < B * (T - 1)
    policy.share_prompts = False
    with torch.no_grad(), TokenCounter(policy) as count:
        batch_logprobs(policy, batch)
    assert count.n == B * (T - 1), "share_prompts off: every row in full"
    policy.share_prompts = True
    distinct = build_batch([r + [9] * i for i, r in enumerate(rows)], comps, policy.tok.pad_id)
    with torch.no_grad(), TokenCounter(policy) as count:
        batch_logprobs(policy, distinct)
    assert count.n == B * (distinct.ids.shape[1] - 1), "no prompt repeats: plain single forward"


def test_only_completion_tokens_are_scored(policy):
    rows, comps = make_group_batch(policy, [4, 6], group=2, seed=3, max_comp=5)
    batch = build_batch(rows, comps, policy.tok.pad_id)
    with torch.no_grad():
        logp, _, mask = batch_logprobs(policy, batch)
    C = batch.ids.shape[1] - batch.prompt_len
    assert logp.shape == mask.shape == (len(rows), C)
    assert mask.sum(-1).tolist() == [float(len(c)) for c in comps]


def test_completions_of_length_one_block(policy):
    """A completion block one token wide (C = 1): only the prompt pass runs."""
    rows, _ = make_group_batch(policy, [5, 2, 8], group=3, seed=11)
    comps = [[7] if i % 2 else [] for i in range(len(rows))]
    batch = build_batch(rows, comps, policy.tok.pad_id)
    plain = grpo_loss_and_grads(policy, batch, 3, shared=False, seed=2)
    with TokenCounter(policy) as count:
        shared = grpo_loss_and_grads(policy, batch, 3, shared=True, seed=2)
    assert count.n == 3 * batch.prompt_len
    assert_same(policy, plain, shared)


def _generate(pol: Policy, prompts, share: bool, temperature: float, seed: int):
    pol.share_prompts = share
    g = torch.Generator().manual_seed(seed)
    with TokenCounter(pol) as count:
        comps, trunc = pol.generate(prompts, 8, temperature=temperature, generator=g)
    pol.share_prompts = True
    return comps, trunc, count.n


@pytest.mark.parametrize("group", [1, 4])
def test_generation_is_unchanged(policy, group):
    """Greedy and seeded sampling give the same completions with and without sharing. (Sampling
    could differ only if a uniform draw fell within float rounding of a cumulative-probability
    boundary — odds about 1e-6 per token; the seeds are fixed, so the test is deterministic.)"""
    rows, _ = make_group_batch(policy, [6, 2, 9], group, seed=5)
    P, B = max(map(len, rows)), len(rows)
    for temperature, seed in ((0.0, 0), (1.0, 0), (1.0, 1)):
        plain, trunc0, n0 = _generate(policy, rows, False, temperature, seed)
        shared, trunc1, n1 = _generate(policy, rows, True, temperature, seed)
        assert shared == plain and trunc1 == trunc0, (temperature, seed)
        assert n0 - n1 == (B - 3) * P, "the prefill runs each distinct prompt once"
    assert len({tuple(c) for c in plain}) > 1, "sampled completions differ within a group"


@pytest.mark.parametrize("share", [True, False])
def test_model_config_switch_reaches_the_policy_and_its_reference(make_cfg, share):
    """`model.share_prompts` in the run config sets the policy's switch (and the KL reference's,
    built from the same model config); a GRPO step runs either way."""
    from trainer.config import RunConfig
    from trainer.loop import Trainer

    cfg = RunConfig.parse(make_cfg(model={"share_prompts": share},
                                   recipe={"algorithm": "grpo", "steps": 1, "batch_size": 2, "group_size": 3,
                                           "kl_coef": 0.1}))
    tr = Trainer(cfg)
    tr.run()
    assert tr.policy.share_prompts is share
    assert tr.ref_policy is not None and tr.ref_policy.share_prompts is share
