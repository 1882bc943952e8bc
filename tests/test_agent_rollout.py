"""The multi-turn rollout (trainer/agent_rollout.py) with a scripted policy (tests/test_agent_fakes.py)
in the real environments: loss masks, exact prompt ids, turn and call limits, tool errors as
observations, observation cutting, the three context policies, per-turn discounting; and one short
episode with the real built-in model (untrained) end to end."""
from __future__ import annotations

import pytest
import torch

from test_agent_fakes import ScriptedPolicy
from trainer.agent_rollout import (EndReason, PolicyGenerator, context_view, cut_at_stop, demonstration, run_episode,
                                   run_episodes, summarize)
from trainer.envs import make_env
from trainer.tasks.base import Verdict
from trainer.tokenizer import DEFAULT_CHARSET, CharTokenizer

TOK = CharTokenizer()


@pytest.fixture
def env():
    return make_env("lookup", seed=0)


def policy_text(traj) -> str:
    return TOK.decode([t for t, m in zip(traj.ids, traj.mask) if m])


def test_demonstration_earns_the_reward_and_masks_only_policy_tokens(env):
    ex = env.episode("train", 0, 2)
    h = env.default_harness()
    turns = demonstration(env, ex, h)
    pol = ScriptedPolicy(turns)
    traj = run_episode(pol, env, ex, h)
    assert traj.end is EndReason.ANSWERED and traj.answer == ex.answer and traj.reward == 1.0
    assert traj.result.verdict is Verdict.CORRECT and traj.tool_calls == 2 and traj.tool_errors == 0
    assert [s.action for s in traj.steps] == ["tool_call", "tool_call", "answer"]
    assert policy_text(traj) == "".join(turns)
    assert len(traj.ids) == len(traj.mask) and sum(traj.mask) == sum(len(s.completion_ids) for s in traj.steps)
    # template and observations are mask 0: the observations' values are in the text, not in the masked part
    env_text = TOK.decode([t for t, m in zip(traj.ids, traj.mask) if not m])
    for k in ex.meta["asked"]:
        assert f"T: {ex.meta['table'][k]}\n" in env_text
    # every prompt is the transcript so far, exactly: prompts extend each other
    for i, s in enumerate(traj.steps):
        n = len(s.prompt_ids)
        assert traj.ids[:n] == s.prompt_ids and traj.ids[n: n + len(s.completion_ids)] == s.completion_ids
        assert traj.mask[n: n + len(s.completion_ids)] == [1] * len(s.completion_ids) and not any(traj.mask[:n][-3:])
        assert s.prompt_ids == pol.calls[i]["prompt_ids"] and s.extends_previous
        assert TOK.decode(s.prompt_ids).endswith("A: ")
    first = TOK.decode(traj.steps[0].prompt_ids)
    assert first == h.system_text() + "\n" + "Q: " + ex.question + "\n" + "A: "
    assert traj.steps[1].prompt_ids[: len(traj.steps[0].prompt_ids) + len(traj.steps[0].completion_ids)] == \
        traj.steps[0].prompt_ids + traj.steps[0].completion_ids
    assert pol.calls[0]["stop"] == h.stop and pol.calls[0]["max_new_tokens"] == h.sampling.max_new_tokens
    assert traj.harness_version == h.version and traj.uid == ex.uid
    d = traj.to_dict()
    assert d["end"] == "answered" and d["result"]["verdict"] == "correct"


def test_text_past_a_stop_string_is_cut(env):
    ex = env.episode("train", 0, 1)
    h = env.default_harness()
    key = ex.meta["asked"][0]
    traj = run_episode(ScriptedPolicy([f'<tool>get(key="{key}")</tool> and then more', "<answer>1</answer>xyz"]), env, ex, h)
    assert traj.steps[0].text == f'<tool>get(key="{key}")</tool>'
    assert traj.steps[1].text == "<answer>1</answer>"
    assert "more" not in policy_text(traj) and "xyz" not in policy_text(traj)
    ids, hit = cut_at_stop(TOK, TOK.encode("ab</tool>cd"), ["</tool>"])
    assert hit and TOK.decode(ids) == "ab</tool>"
    assert cut_at_stop(TOK, TOK.encode("abc"), ["</tool>"]) == (TOK.encode("abc"), False)


