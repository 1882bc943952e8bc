"""Agent harness: everything outside the weights that shapes a multi-turn, tool-using trajectory.

The system prompt, how each message is wrapped into text (`MessageTemplate`), the tools the policy
is told about and the syntax it writes calls in (`harness/tools.py`), turn and call limits, how a
tool's output is cut before the policy reads it, what happens when the context outgrows its token
budget, the stop strings, how the final answer is parsed, sampling, and the per-turn reward
discount. Like `HarnessSpec` it is a pydantic model validated field by field (errors name the
field and the value) and versioned by the SHA-256 of its canonical JSON (`AgentHarness.version`).

A typed intervention edits one field at a time: `check_edit(harness, path, value)` says why the
edit would be refused (the reason) or returns None, and `apply_edit` returns the edited harness.
Paths are dotted field names (`max_turns`, `observation.cut`, `context.kind`); a tool is addressed
by name (`tools.get.description`; `tools.get` with a spec to add or replace it, None to remove it).

    h = AgentHarness(tools=[ToolSpec(name="get", description="...", parameters=params(key="string"))])
    h.system_text()                 # the system prompt with the tool list filled in
    check_edit(h, "max_turns", 0)   # "max_turns=0: Input should be greater than or equal to 1"

The rollout that uses it is `trainer/agent_rollout.py`; the environments are `trainer/envs/`.
"""
from __future__ import annotations

import hashlib
import json
import string
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from harness.spec import AnswerFormat, Sampling, _Strict
from harness.tools import ToolCallSyntax, ToolSpec, describe_tools

SYSTEM_MAX_CHARS = 8192
CUT_MARKER = "..."


