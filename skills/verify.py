"""Run skill programs in the sandbox and verify that a skill fires where it should, and only there.

A skill may ship a program (`swarmlab.program`, usually `skill.py`) that defines

    def trigger(evidence: dict) -> bool          # does the skill apply to this evidence view?
    def propose(evidence: dict) -> dict          # optional: {"changes": {"harness.x": value, ...}}

Programs are untrusted (an LLM may have written them), so they never run in this process: one
sandbox run evaluates one program over a list of evidence views. The code sent to the sandbox is
the small runner below; the program and `input.json` travel as files. The runner imports the
program by path, calls trigger (and propose, where it fired) per view catching exceptions per
view, and prints one JSON line. Stdout belongs to the runner: while the program runs,
`sys.stdout` points at stderr, so a stray `print` is harmless, but bytes written to the real
stdout (fd 1) make the output unreadable, and the run fails as bad_output.

    results = run_program(skill, [view1, view2])            # [ProgramResult(fired, proposal, error)]
    verdict = verify(skill, covered=[...], unrelated=[...]) # Verdict(ok, reason, counts, errors)

`verify` demands that the skill fires on every covered view and on none of the unrelated ones.
A declarative trigger alone is evaluated in-process (skills.trigger.fires); with a program, the
program decides and the declarative trigger must agree on every view. The verdict's reason
starts with what went wrong: "crash", "timeout", "bad_output", "sandbox", "missed", "misfire",
"disagree", "nothing to verify", or is "ok".
"""
from __future__ import annotations

import functools
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, Field

from sandboxes import Limits, Sandbox, StopReason, make_sandbox
from skills.skill import FIELD_RE, Skill, SkillError
from skills.trigger import fires

MiB = 1 << 20
PROGRAM_FILE = "skill.py"       # the program's name inside the sandbox
INPUT_FILE = "input.json"
MEMORY_BYTES = 256 * MiB
OUTPUT_BYTES = 256 * 1024       # the runner's JSON line; a program flooding stdout is cut off here
ERROR_CHARS = 300               # per-view error text kept
PROPOSAL_KEYS = {"changes", "rationale"}

ProgramFailure = Literal["crash", "timeout", "bad_output", "sandbox"]

RUNNER = r'''
import importlib.util, json, sys
out = sys.stdout
sys.stdout = sys.stderr            # the program's prints go to stderr; stdout carries one JSON line


def text(e):
    try:
        s = type(e).__name__ + ": " + str(e)
    except BaseException:
        s = type(e).__name__
    return s[:%(chars)d]


def emit(obj):
    out.write(json.dumps(obj, allow_nan=False) + "\n")
    out.flush()


with open(%(input)r) as f:
    views = json.load(f)
try:
    spec = importlib.util.spec_from_file_location("skill_program", %(program)r)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    trigger = getattr(mod, "trigger", None)
    propose = getattr(mod, "propose", None)
    if not callable(trigger):
        raise TypeError("the program defines no trigger(evidence) function")
except BaseException as e:
    emit({"fatal": text(e)})
    sys.exit(0)
results = []
for view in views:
    r = {"fired": False, "proposal": None, "error": None, "error_kind": None}
    try:
        fired = trigger(view)
        if not isinstance(fired, bool):
            r.update(error="trigger returned %%s, not a bool" %% type(fired).__name__, error_kind="bad_output")
        elif fired:
            r["fired"] = True
            if callable(propose):
                p = propose(view)
                try:
                    json.dumps(p, allow_nan=False)
                    r["proposal"] = p
                except (TypeError, ValueError) as e:
                    r.update(error="propose returned what JSON cannot hold: " + text(e), error_kind="bad_output")
    except BaseException as e:     # SystemExit too: one view's failure is data about that view
        r.update(fired=False, error=text(e), error_kind="crash")
    results.append(r)
emit({"results": results})
''' % {"chars": ERROR_CHARS, "input": INPUT_FILE, "program": PROGRAM_FILE}


class SkillProgramError(SkillError):
    """The whole program run failed: `reason` is crash (at import, or the process died), timeout,
    bad_output (stdout is not the runner's JSON line) or sandbox (the sandbox could not run it)."""

    def __init__(self, skill: Skill, reason: ProgramFailure, message: str) -> None:
        self.reason = reason
        super().__init__(skill.program_path() or skill.path or skill.name, "swarmlab.program", f"{reason}: {message}")


