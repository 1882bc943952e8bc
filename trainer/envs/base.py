"""Agent environment interface: multi-turn, tool-using, verifiable task families.

An environment draws episodes (`Example`s, as task families do) deterministically from (split,
index, difficulty), holds the tools' code, and scores the final answer with a verifier. Train and
held-out splits are disjoint by content: an episode belongs to the held-out split iff a hash of
its content id (the question plus whatever hidden state the episode carries, such as a lookup
table) falls in the held-out bucket, the rule `trainer/tasks/base.py` applies to questions, with
the same seed streams and redraw limit.

Tools are called through `AgentEnv.call`, which never raises for anything the policy did: an
unknown tool, arguments that do not fit the schema, a tool that fails, a sandbox that cannot run
all come back as a `ToolResult` whose `error` names the kind and whose `observation` is what the
policy reads next. A pure tool runs in-process; the code environment's tool runs in the sandbox.

    env = make_env("lookup", seed=0)
    ex = env.episode("train", index=0, difficulty=2)
    env.call(ex, "get", {"key": "..."}).observation
    env.verify(ex, "123")             # VerifyResult
    calls, answer = env.demo(ex)      # what an expert does (SFT demonstrations, tests)
"""
from __future__ import annotations

import abc
import dataclasses
import json
import logging
import random
from typing import Any, Callable, ClassVar

from sandboxes.errors import SwarmlabError
from harness.agent import AgentHarness
from harness.tools import ToolSpec, check_arguments
from trainer.tasks.base import MAX_DRAWS, Example, Split, Verdict, VerifyResult, _split_seed, heldout_question

log = logging.getLogger(__name__)


class ToolFailure(SwarmlabError):
    """Raised by a tool's code for a failure the policy should read (a key that does not exist,
    an expression that does not evaluate); `AgentEnv.call` turns it into an observation."""


class SandboxFailure(ToolFailure):
    """A tool's sandbox could not run the code at all (not the code's fault)."""


ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "tool_error", "sandbox_error", "limit")


@dataclasses.dataclass(frozen=True)
class ToolResult:
    observation: str
    error: str | None = None   # one of ERROR_KINDS, None when the tool ran

    def __post_init__(self) -> None:
        assert self.error is None or self.error in ERROR_KINDS, f"unknown tool error kind {self.error!r}"


@dataclasses.dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    run: Callable[[Example, dict[str, Any]], str]


def error_text(message: str) -> str:
    return "error: " + message


