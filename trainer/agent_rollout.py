"""Multi-turn rollout: a policy acts in an agent environment under an agent harness.

One episode reads top to bottom (`run_episode`):

    messages = [system prompt with the tool list, the question]
    for turn in 0 .. max_turns-1:
        prompt = the messages the context policy keeps, then the assistant prefix    (token ids)
        completion = policy.generate(prompt, max_new_tokens, temperature, stop)      (token ids)
        a tool call (the first thing written)?  run it (or say why not), append the
                                                observation cut per the harness; next turn
        else                                    the turn's answer is final; stop
    verify the final answer; per-turn rewards = reward · turn_discount**(n-1-t)

Token ids are never rebuilt from text: every message is tokenized once, when it enters the
transcript (template and observations) or comes from the policy (its completion ids as
generated), and each prompt is a concatenation of those ids. The trajectory keeps the full
transcript as `ids` with a `mask` (1 on tokens the policy produced, 0 on template and environment
tokens: the loss mask of multi-turn GRPO) and every policy call as a `Step` with its exact prompt
and completion ids and whether its prompt extends the previous prompt + completion exactly (it
does not once the context policy dropped or trimmed something: such calls cannot be merged into
one training row).

Each `Step` also keeps the tool's output before the harness cut it (`raw_observation`, when it was
cut) and the `Trajectory` the verifier's reference answer (`expected`): what a HarnessCritic
(`harness/critic.py`) needs to tell a cut that removed the answer from one that did not.
`Trajectory.record()` is the same without token ids and messages, its texts capped: what a run's
samples.jsonl holds for the swarm's agent detectors (agents/agent_critic.py).

Ends (`EndReason`): answered, no_answer (a final turn without a parsable answer), max_turns,
max_tool_calls (a call past the limit is not run), context_full (the context policy could not fit
the next prompt). A tool error, an unknown tool, a malformed call are observations; nothing the
policy writes raises.

Any object with `tok` (a `trainer.tokenizer.Tokenizer`) and
`generate(prompt_ids, max_new_tokens, temperature, stop) -> ids` is a policy here (an optional
`max_len` bounds prompt + completion); `PolicyGenerator` puts the trainer's `Policy` in that shape.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Literal, Protocol

import torch

from harness.agent import AgentHarness
from harness.tools import Malformed, ToolCall
from trainer.envs.base import AgentEnv, ToolResult, error_text
from trainer.tasks.base import Example, VerifyResult
from trainer.tokenizer import Tokenizer


# step-level records in a run's samples (`Trajectory.record`): kept small, whatever the harness allows
RECORD_TEXT_CHARS = 256      # a policy turn, an observation as shown
RECORD_RAW_CHARS = 1024      # a tool's output before the harness cut it
RECORD_STEPS = 16            # policy calls per trajectory


class Generator(Protocol):
    tok: Tokenizer

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 stop: list[str]) -> list[int]: ...


class EndReason(str, enum.Enum):
    ANSWERED = "answered"
    NO_ANSWER = "no_answer"
    MAX_TURNS = "max_turns"
    MAX_TOOL_CALLS = "max_tool_calls"
    CONTEXT_FULL = "context_full"


@dataclasses.dataclass
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    ids: list[int]                  # prefix + content + suffix, as the policy reads them
    mask: list[int]                 # 1 on the tokens the policy produced
    turn: int = -1                  # the turn an assistant message or observation belongs to
    error: str | None = None        # a tool observation's error kind
    cut: bool = False               # an observation cut to the harness's observation.max_chars


@dataclasses.dataclass
class Step:
    """One policy call."""

    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    finish: Literal["stop", "length"]
    action: Literal["tool_call", "malformed_call", "answer", "no_answer", "over_limit"]
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    observation: str | None = None
    error: str | None = None
    extends_previous: bool = True   # prompt == previous prompt + completion + the tokens between
    raw_observation: str | None = None   # the tool's output before the harness cut it (None: not cut)


@dataclasses.dataclass
class Trajectory:
    env: str
    uid: str
    harness_version: str
    messages: list[Message]
    steps: list[Step]
    ids: list[int]                  # the whole transcript (bos + every message)
    mask: list[int]                 # 1 on policy tokens: the loss mask
    end: EndReason
    answer: str | None
    result: VerifyResult
    reward: float
    turn_rewards: list[float]
    tool_calls: int
    tool_errors: int
    observations_cut: int
    context_edits: int              # policy calls whose prompt the context policy changed
    expected: str | None = None     # the verifier's reference answer (what a critic compares answers with)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["end"] = self.end.value
        d["result"] = {**dataclasses.asdict(self.result), "verdict": self.result.verdict.value}
        return d

    def record(self, text_chars: int = RECORD_TEXT_CHARS, raw_chars: int = RECORD_RAW_CHARS,
               steps: int = RECORD_STEPS) -> dict[str, Any]:
        """The trajectory as a small step-level record: `to_dict` without token ids and messages,
        each step's text and observation capped at `text_chars`, the tool's output before the
        harness cut it at `raw_chars` (its length in `raw_chars`), the first `steps` steps
        (`steps_total` counts them all). What a run's samples.jsonl holds for a HarnessCritic
        (`harness.critic.diagnose` reads it like a `to_dict`)."""
        def cap(s: str | None, n: int) -> str | None:
            return s if s is None or len(s) <= n else s[:n]

        return {
            "uid": self.uid, "harness_version": self.harness_version, "end": self.end.value,
            "answer": cap(self.answer, 64),
            "expected": cap(self.expected, 64), "reward": self.reward, "result": {"verdict": self.result.verdict.value},
            "tool_calls": self.tool_calls, "tool_errors": self.tool_errors, "observations_cut": self.observations_cut,
            "context_edits": self.context_edits, "steps_total": len(self.steps),
            "steps": [{"turn": s.turn, "action": s.action, "finish": s.finish, "text": cap(s.text, text_chars),
                       "tool": s.tool, "arguments": s.arguments if len(repr(s.arguments)) <= text_chars else None,
                       "observation": cap(s.observation, text_chars),
                       "raw_observation": cap(s.raw_observation, raw_chars), "error": s.error,
                       **({"raw_chars": len(s.raw_observation)} if s.raw_observation is not None else {})}
                      for s in self.steps[:steps]],
        }


# ---- the built-in policy in the Generator shape --------------------------------------------
def cut_at_stop(tok: Tokenizer, ids: list[int], stop: list[str]) -> tuple[list[int], bool]:
    """`ids` up to the token that completes the first stop string (exact ids, never re-encoded),
    and whether one was found."""
    text = tok.decode(ids)
    ends = [text.find(s) + len(s) for s in stop if s and s in text]
    if not ends:
        return ids, False
    end = min(ends)
    lo, hi = 1, len(ids)   # the fewest tokens whose text reaches `end`
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tok.decode(ids[:mid])) >= end:
            hi = mid
        else:
            lo = mid + 1
    return ids[:lo], True


class PolicyGenerator:
    """A `trainer.policy.Policy` as a `Generator`: one prompt at a time, stop strings cut after
    generation (the policy stops by itself on eos and on single-token stop strings)."""

    def __init__(self, policy: Any, top_p: float = 1.0, generator: torch.Generator | None = None) -> None:
        self.policy, self.tok, self.top_p, self.rng = policy, policy.tok, top_p, generator
        self.max_len = policy._max_len()

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 stop: list[str]) -> list[int]:
        singles = {ids[0] for ids in (self.tok.encode(s) for s in stop) if len(ids) == 1}
        comps, _ = self.policy.generate([prompt_ids], max_new_tokens, temperature=temperature, top_p=self.top_p,
                                        stop_ids=singles, generator=self.rng)
        return cut_at_stop(self.tok, comps[0], stop)[0]

    @torch.no_grad()
    def logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Per-token log-probs of `completion_ids` after `prompt_ids` under the policy (temperature 1)."""
        from trainer.logprobs import batch_logprobs
        from trainer.policy import build_batch

        if not completion_ids:
            return []
        batch = build_batch([prompt_ids], [completion_ids], self.tok.pad_id)
        logp, _, _ = batch_logprobs(self.policy, batch, backend="torch", shared=False)  # (1, C)
        return [float(x) for x in logp[0, : len(completion_ids)]]


