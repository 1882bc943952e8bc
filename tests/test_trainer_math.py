"""The trainer's math on hand-built tensors: advantage estimators, policy losses (clipping on both
sides for both signs of the advantage, the k3 KL), loss aggregation, the plug-in registries,
token sampling, the batch layout, and the model's incremental decoding and left padding against a
full forward pass."""
from __future__ import annotations

import math

import pytest
import torch

from trainer.algorithms import core
from trainer.algorithms.core import (
    ADVANTAGES,
    aggregate,
    get_advantage,
    get_loss,
    k3_kl,
    register_advantage,
    register_loss,
    token_logprobs_torch,
)
from trainer.config import ModelConfig
from trainer.policy import Policy, build_batch, positions_from_mask, sample_token

# ---- advantages ---------------------------------------------------------------------------------


def test_grpo_advantage_normalises_by_unbiased_group_std():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.5, 1.0]])
    adv = get_advantage("grpo")(r)
    # row 0: mean 0.5, unbiased std sqrt(4·0.25/3) = 1/sqrt(3) → ±0.5·sqrt(3)
    s = 0.5 * math.sqrt(3)
    torch.testing.assert_close(adv[0], torch.tensor([s, -s, -s, s]), rtol=1e-5, atol=1e-5)
    # row 1: no variance → zero advantage (eps keeps it finite)
    torch.testing.assert_close(adv[1], torch.zeros(4))
    # row 2: mean 0.375; deviations (-.375, -.375, .125, .625); sum of squares .6875; std sqrt(.6875/3)
    std = math.sqrt(0.6875 / 3)
    torch.testing.assert_close(adv[2], torch.tensor([-0.375, -0.375, 0.125, 0.625]) / std, rtol=1e-5, atol=1e-5)


def test_dr_grpo_advantage_only_centres():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 1.0]])
    adv = get_advantage("dr_grpo")(r)
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5, -0.5, 0.5], [-0.375, -0.375, 0.125, 0.625]]))


def test_rloo_advantage_is_leave_one_out():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 1.0]])
    adv = get_advantage("rloo")(r)
    # r_i − mean of the other three
    expected = torch.tensor([[1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3],
                             [0 - 0.5, 0 - 0.5, 0.5 - 1 / 3, 1 - 0.5 / 3]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(get_advantage("rloo")(torch.tensor([[0.7]])), torch.zeros(1, 1))


# ---- losses -------------------------------------------------------------------------------------


def _ratio_case():
    """Five tokens with importance ratios (1.5, 0.5, 1.5, 0.5, 1.1) and advantages (+, +, −, −, +)."""
    ratio = torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.1]])
    logp = ratio.log().clone().requires_grad_(True)
    old = torch.zeros_like(logp)
    adv = torch.tensor([[2.0, 2.0, -2.0, -2.0, 2.0]])
    mask = torch.ones_like(adv)
    return logp, old, adv, mask


def test_grpo_clip_clips_on_both_sides_for_both_signs():
    logp, old, adv, mask = _ratio_case()
    per_tok, stats = get_loss("grpo_clip")(logp, old, None, adv, mask, 0.2, 0.0)
    # A>0, r=1.5: min(1.5A, 1.2A) = 1.2A (clipped)      A>0, r=0.5: min(0.5A, 0.8A) = 0.5A
    # A<0, r=1.5: min(1.5A, 1.2A) = 1.5A = −3           A<0, r=0.5: min(0.5A, 0.8A) = 0.8A = −1.6
    # inside the trust region (r=1.1): 1.1A
    expected = -torch.tensor([[1.2 * 2, 0.5 * 2, 1.5 * -2, 0.8 * -2, 1.1 * 2]])
    torch.testing.assert_close(per_tok.detach(), expected)
    # gradient d(−r·A)/dlogp = −r·A where the unclipped term is the minimum, 0 where clipped
    per_tok.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.0, 3.0, 0.0, -2.2]]))
    assert float(stats["clip_frac"]) == pytest.approx(4 / 5)
    assert "kl" not in stats


