"""`lookup`: a hidden key→value table behind a `get(key)` tool.

Every episode draws its own table (3 + 2·d keys of three lowercase letters, values 10..99); the
question names d of its keys and asks for their value (d = 1) or the sum of their values (d >= 2).
The table is never in the prompt, so the answer cannot be guessed (a blind guess of one value is
right 1 time in 90) — the policy must call `get` once per named key. A key not in the table is a
tool error the policy reads ("error: no key 'abd'"). The verifier compares integers.

The option `verbose` (default False) makes `get` answer with a sentence, `key 'abc' holds 42`,
instead of the bare value: the value sits at the end of an output longer than the smallest
`observation.max_chars`, so a harness that cuts the end of long observations removes it (the
agentic fault scenarios, swarmbench/agentic.py). The episodes are the same either way.
"""
from __future__ import annotations

import random
import string
from typing import Any

from harness.tools import ToolSpec, params
from trainer.envs.base import AgentEnv, Tool, ToolFailure, check_integer, register_env
from trainer.tasks.base import Example, VerifyResult


def _quoted(keys: list[str]) -> str:
    names = [f"'{k}'" for k in keys]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@register_env
class LookupEnv(AgentEnv):
    name = "lookup"
    min_difficulty = 1
    max_difficulty = 6

    def __init__(self, seed: int = 0, verbose: bool = False, **options: Any) -> None:
        super().__init__(seed=seed, **options)
        if not isinstance(verbose, bool):
            raise ValueError(f"environment 'lookup': verbose={verbose!r} must be true or false")
        self.verbose = verbose

    def tools(self) -> list[Tool]:
        spec = ToolSpec(name="get", description="the value stored under a key of the table",
                        parameters=params(key="string"))
        return [Tool(spec, self._get)]

    def _get(self, example: Example, args: dict[str, Any]) -> str:
        table = example.meta["table"]
        key = args["key"].strip().strip("'\"")
        if key not in table:
            raise ToolFailure(f"no key {key!r}")
        return f"key {key!r} holds {table[key]}" if self.verbose else str(table[key])

    def make(self, rng: random.Random, difficulty: int) -> Example:
        n = 3 + 2 * difficulty
        keys: list[str] = []
        while len(keys) < n:
            k = "".join(rng.choice(string.ascii_lowercase) for _ in range(3))
            if k not in keys:
                keys.append(k)
        table = {k: rng.randint(10, 99) for k in keys}
        asked = rng.sample(keys, difficulty)
        if difficulty == 1:
            question = f"What is the value of key {_quoted(asked)}?"
        else:
            question = f"What is the sum of the values of keys {_quoted(asked)}?"
        answer = str(sum(table[k] for k in asked))
        return Example(uid="", question=question, answer=answer, meta={"table": table, "asked": asked})

    def check(self, parsed: str, example: Example) -> VerifyResult:
        return check_integer(parsed, example)

    def demo(self, example: Example) -> tuple[list[tuple[str, dict[str, Any]]], str]:
        return [("get", {"key": k}) for k in example.meta["asked"]], example.answer
