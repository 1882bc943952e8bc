"""Tools an agent policy may call: their specs, the syntax a call is written in, and its parser.

A `ToolSpec` is what the policy is told about a tool (name, description, a JSON-schema object of
its parameters), in the shape of the OpenAI `tools` list. The tool's code belongs to the
environment (`trainer/envs/`); the harness only decides which tools the policy is told about and
how it must write a call. `ToolCallSyntax` writes and parses calls between an opening and a
closing tag, in one of two kinds:

    json:  <tool>{"name": "get", "arguments": {"key": "k3"}}</tool>
    call:  <tool>get(key="k3")</tool>

`parse` returns a `ToolCall`, a `Malformed` (the reason, as the policy will read it) or None when
the text holds no call. A lenient parser also takes what a small policy tends to write: positional
arguments (in the schema's order), bare words and single quotes as strings, a missing closing tag,
arguments as a JSON string. `check_arguments` validates a call's arguments against the schema.
Nothing here raises on model output: model output is data.

    syntax = ToolCallSyntax(kind="call")
    spec = ToolSpec(name="get", description="the value of a key", parameters=params(key="string"))
    call = syntax.parse('let me look <tool>get(key="k3")</tool>')   # ToolCall("get", {"key": "k3"})
    check_arguments(spec, call.arguments)                            # ({"key": "k3"}, None): valid
"""
from __future__ import annotations

import ast
import dataclasses
import json
import re
import warnings
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from harness.spec import _Strict  # the same strictness as every harness model: unknown keys, nan and inf refused

TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
PARAM_TYPES = ("string", "integer", "number", "boolean")
MAX_CALL_CHARS = 4096        # a call's text longer than this is malformed (the parser never sees more)
DESCRIPTION_MAX_CHARS = 2048


def params(**types: str) -> dict[str, Any]:
    """A JSON-schema parameters object with every named parameter required: `params(key="string")`."""
    return {"type": "object", "properties": {k: {"type": t} for k, t in types.items()}, "required": list(types)}