def test_grpo_clip_adds_k3_kl_and_respects_mask():
    logp = torch.tensor([[0.0, -1.0, -0.5]])
    ref = torch.tensor([[math.log(2.0), -1.0, -0.5]])
    adv = torch.zeros_like(logp)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    per_tok, stats = get_loss("grpo_clip")(logp, logp, ref, adv, mask, 0.2, 0.5)
    kl0 = 2.0 - math.log(2.0) - 1.0  # exp(d) − d − 1 with d = log 2
    torch.testing.assert_close(per_tok, torch.tensor([[0.5 * kl0, 0.0, 0.0]]))
    assert float(stats["kl"]) == pytest.approx(kl0 / 2)  # mean over the 2 masked-in tokens


def test_k3_kl_is_nonnegative_and_zero_when_equal():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, generator=g), torch.randn(64, generator=g)
    assert bool((k3_kl(a, b) >= 0).all())
    torch.testing.assert_close(k3_kl(a, a), torch.zeros(64))
    assert float(k3_kl(torch.tensor(0.0), torch.tensor(math.log(2.0)))) == pytest.approx(1 - math.log(2.0))


def test_reinforce_loss_is_minus_advantage_times_logp():
    logp = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0]])
    per_tok, stats = get_loss("reinforce")(logp, logp.detach(), None, adv, torch.ones(1, 2), 0.2, 0.0)
    torch.testing.assert_close(per_tok.detach(), torch.tensor([[1.0, -2.0]]))
    per_tok.sum().backward()
    torch.testing.assert_close(logp.grad, -adv)
    assert stats == {}
    _, stats = get_loss("reinforce")(logp, logp.detach(), logp.detach() + 1.0, adv, torch.ones(1, 2), 0.2, 0.1)
    assert float(stats["kl"].detach()) == pytest.approx(math.e - 2.0)


def test_aggregate_modes():
    per = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert float(aggregate(per, mask, "token_mean")) == pytest.approx(7 / 3)
    assert float(aggregate(per, mask, "token_sum")) == pytest.approx(7.0)
    assert float(aggregate(per, mask, "seq_mean_token_mean")) == pytest.approx((1.5 + 4.0) / 2)
    assert float(aggregate(per, torch.zeros_like(mask), "token_mean")) == 0.0
    with pytest.raises(ValueError, match="nope"):
        aggregate(per, mask, "nope")


def test_token_logprobs_against_reference():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 7, 11, generator=g)  # odd shape on purpose
    targets = torch.randint(0, 11, (3, 7), generator=g)
    logp, ent = token_logprobs_torch(logits, targets)
    probs = torch.softmax(logits.double(), -1)
    ref_logp = probs.log().gather(-1, targets[..., None]).squeeze(-1)
    ref_ent = -(probs * probs.log()).sum(-1)
    torch.testing.assert_close(logp.double(), ref_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=1e-5, atol=1e-5)
    _, ent_u = token_logprobs_torch(torch.zeros(1, 11), torch.zeros(1, dtype=torch.long))
    assert float(ent_u) == pytest.approx(math.log(11), rel=1e-5)


# ---- registries ---------------------------------------------------------------------------------


def test_registry_rejects_duplicates_and_unknown_names():
    with pytest.raises(ValueError, match="grpo"):
        register_advantage("grpo")(lambda r: r)
    with pytest.raises(ValueError, match="grpo_clip"):
        register_loss("grpo_clip")(lambda *a: a)
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        get_advantage("nope")
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        get_loss("nope")


def test_registry_plugs_in_a_new_estimator():
    name = "test_math_plugin"
    try:
        @register_advantage(name)
        def plugin(rewards):
            return rewards * 2

        assert get_advantage(name) is plugin
        torch.testing.assert_close(get_advantage(name)(torch.ones(1, 2)), torch.full((1, 2), 2.0))
    finally:
        ADVANTAGES.pop(name, None)
    assert name not in core.ADVANTAGES


# ---- sampling -----------------------------------------------------------------------------------


def test_sample_token_greedy_is_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0], [2.0, 1.0, 0.0]])
    assert sample_token(logits, 0.0, 1.0, None).tolist() == [1, 0]
    # greedy ignores top_p and the generator
    assert sample_token(logits, 0.0, 0.1, torch.Generator().manual_seed(3)).tolist() == [1, 0]


