"""HarnessCritic for agent harnesses: failed trajectories in, named harness failure modes with
counts, and typed, validated edits of `AgentHarness` fields out; then the paired test that keeps an
edit only on a measured gain.

Why here and not in `agents/`: the agent trainer (`python -m trainer.agent_train --critic`) runs
the critic between its stages, and `trainer/` may import `harness/` but never `agents/`. So the
critic is a pure harness component: it reads rollout records and the harness, imports nothing
above `harness/`, and does no I/O. Evaluating an edit is the caller's (the trainer's) job; judging
the measured outcome is `judge_edit` here, a pure function.

    crit = critique(records, harness, available_tools=env.tool_specs())
    crit.findings        # [Finding(mode="malformed_call", count=61, failed=64, evidence="...")]
    crit.edits           # [Edit(path="tool_syntax.kind", value="call", ...)]  each passed check_edit
    verdict = judge_edit(edit, paired_test(before, after), alpha=0.05)     # Kept | Rejected

Records are dicts in the shape of `trainer.agent_rollout.Trajectory.to_dict()` (or objects with a
`to_dict`), or its small `record()` (texts capped; `raw_chars`, the length of a capped
raw_observation): steps (action, finish, text, tool, arguments, observation, raw_observation, error),
messages (role, turn, ids, cut), end, answer, expected, result.verdict, tool_calls, context_edits.
Only failed episodes (verdict not "correct") are read.

Failure modes and the edit each proposes (values come from the harness's current fields, counts
and the environment's tool specs, never from trajectory text):

    malformed_call     calls the parser rejected; re-parsed (as data, by our own parser) under the
                       other call syntax and under a lenient parser  -> tool_syntax.kind / .lenient
    turn_cut           calls or answers cut at max_new_tokens          -> sampling.max_new_tokens x1.5
    unknown_tool       a tool the environment has and the harness does not list, and failed
                       episodes that show it: calls of it (refused as unknown), or episodes that
                       never called it, more often than solved ones (a policy that is not told of
                       a tool stops calling it)                        -> tools.NAME (the env's spec)
    tool_spec_differs  a tool the harness lists with another description or parameters than the
                       environment's own spec, and failed episodes that show it: calls of it that
                       failed with an error (tool_error, bad_arguments), or, when the system prompt
                       shows the tool list (its {tools}), episodes that never called it (a wrong
                       description turns the policy away from the tool)
                                                                       -> tools.NAME (the env's spec)
    max_turns          episodes ended by the turn limit                -> max_turns x1.5
    max_tool_calls     episodes ended by the call limit                -> max_tool_calls x1.5
    observation_cut    observations whose cut removed the expected answer (or, when the tool's
                       output does not hold it, content the policy saw nowhere; which side: the
                       harness's observation.cut)                      -> observation.cut flipped;
                                                                          observation.max_chars raised
    context_dropped    the last prompt lacks an earlier observation    -> context.kind, keep_last_turns
    context_full       episodes ended because the context was full     -> context.kind trim_observations
    answer_unparsed    a final turn the answer parser could not read though the expected answer
                       is in its text                                  -> answer.regex (closing tag optional,
                                                                          or the last number)
    tool_never_called  answered without calling any tool               -> a system-prompt rule

A limit (max_turns, max_tool_calls, context_full) is named only for episodes whose calls ran: an
episode that reaches a limit while most of its calls were refused (`spent_on_refused`: malformed,
unknown tool, bad arguments) spent the limit on the refusal, and the refusal's own mode names it.

Trajectory text is data: it is parsed by the harness's own parsers and searched for the expected
answer, never executed or obeyed; no edit's path or value is read from it (tests hold a
trajectory that asks for `max_turns=999` to that). An optional `ranker` (`agents/harness_critic.py`:
an LLM behind `agents/llm.py` that reads the findings and edits, never trajectory text) may reorder
the proposed edits; it cannot add one, and anything but a permutation of the indices it was given
is ignored and noted.

The paired test (`paired_test`): both harnesses run on the same held-out episodes with the same
weights (greedy, so the same seeds give the same trajectories), and only the discordant episodes
carry information. Under "the edit changes nothing" each discordant episode is equally likely to
favour either harness, so the one-sided p-value is P(X >= gains) for X ~ Binomial(gains + losses,
1/2) (exact McNemar). `judge_edit` keeps an edit iff gains > losses and p <= alpha; a caller that
tries k candidates passes alpha/k (Bonferroni). `swarm/decisions.py`'s `decide` is not reused: it
compares independent arms (binomial noise of both rates, a between-seed spread), which overstates
the noise of a paired comparison on the same episodes, and `harness/` may not import `swarm/`.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import re
from typing import Any, Iterable, Protocol, Union

from harness.agent import CUT_MARKER, AgentHarness, check_edit
from harness.tools import ToolCall, ToolCallSyntax, ToolSpec

TOOL_RULE = "Call a tool before you answer."
EXAMPLES = 3            # episode uids quoted per finding


class Mode(str, enum.Enum):
    MALFORMED_CALL = "malformed_call"
    TURN_CUT = "turn_cut"
    UNKNOWN_TOOL = "unknown_tool"
    TOOL_SPEC_DIFFERS = "tool_spec_differs"
    MAX_TURNS = "max_turns"
    MAX_TOOL_CALLS = "max_tool_calls"
    OBSERVATION_CUT = "observation_cut"
    CONTEXT_DROPPED = "context_dropped"
    CONTEXT_FULL = "context_full"
    ANSWER_UNPARSED = "answer_unparsed"
    TOOL_NEVER_CALLED = "tool_never_called"


@dataclasses.dataclass(frozen=True)
class Finding:
    mode: Mode
    count: int                       # failed episodes that show it
    failed: int                      # failed episodes read
    evidence: str                    # one line, with the counts
    examples: tuple[str, ...] = ()   # uids of episodes that show it
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    def text(self) -> str:
        return f"{self.mode.value}: {self.count}/{self.failed} failed episodes; {self.evidence}"


@dataclasses.dataclass(frozen=True)
class Edit:
    path: str
    value: Any
    mode: Mode
    reason: str

    def text(self) -> str:
        return f"{self.path}={self.value!r}"


@dataclasses.dataclass
class Critique:
    read: int                                   # episodes read
    failed: int                                 # of them failed
    findings: list[Finding]                     # most frequent first
    edits: list[Edit]                           # valid edits, in the order to try them
    refused: list[tuple[Edit, str]]             # proposals the harness's validation refused, and why
    policy: str = "rules"                       # "rules" or "rules+ranker"
    notes: list[str] = dataclasses.field(default_factory=list)


class Ranker(Protocol):
    def rank(self, findings: list[dict[str, Any]], edits: list[dict[str, Any]]) -> list[int]:
        """A permutation of range(len(edits)): the order to try them in."""


# ---- reading records ---------------------------------------------------------------------------
def _record(r: Any) -> dict[str, Any]:
    d = r if isinstance(r, dict) else r.to_dict()
    if not isinstance(d, dict) or "steps" not in d or "end" not in d:
        raise ValueError(f"a trajectory record needs 'steps' and 'end'; got keys {sorted(d)[:8] if isinstance(d, dict) else type(d).__name__}")
    return d


def _failed(d: dict[str, Any]) -> bool:
    verdict = (d.get("result") or {}).get("verdict")
    return verdict != "correct" if verdict is not None else float(d.get("reward", 0.0)) < 1.0


def _contains(hay: list[int], needle: list[int]) -> bool:
    n = len(needle)
    if n == 0:
        return True
    first = needle[0]
    return any(hay[i] == first and hay[i:i + n] == needle for i in range(len(hay) - n + 1))


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z0-9_]+", text))


def _removed(raw: str, shown: str, side: str) -> str:
    """The part of `raw` that the cut left out of `shown`."""
    kept = shown.replace(CUT_MARKER, "", 1)
    if side == "end":
        return raw[len(kept):]
    if side == "start":
        return raw[: len(raw) - len(kept)]
    head = shown.split(CUT_MARKER, 1)[0]
    tail_len = len(kept) - len(head)
    return raw[len(head): len(raw) - tail_len]


def _other_kind(syntax: ToolCallSyntax) -> ToolCallSyntax:
    return syntax.model_copy(update={"kind": "json" if syntax.kind == "call" else "call"})


def _parses(syntax: ToolCallSyntax, text: str, tools: list[ToolSpec]) -> bool:
    return isinstance(syntax.parse(text, tools), ToolCall)


class _Tally:
    def __init__(self) -> None:
        self.uids: dict[Mode, list[str]] = {}
        self.detail: dict[Mode, dict[str, Any]] = {}

    def hit(self, mode: Mode, uid: str) -> None:
        got = self.uids.setdefault(mode, [])
        if uid not in got:
            got.append(uid)

    def add(self, mode: Mode, key: str, n: float = 1) -> None:
        d = self.detail.setdefault(mode, {})
        d[key] = d.get(key, 0) + n

    def most(self, mode: Mode, key: str, n: float) -> None:
        d = self.detail.setdefault(mode, {})
        d[key] = max(d.get(key, 0), n)


REFUSED = ("malformed", "unknown_tool", "bad_arguments")   # errors of a call the harness never ran
LIMIT_ENDS = {"max_turns": Mode.MAX_TURNS, "max_tool_calls": Mode.MAX_TOOL_CALLS, "context_full": Mode.CONTEXT_FULL}


def spent_on_refused(d: dict[str, Any]) -> bool:
    """Whether most of the calls of record `d` were refused by the harness (never ran): a limit
    such an episode reaches is spent repeating refused calls, so the refusal, not the limit, is
    what failed it."""
    calls = [s for s in d.get("steps") or [] if s.get("action") in ("tool_call", "malformed_call")]
    return 2 * sum(s.get("error") in REFUSED for s in calls) > len(calls)


def _unused_share(group: list[dict[str, Any]], name: str) -> float:
    return sum(name not in {s.get("tool") for s in d.get("steps") or []} for d in group) / max(len(group), 1)


def _by_name(tally: _Tally, mode: Mode, uid: str, name: str, kind: str) -> None:
    """One piece of evidence against the harness's listing of tool `name`: a failing call of it
    (`kind` "calls") or a failed episode that never called it ("unused")."""
    tally.hit(mode, uid)
    d = tally.detail.setdefault(mode, {"calls": 0, "unused": 0, "names": {}})
    d[kind] += 1
    d["names"][name] = d["names"].get(name, 0) + 1


def _spec_differs(tally: _Tally, uid: str, name: str, kind: str) -> None:
    """One piece of evidence against the harness's spec of tool `name` (see `_by_name`)."""
    _by_name(tally, Mode.TOOL_SPEC_DIFFERS, uid, name, kind)