class AgentEnv(abc.ABC):
    """An environment family. Subclasses set `name`, and implement `tools`, `make` and `check`
    (and `demo` for demonstrations). `difficulty` is an integer knob whose meaning is the family's."""

    name: ClassVar[str]
    min_difficulty: ClassVar[int] = 1
    max_difficulty: ClassVar[int] = 8

    def __init__(self, seed: int = 0, **options: Any) -> None:
        if options:
            raise ValueError(f"environment {self.name!r}: unknown options {sorted(options)}")
        self.seed = seed

    # ---- what subclasses provide ------------------------------------------------------
    @abc.abstractmethod
    def tools(self) -> list[Tool]:
        """The tools this environment runs."""

    @abc.abstractmethod
    def make(self, rng: random.Random, difficulty: int) -> Example:
        """One episode from `rng` (uid and difficulty are filled in by `episode`)."""

    @abc.abstractmethod
    def check(self, parsed: str, example: Example) -> VerifyResult:
        """Score a parsed final answer."""

    def demo(self, example: Example) -> tuple[list[tuple[str, dict[str, Any]]], str]:
        """An expert's tool calls (in order) and final answer for `example`."""
        raise NotImplementedError(f"environment {self.name!r} has no demonstrations")

    def content_id(self, example: Example) -> str:
        """What makes the episode what it is, for the split: the question and the hidden state."""
        return example.question + "|" + json.dumps(example.meta, sort_keys=True)

    # ---- the interface the rollout uses ---------------------------------------------
    def tool_specs(self) -> list[ToolSpec]:
        return [t.spec for t in self.tools()]

    def default_harness(self, **fields: Any) -> AgentHarness:
        """A harness that tells the policy about every tool of this environment."""
        return AgentHarness(**{"tools": self.tool_specs(), **fields})

    def check_difficulty(self, difficulty: int) -> int:
        if not (isinstance(difficulty, int) and self.min_difficulty <= difficulty <= self.max_difficulty):
            raise ValueError(f"environment {self.name!r}: difficulty={difficulty!r} outside "
                             f"[{self.min_difficulty}, {self.max_difficulty}]")
        return difficulty

    def episode(self, split: Split | str, index: int, difficulty: int) -> Example:
        split = Split(split)
        self.check_difficulty(difficulty)
        want_heldout = split is Split.HELDOUT
        rng = random.Random()
        for draw in range(MAX_DRAWS):
            rng.seed(_split_seed("env:" + self.name, split, index, difficulty, self.seed, draw))
            ex = self.make(rng, difficulty)
            if heldout_question(self.content_id(ex)) == want_heldout:
                uid = f"{self.name}/{split.value}/d{difficulty}/{index}"
                return Example(uid, ex.question, ex.answer, ex.solution, difficulty, ex.meta)
        raise ValueError(f"environment {self.name!r}: no {split.value} episode found at difficulty={difficulty} "
                         f"in {MAX_DRAWS} draws")

    def call(self, example: Example, name: str, arguments: dict[str, Any],
             harness: AgentHarness | None = None) -> ToolResult:
        """Run one tool call; every failure is an observation. With a `harness`, only the tools it
        lists exist for the policy, and its parser's leniency applies to the arguments."""
        tools = {t.spec.name: t for t in self.tools()}
        offered = [t.name for t in harness.tools] if harness is not None else list(tools)
        if name not in tools or name not in offered:
            known = ", ".join(n for n in offered if n in tools) or "none"
            return ToolResult(error_text(f"unknown tool {name!r}; the tools are: {known}"), "unknown_tool")
        tool = tools[name]
        lenient = harness.tool_syntax.lenient if harness is not None else False
        args, why = check_arguments(tool.spec, arguments, lenient=lenient)
        if why is not None:
            return ToolResult(error_text(why), "bad_arguments")
        try:
            return ToolResult(tool.run(example, args))
        except SandboxFailure as e:
            return ToolResult(error_text(str(e)), "sandbox_error")
        except ToolFailure as e:
            return ToolResult(error_text(str(e)), "tool_error")
        except Exception as e:  # a bug in a tool's code: still data for the rollout, and logged
            log.exception("environment %s: tool %s failed", self.name, name)
            return ToolResult(error_text(f"{name} failed: {type(e).__name__}"), "tool_error")

    def verify(self, example: Example, answer: str | None, truncated: bool = False) -> VerifyResult:
        if answer is None or not answer.strip():
            verdict = Verdict.TRUNCATED if truncated else Verdict.MALFORMED
            return VerifyResult(0.0, verdict, None, "no answer given")
        return self.check(answer.strip(), example)

    def close(self) -> None:
        """Release what the tools hold (a sandbox)."""


def check_integer(parsed: str, example: Example) -> VerifyResult:
    """The verdict on an answer that must be the example's integer (the lookup and calc environments)."""
    from trainer.tasks.arithmetic import canonical_int

    got = canonical_int(parsed)
    if got is None:
        return VerifyResult(0.0, Verdict.MALFORMED, parsed, "not an integer")
    if got == example.answer:
        return VerifyResult(1.0, Verdict.CORRECT, got)
    return VerifyResult(0.0, Verdict.WRONG, got, f"expected {example.answer}")


ENVS: dict[str, type[AgentEnv]] = {}


def register_env(cls: type[AgentEnv]) -> type[AgentEnv]:
    if cls.name in ENVS:
        raise ValueError(f"environment {cls.name!r} registered twice")
    ENVS[cls.name] = cls
    return cls


def make_env(name: str, seed: int = 0, **options: Any) -> AgentEnv:
    from trainer import envs as _  # noqa: F401  (imports the built-in environments)

    if name not in ENVS:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(ENVS))}")
    return ENVS[name](seed=seed, **options)