def content_hash(model: BaseModel) -> str:
    """The version of a harness model: SHA-256 of its canonical JSON, 12 hex digits (as
    `HarnessSpec.version`)."""
    blob = json.dumps(model.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


class MessageTemplate(_Strict):
    """How each role's message becomes text: `{content}` once, text around it. The text before
    `{content}` of the assistant template is the generation prompt; template text is never
    trained on (loss mask 0)."""

    system: str = Field("{content}\n", description="wraps the system prompt")
    user: str = Field("Q: {content}\n", description="wraps the task's question")
    assistant: str = Field("A: {content}\n", description="wraps each policy turn; its prefix ends the generation prompt")
    tool: str = Field("T: {content}\n", description="wraps each tool observation")

    @field_validator("system", "user", "assistant", "tool")
    @classmethod
    def _one_content(cls, v: str, info: Any) -> str:
        if v.count("{content}") != 1:
            raise ValueError(f"template.{info.field_name}={v!r} must contain {{content}} exactly once")
        if len(v) > 256:
            raise ValueError(f"template.{info.field_name} of {len(v)} characters: at most 256")
        return v

    def parts(self, role: str) -> tuple[str, str]:
        """(prefix, suffix) around a `role` message's content."""
        prefix, suffix = getattr(self, role).split("{content}")
        return prefix, suffix


class ObservationPolicy(_Strict):
    """How a tool's output is cut before the policy reads it."""

    max_chars: int = Field(512, ge=8, le=65536, description="longest observation shown, marker included")
    cut: Literal["end", "start", "middle"] = Field(
        "end", description="which side of a long observation is removed: end keeps the head, start keeps the tail, "
                           "middle keeps both ends")

    def apply(self, text: str) -> tuple[str, bool]:
        """The observation as shown, and whether it was cut."""
        if len(text) <= self.max_chars:
            return text, False
        keep = self.max_chars - len(CUT_MARKER)
        if self.cut == "end":
            return text[:keep] + CUT_MARKER, True
        if self.cut == "start":
            return CUT_MARKER + text[len(text) - keep:], True
        head = keep - keep // 2
        return text[:head] + CUT_MARKER + text[len(text) - keep // 2:], True


class ContextPolicy(_Strict):
    """What the rollout does when a prompt plus the turn's `max_new_tokens` passes `max_tokens`
    (or the policy's own length limit). keep_all: nothing, the episode ends (`context_full`).
    drop_oldest: whole old turns (an assistant message and its observation) go, oldest first.
    trim_observations: old observations are cut to `trimmed_chars` first, then old turns dropped
    if that is not enough. The system prompt, the question and the last `keep_last_turns` turns
    are never touched."""

    kind: Literal["keep_all", "drop_oldest", "trim_observations"] = Field(
        "keep_all", description="keep_all: end the episode when full; drop_oldest: drop old turns; trim_observations: "
                                "cut old observations first, then drop old turns")
    max_tokens: int = Field(2048, ge=16, le=1 << 20, description="token budget of prompt + one turn's completion")
    keep_last_turns: int = Field(1, ge=0, le=64, description="the newest turns kept whole")
    trimmed_chars: int = Field(16, ge=0, le=4096, description="trim_observations: what is left of an old observation")


DEFAULT_SYSTEM = ("Answer the question. You may call tools.\n{tools}\n"
                  "When you know the answer, write <answer>...</answer>.")


class AgentHarness(_Strict):
    system_prompt: str = Field(DEFAULT_SYSTEM, description="the system prompt; {tools} (optional) becomes the tool list")
    template: MessageTemplate = Field(default_factory=MessageTemplate, description="how each message is wrapped")
    tools: list[ToolSpec] = Field(default_factory=list, description="the tools the policy is told about and may call")
    tool_syntax: ToolCallSyntax = Field(default_factory=ToolCallSyntax, description="how a call is written and parsed")
    max_turns: int = Field(8, ge=1, le=64, description="policy turns before the episode ends (max_turns)")
    max_tool_calls: int = Field(8, ge=0, le=256, description="tool calls allowed; one more ends the episode")
    observation: ObservationPolicy = Field(default_factory=ObservationPolicy, description="how tool output is cut")
    context: ContextPolicy = Field(default_factory=ContextPolicy, description="what happens when the context is full")
    stop: list[str] = Field(default_factory=lambda: ["</tool>", "</answer>"],
                            description="strings that end a turn (kept in the turn)")
    answer: AnswerFormat = Field(
        default_factory=lambda: AnswerFormat(regex=r"<answer>(.*?)</answer>", stop="</answer>", prefix="<answer>"),
        description="how the final answer is written and extracted")
    sampling: Sampling = Field(default_factory=lambda: Sampling(max_new_tokens=64),
                               description="per-turn sampling (max_new_tokens counts one turn)")
    turn_discount: float = Field(1.0, ge=0.0, le=1.0, description="turn t of n gets the final reward times "
                                                                  "turn_discount**(n-1-t)")

    @field_validator("system_prompt")
    @classmethod
    def _system(cls, v: str) -> str:
        if len(v) > SYSTEM_MAX_CHARS:
            raise ValueError(f"system_prompt of {len(v)} characters: at most {SYSTEM_MAX_CHARS}")
        shown = v if len(v) <= 80 else v[:77] + "..."
        try:
            fields = [f for _, f, spec, conv in string.Formatter().parse(v) if f is not None]
        except ValueError as e:
            raise ValueError(f"system_prompt {shown!r} does not parse as a format string: {e}") from None
        bad = [f for f in fields if f != "tools"]
        if bad:
            raise ValueError(f"system_prompt {shown!r} has a placeholder other than {{tools}}: {{{bad[0]}}}")
        try:
            v.format(tools="x")
        except (ValueError, KeyError, IndexError) as e:
            raise ValueError(f"system_prompt {shown!r} does not format: {e}") from None
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: list[str]) -> list[str]:
        if len(v) > 8:
            raise ValueError(f"stop has {len(v)} strings: at most 8")
        for s in v:
            if not s or len(s) > 64:
                raise ValueError(f"stop string {s!r} must be 1 to 64 characters")
        if len(set(v)) != len(v):
            raise ValueError(f"stop={v!r} repeats a string")
        return v

    @model_validator(mode="after")
    def _check(self) -> "AgentHarness":
        names = [t.name for t in self.tools]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"tools: {dup[0]!r} is listed twice")
        if self.answer.prefix and self.answer.prefix == self.tool_syntax.open:
            raise ValueError(f"answer.prefix={self.answer.prefix!r} is the tool call's opening tag")
        return self

    # ---- rendering -----------------------------------------------------------------
    def system_text(self) -> str:
        return self.system_prompt.format(tools=describe_tools(self.tools, self.tool_syntax))

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

    def cut_at_stop(self, text: str) -> int | None:
        """Where the first stop string ends in `text` (None: no stop string)."""
        ends = [text.find(s) + len(s) for s in self.stop if s in text]
        return min(ends) if ends else None

    def render_text(self, messages: list[dict[str, str]], generation_prompt: bool = True) -> str:
        """Messages ({"role", "content"}) as the text the policy reads (a view for people; the
        rollout works on token ids, message by message)."""
        out = []
        for m in messages:
            prefix, suffix = self.template.parts(m["role"])
            out.append(prefix + m["content"] + suffix)
        if generation_prompt:
            out.append(self.template.parts("assistant")[0])
        return "".join(out)

    @property
    def version(self) -> str:
        return content_hash(self)


