"""Multi-turn GRPO (trainer/algorithms/agent_grpo.py) and the agent trainer (trainer/agent_train.py):
prefix merging and loss masks on hand-built trajectories, the per-trajectory normalisation and the
masking held against a row-by-row reference gradient, batched rollouts equal to sequential ones,
and a tiny end-to-end run (warm-up + GRPO) whose held-out success rises and whose every trainable
parameter changes under GRPO."""
from __future__ import annotations

import json

import pytest
import torch

from test_agent_fakes import ScriptedPolicy
from trainer.agent_batching import BatchedGenerator
from trainer.agent_rollout import PolicyGenerator, demonstration, run_episode
from trainer.agent_train import AgentTrainConfig, AgentTrainer, DemoGenerator, main
from trainer.algorithms.agent_grpo import (Call, Row, agent_grpo_loss, episodes_from_records, fit_batches,
                                           group_advantages, merge_calls, per_trajectory_mean, row_logprobs,
                                           rows_batch, sft_rows_loss, trajectory_calls)
from trainer.config import ConfigError, ModelConfig
from trainer.envs import make_env
from trainer.logprobs import batch_logprobs
from trainer.policy import Policy, build_batch
from trainer.tokenizer import CharTokenizer

TOK = CharTokenizer()


# ---- prefix merging on hand-built trajectories ---------------------------------------------
def test_calls_that_extend_each_other_become_one_row_with_the_policy_tokens_masked_in():
    p0, c0 = [1, 10, 11], [20, 21]
    obs = [30, 31, 32]                      # template + tool output between the turns
    p1 = p0 + c0 + obs
    c1 = [22, 23, 24]
    p2 = p1 + c1 + [33]
    c2 = [25]
    rows, drift = merge_calls([Call(p0, c0), Call(p1, c1), Call(p2, c2)], trajectory=7)
    assert drift == 0 and len(rows) == 1
    r = rows[0]
    assert r.prompt_ids == p0 and r.trajectory == 7
    assert r.completion_ids == c0 + obs + c1 + [33] + c2
    assert r.mask == [1, 1, 0, 0, 0, 1, 1, 1, 0, 1]
    assert r.turn == [0, 0, -1, -1, -1, 1, 1, 1, -1, 2]


@pytest.mark.parametrize("second_prompt, why", [
    ([1, 10, 11, 20, 30, 31], "a completion token missing (the previous turn re-tokenized)"),
    ([1, 10, 11, 20, 99, 30], "a completion token changed"),
    ([1, 10, 11, 20], "the prompt shorter than the previous prompt + completion"),
    ([1, 11, 30], "an old turn dropped by the context policy"),
])
def test_a_call_that_does_not_extend_exactly_starts_a_new_row_and_counts_as_drift(second_prompt, why):
    calls = [Call([1, 10, 11], [20, 21]), Call(second_prompt, [22, 23]), Call(second_prompt + [22, 23, 5], [24])]
    rows, drift = merge_calls(calls, trajectory=3)
    assert drift == 1, why
    assert [r.prompt_ids for r in rows] == [[1, 10, 11], second_prompt]
    assert rows[0].mask == [1, 1] and rows[1].mask == [1, 1, 0, 1]
    assert rows[1].turn == [1, 1, -1, 2] and {r.trajectory for r in rows} == {3}


def test_a_real_trajectory_is_one_row_equal_to_its_transcript_and_mask():
    env = make_env("lookup", seed=0)
    h = env.default_harness()
    ex = env.episode("train", 3, 2)
    k0, k1 = ex.meta["asked"]
    outputs = [f'<tool>get(key="{k0}")</tool>', '<tool>get(key="nope")</tool>', f'<tool>get(key="{k1}")</tool>',
               f"<answer>{ex.answer}</answer>"]
    traj = run_episode(ScriptedPolicy(outputs), env, ex, h)
    assert traj.reward == 1.0 and traj.tool_errors == 1
    rows, drift = merge_calls(trajectory_calls(traj))
    assert drift == 0 and len(rows) == 1
    r = rows[0]
    # the row is the transcript up to the last completion (the template suffix after it is never trained on)
    n = len(r.prompt_ids) + len(r.completion_ids)
    assert r.prompt_ids + r.completion_ids == traj.ids[:n]
    assert r.mask == traj.mask[len(r.prompt_ids): n] and not any(traj.mask[n:])
    policy_text = TOK.decode([t for t, m in zip(r.completion_ids, r.mask) if m])
    assert policy_text == "".join(outputs)
    masked_text = TOK.decode([t for t, m in zip(r.completion_ids, r.mask) if not m])
    assert "T: error: no key 'nope'" in masked_text and f"T: {ex.meta['table'][k0]}" in masked_text