def test_sample_token_top_p_keeps_only_the_nucleus():
    # probabilities (0.5, 0.3, 0.2): top_p 0.6 keeps tokens 0 and 1 (0.5 < 0.6, then 0.8 ≥ 0.6)
    logits = torch.tensor([0.5, 0.3, 0.2]).log().expand(4000, 3).contiguous()
    g = torch.Generator().manual_seed(0)
    toks = sample_token(logits, 1.0, 0.6, g)
    counts = torch.bincount(toks, minlength=3)
    assert int(counts[2]) == 0
    # renormalised nucleus: P(0) = 0.625; 4000 draws have std 0.0077, so ±0.04 is > 5σ (odds < 1e-6)
    assert abs(float(counts[0]) / 4000 - 0.625) < 0.04
    # a tiny top_p always keeps the top token: sampling becomes greedy
    assert set(sample_token(logits, 1.0, 0.01, g).tolist()) == {0}
    # no nucleus: all three tokens appear (P(token 2 never in 4000) = 0.8^4000)
    assert set(sample_token(logits, 1.0, 1.0, g).tolist()) == {0, 1, 2}
    # the generator makes sampling reproducible
    a = sample_token(logits[:50], 1.0, 0.9, torch.Generator().manual_seed(7))
    b = sample_token(logits[:50], 1.0, 0.9, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


# ---- batch layout -------------------------------------------------------------------------------


def test_build_batch_layout():
    b = build_batch([[5, 6, 7], [8]], [[9], [10, 11, 12]], pad_id=0)
    assert b.prompt_len == 3
    assert b.ids.tolist() == [[5, 6, 7, 9, 0, 0], [0, 0, 8, 10, 11, 12]]
    assert b.attn.tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    assert b.positions.tolist() == [[0, 1, 2, 3, 3, 3], [0, 0, 0, 1, 2, 3]]
    assert b.loss_mask.tolist() == [[0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 1]]
    empty = build_batch([[5]], [[]], pad_id=0)
    assert empty.ids.tolist() == [[5, 0]] and empty.loss_mask.sum() == 0


# ---- the built-in model: KV cache and left padding -----------------------------------------------


@pytest.fixture(scope="module")
def builtin_policy():
    return Policy.build(ModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=32), seed=3)


def _full_logits(policy: Policy, ids, attn, pos) -> torch.Tensor:
    with torch.no_grad():
        return policy.model.lm_head(policy.hidden(ids, attn, pos))


@pytest.mark.parametrize("prompts", [[[1, 5, 6, 7, 8, 9], [1, 10, 11]],    # different lengths → left padding: masked
                                     [[1, 5, 6, 7], [1, 10, 11, 12]]],     # no padding: a decoded token attends to all, unmasked
                         ids=["left_padded", "unpadded"])
def test_kv_cache_decoding_equals_full_forward(builtin_policy, prompts):
    pol = builtin_policy
    m = pol.model.eval()
    g = torch.Generator().manual_seed(0)
    b = build_batch(prompts, [[]] * 2, pol.tok.pad_id)
    P = b.prompt_len
    ids, attn = b.ids[:, :P], b.attn[:, :P]
    pos = positions_from_mask(attn)
    steps = 6
    new = torch.randint(4, pol.tok.vocab_size, (2, steps), generator=g)
    with torch.no_grad():
        cache = m.new_cache(2)
        logits_inc = [m.lm_head(m(ids, attention_mask=attn, cache=cache, positions=pos)[:, -1])]
        full_attn = torch.zeros(2, m.cfg.max_seq_len, dtype=torch.long)
        full_attn[:, :P] = attn
        for t in range(steps):
            full_attn[:, P + t] = 1
            p = pos[:, -1] + 1 + t
            h = m(new[:, t : t + 1], attention_mask=full_attn, cache=cache, positions=p[:, None])
            logits_inc.append(m.lm_head(h[:, -1]))
    seq = torch.cat([ids, new], 1)
    seq_attn = torch.cat([attn, torch.ones_like(new)], 1)
    full = _full_logits(pol, seq, seq_attn, positions_from_mask(seq_attn))  # (B, P+steps, V)
    for t in range(steps + 1):
        torch.testing.assert_close(logits_inc[t], full[:, P - 1 + t], rtol=1e-4, atol=1e-5)