def diagnose(records: Iterable[Any], harness: AgentHarness,
             available_tools: list[ToolSpec] | None = None) -> tuple[list[Finding], int, int]:
    """The failure modes in the failed episodes of `records`, most frequent first, with the
    number of episodes read and failed."""
    recs = [_record(r) for r in records]
    failed = [d for d in recs if _failed(d)]
    tools = list(harness.tools) + [t for t in available_tools or [] if harness.tool(t.name) is None]
    other, lenient = _other_kind(harness.tool_syntax), harness.tool_syntax.model_copy(update={"lenient": True})
    env_tools = {t.name for t in available_tools or []}
    env_specs = {t.name: t for t in available_tools or []}
    differs = {t.name for t in harness.tools if t.name in env_specs and t != env_specs[t.name]}
    # the tools whose different spec the policy reads (the tool list is shown only through {tools}),
    # left unused more often in failed episodes than in solved ones (a tool irrelevant to failing is not)
    shown_differs = differs if "{tools}" in harness.system_prompt else set()
    solved = [d for d in recs if not _failed(d)]

    def relevant(names: set[str]) -> set[str]:   # left unused more often by failed episodes than by solved ones
        return {n for n in names if not solved or _unused_share(failed, n) > _unused_share(solved, n)}

    shown_differs = relevant(shown_differs)
    # the environment's tools the harness does not list: the policy is not told of them and cannot call them
    unlisted = relevant({n for n in env_tools if harness.tool(n) is None})
    tally = _Tally()
    for d in failed:
        uid = str(d.get("uid", "?"))
        steps = d.get("steps") or []
        for s in steps:
            action, text = s.get("action"), s.get("text") or ""
            cut_turn = s.get("finish") == "length" and action in ("malformed_call", "no_answer")
            if cut_turn:
                tally.hit(Mode.TURN_CUT, uid)
                tally.add(Mode.TURN_CUT, "turns")
            if action == "malformed_call" and not cut_turn:
                tally.hit(Mode.MALFORMED_CALL, uid)
                tally.add(Mode.MALFORMED_CALL, "calls")
                tally.add(Mode.MALFORMED_CALL, "parse_as_other_kind", _parses(other, text, tools))
                tally.add(Mode.MALFORMED_CALL, "parse_lenient", _parses(lenient, text, tools))
            if s.get("error") == "unknown_tool" and s.get("tool") in env_tools and harness.tool(s["tool"]) is None:
                _by_name(tally, Mode.UNKNOWN_TOOL, uid, s["tool"], "calls")
            if s.get("tool") in differs and s.get("error") in ("tool_error", "bad_arguments"):
                _spec_differs(tally, uid, s["tool"], "calls")
            raw, shown = s.get("raw_observation"), s.get("observation")
            if raw is not None and shown is not None and raw != shown:
                # the cut matters when it removed the expected answer (when the tool's output held it),
                # else when it removed content the policy saw nowhere in what was shown
                expected = str(d.get("expected") or "")
                if expected and expected in raw:
                    removed_expected = expected not in shown
                    needed = removed_expected
                else:
                    removed_expected = False
                    needed = bool(_words(_removed(raw, shown, harness.observation.cut)) - _words(shown))
                if needed:
                    tally.hit(Mode.OBSERVATION_CUT, uid)
                    tally.add(Mode.OBSERVATION_CUT, "observations")
                    tally.add(Mode.OBSERVATION_CUT, "removed_expected", removed_expected)
                    tally.most(Mode.OBSERVATION_CUT, "longest_raw", int(s.get("raw_chars") or len(raw)))
        called = {s.get("tool") for s in steps}
        for name in sorted(shown_differs - called):
            _spec_differs(tally, uid, name, "unused")
        for name in sorted(unlisted - called):
            _by_name(tally, Mode.UNKNOWN_TOOL, uid, name, "unused")
        end = d.get("end")
        if end in LIMIT_ENDS:
            if not spent_on_refused(d):
                tally.hit(LIMIT_ENDS[end], uid)
        elif end == "no_answer" and steps:
            last = steps[-1].get("text") or ""
            expected = d.get("expected")
            if expected and re.search(r"(?<![0-9A-Za-z])" + re.escape(str(expected)) + r"(?![0-9A-Za-z])", last):
                tally.hit(Mode.ANSWER_UNPARSED, uid)
                prefix = harness.answer.prefix
                tally.add(Mode.ANSWER_UNPARSED, "prefix_unclosed", bool(prefix) and prefix in last)
        if end == "answered" and int(d.get("tool_calls", 0)) == 0 and harness.tools:
            tally.hit(Mode.TOOL_NEVER_CALLED, uid)
        if int(d.get("context_edits", 0)) > 0 and steps:
            prompt = steps[-1].get("prompt_ids") or []
            last_turn = steps[-1].get("turn", len(steps) - 1)
            dropped = sum(1 for m in d.get("messages") or [] if m.get("role") == "tool"
                          and 0 <= m.get("turn", -1) < last_turn and not _contains(prompt, m.get("ids") or []))
            if dropped:
                tally.hit(Mode.CONTEXT_DROPPED, uid)
                tally.add(Mode.CONTEXT_DROPPED, "observations", dropped)
    findings = [Finding(mode, len(uids), len(failed), _evidence(mode, len(uids), tally.detail.get(mode, {}), harness),
                        tuple(uids[:EXAMPLES]), dict(tally.detail.get(mode, {})))
                for mode, uids in tally.uids.items()]
    order = list(Mode)
    findings.sort(key=lambda f: (-f.count, order.index(f.mode)))
    return findings, len(recs), len(failed)