def test_a_context_edit_makes_per_call_rows_with_the_drift_counted():
    env = make_env("lookup", seed=0)
    ex = env.episode("train", 0, 1)
    long_key = "w" * 35
    outputs = [f'<tool>get(key="{long_key}")</tool>', f'<tool>get(key="{long_key}x")</tool>',
               f'<tool>get(key="{ex.meta["asked"][0]}")</tool>', f"<answer>{ex.answer}</answer>"]
    free = run_episode(ScriptedPolicy(outputs), env, ex, env.default_harness())
    budget = len(free.steps[3].prompt_ids) + 64 - 5   # the fourth prompt overflows: its oldest turn is dropped
    h = env.default_harness(context={"kind": "drop_oldest", "max_tokens": budget, "keep_last_turns": 1})
    traj = run_episode(ScriptedPolicy(outputs), env, ex, h)
    assert traj.reward == 1.0 and [s.extends_previous for s in traj.steps] == [True, True, True, False]
    rows, drift = merge_calls(trajectory_calls(traj), trajectory=0)
    assert drift == 1 and len(rows) == 2
    assert rows[1].prompt_ids == traj.steps[3].prompt_ids and rows[1].completion_ids == traj.steps[3].completion_ids
    assert sum(sum(r.mask) for r in rows) == sum(len(s.completion_ids) for s in traj.steps)


def test_endpoint_records_become_episodes_keeping_the_last_attempt():
    recs = [
        {"type": "call", "episode": "e1", "attempt": "1", "call": 1, "prompt_ids": [1, 2], "completion_ids": [3]},
        {"type": "call", "episode": "e2", "attempt": None, "call": 1, "prompt_ids": [1, 2], "completion_ids": [4]},
        {"type": "call", "episode": "e1", "attempt": "2", "call": 2, "prompt_ids": [1, 2], "completion_ids": [5]},
        {"type": "call", "episode": "e1", "attempt": "2", "call": 3, "prompt_ids": [1, 2, 5, 9], "completion_ids": [6]},
        {"type": "reward", "episode": "e1", "reward": 1.0},
        {"type": "reward", "episode": "e3", "reward": 1.0},
    ]
    eps = episodes_from_records(recs)
    assert sorted(eps) == ["e1", "e2"]
    assert eps["e1"]["calls"] == [Call([1, 2], [5]), Call([1, 2, 5, 9], [6])] and eps["e1"]["attempt"] == "2"
    assert eps["e1"]["reward"] == 1.0 and eps["e2"]["reward"] is None and eps["e1"]["prompt"] == (1, 2)
    rows, drift = merge_calls(eps["e1"]["calls"])
    assert drift == 0 and rows[0].mask == [1, 0, 1]


def test_group_advantages_normalise_each_group_on_its_own():
    adv = group_advantages([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0], [0.0, 1.0, 0.5]])
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item()
    assert adv[0] == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std], rel=1e-4)
    assert adv[1] == [0.0, 0.0]
    assert adv[2] == pytest.approx([-1.0, 1.0, 0.0], abs=1e-4)
    with pytest.raises(ValueError, match="unknown advantage"):
        group_advantages([[1.0]], "nope")


def test_per_trajectory_mean_weighs_each_trajectory_once_whatever_its_rows():
    per_tok = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    # trajectory 0 = rows 0 and 1 (tokens 1, 2, 3), trajectory 1 = row 2, trajectory 2 has no tokens
    got = per_trajectory_mean(per_tok, mask, torch.tensor([0, 0, 1]), 3)
    assert float(got) == pytest.approx(((1 + 2 + 3) / 3 + 5.0 + 0.0) / 3)