def _greedy_consistent(pol: Policy, prompts: list[list[int]], max_new: int) -> None:
    """Greedy generation (KV cache) picks, at every step, the argmax of a full teacher-forced
    forward pass over the same layout the trainer scores."""
    comps, trunc = pol.generate(prompts, max_new, temperature=0.0)
    assert len(comps) == len(prompts) and len(trunc) == len(prompts)
    b = build_batch(prompts, comps, pol.tok.pad_id)
    full = _full_logits(pol, b.ids, b.attn, b.positions)
    P = b.prompt_len
    for i, c in enumerate(comps):
        for t, tok in enumerate(c):
            row = full[i, P - 1 + t]
            assert int(row.argmax()) == tok or float(row.max() - row[tok]) < 1e-5, (i, t)


def test_greedy_generation_matches_teacher_forced_argmax(builtin_policy):
    _greedy_consistent(builtin_policy, [[1, 5, 6, 7, 8, 9, 10], [1, 20], [1, 30, 31, 32]], 8)


def test_left_padding_gives_the_same_logits_as_unpadded(builtin_policy):
    pol = builtin_policy
    short = [1, 12, 13, 14]
    long = [1, 20, 21, 22, 23, 24, 25, 26, 27]
    b = build_batch([long, short], [[]] * 2, pol.tok.pad_id)
    padded = _full_logits(pol, b.ids, b.attn, b.positions)
    alone_ids = torch.tensor([short])
    alone = _full_logits(pol, alone_ids, torch.ones_like(alone_ids), positions_from_mask(torch.ones_like(alone_ids)))
    n = len(short)
    P = b.prompt_len
    torch.testing.assert_close(padded[1, P - n : P], alone[0], rtol=1e-4, atol=1e-5)


def test_hf_model_padding_and_cache_consistency(tiny_hf_dir):
    pol = Policy.build(ModelConfig(kind="hf", path=str(tiny_hf_dir)))
    enc = pol.tok.encode
    short, long = [pol.tok.bos_id] + enc("12+3="), [pol.tok.bos_id] + enc("r:98765=")
    b = build_batch([long, short], [[]] * 2, pol.tok.pad_id)
    padded = _full_logits(pol, b.ids, b.attn, b.positions)
    ids = torch.tensor([short])
    alone = _full_logits(pol, ids, torch.ones_like(ids), positions_from_mask(torch.ones_like(ids)))
    P, n = b.prompt_len, len(short)
    torch.testing.assert_close(padded[1, P - n : P], alone[0], rtol=1e-4, atol=1e-5)
    _greedy_consistent(pol, [long, short], 6)


def test_rotary_rotates_interleaved_pairs_and_scores_depend_on_relative_position():
    """apply_rotary (one complex multiply) equals rotating each pair (x[2i], x[2i+1]) by hand,
    forward and backward, and a rotated query·key product depends only on the position gap."""
    import torch

    from trainer.model import apply_rotary, rotary_tables

    torch.manual_seed(0)
    cos, sin = rotary_tables(8, 16)
    x = torch.randn(2, 3, 16, 8, dtype=torch.float64, requires_grad=True)
    x1, x2 = x[..., ::2], x[..., 1::2]
    ref = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    got = apply_rotary(x, cos, sin)
    assert got.dtype == x.dtype and torch.allclose(got, ref, atol=1e-12)
    w = torch.randn_like(ref)
    g_ref, = torch.autograd.grad((ref * w).sum(), x)
    g_got, = torch.autograd.grad((got * w).sum(), x)
    assert torch.allclose(g_got, g_ref, atol=1e-12)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    at = lambda v, p: apply_rotary(v.view(1, 1, 1, 8), cos[p], sin[p]).flatten()  # noqa: E731
    assert torch.allclose(at(q, 5) @ at(k, 2), at(q, 13) @ at(k, 10), atol=1e-6)
    assert not torch.allclose(at(q, 5) @ at(k, 2), at(q, 5) @ at(k, 4), atol=1e-3)