def test_tool_errors_are_observations_and_the_episode_goes_on(env):
    ex = env.episode("train", 0, 1)
    h = env.default_harness()
    outputs = ["<tool>nope()</tool>", "<tool>get(k)</tool>", "<tool>get(name=\"a\")</tool>",
               '<tool>get(key="zzz")</tool>', "<tool>get(key=\"a\"", f"<answer>{ex.answer}</answer>"]
    traj = run_episode(ScriptedPolicy(outputs), env, ex, h)
    assert traj.end is EndReason.ANSWERED and traj.reward == 1.0
    assert [s.error for s in traj.steps] == ["unknown_tool", "malformed", "bad_arguments", "tool_error", "malformed",
                                             None]
    assert [s.action for s in traj.steps][:2] == ["tool_call", "malformed_call"]
    assert traj.tool_calls == 5 and traj.tool_errors == 5
    assert all(s.observation.startswith("error: ") for s in traj.steps[:5])


def test_max_turns_ends_the_episode(env):
    ex = env.episode("train", 0, 1)
    h = env.default_harness(max_turns=2)
    key = ex.meta["asked"][0]
    pol = ScriptedPolicy([f'<tool>get(key="{key}")</tool>'] * 3)
    traj = run_episode(pol, env, ex, h)
    assert traj.end is EndReason.MAX_TURNS and len(traj.steps) == 2 and len(pol.calls) == 2
    assert traj.reward == 0.0 and traj.result.verdict is Verdict.MALFORMED


def test_a_call_past_max_tool_calls_is_not_run(env):
    ex = env.episode("train", 0, 1)
    h = env.default_harness(max_tool_calls=1)
    key = ex.meta["asked"][0]
    traj = run_episode(ScriptedPolicy([f'<tool>get(key="{key}")</tool>'] * 2), env, ex, h)
    assert traj.end is EndReason.MAX_TOOL_CALLS and traj.tool_calls == 1
    assert traj.steps[-1].action == "over_limit" and traj.steps[-1].observation is None
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]


def test_no_answer_and_truncation(env):
    ex = env.episode("train", 0, 1)
    h = env.default_harness(sampling={"max_new_tokens": 8})
    traj = run_episode(ScriptedPolicy(["I think"]), env, ex, h)
    assert traj.end is EndReason.NO_ANSWER and traj.result.verdict is Verdict.MALFORMED
    assert traj.steps[0].finish == "stop"
    traj = run_episode(ScriptedPolicy(["I think it is"]), env, ex, h)
    assert traj.steps[0].finish == "length" and traj.result.verdict is Verdict.TRUNCATED
    # an answer written before a call is the answer
    traj = run_episode(ScriptedPolicy([f"<answer>{ex.answer}</answer><tool>get(key=\"a\")</tool>"]), env, ex,
                       env.default_harness(stop=["</tool>"]))
    assert traj.end is EndReason.ANSWERED and traj.reward == 1.0


def test_turn_discount(env):
    ex = env.episode("train", 0, 2)
    h = env.default_harness(turn_discount=0.5)
    traj = run_episode(ScriptedPolicy(demonstration(env, ex, h)), env, ex, h)
    assert traj.turn_rewards == [0.25, 0.5, 1.0]
    wrong = run_episode(ScriptedPolicy(["<answer>0</answer>"]), env, ex, h)
    assert wrong.turn_rewards == [0.0]


def test_observations_are_cut_per_harness(env):
    ex = env.episode("train", 0, 1)
    key = "q" * 30
    for cut, check in [("end", lambda s: s.startswith("error: no key") and s.endswith("...")),
                       ("start", lambda s: s.startswith("...") and s.endswith("q'"))]:
        h = env.default_harness(observation={"max_chars": 20, "cut": cut})
        traj = run_episode(ScriptedPolicy([f'<tool>get(key="{key}")</tool>', "<answer>1</answer>"]), env, ex, h)
        shown = traj.steps[0].observation
        assert len(shown) == 20 and check(shown), shown
        assert traj.observations_cut == 1 and traj.messages[3].cut