def _evidence(mode: Mode, n: int, det: dict[str, Any], h: AgentHarness) -> str:
    if mode is Mode.MALFORMED_CALL:
        other = "json" if h.tool_syntax.kind == "call" else "call"
        return (f"{det['calls']} calls rejected by the {h.tool_syntax.kind} parser; {det['parse_as_other_kind']} parse "
                f"as {other} calls, {det['parse_lenient']} under a lenient parser")
    if mode is Mode.TURN_CUT:
        return f"{det['turns']} turns cut at sampling.max_new_tokens={h.sampling.max_new_tokens} without a call or answer"
    if mode is Mode.UNKNOWN_TOOL:
        return (f"{det['calls']} calls refused as unknown and {det['unused']} failed episodes that never called them, "
                f"of tools the environment has but the harness does not list: {sorted(det['names'])}")
    if mode is Mode.TOOL_SPEC_DIFFERS:
        return (f"{det['calls']} calls failed with an error and {det['unused']} failed episodes never called them, "
                f"of tools the harness describes otherwise than the environment's spec: {sorted(det['names'])}")
    if mode is Mode.MAX_TURNS:
        return f"ended by max_turns={h.max_turns}"
    if mode is Mode.MAX_TOOL_CALLS:
        return f"ended by max_tool_calls={h.max_tool_calls}"
    if mode is Mode.OBSERVATION_CUT:
        o = h.observation
        kept = {"end": "the head", "start": "the tail", "middle": "both ends"}[o.cut]
        return (f"{det['observations']} observations cut to max_chars={o.max_chars} (cut={o.cut!r} kept {kept}) with "
                f"content the policy never saw; the expected answer was in the removed part of "
                f"{det['removed_expected']}; the longest tool output was {det['longest_raw']} characters")
    if mode is Mode.CONTEXT_DROPPED:
        return (f"the last prompt lacked {det['observations']} earlier observations (context.kind={h.context.kind!r}, "
                f"keep_last_turns={h.context.keep_last_turns})")
    if mode is Mode.CONTEXT_FULL:
        return f"ended with the context full (context.kind={h.context.kind!r}, max_tokens={h.context.max_tokens})"
    if mode is Mode.ANSWER_UNPARSED:
        return (f"the final turn held the expected answer but answer.regex={h.answer.regex!r} read nothing; "
                f"{det['prefix_unclosed']} opened {h.answer.prefix!r} without closing it")
    return "answered without calling any tool although the harness lists tools"