class ToolSpec(_Strict):
    """One tool as the policy is told about it (the OpenAI `function` shape)."""

    name: str = Field(description="the name a call uses: a letter or _, then letters, digits or _ (at most 64)")
    description: str = Field("", description="what the tool does, as the policy reads it")
    parameters: dict[str, Any] = Field(default_factory=lambda: params(),
                                       description="JSON schema of the arguments: an object whose properties are "
                                                   "string, integer, number or boolean")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not TOOL_NAME.fullmatch(v):
            raise ValueError(f"tool name {v!r} must be a letter or _ then up to 63 letters, digits or _")
        return v

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        if len(v) > DESCRIPTION_MAX_CHARS:
            raise ValueError(f"tool description of {len(v)} characters: at most {DESCRIPTION_MAX_CHARS}")
        return v

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v.get("type") != "object":
            raise ValueError(f"tool parameters {v!r}: the schema must have type 'object'")
        props = v.get("properties", {})
        if not isinstance(props, dict):
            raise ValueError(f"tool parameters: properties={props!r} must be an object")
        for k, p in props.items():
            if not TOOL_NAME.fullmatch(str(k)):
                raise ValueError(f"tool parameter name {k!r} must be an identifier")
            if not isinstance(p, dict) or p.get("type") not in PARAM_TYPES:
                raise ValueError(f"tool parameter {k!r}: {p!r} must have a type among {', '.join(PARAM_TYPES)}")
        required = v.get("required", [])
        if not isinstance(required, list) or any(r not in props for r in required):
            raise ValueError(f"tool parameters: required={required!r} must list properties among {sorted(props)}")
        unknown = set(v) - {"type", "properties", "required", "additionalProperties", "description"}
        if unknown:
            raise ValueError(f"tool parameters: unsupported schema keys {sorted(unknown)}")
        return v

    @property
    def param_names(self) -> list[str]:
        return list(self.parameters.get("properties", {}))

    def signature(self) -> str:
        """`get(key: string)` — how a tool list shows it to the policy."""
        props = self.parameters.get("properties", {})
        return f"{self.name}(" + ", ".join(f"{k}: {p['type']}" for k, p in props.items()) + ")"

    def openai(self) -> dict[str, Any]:
        """The OpenAI `tools` entry for this tool."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    text: str   # the call as written, tags included


@dataclasses.dataclass(frozen=True)
class Malformed:
    reason: str
    text: str


def _check_type(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_arguments(spec: ToolSpec, arguments: dict[str, Any], lenient: bool = False
                    ) -> tuple[dict[str, Any], str | None]:
    """The arguments, coerced where `lenient` allows (a number given for a string, a numeric string
    for a number), and why they do not fit the schema (None when they do)."""
    props = spec.parameters.get("properties", {})
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        return arguments, f"{spec.name}: unknown argument {unknown[0]!r}; it takes {', '.join(props) or 'none'}"
    missing = [r for r in spec.parameters.get("required", []) if r not in arguments]
    if missing:
        return arguments, f"{spec.name}: missing argument {missing[0]!r}"
    out = dict(arguments)
    for k, v in arguments.items():
        kind = props[k]["type"]
        if lenient and kind == "string" and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = v = str(v)
        elif lenient and kind in ("integer", "number") and isinstance(v, str):
            try:
                out[k] = v = int(v.strip()) if kind == "integer" else float(v.strip())
            except ValueError:
                pass
        if not _check_type(v, kind):
            return arguments, f"{spec.name}: argument {k!r}={v!r} is not a {kind}"
    return out, None


class ToolCallSyntax(_Strict):
    """How a tool call is written: `kind` json or call, between `open` and `close`; `lenient`
    accepts the near-misses a small policy writes (see the module docstring)."""

    kind: Literal["json", "call"] = Field("call", description="json: {\"name\": ..., \"arguments\": {...}}; "
                                          "call: name(arg=value, ...) with literal values")
    open: str = Field("<tool>", description="the tag that opens a call")
    close: str = Field("</tool>", description="the tag that closes a call")
    lenient: bool = Field(False, description="accept positional arguments, bare words, single quotes, a missing "
                                             "closing tag and arguments given as a JSON string")

    @model_validator(mode="after")
    def _tags(self) -> "ToolCallSyntax":
        for name, tag in (("open", self.open), ("close", self.close)):
            if not tag.strip() or len(tag) > 32:
                raise ValueError(f"tool_syntax.{name}={tag!r} must be 1 to 32 characters, not only spaces")
        if self.open == self.close or self.open in self.close or self.close in self.open:
            raise ValueError(f"tool_syntax.open={self.open!r} and tool_syntax.close={self.close!r} must differ "
                             "and neither may contain the other")
        return self

    # ---- writing ---------------------------------------------------------------------
    def render(self, name: str, arguments: dict[str, Any], positional: bool = False) -> str:
        """The call a well-formed policy writes (demonstrations, the endpoint's replayed calls).
        `positional` (call syntax only): values without names, in the order given, as some agent
        data writes them; only a lenient parser reads them."""
        if self.kind == "json":
            if positional:
                raise ValueError("positional arguments exist only in the call syntax, not in json")
            body = json.dumps({"name": name, "arguments": arguments})
        elif positional:
            body = name + "(" + ", ".join(json.dumps(v) for v in arguments.values()) + ")"
        else:
            body = name + "(" + ", ".join(f"{k}={json.dumps(v)}" for k, v in arguments.items()) + ")"
        return self.open + body + self.close

    def example(self, spec: ToolSpec) -> str:
        """A call of `spec` with placeholder values, for the tool list shown to the policy."""
        sample = {"string": "...", "integer": 1, "number": 1.5, "boolean": True}
        props = spec.parameters.get("properties", {})
        return self.render(spec.name, {k: sample[p["type"]] for k, p in props.items()})

    # ---- reading ---------------------------------------------------------------------
    def find(self, text: str) -> int:
        """Where the first call opens in `text` (-1: none)."""
        return text.find(self.open)

    def parse(self, text: str, tools: list[ToolSpec] | None = None) -> ToolCall | Malformed | None:
        """The first call in `text`. `tools` gives the parameter order for positional arguments
        (lenient call syntax). Unknown tools and bad arguments are not judged here
        (`check_arguments` and the environment do that)."""
        start = self.find(text)
        if start < 0:
            return None
        body_at = start + len(self.open)
        end = text.find(self.close, body_at)
        if end < 0:
            if not self.lenient:
                return Malformed(f"the call has no closing {self.close}", text[start:])
            body, whole = text[body_at:], text[start:]
        else:
            body, whole = text[body_at:end], text[start:end + len(self.close)]
        if len(body) > MAX_CALL_CHARS:
            return Malformed(f"the call is {len(body)} characters long (at most {MAX_CALL_CHARS})", whole[:200])
        body = body.strip()
        if not body:
            return Malformed("the call is empty", whole)
        got = self._parse_json(body, tools) if self.kind == "json" else self._parse_call(body, tools)
        if isinstance(got, str):
            return Malformed(got, whole)
        name, args = got
        return ToolCall(name, args, whole)

    def _parse_json(self, body: str, tools: list[ToolSpec] | None) -> tuple[str, dict[str, Any]] | str:
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError) as e:
            return f"the call is not valid JSON: {str(e)[:80]}"
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return 'the call must be a JSON object with a "name" string and an "arguments" object'
        args = obj.get("arguments", {})
        if isinstance(args, str) and self.lenient:
            try:
                args = json.loads(args) if args.strip() else {}
            except (ValueError, RecursionError):
                return "the arguments string is not valid JSON"
        if not isinstance(args, dict):
            return '"arguments" must be a JSON object'
        extra = set(obj) - {"name", "arguments"}
        if extra and not self.lenient:
            return f"unexpected keys in the call: {sorted(extra)}"
        return obj["name"], args

    def _parse_call(self, body: str, tools: list[ToolSpec] | None) -> tuple[str, dict[str, Any]] | str:
        form = "name(arg=value, ...)"
        m = re.match(r"([A-Za-z_]\w*)\s*\(", body)
        if m is None:
            if self.lenient and TOOL_NAME.fullmatch(body):
                return body, {}
            return f"the call must be written {form}"
        name = m.group(1)
        if self.lenient and not body.endswith(")"):
            body += ")"
        try:
            with warnings.catch_warnings():   # model output is data: no SyntaxWarning on stderr for it
                warnings.simplefilter("ignore", SyntaxWarning)
                node = ast.parse(body, mode="eval").body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return f"the call does not parse; write {form} with quoted strings"
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            return f"the call must be written {form}"
        if node.args and not self.lenient:
            return f"arguments must be named: {form}"
        order = next((t.param_names for t in tools or [] if t.name == name), [])
        if len(node.args) > len(order):
            return f"{name} takes at most {len(order)} positional arguments, got {len(node.args)}"
        args: dict[str, Any] = {}
        for k, v in [(order[i], a) for i, a in enumerate(node.args)] + [(kw.arg, kw.value) for kw in node.keywords]:
            if k is None:
                return "**arguments are not allowed"
            if k in args:
                return f"argument {k!r} given twice"
            value = self._literal(v)
            if isinstance(value, _Bad):
                return f"argument {k!r}: {value.reason}"
            args[k] = value
        return name, args

    def _literal(self, node: ast.expr) -> Any:
        if self.lenient and isinstance(node, ast.Name):
            return {"true": True, "false": False, "null": None}.get(node.id, node.id)
        try:
            value = ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return _Bad("values must be literals (a quoted string, a number, true or false)")
        if isinstance(value, (str, int, float, bool)) or value is None:
            return value
        return _Bad(f"a {type(value).__name__} is not a supported value")


@dataclasses.dataclass(frozen=True)
class _Bad:
    reason: str


def describe_tools(tools: list[ToolSpec], syntax: ToolCallSyntax) -> str:
    """The tool list the system prompt shows (its `{tools}` placeholder)."""
    if not tools:
        return "No tools."
    lines = ["Tools:"] + [f"- {t.signature()}: {t.description}".rstrip(": ") for t in tools]
    lines.append(f"Call one tool per turn, e.g. {syntax.example(tools[0])}")
    return "\n".join(lines)
