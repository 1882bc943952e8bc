"""A scripted fake policy for the agent tests (the shape of openai-agents-python's
`tests/fake_model.py`): a queue of outputs, each text encoded with a real character tokenizer and
returned as token ids (a list of ids is returned as is: a split the tokenizer would not make); an
exception in the queue is raised; every call's arguments are recorded.

    policy = ScriptedPolicy(['<tool>get(key="abc")</tool>', "<answer>42</answer>"])
    trajectory = run_episode(policy, env, example, harness)
    policy.calls[0]["prompt_ids"]     # what the rollout fed it

The tests below check the fake itself, so the agent tests can trust it.
"""
from __future__ import annotations

import collections
from typing import Any, Iterable

import pytest

from trainer.tokenizer import CharTokenizer


class ScriptedPolicy:
    def __init__(self, outputs: Iterable[str | list[int] | BaseException], tok: Any = None, max_len: int | None = None,
                 logprob: float | None = None) -> None:
        self.tok = tok or CharTokenizer()
        self.outputs = collections.deque(outputs)
        self.calls: list[dict[str, Any]] = []
        if max_len is not None:
            self.max_len = max_len
        if logprob is not None:
            self.logprobs = lambda prompt, completion: [logprob] * len(completion)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float, stop: list[str]) -> list[int]:
        self.calls.append({"prompt_ids": list(prompt_ids), "max_new_tokens": max_new_tokens,
                           "temperature": temperature, "stop": list(stop)})
        if not self.outputs:
            raise AssertionError("ScriptedPolicy has no scripted output left")
        out = self.outputs.popleft()
        if isinstance(out, BaseException):
            raise out
        ids = list(out) if isinstance(out, list) else self.tok.encode(out)
        return ids[:max_new_tokens]

    def prompt_text(self, i: int) -> str:
        return self.tok.decode(self.calls[i]["prompt_ids"])


def test_scripted_policy_returns_ids_records_calls_and_raises():
    p = ScriptedPolicy(["ab", RuntimeError("boom")])
    assert p.tok.decode(p.generate([1, 5], 8, 0.5, ["x"])) == "ab"
    assert p.calls == [{"prompt_ids": [1, 5], "max_new_tokens": 8, "temperature": 0.5, "stop": ["x"]}]
    with pytest.raises(RuntimeError, match="boom"):
        p.generate([1], 8, 1.0, [])
    with pytest.raises(AssertionError, match="no scripted output"):
        p.generate([1], 8, 1.0, [])


def test_scripted_policy_cuts_at_max_new_tokens_and_returns_ids_as_given():
    assert ScriptedPolicy(["abcdef"]).generate([1], 3, 1.0, []) == CharTokenizer().encode("abc")
    assert ScriptedPolicy([[7, 8, 9]]).generate([1], 2, 1.0, []) == [7, 8]