# ---- proposing -----------------------------------------------------------------------------------
def _grow(v: int, hi: int) -> int:
    return min(hi, v + max(1, v // 2))


def _candidates(f: Finding, h: AgentHarness, available: dict[str, ToolSpec]) -> list[tuple[str, Any, str]]:
    det = f.detail
    if f.mode is Mode.MALFORMED_CALL:
        out = []
        if det["parse_as_other_kind"] * 2 >= det["calls"]:
            out.append(("tool_syntax.kind", "json" if h.tool_syntax.kind == "call" else "call",
                        "most rejected calls are well-formed in the other call syntax"))
        if det["parse_lenient"] * 2 >= det["calls"] and not h.tool_syntax.lenient:
            out.append(("tool_syntax.lenient", True, "most rejected calls parse under a lenient parser"))
        return out
    if f.mode is Mode.TURN_CUT:
        return [("sampling.max_new_tokens", _grow(h.sampling.max_new_tokens, 4096), "turns are cut before they finish")]
    if f.mode is Mode.UNKNOWN_TOOL:
        return [(f"tools.{name}", available[name].model_dump(mode="json"), "the policy calls it and the environment has it")
                for name in sorted(det["names"], key=lambda n: -det["names"][n]) if name in available]
    if f.mode is Mode.TOOL_SPEC_DIFFERS:
        return [(f"tools.{name}", available[name].model_dump(mode="json"),
                 "calls of it fail or the policy does not use it, and the harness describes it otherwise than "
                 "the environment")
                for name in sorted(det["names"], key=lambda n: -det["names"][n]) if name in available]
    if f.mode is Mode.MAX_TURNS:
        return [("max_turns", _grow(h.max_turns, 64), "episodes run out of turns")]
    if f.mode is Mode.MAX_TOOL_CALLS:
        return [("max_tool_calls", _grow(h.max_tool_calls, 256), "episodes run out of tool calls")]
    if f.mode is Mode.OBSERVATION_CUT:
        out = []
        flip = {"end": "start", "start": "end"}.get(h.observation.cut)
        if flip:
            out.append(("observation.cut", flip, f"the cut removed the {h.observation.cut} of observations the "
                                                 "policy needed; keep that side"))
        out.append(("observation.max_chars", min(65536, max(det["longest_raw"], h.observation.max_chars + 1)),
                    "show the longest tool output whole"))
        return out
    if f.mode is Mode.CONTEXT_DROPPED:
        out = []
        if h.context.kind == "drop_oldest":
            out.append(("context.kind", "trim_observations", "trim old observations before dropping turns"))
        out.append(("context.keep_last_turns", min(64, h.context.keep_last_turns + 1), "keep one more recent turn whole"))
        return out
    if f.mode is Mode.CONTEXT_FULL:
        return [("context.kind", "trim_observations", "make room by trimming old observations")] \
            if h.context.kind != "trim_observations" else []
    if f.mode is Mode.ANSWER_UNPARSED:
        a = h.answer
        if det.get("prefix_unclosed") and a.prefix:
            closing = re.escape(a.stop) + "|" if a.stop else ""
            return [("answer.regex", re.escape(a.prefix) + r"\s*(.*?)\s*(?:" + closing + r"$)",
                     "read an answer whose closing tag is missing")]
        return [("answer.regex", r"(-?\d+(?:\.\d+)?)", "read the last number of the final turn")]
    if f.mode is Mode.TOOL_NEVER_CALLED:
        if "{tools}" not in h.system_prompt:
            return [("system_prompt", h.system_prompt.rstrip("\n") + "\n{tools}", "the system prompt does not list the tools")]
        if TOOL_RULE not in h.system_prompt:
            return [("system_prompt", h.system_prompt.rstrip("\n") + "\n" + TOOL_RULE, "add a rule to call a tool")]
        return []
    raise AssertionError(f"no edits for mode {f.mode}")


def propose(findings: list[Finding], harness: AgentHarness, available_tools: list[ToolSpec] | None = None
            ) -> tuple[list[Edit], list[tuple[Edit, str]]]:
    """The edits for `findings` (in their order) that `check_edit` accepts, and the refused ones
    with the reason: the same validation a live trainer applies."""
    available = {t.name: t for t in available_tools or []}
    edits: list[Edit] = []
    refused: list[tuple[Edit, str]] = []
    seen: set[str] = set()
    for f in findings:
        for path, value, why in _candidates(f, harness, available):
            e = Edit(path, value, f.mode, f"{why} ({f.count}/{f.failed} failed episodes)")
            if e.text() in seen:
                continue
            seen.add(e.text())
            reason = check_edit(harness, path, value)
            if reason is None:
                edits.append(e)
            else:
                refused.append((e, reason))
    return edits, refused


def critique(records: Iterable[Any], harness: AgentHarness, available_tools: list[ToolSpec] | None = None,
             ranker: Ranker | None = None) -> Critique:
    """Diagnose, propose, validate; with a `ranker`, its order of the same edits."""
    findings, read, failed = diagnose(records, harness, available_tools)
    edits, refused = propose(findings, harness, available_tools)
    crit = Critique(read, failed, findings, edits, refused)
    if ranker is not None and edits:
        crit.policy = "rules+ranker"
        try:
            order = ranker.rank([{"mode": f.mode.value, "count": f.count, "failed": f.failed, "evidence": f.evidence}
                                 for f in findings],
                                [{"path": e.path, "value": e.value, "mode": e.mode.value, "reason": e.reason}
                                 for e in edits])
        except Exception as e:  # the ranker is a boundary (an LLM): its failure is a note, the rules' order stands
            crit.notes.append(f"ranker failed ({type(e).__name__}: {str(e)[:120]}); rule order kept")
            return crit
        if isinstance(order, list) and sorted(order) == list(range(len(edits))) and \
                all(type(i) is int for i in order):
            crit.edits = [edits[i] for i in order]
        else:
            crit.notes.append(f"ranker returned {str(order)[:120]!r}, not a permutation of 0..{len(edits) - 1}; "
                              "rule order kept")
    return crit


# ---- judging a measured edit ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Paired:
    n: int                 # episodes run under both harnesses
    before: int            # successes under the current harness
    after: int             # successes under the edited harness
    gains: int             # episodes only the edited harness solved
    losses: int            # episodes only the current harness solved
    p_value: float         # one-sided exact McNemar: P(X >= gains), X ~ Binomial(gains + losses, 1/2)

    def text(self) -> str:
        return (f"{self.before}/{self.n} -> {self.after}/{self.n} on the same episodes ({self.gains} gained, "
                f"{self.losses} lost; one-sided exact McNemar p = {self.p_value:.3g})")


def paired_test(before: list[bool], after: list[bool]) -> Paired:
    """The paired comparison of two harnesses' per-episode successes on the same episodes."""
    if len(before) != len(after) or not before:
        raise ValueError(f"paired_test needs two equal, non-empty lists of outcomes; got {len(before)} and {len(after)}")
    gains = sum(1 for b, a in zip(before, after) if a and not b)
    losses = sum(1 for b, a in zip(before, after) if b and not a)
    m = gains + losses
    p = sum(math.comb(m, k) for k in range(gains, m + 1)) / 2 ** m if m else 1.0
    return Paired(len(before), sum(map(bool, before)), sum(map(bool, after)), gains, losses, p)


@dataclasses.dataclass(frozen=True)
class Kept:
    edit: Edit
    paired: Paired
    alpha: float
    reason: str


@dataclasses.dataclass(frozen=True)
class Rejected:
    edit: Edit
    paired: Paired
    alpha: float
    reason: str


Verdict = Union[Kept, Rejected]


def judge_edit(edit: Edit, paired: Paired, alpha: float) -> Verdict:
    """Kept iff the edited harness solved more of the same episodes and p <= alpha; no measured
    gain is a rejection."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha!r} must be in (0, 1)")
    if paired.gains <= paired.losses:
        return Rejected(edit, paired, alpha, f"no gain: {paired.text()}")
    if paired.p_value > alpha:
        return Rejected(edit, paired, alpha, f"gain not significant at alpha={alpha:.3g}: {paired.text()}")
    return Kept(edit, paired, alpha, f"gain at alpha={alpha:.3g}: {paired.text()}")


def edit_record(v: Verdict) -> dict[str, Any]:
    """A verdict as a JSON row (events, reports)."""
    p = v.paired
    return {"kept": isinstance(v, Kept), "path": v.edit.path, "value": v.edit.value, "mode": v.edit.mode.value,
            "reason": v.edit.reason, "verdict": v.reason, "n": p.n, "before": p.before, "after": p.after,
            "gains": p.gains, "losses": p.losses, "p_value": p.p_value, "alpha": v.alpha}


__all__ = ["LIMIT_ENDS", "Critique", "Edit", "Finding", "Kept", "Mode", "Paired", "Ranker", "Rejected", "Verdict",
           "critique", "diagnose", "edit_record", "judge_edit", "paired_test", "propose", "spent_on_refused"]