# ---- context policy (pure) -----------------------------------------------------------------
def context_view(messages: list[Message], harness: AgentHarness, budget: int, turn: int,
                 encode: Any) -> tuple[list[list[int]], bool] | None:
    """The message ids the next prompt holds under the harness's context policy, within `budget`
    tokens, and whether anything was dropped or trimmed; None when it cannot fit. `turn` is the
    turn about to be generated; the last `keep_last_turns` turns before it, the system prompt and
    the question are never touched. Trimmed observations are environment text, re-encoded."""
    ctx = harness.context
    chunks: list[list[int] | None] = [m.ids for m in messages]

    def size() -> int:
        return sum(len(c) for c in chunks if c is not None)

    if size() <= budget:
        return [c for c in chunks if c is not None], False
    if ctx.kind == "keep_all":
        return None
    old = [i for i, m in enumerate(messages) if 0 <= m.turn < turn - ctx.keep_last_turns]
    if ctx.kind == "trim_observations":
        for i in old:
            m = messages[i]
            if m.role != "tool" or len(m.content) <= ctx.trimmed_chars:
                continue
            prefix, suffix = harness.template.parts("tool")
            chunks[i] = encode(prefix + m.content[: ctx.trimmed_chars] + "..." + suffix)
            if size() <= budget:
                return [c for c in chunks if c is not None], True
    for t in sorted({messages[i].turn for i in old}):
        for i in old:
            if messages[i].turn == t:
                chunks[i] = None
        if size() <= budget:
            return [c for c in chunks if c is not None], True
    return None