def _long_episode(env, ex, harness):
    long_key = "w" * 35
    outputs = [f'<tool>get(key="{long_key}")</tool>', f'<tool>get(key="{long_key}x")</tool>',
               f'<tool>get(key="{ex.meta["asked"][0]}")</tool>', f"<answer>{ex.answer}</answer>"]
    pol = ScriptedPolicy(outputs)
    return run_episode(pol, env, ex, harness), pol


@pytest.mark.parametrize("kind", ["keep_all", "drop_oldest", "trim_observations"])
def test_context_policies(env, kind):
    ex = env.episode("train", 0, 1)
    free, _ = _long_episode(env, ex, env.default_harness())
    assert free.context_edits == 0 and all(s.extends_previous for s in free.steps)
    max_new = 64
    # a budget the fourth prompt overflows by 5 tokens; the third still fits
    budget = len(free.steps[3].prompt_ids) + max_new - 5
    assert len(free.steps[2].prompt_ids) + max_new <= budget
    h = env.default_harness(context={"kind": kind, "max_tokens": budget, "keep_last_turns": 1, "trimmed_chars": 4})
    traj, pol = _long_episode(env, ex, h)
    first_obs = free.steps[0].observation
    last = pol.prompt_text(len(pol.calls) - 1)
    if kind == "keep_all":
        assert traj.end is EndReason.CONTEXT_FULL and len(traj.steps) == 3 and traj.reward == 0.0
        return
    assert traj.end is EndReason.ANSWERED and traj.reward == 1.0 and traj.context_edits == 1
    assert len(traj.steps[3].prompt_ids) + max_new <= budget
    assert not traj.steps[3].extends_previous and traj.steps[2].extends_previous
    assert first_obs not in last
    if kind == "drop_oldest":
        assert free.steps[0].text not in last and free.steps[1].text in last
    else:
        assert free.steps[0].text in last and f"T: {first_obs[:4]}...\n" in last
    # the transcript keeps everything whatever the context policy showed
    assert traj.ids == free.ids and traj.mask == free.mask


def test_context_view_protects_the_question_and_recent_turns(env):
    ex = env.episode("train", 0, 1)
    free, _ = _long_episode(env, ex, env.default_harness())
    h = env.default_harness(context={"kind": "drop_oldest", "keep_last_turns": 3})
    msgs = free.messages
    assert context_view(msgs, h, sum(len(m.ids) for m in msgs), 3, TOK.encode) == ([m.ids for m in msgs], False)
    assert context_view(msgs, h, 10, 3, TOK.encode) is None


def test_policy_errors_are_raised(env):
    ex = env.episode("train", 0, 1)
    with pytest.raises(RuntimeError, match="policy down"):
        run_episode(ScriptedPolicy([RuntimeError("policy down")]), env, ex, env.default_harness())


def test_calc_and_code_environments_through_the_rollout():
    calc = make_env("calc")
    ex = calc.episode("heldout", 2, 3)
    h = calc.default_harness(tool_syntax={"kind": "json"}, sampling={"max_new_tokens": 96})
    traj = run_episode(ScriptedPolicy(demonstration(calc, ex, h)), calc, ex, h)
    assert traj.reward == 1.0 and traj.tool_calls == 3 and traj.tool_errors == 0
    assert [s.observation for s in traj.steps[:3]] == [calc.call(ex, *c).observation for c in calc.demo(ex)[0]]
    # a turn cut at max_new_tokens before the closing tag is a malformed call, read as an observation
    short = calc.default_harness(tool_syntax={"kind": "json"}, sampling={"max_new_tokens": 40})
    traj = run_episode(ScriptedPolicy(demonstration(calc, ex, short)), calc, ex, short)
    assert traj.steps[0].finish == "length" and traj.steps[0].error == "malformed"
    code = make_env("code", timeout=3.0)
    try:
        ex = code.episode("train", 1, 2)
        h = code.default_harness()
        # code needs characters the default character set lacks (a backslash in the call's escapes, %)
        tok = CharTokenizer(DEFAULT_CHARSET + "\\%")
        traj = run_episode(ScriptedPolicy(demonstration(code, ex, h), tok=tok), code, ex, h)
        assert traj.steps[0].observation == "3/3 tests passed" and traj.reward == 1.0
    finally:
        code.close()