def test_right_padded_batches_take_the_causal_path_with_the_same_real_token_states(monkeypatch):
    """Without left padding the built-in model runs SDPA's plain causal path; the hidden states
    of every real token equal those of the explicit padding mask (forced here)."""
    import torch

    import trainer.model as tm
    from trainer.config import ModelConfig

    torch.manual_seed(0)
    m = tm.TinyLM(ModelConfig(kind="builtin", d_model=32, n_layers=2, n_heads=4, max_seq_len=16), 20)
    ids = torch.randint(4, 20, (3, 7))
    attn = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    assert tm.right_padded(attn) and not tm.right_padded(attn.flip(1))
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(tm.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(k) or sdpa(*a, **k))
    fast = m(ids, attention_mask=attn)
    assert all(k["attn_mask"] is None and k["is_causal"] for k in calls)
    monkeypatch.setattr(tm, "right_padded", lambda mask: False)
    slow = m(ids, attention_mask=attn)
    real = attn.bool()
    assert torch.allclose(fast[real], slow[real], atol=1e-5)


def test_learned_positions_are_optional_and_trained():
    """`model.learned_positions` adds an absolute position table (off by default) that takes part
    in the forward pass and gets a gradient; positions follow the real tokens of padded rows."""
    import torch

    from trainer.config import ModelConfig
    from trainer.model import TinyLM

    cfg = dict(kind="builtin", d_model=16, n_layers=1, n_heads=2, max_seq_len=8)
    assert TinyLM(ModelConfig(**cfg), 12).pos_embed is None
    torch.manual_seed(0)
    m = TinyLM(ModelConfig(**cfg, learned_positions=True), 12)
    ids = torch.randint(4, 12, (2, 5))
    m.lm_head(m(ids)).sum().backward()
    assert m.pos_embed.weight.grad[:5].abs().sum() > 0 and m.pos_embed.weight.grad[5:].abs().sum() == 0
    with torch.no_grad():
        before = m(ids)
        m.pos_embed.weight[2] += 1.0  # position 2 only: changes that token and the ones after it
        diff = (m(ids) - before).abs().sum(-1)  # (B, T)
    assert (diff[:, :2] == 0).all() and (diff[:, 2:] > 0).all()


def test_init_choice_scales_only_the_residual_projections():
    """`model.init`: 'scaled_residual' (default) draws the attention output and MLP down projections
    from N(0, 0.02/sqrt(2L)); 'torch' leaves every layer at PyTorch's default (Kaiming-uniform,
    std = 1/sqrt(3·fan_in)); every other parameter is drawn the same way in both."""
    import math

    import torch

    from trainer.config import ModelConfig
    from trainer.model import TinyLM

    cfg = dict(kind="builtin", d_model=64, n_layers=2, n_heads=2, max_seq_len=8)
    torch.manual_seed(0)
    scaled = TinyLM(ModelConfig(**cfg), 12)
    torch.manual_seed(0)
    plain = TinyLM(ModelConfig(**cfg, init="torch"), 12)
    for b_s, b_p in zip(scaled.blocks, plain.blocks):
        for name, fan_in in (("attn.proj", 64), ("mlp.down", b_p.mlp.down.in_features)):
            ws, wp = b_s.get_submodule(name).weight, b_p.get_submodule(name).weight
            assert abs(ws.std().item() - 0.02 / math.sqrt(4)) < 0.002, name
            assert abs(wp.std().item() - 1 / math.sqrt(3 * fan_in)) < 0.2 / math.sqrt(3 * fan_in), name
    residual = {n for n, _ in scaled.named_parameters() if n.endswith(("attn.proj.weight", "mlp.down.weight"))}
    assert len(residual) == 4
    for (n, a), (_, b) in zip(scaled.named_parameters(), plain.named_parameters()):
        if n not in residual:   # the scaled init runs after every layer is built: the rest is identical
            assert torch.equal(a, b), n


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_builtin_model_runs_in_other_dtypes(dtype):
    """The rotary table is complex64 whatever the model's dtype (bf16 has no complex type)."""
    from trainer.config import ModelConfig
    from trainer.model import TinyLM

    torch.manual_seed(0)
    m32 = TinyLM(ModelConfig(kind="builtin", d_model=32, n_layers=1, n_heads=2, max_seq_len=16), 20)
    m = TinyLM(ModelConfig(kind="builtin", d_model=32, n_layers=1, n_heads=2, max_seq_len=16), 20)
    m.load_state_dict(m32.state_dict())
    m = m.to(dtype)
    ids = torch.randint(0, 20, (2, 5))
    h = m(ids)
    assert h.dtype == dtype
    torch.testing.assert_close(h.float(), m32(ids), rtol=0.05, atol=0.05)