# ---- one episode ---------------------------------------------------------------------------
def _message(tok: Tokenizer, harness: AgentHarness, role: str, content: str, turn: int = -1,
             policy_ids: list[int] | None = None, **kw: Any) -> Message:
    prefix, suffix = harness.template.parts(role)
    pre, post = tok.encode(prefix), tok.encode(suffix)
    body = policy_ids if policy_ids is not None else tok.encode(content)
    mask = [0] * len(pre) + [1 if policy_ids is not None else 0] * len(body) + [0] * len(post)
    return Message(role, content, pre + body + post, mask, turn, **kw)  # type: ignore[arg-type]


def run_episode(policy: Generator, env: AgentEnv, example: Example, harness: AgentHarness,
                greedy: bool = False) -> Trajectory:
    """One episode of `example` in `env` under `harness` (see the module docstring)."""
    tok = policy.tok
    limit = min(harness.context.max_tokens, getattr(policy, "max_len", None) or harness.context.max_tokens)
    max_new = harness.sampling.max_new_tokens
    temperature = 0.0 if greedy else harness.sampling.temperature
    gen_prefix = tok.encode(harness.template.parts("assistant")[0])
    messages = [_message(tok, harness, "system", harness.system_text()),
                _message(tok, harness, "user", example.question)]
    steps: list[Step] = []
    calls = edits = 0
    answer: str | None = None
    truncated = False
    end = EndReason.MAX_TURNS
    for turn in range(harness.max_turns):
        budget = limit - max_new - 1 - len(gen_prefix)   # 1: the bos token
        view = context_view(messages, harness, budget, turn, tok.encode)
        if view is None:
            end = EndReason.CONTEXT_FULL
            break
        chunks, edited = view
        edits += edited
        prompt = [tok.bos_id] + [t for c in chunks for t in c] + gen_prefix
        out = list(policy.generate(prompt, max_new, temperature, list(harness.stop)))[:max_new]
        out, stopped = cut_at_stop(tok, out, harness.stop)
        stopped = stopped or (bool(out) and out[-1] == tok.eos_id)
        text = tok.decode(out)
        finish: Literal["stop", "length"] = "stop" if stopped or len(out) < max_new else "length"
        prev = steps[-1] if steps else None
        extends = prev is None or prompt[: len(prev.prompt_ids) + len(prev.completion_ids)] == \
            prev.prompt_ids + prev.completion_ids
        messages.append(_message(tok, harness, "assistant", text, turn, policy_ids=out))
        step = Step(turn, prompt, out, text, finish, "no_answer", extends_previous=extends)
        steps.append(step)

        at_call = harness.tool_syntax.find(text)
        call = harness.tool_syntax.parse(text, harness.tools) if at_call >= 0 else None
        found = harness.answer.extract(text)
        answer_first = found is not None and (at_call < 0 or _answer_at(harness, text) < at_call)
        if call is None or answer_first:
            answer, truncated = found, finish == "length"
            step.action = "answer" if found is not None else "no_answer"
            end = EndReason.ANSWERED if found is not None else EndReason.NO_ANSWER
            break
        if calls >= harness.max_tool_calls:
            step.action = "over_limit"
            end = EndReason.MAX_TOOL_CALLS
            break
        calls += 1
        if isinstance(call, Malformed):
            res = ToolResult(error_text(f"malformed tool call: {call.reason}"), "malformed")
            step.action = "malformed_call"
        else:
            assert isinstance(call, ToolCall), f"parse returned {call!r}"
            res = env.call(example, call.name, call.arguments, harness)
            step.action, step.tool, step.arguments = "tool_call", call.name, call.arguments
        shown, cut = harness.observation.apply(res.observation)
        step.observation, step.error = shown, res.error
        step.raw_observation = res.observation if cut else None
        messages.append(_message(tok, harness, "tool", shown, turn, error=res.error, cut=cut))

    result = env.verify(example, answer, truncated=truncated)
    n = len(steps)
    turn_rewards = [result.reward * harness.turn_discount ** (n - 1 - t) for t in range(n)]
    ids = [tok.bos_id] + [t for m in messages for t in m.ids]
    mask = [0] + [x for m in messages for x in m.mask]
    return Trajectory(
        env=env.name, uid=example.uid, harness_version=harness.version, messages=messages, steps=steps,
        ids=ids, mask=mask, end=end, answer=answer, result=result, reward=result.reward, turn_rewards=turn_rewards,
        tool_calls=calls, tool_errors=sum(m.error is not None for m in messages),
        observations_cut=sum(m.cut for m in messages), context_edits=edits, expected=example.answer)