# ---- the loss against a row-by-row reference ----------------------------------------------
def tiny_policy(seed: int = 0) -> Policy:
    return Policy.build(ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=128), seed=seed)


def test_agent_grpo_loss_gradient_equals_the_per_trajectory_reference():
    """At ratio 1 the clipped surrogate's gradient is that of -mean_i A_i · mean_{t ∈ policy tokens of i} log p_t
    (times the turn discount); computed here row by row, with the masks built by hand."""
    pol = tiny_policy()
    pol.share_prompts = True
    trajs = [  # (rows as (prompt, completion, hand mask, turn)), advantage, turns
        ([([1, 5, 6], [7, 8, 9, 10, 11], [1, 1, 0, 0, 1], [0, 0, -1, -1, 1])], 1.5, 2),
        ([([1, 5, 6], [12, 13], [1, 1], [0, 0]), ([1, 40, 41, 42], [14, 15, 16], [1, 0, 1], [1, -1, 2])], -0.5, 3),
        ([([1, 5, 6], [17], [1], [0])], -1.0, 1),
    ]
    rows = [Row(p, c, t, i) for i, (rs, _, _) in enumerate(trajs) for p, c, _, t in rs]
    adv, turns = [a for _, a, _ in trajs], [n for _, _, n in trajs]
    for discount, max_len in ((1.0, None), (0.5, None), (0.5, 7)):
        if max_len is not None:   # rows scored in several batches (the padded width passes the policy's length)
            pol._max_len = lambda: max_len
            assert len(fit_batches(rows, max_len)) > 1
        loss, stats = agent_grpo_loss(pol, rows, adv, turns, turn_discount=discount)
        pol.model.zero_grad()
        loss.backward()
        got = {n: p.grad.clone() for n, p in pol.model.named_parameters()}
        pol.model.zero_grad()
        ref, value = 0.0, 0.0
        for rs, a, n in trajs:
            num, weight, tokens = 0.0, 0.0, 0
            for p, c, m, t in rs:
                logp, _, _ = batch_logprobs(pol, build_batch([p], [c], 0), shared=False)  # (1, C)
                w = torch.tensor([discount ** (n - 1 - x) if x >= 0 else 0.0 for x in t])
                num = num + (logp[0] * w * torch.tensor(m, dtype=torch.float32)).sum()
                weight += float((w * torch.tensor(m, dtype=torch.float32)).sum())
                tokens += sum(m)
            ref = ref - a * num / tokens
            value -= a * weight / tokens
        ref = ref / len(trajs)
        # ratio ≡ 1: the surrogate's value is -mean_i A_i·mean_t w_t; its gradient that of the log-probs
        assert float(loss.detach()) == pytest.approx(value / len(trajs), abs=1e-5)
        ref.backward()
        for name, p in pol.model.named_parameters():
            assert torch.allclose(got[name], p.grad, atol=1e-6), name
        assert stats["policy_tokens"] == 8.0 and stats["rows"] == 4.0


def test_tool_output_tokens_get_no_gradient():
    """A masked (tool-output) token's own log-prob does not count: changing it leaves the loss and
    every gradient as they were."""
    pol = tiny_policy()
    out = []
    for obs in (30, 31):
        rows = [Row([1, 5, 6], [7, 8, obs], [0, 0, -1], 0), Row([1, 5, 6], [10, 11], [0, 0], 1)]
        loss, _ = agent_grpo_loss(pol, rows, [1.0, -1.0], [1, 1])
        pol.model.zero_grad()
        loss.backward()
        out.append((float(loss.detach()), torch.cat([p.grad.flatten() for p in pol.model.parameters()])))
    assert out[0][0] == pytest.approx(out[1][0]) and torch.allclose(out[0][1], out[1][1])
    assert out[0][1].abs().sum() > 0