# ---- typed edits ---------------------------------------------------------------------
def _set_path(data: dict[str, Any], path: str, value: Any) -> str | None:
    """Set `path` in the dumped harness `data` in place; the reason when the path names nothing."""
    parts = path.split(".")
    if parts[0] == "tools" and len(parts) >= 2:
        tools = data["tools"]
        at = next((i for i, t in enumerate(tools) if t["name"] == parts[1]), None)
        if len(parts) == 2:
            if value is None:
                if at is None:
                    return f"tools.{parts[1]}: there is no tool {parts[1]!r} to remove"
                del tools[at]
            else:
                spec = dict(value) if isinstance(value, dict) else value
                if isinstance(spec, dict):
                    spec.setdefault("name", parts[1])
                    if spec["name"] != parts[1]:
                        return f"tools.{parts[1]}: the spec names another tool, {spec['name']!r}"
                if at is None:
                    tools.append(spec)
                else:
                    tools[at] = spec
            return None
        if at is None:
            return f"{path}: there is no tool {parts[1]!r}"
        if len(parts) != 3 or parts[2] not in ToolSpec.model_fields:
            return f"{path}: a tool's fields are {', '.join(ToolSpec.model_fields)}"
        tools[at][parts[2]] = value
        return None
    node: Any = data
    model: Any = AgentHarness
    for i, key in enumerate(parts):
        fields = getattr(model, "model_fields", None)
        if fields is None or key not in fields:
            return f"{path}: unknown field {'.'.join(parts[: i + 1])!r}"
        if i == len(parts) - 1:
            node[key] = value
            return None
        node = node[key]
        model = fields[key].annotation
    return None


def _describe(e: ValidationError, path: str, value: Any) -> str:
    first = e.errors()[0]
    loc = ".".join(str(x) for x in first["loc"])
    where = f" (at {loc})" if loc and loc != path else ""
    msg = first["msg"].removeprefix("Value error, ")
    return f"{path}={value!r}: {msg}{where}"


def apply_edit(harness: AgentHarness, path: str, value: Any) -> AgentHarness:
    """The harness with `path` set to `value`; ValueError naming the field and value when the
    edit is invalid, names nothing, or changes nothing."""
    reason, new = _edit(harness, path, value)
    if reason is not None:
        raise ValueError(reason)
    assert new is not None, "an edit without a reason has a result"
    return new


def check_edit(harness: AgentHarness, path: str, value: Any) -> str | None:
    """Why a typed intervention setting `path` to `value` would be refused, else None. The same
    validation the rollout's harness gets: the edited harness must validate as a whole, and an
    edit that changes nothing (same version) is refused as a no-op."""
    return _edit(harness, path, value)[0]


def _edit(harness: AgentHarness, path: str, value: Any) -> tuple[str | None, AgentHarness | None]:
    if not isinstance(path, str) or not path:
        return f"edit path {path!r} must be a dotted field name", None
    data = harness.model_dump(mode="json")
    why = _set_path(data, path, value)
    if why is not None:
        return why, None
    try:
        new = AgentHarness.model_validate(data)
    except ValidationError as e:
        return _describe(e, path, value), None
    if new.version == harness.version:
        return f"{path}={value!r}: no change (harness version {harness.version} stays)", None
    return None, new
