"""The agent harness (harness/agent.py) and its tools (harness/tools.py): validation that names the
field and the value, content-hash versions, typed edits, the tool-call parser in both syntaxes,
argument checks, and observation cutting."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness import AgentHarness
from harness.agent import ContextPolicy, MessageTemplate, ObservationPolicy, apply_edit, check_edit
from harness.tools import Malformed, ToolCall, ToolCallSyntax, ToolSpec, check_arguments, describe_tools, params

GET = ToolSpec(name="get", description="the value of a key", parameters=params(key="string"))
ADD = ToolSpec(name="add", description="a + b", parameters=params(a="integer", b="integer"))


def harness(**kw):
    return AgentHarness(tools=[GET, ADD], **kw)


@pytest.mark.parametrize("field,value,match", [
    ("max_turns", 0, "max_turns"),
    ("max_tool_calls", -1, "max_tool_calls"),
    ("turn_discount", 1.5, "turn_discount"),
    ("turn_discount", float("nan"), "turn_discount"),
    ("stop", [""], "stop string ''"),
    ("stop", ["a", "a"], "repeats"),
    ("system_prompt", "use {tool}", "placeholder other than {tools}: {tool}"),
    ("template", {"user": "no content"}, "template.user='no content'"),
    ("observation", {"max_chars": 4}, "max_chars"),
    ("observation", {"cut": "left"}, "cut"),
    ("context", {"kind": "forget"}, "kind"),
    ("tools", [GET, GET], "'get' is listed twice"),
    ("tool_syntax", {"open": "<t>", "close": "<t>"}, "must differ"),
])
def test_fields_are_validated_naming_field_and_value(field, value, match):
    with pytest.raises(ValidationError, match=match):
        AgentHarness(**{field: value})


def test_tool_specs_are_validated():
    for bad, match in [({"name": "1get"}, "1get"),
                       ({"name": "get", "parameters": {"type": "array"}}, "type 'object'"),
                       ({"name": "get", "parameters": {"type": "object", "properties": {"k": {"type": "list"}}}}, "'k'"),
                       ({"name": "get", "parameters": {"type": "object", "properties": {}, "required": ["k"]}},
                        "required")]:
        with pytest.raises(ValidationError, match=match):
            ToolSpec(**bad)


def test_version_is_a_content_hash():
    a, b = harness(), harness()
    assert a.version == b.version and len(a.version) == 12
    assert harness(max_turns=3).version != a.version
    assert AgentHarness.model_validate(a.model_dump(mode="json")).version == a.version
    desc = a.model_copy(deep=True)
    desc.tools[0].description = "changed"
    assert desc.version != a.version


def test_system_text_lists_tools_in_the_call_syntax():
    text = harness().system_text()
    assert "- get(key: string): the value of a key" in text and "- add(a: integer, b: integer)" in text
    assert '<tool>get(key="...")</tool>' in text
    json_text = describe_tools([GET], ToolCallSyntax(kind="json"))
    assert '<tool>{"name": "get", "arguments": {"key": "..."}}</tool>' in json_text
    assert describe_tools([], ToolCallSyntax()) == "No tools."


@pytest.mark.parametrize("path,value,reason", [
    ("max_turns", 0, "max_turns=0: Input should be greater than or equal to 1"),
    ("max_turns", 8, "no change"),
    ("observation.cut", "left", "observation.cut='left'"),
    ("observation.colour", 1, "unknown field 'observation.colour'"),
    ("colour", 1, "unknown field 'colour'"),
    ("tools.nope.description", "x", "there is no tool 'nope'"),
    ("tools.nope", None, "no tool 'nope' to remove"),
    ("tools.get.colour", 1, "a tool's fields are"),
    ("tools.get", {"name": "other"}, "names another tool"),
    ("tools.get.name", "1x", "1x"),
    ("system_prompt", "{x}", "placeholder other than {tools}"),
    ("answer.regex", "(a)(b)", "exactly one capture group"),
    ("sampling.temperature", 9, "sampling.temperature=9: Input should be less than or equal to 5"),
    ("context.max_tokens", "many", "context.max_tokens='many'"),
])
def test_check_edit_refuses_with_a_reason(path, value, reason):
    got = check_edit(harness(), path, value)
    assert got is not None and reason in got, got
    with pytest.raises(ValueError, match="."):
        apply_edit(harness(), path, value)


def test_edits_that_pass_change_the_version_and_only_their_field():
    h = harness()
    for path, value, check in [
        ("max_turns", 3, lambda n: n.max_turns == 3),
        ("observation.cut", "start", lambda n: n.observation.cut == "start"),
        ("context.kind", "drop_oldest", lambda n: n.context.kind == "drop_oldest"),
        ("tools.get.description", "look it up", lambda n: n.tool("get").description == "look it up"),
        ("tools.add", None, lambda n: [t.name for t in n.tools] == ["get"]),
        ("tools.calc", {"description": "c", "parameters": params(expression="string")},
         lambda n: n.tool("calc") is not None and len(n.tools) == 3),
        ("tool_syntax.lenient", True, lambda n: n.tool_syntax.lenient),
        ("system_prompt", "Be brief. {tools}", lambda n: n.system_prompt.startswith("Be brief")),
    ]:
        assert check_edit(h, path, value) is None, path
        new = apply_edit(h, path, value)
        assert check(new) and new.version != h.version, path
        assert new.max_tool_calls == h.max_tool_calls
    assert h.max_turns == 8 and len(h.tools) == 2, "the original is not edited"


def test_call_syntax_parses_and_reports_malformed_calls():
    s = ToolCallSyntax()
    assert s.parse("no call here") is None
    assert s.parse('think <tool>get(key="k1")</tool> more') == ToolCall("get", {"key": "k1"}, '<tool>get(key="k1")</tool>')
    assert s.parse("<tool>add(a=2, b=-3)</tool>").arguments == {"a": 2, "b": -3}
    for text, reason in [('<tool>get(key="k1")', "no closing </tool>"), ("<tool></tool>", "empty"),
                         ('<tool>get("k1")</tool>', "must be named"), ("<tool>get(key=k1)</tool>", "literals"),
                         ("<tool>get(key=[1])</tool>", "list"), ("<tool>get(key=</tool>", "does not parse"),
                         ("<tool>__import__('os')</tool>", "must be named"), ("<tool>x.y()</tool>", "written"),
                         ('<tool>get(key="a", key="b")</tool>', "given twice"),
                         ("<tool>" + "(" * 5000 + "</tool>", "characters long")]:
        got = s.parse(text, [GET])
        assert isinstance(got, Malformed) and reason in got.reason, (text, got)


def test_lenient_call_syntax_takes_near_misses():
    s = ToolCallSyntax(lenient=True)
    assert s.parse("<tool>get(k1)</tool>", [GET]).arguments == {"key": "k1"}
    assert s.parse("<tool>get('k1'", [GET]).arguments == {"key": "k1"}
    assert s.parse("<tool>add(2, 3)</tool>", [ADD]).arguments == {"a": 2, "b": 3}
    assert isinstance(s.parse("<tool>add(1, 2, 3)</tool>", [ADD]), Malformed)


def test_json_syntax_round_trips_and_rejects_bad_json():
    s = ToolCallSyntax(kind="json")
    call = s.parse("x " + s.render("add", {"a": 1, "b": 2}))
    assert call.name == "add" and call.arguments == {"a": 1, "b": 2}
    assert isinstance(s.parse("<tool>{oops</tool>"), Malformed)
    assert isinstance(s.parse('<tool>{"name": "get", "arguments": "{\\"key\\": \\"a\\"}"}</tool>'), Malformed)
    lenient = ToolCallSyntax(kind="json", lenient=True)
    assert lenient.parse('<tool>{"name": "get", "arguments": "{\\"key\\": \\"a\\"}"}</tool>').arguments == {"key": "a"}
    assert ToolCallSyntax().parse(ToolCallSyntax().render("get", {"key": 'a "q"'})).arguments == {"key": 'a "q"'}


def test_check_arguments():
    assert check_arguments(ADD, {"a": 1, "b": 2}) == ({"a": 1, "b": 2}, None)
    assert "missing argument 'b'" in check_arguments(ADD, {"a": 1})[1]
    assert "unknown argument 'c'" in check_arguments(ADD, {"a": 1, "b": 2, "c": 3})[1]
    assert "is not a integer" in check_arguments(ADD, {"a": "1", "b": 2})[1]
    assert "is not a integer" in check_arguments(ADD, {"a": True, "b": 2})[1]
    assert check_arguments(ADD, {"a": "1", "b": 2}, lenient=True) == ({"a": 1, "b": 2}, None)
    assert check_arguments(GET, {"key": 7}, lenient=True) == ({"key": "7"}, None)


@pytest.mark.parametrize("cut,expect", [("end", "abcdefghijklm..."), ("start", "...hijklmnopqrst"),
                                        ("middle", "abcdefg...nopqrst")])
def test_observation_cut_sides(cut, expect):
    pol = ObservationPolicy(max_chars=16 if cut != "middle" else 17, cut=cut)
    text = "abcdefghijklmnopqrst"
    assert pol.apply(text) == (expect, True)
    assert len(pol.apply(text)[0]) == pol.max_chars
    assert pol.apply("short") == ("short", False)


def test_template_parts_and_render_text():
    t = MessageTemplate(user="<u>{content}</u>\n")
    assert t.parts("user") == ("<u>", "</u>\n")
    h = AgentHarness(system_prompt="S", template=t)
    assert h.render_text([{"role": "system", "content": "S"}, {"role": "user", "content": "q"}]) == "S\n<u>q</u>\nA: "
    assert ContextPolicy().kind == "keep_all"


def test_answer_and_stop():
    h = harness()
    assert h.answer.extract("x <answer> 42 </answer> tail") == "42"
    assert h.cut_at_stop("a</tool>b</answer>") == len("a</tool>")
    assert h.cut_at_stop("nothing") is None