class ProgramResult(BaseModel):
    """What the program said about one evidence view."""

    fired: bool = Field(description="trigger returned True (False when it raised or returned a non-bool)")
    proposal: dict[str, Any] | None = Field(None, description="propose()'s result, when it fired and has propose")
    error: str | None = Field(None, description="what went wrong on this view")
    error_kind: Literal["crash", "bad_output"] | None = Field(None, description="crash: it raised; bad_output: wrong type")


class Verdict(BaseModel):
    ok: bool
    reason: str = Field(description="'ok', or what failed first: crash, timeout, bad_output, missed, misfire, ...")
    fired_on_covered: int = 0
    covered: int = 0
    fired_on_unrelated: int = 0
    unrelated: int = 0
    errors: list[str] = Field(default_factory=list, description="per-view errors, e.g. 'covered[1]: crash: ...'")


@functools.lru_cache(maxsize=1)
def default_sandbox() -> Sandbox:
    """One auto-chosen sandbox per process (the choice probes for a Docker engine, so it is kept)."""
    return make_sandbox("auto")


def _tail(b: bytes, n: int = 400) -> str:
    return " ".join(b.decode("utf-8", "replace")[-n:].split())


def check_proposal(proposal: Any) -> str | None:
    """Why `proposal` is not {"changes": {dotted recipe.*/harness.* field: JSON value}}, or None."""
    if not isinstance(proposal, dict):
        return f"propose returned {type(proposal).__name__}, not a dict"
    stray = sorted(set(proposal) - PROPOSAL_KEYS)
    if stray:
        return f"proposal has unknown keys {stray} (allowed: {sorted(PROPOSAL_KEYS)})"
    changes = proposal.get("changes")
    if not isinstance(changes, dict):
        return f"proposal['changes'] is {type(changes).__name__}, not a dict"
    bad = [k for k in changes if not (isinstance(k, str) and FIELD_RE.match(k))]
    if bad:
        return f"proposal changes {bad[0]!r}, not a dotted recipe.* or harness.* field"
    if "rationale" in proposal and not isinstance(proposal["rationale"], str):
        return "proposal['rationale'] is not a string"
    return None


def run_program(skill: Skill, evidences: list[dict[str, Any]], sandbox: Sandbox | None = None,
                timeout_s: float = 5.0) -> list[ProgramResult]:
    """Evaluate the skill's program on each evidence view, in one sandbox run. Per-view failures
    come back in the results; a failure of the whole run raises SkillProgramError."""
    src = skill.program_source()
    if src is None:
        raise SkillError(skill.path, "swarmlab.program", "the skill has no program file to run")
    try:
        payload = json.dumps(list(evidences))
    except (TypeError, ValueError) as e:
        raise ValueError(f"evidence views must be JSON: {e}") from None
    limits = Limits(wall_seconds=timeout_s, cpu_seconds=math.ceil(timeout_s) + 1, memory_bytes=MEMORY_BYTES,
                    output_bytes=OUTPUT_BYTES)
    sb = sandbox if sandbox is not None else default_sandbox()
    res = sb.run_python(RUNNER, files={PROGRAM_FILE: src, INPUT_FILE: payload}, limits=limits)
    if res.reason is StopReason.TIMEOUT:
        raise SkillProgramError(skill, "timeout", f"no answer within {timeout_s:g} s ({res.detail})")
    if res.reason is StopReason.OUTPUT_CAP:
        raise SkillProgramError(skill, "bad_output", f"output past {OUTPUT_BYTES} bytes ({res.detail})")
    if res.reason is StopReason.ERROR:
        raise SkillProgramError(skill, "sandbox", f"the sandbox could not run it: {res.detail}")
    if res.reason is StopReason.MEMORY:
        raise SkillProgramError(skill, "crash", f"memory limit ({res.detail}): {_tail(res.stderr)}")
    if not res.ok:
        raise SkillProgramError(skill, "crash", f"{res.summary()}: {_tail(res.stderr)}")
    lines = res.stdout_text.strip().splitlines()
    try:
        if len(lines) != 1:
            raise ValueError(f"{len(lines)} lines")
        out = json.loads(lines[0])
        if not isinstance(out, dict):
            raise ValueError("not an object")
    except ValueError:
        raise SkillProgramError(skill, "bad_output",
                                f"stdout is not the runner's one JSON line ({len(lines)} lines, starting "
                                f"{res.stdout_text[:120]!r})") from None
    if "fatal" in out:
        raise SkillProgramError(skill, "crash", f"loading the program failed: {str(out['fatal'])[:ERROR_CHARS]}")
    rows = out.get("results")
    if not isinstance(rows, list) or len(rows) != len(evidences):
        raise SkillProgramError(skill, "bad_output", f"expected {len(evidences)} results, got {str(rows)[:200]}")
    results = []
    for row in rows:
        try:
            r = ProgramResult.model_validate(row)
        except ValueError:
            raise SkillProgramError(skill, "bad_output", f"malformed result {str(row)[:200]}") from None
        if r.fired and r.proposal is not None and r.error is None:
            why = check_proposal(r.proposal)
            if why is not None:
                r = ProgramResult(fired=True, proposal=None, error=why, error_kind="bad_output")
        results.append(r)
    return results