def test_summarize(env):
    exs = [env.episode("train", i, 1) for i in range(2)]
    h = env.default_harness()
    trajs = [run_episode(ScriptedPolicy(demonstration(env, exs[0], h)), env, exs[0], h),
             run_episode(ScriptedPolicy(["<tool>x()</tool>", "no"]), env, exs[1], h)]
    s = summarize(trajs)
    assert s["reward_mean"] == 0.5 and s["tool_error_rate"] == 0.5 and s["end_answered"] == 0.5
    assert s["end_no_answer"] == 0.5 and s["turns_mean"] == 2.0


def test_the_built_in_model_runs_episodes_end_to_end(env):
    from trainer.config import ModelConfig
    from trainer.policy import Policy

    torch.manual_seed(0)
    policy = Policy.build(ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=512), seed=0)
    gen = PolicyGenerator(policy, generator=torch.Generator().manual_seed(0))
    h = env.default_harness(max_turns=2, sampling={"max_new_tokens": 12})
    trajs = run_episodes(gen, env, [env.episode("train", i, 1) for i in range(2)], h)
    for t in trajs:
        assert t.end in set(EndReason) and 1 <= len(t.steps) <= 2
        assert len(t.ids) == len(t.mask) and sum(t.mask) == sum(len(s.completion_ids) for s in t.steps)
        for s in t.steps:
            assert len(s.completion_ids) <= 12 and len(s.prompt_ids) + 12 <= 512
            lp = gen.logprobs(s.prompt_ids, s.completion_ids)
            assert len(lp) == len(s.completion_ids) and all(x <= 0.0 for x in lp)
    greedy = run_episode(gen, env, env.episode("train", 0, 1), h, greedy=True)
    again = run_episode(gen, env, env.episode("train", 0, 1), h, greedy=True)
    assert greedy.ids == again.ids


class BPETokenizer:
    """A byte-level BPE tokenizer trained here (the `tokenizers` library, offline), so one text has
    several id sequences: the policy's own split must survive, never re-encoded."""

    def __init__(self) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tk = Tokenizer(models.BPE(unk_token="<unk>"))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<bos>", "<eos>", "<unk>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tk.train_from_iterator(["<answer>42</answer>", '<tool>get(key="abc")</tool>', "What is the value"] * 50,
                               trainer)
        self.tk, self.pad_id, self.bos_id, self.eos_id = tk, 0, 1, 2
        self.vocab_size = tk.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tk.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tk.decode(list(ids))

    def chars(self, text: str) -> list[int]:
        """`text` one byte-level symbol per character (ASCII without spaces): a split BPE never makes."""
        return [self.tk.token_to_id(c) for c in text]


def test_exact_ids_across_turns_with_a_bpe_tokenizer(env):
    tok = BPETokenizer()
    ex = env.episode("train", 0, 1)
    key = ex.meta["asked"][0]
    call, answer = f'<tool>get(key="{key}")</tool>', f"<answer>{ex.answer}</answer>"
    raw = [tok.chars(call + "junk"), tok.chars(answer)]
    assert tok.encode(call) != tok.chars(call), "the test needs a split the tokenizer would not make"
    traj = run_episode(ScriptedPolicy(raw, tok=tok), env, ex, env.default_harness())
    assert traj.reward == 1.0 and traj.steps[0].text == call
    assert traj.steps[0].completion_ids == tok.chars(call), "cut after the stop string, ids as generated"
    assert traj.steps[1].completion_ids == raw[1]
    assert [t for t, m in zip(traj.ids, traj.mask) if m] == tok.chars(call) + raw[1]
    a, b = traj.steps
    assert b.prompt_ids[: len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids
    # a stop string ending inside a multi-character token keeps that whole token
    merged = tok.encode("</tool>x")
    ids, hit = cut_at_stop(tok, merged, ["</tool"])
    assert hit and tok.decode(ids).startswith("</tool") and ids == merged[: len(ids)]
    assert len(tok.decode(ids[:-1])) < len("</tool")