def test_fit_batches_keeps_each_batch_within_the_policy_length():
    rows = [Row([1] * p, [2] * c, [0] * c, i) for i, (p, c) in enumerate([(3, 9), (9, 2), (3, 1), (5, 5), (9, 3)])]
    batches = fit_batches(rows, 11)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    for b in batches:
        assert max(len(rows[i].prompt_ids) for i in b) + max(len(rows[i].completion_ids) for i in b) - 1 <= 11
    assert fit_batches(rows, 100) == [[0, 2, 3, 1, 4]]
    with pytest.raises(ValueError, match="longer than the policy's 10"):
        fit_batches(rows, 10)


def test_old_logprobs_of_the_same_weights_give_ratio_one():
    pol = tiny_policy()
    rows = [Row([1, 5, 6], [7, 8, 9], [0, -1, 1], 0), Row([1, 5], [10, 12], [0, 0], 1)]
    old = row_logprobs(pol, rows)
    assert [len(x) for x in old] == [3, 2]
    a, sa = agent_grpo_loss(pol, rows, [1.0, -1.0], [2, 1])
    b, sb = agent_grpo_loss(pol, rows, [1.0, -1.0], [2, 1], old_logp=old)
    assert float(a.detach()) == pytest.approx(float(b.detach()), abs=1e-6) and sb["clip_frac"] == 0.0


def test_kl_to_an_identical_reference_is_zero_and_leaves_the_loss_alone():
    pol, ref = tiny_policy(), tiny_policy()
    rows = [Row([1, 5, 6], [7, 8, 9], [0, -1, 1], 0), Row([1, 5, 6], [10], [0], 1)]
    plain, _ = agent_grpo_loss(pol, rows, [1.0, -1.0], [2, 1])
    with_kl, stats = agent_grpo_loss(pol, rows, [1.0, -1.0], [2, 1], kl_coef=0.5, ref_policy=ref)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)
    assert float(with_kl.detach()) == pytest.approx(float(plain.detach()))
    other = tiny_policy(seed=1)
    _, stats = agent_grpo_loss(pol, rows, [1.0, -1.0], [2, 1], kl_coef=0.5, ref_policy=other)
    assert stats["kl"] > 1e-4


def test_sft_rows_loss_is_the_token_mean_nll_of_the_policy_tokens():
    pol = tiny_policy()
    rows = [Row([1, 5], [7, 8, 9], [0, -1, 1], 0), Row([1, 6, 6], [10], [0], 1)]
    loss, stats = sft_rows_loss(pol, rows)
    lp = [batch_logprobs(pol, build_batch([r.prompt_ids], [r.completion_ids], 0), shared=False)[0][0] for r in rows]
    ref = -(lp[0][0] + lp[0][2] + lp[1][0]) / 3
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), abs=1e-5) and stats["policy_tokens"] == 3.0
    batch, mask, turn = rows_batch(rows, 0)
    assert mask.tolist() == [[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]] and turn[0].tolist() == [0, -1, 1]


# ---- batched rollouts ---------------------------------------------------------------------
def test_batched_rollout_gives_the_sequential_greedy_trajectories():
    env = make_env("lookup", seed=0)
    h = env.default_harness(system_prompt="{tools}", sampling={"max_new_tokens": 24})
    pol = Policy.build(ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=256), seed=1)
    exs = [env.episode("heldout", i, 1) for i in range(5)]
    seq = [run_episode(PolicyGenerator(pol), env, ex, h, greedy=True) for ex in exs]
    b = BatchedGenerator(pol)
    bat = b.run(env, exs, h, greedy=True)
    assert [t.ids for t in bat] == [t.ids for t in seq] and [t.mask for t in bat] == [t.mask for t in seq]
    assert b.rows == sum(len(t.steps) for t in seq) and b.calls < b.rows


def test_a_policy_failure_in_a_batched_rollout_is_raised():
    class Broken:
        tok = TOK

        def _max_len(self):
            return 1024

        def generate(self, *a, **k):
            raise RuntimeError("policy down")

    env = make_env("lookup", seed=0)
    with pytest.raises(RuntimeError, match="policy down"):
        BatchedGenerator(Broken()).run(env, [env.episode("train", i, 1) for i in range(3)], env.default_harness())