def _program_declares(skill: Skill, proposal: dict[str, Any] | None) -> str | None:
    """A proposal may only change the fields the skill declares (when it declares an intervention)."""
    iv = skill.swarmlab.intervention if skill.swarmlab is not None else None
    if proposal is None or iv is None:
        return None
    stray = sorted(set(proposal.get("changes", {})) - set(iv.fields))
    return f"proposal changes {stray}, outside the skill's fields {iv.fields}" if stray else None


def verify(skill: Skill, covered: list[dict[str, Any]], unrelated: list[dict[str, Any]],
           sandbox: Sandbox | None = None, timeout_s: float = 5.0) -> Verdict:
    """Does `skill` fire on every covered evidence view and on none of the unrelated ones?"""
    sw = skill.swarmlab
    trigger = sw.trigger if sw is not None else None
    has_program = sw is not None and sw.program is not None
    base = {"covered": len(covered), "unrelated": len(unrelated)}
    if trigger is None and not has_program:
        return Verdict(ok=False, reason="nothing to verify: no trigger", **base)
    if not covered:
        return Verdict(ok=False, reason="nothing to verify: no covered evidence views", **base)
    views = list(covered) + list(unrelated)
    labels = [f"covered[{i}]" for i in range(len(covered))] + [f"unrelated[{i}]" for i in range(len(unrelated))]
    declared = [fires(trigger, v) for v in views] if trigger is not None else None

    errors: list[str] = []
    first_kind: str | None = None
    if has_program:
        try:
            results = run_program(skill, views, sandbox=sandbox, timeout_s=timeout_s)
        except SkillProgramError as e:
            return Verdict(ok=False, reason=e.detail, **base)
        except SkillError as e:
            return Verdict(ok=False, reason=f"crash: {e.detail}", **base)
        fired = [r.fired for r in results]
        for label, r in zip(labels, results):
            err, kind = r.error, r.error_kind
            if err is None:
                err = _program_declares(skill, r.proposal)
                kind = "bad_output" if err else None
            if err is not None:
                errors.append(f"{label}: {kind}: {err}")
                first_kind = first_kind or kind
    else:
        assert declared is not None, "no program means a declarative trigger"
        fired = declared

    n_cov = sum(fired[: len(covered)])
    n_unrel = sum(fired[len(covered) :])
    counts = dict(fired_on_covered=n_cov, fired_on_unrelated=n_unrel, errors=errors, **base)
    if errors:
        what = "raised" if first_kind == "crash" else "gave bad output"
        return Verdict(ok=False, reason=f"{first_kind}: the program {what} on {len(errors)} of {len(views)} "
                                        f"evidence views ({errors[0]})", **counts)
    if n_cov < len(covered):
        missed = [labels[i] for i in range(len(covered)) if not fired[i]]
        return Verdict(ok=False, reason=f"missed: did not fire on {len(missed)} of {len(covered)} covered views "
                                        f"({', '.join(missed[:5])})", **counts)
    if n_unrel:
        wrong = [labels[i] for i in range(len(covered), len(views)) if fired[i]]
        return Verdict(ok=False, reason=f"misfire: fired on {n_unrel} of {len(unrelated)} unrelated views "
                                        f"({', '.join(wrong[:5])})", **counts)
    if declared is not None and has_program and declared != fired:
        differ = [labels[i] for i in range(len(views)) if declared[i] != fired[i]]
        return Verdict(ok=False, reason=f"disagree: the declarative trigger and the program differ on "
                                        f"{', '.join(differ[:5])}", **counts)
    return Verdict(ok=True, reason="ok", **counts)