def _answer_at(harness: AgentHarness, text: str) -> int:
    at = text.find(harness.answer.prefix) if harness.answer.prefix else -1
    return at if at >= 0 else len(text)


def run_episodes(policy: Generator, env: AgentEnv, examples: list[Example], harness: AgentHarness,
                 greedy: bool = False) -> list[Trajectory]:
    return [run_episode(policy, env, ex, harness, greedy=greedy) for ex in examples]


def demonstration(env: AgentEnv, example: Example, harness: AgentHarness) -> list[str]:
    """The policy turns an expert writes for `example` under `harness` (each tool call, then the
    answer): SFT warm-up targets, and scripts for tests."""
    calls, answer = env.demo(example)
    return [harness.tool_syntax.render(name, args) for name, args in calls] + [harness.answer.render(answer)]


def summarize(trajectories: list[Trajectory]) -> dict[str, float]:
    n = max(1, len(trajectories))
    turns = sum(len(t.steps) for t in trajectories)
    return {
        "reward_mean": sum(t.reward for t in trajectories) / n,
        "turns_mean": turns / n,
        "tool_calls_mean": sum(t.tool_calls for t in trajectories) / n,
        "tool_error_rate": sum(t.tool_errors for t in trajectories) / max(1, sum(t.tool_calls for t in trajectories)),
        **{f"end_{r.value}": sum(t.end is r for t in trajectories) / n for r in EndReason},
    }