# ---- the trainer --------------------------------------------------------------------------
def test_demonstrations_earn_the_reward_with_the_tool():
    tr = AgentTrainer(AgentTrainConfig(env="calc", difficulty=3, max_new_tokens=48, model={"max_seq_len": 512}),
                      printer=None)
    trajs = tr.demonstrations(tr.next_train(4))
    assert all(t.reward == 1.0 and t.tool_calls == 3 and t.tool_errors == 0 for t in trajs)
    assert DemoGenerator(TOK, []).generate([1], 8, 1.0, []) == []
    # a harness the expert cannot succeed in (turns cut short) is refused before any training
    with pytest.raises(ConfigError, match="max_new_tokens=24"):
        AgentTrainer(AgentTrainConfig(env="calc", difficulty=3, max_new_tokens=24, model={"max_seq_len": 512}),
                     printer=None)
    with pytest.raises(ConfigError, match="max_turns=3"):
        AgentTrainer(AgentTrainConfig(env="calc", difficulty=3, max_turns=3, model={"max_seq_len": 512}), printer=None)
    # by default the harness gives the expert's longest turn + 8 tokens and its most turns + 1
    auto = AgentTrainer(AgentTrainConfig(env="calc", difficulty=3, model={"max_seq_len": 512}), printer=None)
    assert auto.harness.max_turns == 5
    longest = max(len(TOK.encode(x)) for i in range(32)
                  for x in demonstration(auto.env, auto.env.episode("train", i, 3), auto.harness))
    assert auto.harness.sampling.max_new_tokens == longest + 8


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="grpo.group_size"):
        AgentTrainConfig.parse({"grpo": {"group_size": 1}})
    with pytest.raises(ConfigError, match="max_new_tokens=300 must be below model.max_seq_len=256"):
        AgentTrainConfig.parse({"max_new_tokens": 300})
    with pytest.raises(ConfigError, match="difficulty=9"):
        AgentTrainer(AgentTrainConfig(env="lookup", difficulty=9), printer=None)


def test_cli_error_is_one_line(capsys, tmp_path):
    assert main(["--env", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown environment 'nope'") and err.count("\n") == 1


FAST = {"system_prompt": "Tools: get(key).", "threads": 1, "max_new_tokens": 32, "max_turns": 4, "eval_size": 32,
        "eval_every": 0, "log_every": 50, "sft": {"steps": 200, "lr": 3e-3, "batch_size": 16}, "grpo": {"steps": 4, "prompts": 4, "group_size": 8}}


def test_warm_up_then_grpo_raises_held_out_success_and_changes_every_parameter(tmp_path):
    """Seed 0, one thread: deterministic. Measured (32 held-out episodes): success 0.0 untrained, 0.66 after
    the warm-up (200 steps), 0.81 after 4 GRPO steps; about 15 s of CPU."""
    threads = torch.get_num_threads()
    lines: list[str] = []
    try:
        cfg = AgentTrainConfig.parse({**FAST, "out_dir": str(tmp_path), "name": "e2e"})
        tr = AgentTrainer(cfg, printer=lines.append)
        tr.start()
        warm = tr.warm_up()
        before = {n: p.detach().clone() for n, p in tr.policy.model.named_parameters() if p.requires_grad}
        final = tr.reinforce()
        summary = tr.finish()
    finally:
        torch.set_num_threads(threads)
    assert summary["heldout_acc_start"] == 0.0
    assert warm >= 0.3, summary
    assert final >= warm - 0.1 and final == summary["heldout_acc"], summary
    unchanged = [n for n, p in tr.policy.model.named_parameters() if p.requires_grad and torch.equal(before[n], p)]
    assert not unchanged, f"GRPO left these parameters unchanged: {unchanged}"
    rows = [json.loads(x) for x in (tmp_path / "e2e" / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if r["algorithm"] == "grpo"]
    assert len(grpo) == 4 and all(r["drift"] == 0 and r["turns_mean"] >= 1 for r in grpo)
    assert any(r["informative_groups"] > 0 and r["skipped"] == 0 for r in grpo)
    # every step that updated logs how far it moved the weights and their size over the untrained
    # model's (the step detectors' evidence: an lr far too low, weights an lr far too high inflated)
    stepped = [r for r in rows if r["algorithm"] in ("sft", "grpo") and r.get("skipped") == 0]
    assert stepped and all(r["update_ratio"] > 0 and 0.5 < r["weight_growth"] < 3.0 for r in stepped), stepped[:2]
    assert rows[-1]["final"] and rows[-1]["heldout_acc"] == final
    assert (tmp_path / "e2e" / "config.yaml").is_file() and (tmp_path / "e2e" / "heartbeat.json").is_file()
    samples = [json.loads(x) for x in (tmp_path / "e2e" / "samples.jsonl").read_text().splitlines()]
    assert samples and "<tool>get(" in samples[0]["transcript"]
    assert any(x.startswith("[grpo") for x in lines)


@pytest.mark.slow
def test_grpo_raises_held_out_success_above_the_warm_up(tmp_path):
    """Measured (seed 0, 128 held-out episodes): success 0.67 after the warm-up, 0.75 / 0.76 / 0.80 after
    10 / 20 / 30 GRPO steps (about 30 s of CPU). The eval set is fixed and the run deterministic: the
    comparison is of one policy to another on the same 128 episodes."""
    cfg = AgentTrainConfig.parse({**FAST, "out_dir": str(tmp_path), "name": "long", "eval_size": 128,
                                  "eval_every": 10, "grpo": {"steps": 30, "prompts": 4, "group_size": 8, "lr": 1e-3}})
    summary = AgentTrainer(cfg, printer=None).run()
    assert summary["heldout_acc"] >= summary["heldout_acc_warm"] + 0.05, summary


# ---- a Hugging Face model ------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_agent_dir(tmp_path_factory):
    """A random 1-layer Llama with a character-level tokenizer that has every character the lookup
    environment writes, and room for its prompts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from trainer.tokenizer import DEFAULT_CHARSET

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    for c in DEFAULT_CHARSET:
        vocab.setdefault(c, len(vocab))
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tk.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", padding_side="left")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    d = tmp_path_factory.mktemp("hf_agent")
    LlamaForCausalLM(cfg).save_pretrained(d)
    fast.save_pretrained(d)
    return d


def test_hf_model_sft_and_grpo_steps_change_every_parameter(hf_agent_dir, tmp_path):
    cfg = AgentTrainConfig.parse({"model": {"kind": "hf", "path": str(hf_agent_dir)}, "out_dir": str(tmp_path),
                                  "system_prompt": "Tools: get(key).", "threads": 1,
                                  "sft": {"steps": 1, "batch_size": 4}, "grpo": {"steps": 0}})
    tr = AgentTrainer(cfg, printer=None)
    assert tr.policy.is_hf
    start = {n: p.detach().clone() for n, p in tr.policy.model.named_parameters()}
    s = tr.sft_step(0)
    assert s["skipped"] == 0.0 and s["demo_kept"] == 1.0
    # GRPO on a group of two demonstrations and two scripted failures: the advantages are non-zero
    env, h = tr.env, tr.harness
    ex = env.episode("train", 0, 1)
    good = tr.demonstrations([ex, ex])
    bad = [run_episode(ScriptedPolicy(["<answer>1</answer>"], tok=tr.policy.tok), env, ex, h) for _ in range(2)]
    trajs = good + bad
    adv = group_advantages([[t.reward for t in trajs]])[0]
    rows = [r for k, t in enumerate(trajs) for r in merge_calls(trajectory_calls(t), k)[0]]
    loss, _ = agent_grpo_loss(tr.policy, rows, adv, [len(t.steps) for t in trajs])
    tr.optimise(loss, 1e-2)
    unchanged = [n for n, p in tr.policy.model.named_parameters() if torch.equal(start[n], p)]
    assert not unchanged, unchanged
    assert tr.policy.tok.decode(rows[0].completion_ids).startswith('<tool>get(key="')
