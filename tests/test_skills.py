"""Skill library: format, declarative triggers, sandboxed programs, verification, ranking, packs.

Programs run in the real sandbox (`make_sandbox("auto")`: Docker, bubblewrap or the plain
fallback, whichever this machine has). Every file written lives under tmp_path.

    .venv/bin/pytest tests/test_skills.py -p no:cacheprovider -q
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from agents.domain import Diagnosis, Intervention, InterventionKind
from sandboxes import make_sandbox
from skills import (
    Skill,
    SkillError,
    SkillLibrary,
    SkillPackError,
    SkillProgramError,
    fires,
    parse_skill,
    parse_skill_text,
    run_program,
    seed_dir,
    utility_from_episodes,
    verify,
)
from skills.skill import KINDS

SEED_NAMES = {
    "raise-max-new-tokens-on-truncation": "truncation",
    "restore-template-on-mismatch": "template_mismatch",
    "restart-crashed-job": "crashed_job",
    "temperature-back-to-one": "low_temperature",
    "ease-curriculum-when-too-hard": "too_hard_curriculum",
}


@pytest.fixture(scope="module")
def sandbox():
    return make_sandbox("auto")


def view(*diagnoses: str, metrics: list[dict[str, Any]] | None = None, **finding: Any) -> dict[str, Any]:
    """An evidence view as agents.recall.evidence_view builds it."""
    rows = metrics if metrics is not None else [
        {"step": s, "loss": 1.0 / s, "truncation_rate": 0.9, "pass_rate": 0.0} for s in range(1, 9)]
    return {"step": rows[-1]["step"] if rows else 0, "task": "addition", "metrics": rows,
            "diagnoses": [{"name": d, "severity": "warning", "summary": d, "evidence": dict(finding)} for d in diagnoses],
            "recipe": {"algorithm": "grpo", "lr": 1e-3}, "harness": {"sampling": {"max_new_tokens": 8}}}


def skill_md(name: str, front: str = "", body: str = "## When it applies\n\nAlways.\n") -> str:
    return f"---\nname: {name}\ndescription: A skill for tests.\n{front}---\n{body}"


def make_skill(root: Path, name: str, front: str = "", program: str | None = None, body: str | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text(skill_md(name, front) if body is None else body)
    if program is not None:
        (d / "skill.py").write_text(program)
    return d


def program_skill(tmp_path: Path, program: str, diagnosis: str = "truncation", trigger: str | None = None) -> Skill:
    block = (f"swarmlab:\n  diagnosis: {diagnosis}\n"
             + (f"  trigger: {trigger}\n" if trigger else "")
             + "  intervention: {kind: harness_edit, fields: [harness.sampling.max_new_tokens]}\n"
             + "  program: skill.py\n")
    return parse_skill(make_skill(tmp_path, "prog", block, program=program))


# ---------------------------------------------------------------------- format


def test_kinds_and_signature_match_the_domain():
    assert set(KINDS) == {k.value for k in InterventionKind}
    for s in SkillLibrary(seed_dir()).load()[0]:
        iv = s.swarmlab.intervention
        d = Diagnosis(name=s.swarmlab.diagnosis, summary="", operator="t", policy="builtin")
        real = Intervention(kind=InterventionKind(iv.kind), changes={f: 1 for f in iv.fields}, diagnosis=d,
                            rationale="", operator="t", policy="builtin")
        assert s.signature() == real.signature()


def test_round_trip_parse_write_parse(tmp_path):
    src = parse_skill(seed_dir() / "raise-max-new-tokens-on-truncation")
    assert parse_skill_text(src.to_markdown()) == src
    lib = SkillLibrary(tmp_path / "lib")
    path = lib.write(src)                                   # copies the program along from the seed folder
    assert path == tmp_path / "lib" / src.name and (path / "skill.py").read_text() == src.program_source()
    again = lib.get(src.name)
    assert again == src and again.path == path / "SKILL.md" and again.digest() == src.digest()
    lib.write(again)
    assert (path / "SKILL.md").read_text() == src.to_markdown()   # canonical text is a fixed point

    # unknown top-level keys, metadata and allowed-tools survive; a written program is declared
    hand = parse_skill_text(skill_md("odd-one", "x-origin: {by: tool, n: 3}\nmetadata: {author: me}\n"
                                     "allowed-tools: [Bash, Read]\ncompatibility: any\nswarmlab:\n"
                                     "  trigger: {any: [{metric: loss, op: nonfinite}]}\n"))
    assert hand.extra == {"x-origin": {"by": "tool", "n": 3}} and hand.meta == {"author": "me"}
    p = lib.write(hand, program="def trigger(e):\n    return False\n")
    back = parse_skill(p)
    assert back.swarmlab.program == "skill.py" and back.extra == hand.extra and back.allowed_tools == ["Bash", "Read"]
    assert parse_skill_text(back.to_markdown()) == back
    assert {s.name for s in lib.load()[0]} == {src.name, "odd-one"} and not list(lib.root.glob(".*"))

    # '---' inside values or the body cannot end the front matter early
    tricky = Skill(name="a-b", description="x\n---\ny: z", body="---\nname: evil\n---\n", extra={"k": "---"})
    assert parse_skill_text(tricky.to_markdown()) == tricky
    for bad in ({"name": "Bad_Name"}, {"name": "a--b"}, {"name": "x" * 65}, {"description": " "}):
        with pytest.raises(ValueError):
            Skill(**{"name": "ok", "description": "fine", **bad})


def test_write_validates_before_replacing(tmp_path):
    lib = SkillLibrary(tmp_path)
    good = parse_skill(make_skill(tmp_path / "src", "keep-me", "swarmlab:\n  trigger: {diagnosis: truncation}\n"))
    lib.write(good)
    before = (tmp_path / "keep-me" / "SKILL.md").read_bytes()
    broken = good.model_copy(update={"description": ""})        # model_copy skips validation
    with pytest.raises(SkillError) as e:
        lib.write(broken)
    assert e.value.field == "description"
    assert (tmp_path / "keep-me" / "SKILL.md").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep-me", "src"]     # no temp folder left
    with pytest.raises(ValueError):
        lib.write(good.model_copy(update={"name": "../escape"}))


MALFORMED = [
    ("missing front matter", "name: bad\ndescription: x\n", "front matter"),
    ("missing name", "---\ndescription: x\n---\nbody\n", "name"),
    ("name not the folder", "---\nname: other-name\ndescription: x\n---\n", "name"),
    ("description wrong type", "---\nname: bad\ndescription: [1, 2]\n---\n", "description"),
    ("unknown swarmlab key", "---\nname: bad\ndescription: x\nswarmlab:\n  triger: {diagnosis: truncation}\n---\n",
     "swarmlab.triger"),
    ("wrong kind", "---\nname: bad\ndescription: x\nswarmlab:\n  intervention: {kind: explode}\n---\n",
     "swarmlab.intervention.kind"),
    ("unparsable yaml", "---\nname: [bad\n---\n", "front matter"),
    ("metadata not str->str", "---\nname: bad\ndescription: x\nmetadata: {version: 1.0}\n---\n", "metadata.version"),
    ("bad field", "---\nname: bad\ndescription: x\nswarmlab:\n  intervention: {kind: recipe_edit, fields: [model.lr]}\n---\n",
     "swarmlab.intervention.fields"),
    ("missing program", "---\nname: bad\ndescription: x\nswarmlab:\n  program: skill.py\n---\n", "swarmlab.program"),
]


@pytest.mark.parametrize("case,text,field", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_skill_names_file_and_field(tmp_path, case, text, field):
    lib = SkillLibrary(tmp_path)
    make_skill(tmp_path, "good-one", "swarmlab:\n  trigger: {diagnosis: truncation}\n")
    good_bytes = (tmp_path / "good-one" / "SKILL.md").read_bytes()
    make_skill(tmp_path, "bad", body=text)
    skills, errors = lib.load()
    assert [s.name for s in skills] == ["good-one"]
    assert len(errors) == 1
    err = errors[0]
    assert err.field == field and err.path == tmp_path / "bad" / "SKILL.md"
    assert str(tmp_path / "bad" / "SKILL.md") in str(err) and field in str(err)
    assert (tmp_path / "good-one" / "SKILL.md").read_bytes() == good_bytes
    if case == "wrong kind":
        assert "'explode' is not one of" in str(err)


def test_agent_skills_format_loads(tmp_path, sandbox):
    text = ("---\nname: pdf-processing\ndescription: Extract text and tables from PDF files.\n"
            "license: Apache-2.0\nmetadata:\n  author: example-org\n  version: \"1.0\"\n---\n\n# PDF\n\nUse pdfplumber.\n")
    make_skill(tmp_path, "pdf-processing", body=text)
    (tmp_path / "pdf-processing" / "scripts").mkdir()
    (tmp_path / "pdf-processing" / "scripts" / "extract.py").write_text("print('x')\n")
    sk = SkillLibrary(tmp_path).get("pdf-processing")
    assert sk.meta == {"author": "example-org", "version": "1.0"} and sk.license == "Apache-2.0"
    assert sk.swarmlab is None and sk.active and sk.signature() is None
    assert "pdfplumber" in sk.document() and sk.metadata()["signature"] == "" and sk.metadata()["version"] == 0
    v = verify(sk, [view("truncation")], [], sandbox=sandbox)
    assert not v.ok and v.reason == "nothing to verify: no trigger"
    SkillLibrary(tmp_path).retire("pdf-processing", "superseded")   # gains a block; its scripts stay
    assert (tmp_path / "pdf-processing" / "scripts" / "extract.py").exists()
    assert SkillLibrary(tmp_path).get("pdf-processing").swarmlab.status == "retired"


# ---------------------------------------------------------------------- triggers


def test_declarative_trigger():
    rows = [{"step": i, "truncation_rate": r} for i, r in enumerate([0.0, 0.0, 0.0, 0.6, 0.7, 0.8, 0.6, 0.9], 1)]
    t = {"diagnosis": "truncation", "all": [{"metric": "truncation_rate", "op": ">=", "value": 0.5, "window": 5}]}
    assert fires(t, view("truncation", metrics=rows))
    assert not fires(t, view("plateau", metrics=rows))                       # wrong diagnosis
    assert not fires(t, view("truncation", metrics=rows[:4]))                # mean of the last rows too low
    assert not fires(t, view("truncation", metrics=[{"step": 1, "loss": 1.0}]))   # metric missing
    assert fires({"diagnosis": ["crashed_job", "stale_heartbeat"]}, view("stale_heartbeat"))
    # non-finite values, as evidence views write them ("nan" strings) or as floats
    nan_rows = [{"step": 1, "loss": 1.0}, {"step": 2, "loss": "nan"}, {"step": 3, "loss": 2.0}]
    assert fires({"all": [{"metric": "loss", "op": "nonfinite", "window": 2}]}, view(metrics=nan_rows))
    assert not fires({"all": [{"metric": "loss", "op": "nonfinite", "window": 1}]}, view(metrics=nan_rows))
    for op in (">=", "<=", ">", "<"):
        assert not fires({"all": [{"metric": "loss", "op": op, "value": 1.0}]}, view(metrics=nan_rows))
        assert not fires({"all": [{"metric": "loss", "op": op, "value": 1.0}]},
                         view(metrics=[{"step": 1, "loss": math.nan}]))
    assert fires({"all": [{"metric": "loss", "op": ">=", "value": 10}]}, view(metrics=[{"step": 1, "loss": "inf"}]))
    assert fires({"any": [{"metric": "x", "op": ">", "value": 0}, {"metric": "loss", "op": "<", "value": 5, "window": 1}]},
                 view(metrics=nan_rows))
    for junk in ({}, {"metrics": "no", "diagnoses": [1, None]}, {"metrics": [None, 3, {"loss": True}]}):
        assert not fires(t, junk)
    for bad in ({}, {"all": [{"metric": "loss", "op": "=="}]}, {"all": [{"metric": "loss", "op": ">"}]},
                {"diagnosis": "x", "when": 1}):
        with pytest.raises(ValueError):
            fires(bad, view())


# ---------------------------------------------------------------------- programs and verification


def _seed_views(name: str) -> tuple[list[dict], list[dict]]:
    diag = SEED_NAMES[name]
    covered = [view(diag, response_len_max=7.0)]
    unrelated = [view(d) for d in SEED_NAMES.values() if d != diag] + [view(), view("plateau")]
    return covered, unrelated


def test_seed_skills_parse_and_verify(sandbox):
    skills, errors = SkillLibrary(seed_dir()).load()
    assert not errors and {s.name for s in skills} == set(SEED_NAMES)
    for s in skills:
        assert s.swarmlab.diagnosis == SEED_NAMES[s.name] and s.swarmlab.trigger is not None
        assert all(h in s.body for h in ("## When it applies", "## What to do", "## Evidence"))
        covered, unrelated = _seed_views(s.name)
        v = verify(s, covered, unrelated, sandbox=sandbox)
        assert v.ok, (s.name, v)
        assert (v.fired_on_covered, v.fired_on_unrelated) == (len(covered), 0)
    assert sum(1 for s in skills if s.swarmlab.program) >= 1

    restart = parse_skill(seed_dir() / "restart-crashed-job")
    res = run_program(restart, [view("stale_heartbeat"), view("crashed_job"), view("plateau")], sandbox=sandbox)
    assert [r.fired for r in res] == [True, True, False] and res[0].proposal["changes"] == {}
    trunc = parse_skill(seed_dir() / "raise-max-new-tokens-on-truncation")
    res = run_program(trunc, [view("truncation", response_len_max=7.0), view("truncation")], sandbox=sandbox)
    assert res[0].proposal["changes"] == {"harness.sampling.max_new_tokens": 16}   # 2 × 7 + 2
    assert res[1].proposal["changes"] == {} and res[1].error is None


BAD_PROGRAMS = [
    ("crash", "def trigger(e):\n    return 1 / 0\n", "crash: the program raised", "ZeroDivisionError"),
    ("crash at import", "import nonexistent_module_xyz\ndef trigger(e):\n    return True\n", "crash: loading", "ModuleNotFound"),
    ("loop", "def trigger(e):\n    while True:\n        pass\n", "timeout", "no answer within 2"),
    ("misfire", "def trigger(e):\n    return True\n", "misfire: fired on 2 of 2 unrelated", ""),
    ("garbage on stdout", "import sys\nsys.__stdout__.write('garbage\\n')\ndef trigger(e):\n    return True\n",
     "bad_output: stdout is not", "garbage"),
    ("non-bool trigger", "def trigger(e):\n    return 'yes'\n", "bad_output", "str, not a bool"),
    ("proposal outside recipe/harness", "def trigger(e):\n    return bool(e['diagnoses'])\n"
     "def propose(e):\n    return {'changes': {'os.system': 'rm -rf /'}}\n", "bad_output", "'os.system'"),
    ("proposal off the skill's fields", "def trigger(e):\n    return any(d['name'] == 'truncation' for d in e['diagnoses'])\n"
     "def propose(e):\n    return {'changes': {'recipe.lr': 1.0}}\n", "bad_output", "outside the skill's fields"),
    ("disagrees with its declarative trigger", "def trigger(e):\n    return any(d['name'] == 'truncation' for d in e['diagnoses'])\n",
     "disagree", "covered[1]"),
]


@pytest.mark.parametrize("case,program,reason,detail", BAD_PROGRAMS, ids=[b[0] for b in BAD_PROGRAMS])
def test_verification_rejects_bad_programs(tmp_path, sandbox, case, program, reason, detail):
    trigger = "{diagnosis: truncation, all: [{metric: truncation_rate, op: '>=', value: 0.5}]}" if case.startswith("disagree") else None
    sk = program_skill(tmp_path, program, trigger=trigger)
    covered = [view("truncation")] + ([view("truncation", metrics=[{"step": 1, "truncation_rate": 0.1}])]
                                      if case.startswith("disagree") else [])
    v = verify(sk, covered, [view("plateau"), view()], sandbox=sandbox, timeout_s=2.0)
    assert not v.ok and v.reason.startswith(reason), v
    assert detail in v.reason + " ".join(v.errors), v


def test_program_prints_are_harmless_and_run_program_errors(tmp_path, sandbox):
    sk = program_skill(tmp_path, "def trigger(e):\n    print('debugging', e['task'])\n"
                                 "    return any(d['name'] == 'truncation' for d in e['diagnoses'])\n")
    v = verify(sk, [view("truncation")], [view("plateau")], sandbox=sandbox)
    assert v.ok and v.reason == "ok"
    loop = program_skill(tmp_path / "b", "while True:\n    pass\n")
    with pytest.raises(SkillProgramError) as e:
        run_program(loop, [view()], sandbox=sandbox, timeout_s=1.0)
    assert e.value.reason == "timeout" and e.value.field == "swarmlab.program"
    per_view = program_skill(tmp_path / "c", "def trigger(e):\n    return e['diagnoses'][0]['name'] == 'truncation'\n")
    res = run_program(per_view, [view("truncation"), view()], sandbox=sandbox)
    assert res[0].fired and res[0].error is None
    assert not res[1].fired and res[1].error_kind == "crash" and "IndexError" in res[1].error


def test_verify_needs_covered_views(sandbox):
    sk = parse_skill(seed_dir() / "temperature-back-to-one")
    assert verify(sk, [], [view("plateau")], sandbox=sandbox).reason.startswith("nothing to verify")
    v = verify(sk, [view("low_temperature"), view("plateau")], [], sandbox=sandbox)
    assert not v.ok and v.reason.startswith("missed: did not fire on 1 of 2")


# ---------------------------------------------------------------------- ranking and utility


@dataclasses.dataclass
class Episode:
    skills_used: list[str]
    outcome: str
    effect: float | None = None

    def won(self) -> bool:
        return self.outcome == "won"

    def lost(self) -> bool:
        return self.outcome == "lost"


def test_utility_and_rank(tmp_path):
    lib = SkillLibrary(tmp_path)
    for name in ("loser", "winner", "untried", "old"):
        make_skill(tmp_path, name, "swarmlab:\n  trigger: {diagnosis: truncation}\n")
    lib.retire("old", "lost every backtest")
    eps = [Episode(["loser"], "lost", -0.1), Episode(["loser"], "lost", None), Episode(["loser", "loser"], "lost", -0.3),
           Episode(["winner"], "won", 0.2), Episode(["winner"], "won", 0.4), Episode(["winner"], "pending", math.nan)]
    util = utility_from_episodes(eps, {"loser": 4, "untried": 1})
    assert util["loser"].model_dump() == {"retrieved": 4, "applied": 3, "wins": 0, "losses": 3,
                                          "mean_effect": pytest.approx(-0.2)}
    assert util["winner"].applied == 3 and util["winner"].wins == 2 and util["winner"].mean_effect == pytest.approx(0.3)
    assert util["untried"].weight() == 1.0 and util["winner"].weight() == pytest.approx(1.5)
    assert util["loser"].weight() == pytest.approx(0.4)

    hits = [("old", 0.05), ("loser", 0.10), ("winner", 0.15), ("untried", 0.30), ("ghost", 0.01), ("winner", 0.5)]
    ranked = lib.rank(hits, util, n=5)
    assert [s.name for s, _ in ranked] == ["winner", "untried", "loser"]      # retired and missing left out
    assert ranked[0][1] == pytest.approx(0.85 * 1.5) and ranked[2][1] == pytest.approx(0.9 * 0.4)
    assert [s.name for s, _ in lib.rank(hits, {}, n=2)] == ["loser", "winner"]   # no history: similarity alone

    old = lib.get("old")
    assert old.swarmlab.status == "retired" and old.swarmlab.version == 2 and not old.active
    assert old.swarmlab.retired_reason == "lost every backtest" and old.metadata()["status"] == "retired"


# ---------------------------------------------------------------------- packs


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_pack_round_trip_and_conflicts(tmp_path):
    src = SkillLibrary(tmp_path / "src")
    for name in ("restart-crashed-job", "temperature-back-to-one"):
        src.write(parse_skill(seed_dir() / name))
    pack = src.export_pack(tmp_path / "pack.tar.gz")
    with tarfile.open(pack) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        assert "restart-crashed-job/skill.py" in tar.getnames()
    assert [e["name"] for e in manifest["skills"]] == ["restart-crashed-job", "temperature-back-to-one"]
    assert manifest["skills"][0]["digest"] == src.get("restart-crashed-job").digest() and manifest["swarmlab_version"]

    dst = SkillLibrary(tmp_path / "dst")
    assert dst.import_pack(pack) == {"restart-crashed-job": "added", "temperature-back-to-one": "added"}
    assert _tree(dst.root) == _tree(src.root)
    assert dst.get("restart-crashed-job") == src.get("restart-crashed-job")

    dst.retire("temperature-back-to-one", "testing conflicts")
    assert dst.import_pack(pack) == {"restart-crashed-job": "skipped (exists)", "temperature-back-to-one": "skipped (exists)"}
    assert dst.get("temperature-back-to-one").swarmlab.status == "retired"
    assert dst.import_pack(pack, replace=True)["temperature-back-to-one"] == "replaced"
    assert dst.get("temperature-back-to-one").active

    # a folder of skill folders imports too; a broken skill is rejected, the others still come in
    folder = tmp_path / "folder"
    shutil.copytree(seed_dir() / "restore-template-on-mismatch", folder / "restore-template-on-mismatch")
    make_skill(folder, "broken", body="---\nname: broken\ndescription: 5\n---\n")
    out = dst.import_pack(folder)
    assert out["restore-template-on-mismatch"] == "added"
    assert out["broken"].startswith("rejected:") and "description" in out["broken"]
    assert not (dst.root / "broken").exists()

    # a skill altered after export no longer matches the manifest's digest
    tampered = tmp_path / "tampered.tar.gz"
    with tarfile.open(pack) as tin, tarfile.open(tampered, "w:gz") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read() if m.isfile() else None
            if m.name == "restart-crashed-job/skill.py":
                data = b"def trigger(e):\n    return True\n"
                m.size = len(data)
            tout.addfile(m, io.BytesIO(data) if data is not None else None)
    res = SkillLibrary(tmp_path / "fresh").import_pack(tampered)
    assert res["restart-crashed-job"].startswith("rejected: digest") and res["temperature-back-to-one"] == "added"


def _evil_pack(path: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    good = (seed_dir() / "restart-crashed-job" / "SKILL.md").read_bytes()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("restart-crashed-job/SKILL.md")
        info.size = len(good)
        tar.addfile(info, io.BytesIO(good))
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, target: str = "", size: int = 0) -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.linkname, m.size = kind, target, size
    return m


@pytest.mark.parametrize("case", ["dotdot", "absolute", "symlink", "hardlink", "fifo"])
def test_malicious_pack_rejected_with_nothing_written(tmp_path, case):
    members = {
        "dotdot": (_member("../evil/SKILL.md", size=4), b"evil"),
        "absolute": (_member(str(tmp_path / "abs-evil"), size=4), b"evil"),
        "symlink": (_member("restart-crashed-job/skill.py", tarfile.SYMTYPE, str(tmp_path / "secret")), b""),
        "hardlink": (_member("restart-crashed-job/skill.py", tarfile.LNKTYPE, "/etc/passwd"), b""),
        "fifo": (_member("restart-crashed-job/pipe", tarfile.FIFOTYPE), b""),
    }
    pack = _evil_pack(tmp_path / "evil.tar.gz", *members[case])
    lib = SkillLibrary(tmp_path / "lib" / "skills")
    make_skill(lib.root, "already-here")
    before = _tree(tmp_path)
    with pytest.raises(SkillPackError):
        lib.import_pack(pack)
    assert _tree(tmp_path) == before
    assert sorted(os.listdir(lib.root)) == ["already-here"]
    assert not (tmp_path / "lib" / "evil").exists() and not (tmp_path / "abs-evil").exists()


def test_folder_with_symlink_rejected(tmp_path):
    folder = tmp_path / "folder"
    shutil.copytree(seed_dir() / "restart-crashed-job", folder / "restart-crashed-job")
    (tmp_path / "secret").write_text("x")
    (folder / "restart-crashed-job" / "notes.md").symlink_to(tmp_path / "secret")
    lib = SkillLibrary(tmp_path / "lib")
    with pytest.raises(SkillPackError):
        lib.import_pack(folder)
    assert os.listdir(lib.root) == []


# ---------------------------------------------------------------------- skills written by others

PUBLISHED = {   # the shape of a published Agent Skill (the pdf one has 12 files): text, scripts, binaries
    "SKILL.md": ("---\nname: pdf\ndescription: Extract text and tables from PDF files, fill PDF forms, merge and "
                 "split documents.\nlicense: Complete terms in LICENSE.txt\n---\n# PDF processing\n\n"
                 "Forms: see [forms.md](forms.md). Tables: `python scripts/x.py in.pdf`.\n").encode(),
    "LICENSE.txt": b"Copyright the authors.\n\nPermission is granted to use these materials ...\n",
    "forms.md": b"# Filling forms\n\n1. Run scripts/check_fields.py\n",
    "reference.md": b"# Advanced reference\n\npypdf, pdfplumber, qpdf ...\n",
    "scripts/x.py": b"#!/usr/bin/env python3\nimport sys\nprint(open(sys.argv[1], 'rb').read(4))\n",
    "scripts/check_fields.py": b"def fields(doc):\n    return []\n",
    "scripts/requirements.txt": b"pypdf\npdfplumber\n",
    "references/a.md": b"# A\n\nmore detail\n",
    "references/api/deep.md": b"# Deep\n\nthree levels down\n",
    "assets/b.bin": bytes(range(256)) * 16 + b"\x00\xff\xfe",        # not UTF-8, NUL bytes
    "assets/logo.png": b"\x89PNG\r\n\x1a\n" + bytes(200),
    "assets/empty.dat": b"",
}


def _published(root: Path) -> Path:
    for rel, data in PUBLISHED.items():
        p = root / "pdf" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def _git_files(repo: Path, prefix: str) -> dict[str, bytes]:
    import subprocess

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout

    names = git("ls-tree", "-r", "--name-only", "main", "--", prefix).decode().split("\n")
    return {n.removeprefix(prefix): git("show", f"main:{n}") for n in names if n}


def test_a_published_skill_keeps_every_file_through_import_export_git_and_the_shared_library(tmp_path):
    """The 12 files of a published-style skill (its licence, scripts, references, binary assets)
    through `swarm skills import` of a folder → the workspace's git → `swarm skills export` →
    import into a second workspace → the shared library → a third workspace seeded from it; a
    miner-style update (SKILL.md only) keeps the other files; an altered file fails the manifest."""
    from typer.testing import CliRunner

    from swarm.cli import app
    from swarm.goal import MemorySettings
    from swarm.knowledge import Knowledge, seed_workspace, skill_files
    from swarm.workspace import Workspace

    assert len(PUBLISHED) == 12
    runner = CliRunner()

    def new_ws(name: str) -> Workspace:
        return Workspace.init(tmp_path / name, "goal: g\n", {"lr": 0.003}, {"template": "{question}="})

    ws1 = new_ws("ws1")
    res = runner.invoke(app, ["skills", "import", str(_published(tmp_path / "download")), "--workspace", str(ws1.root)])
    assert res.exit_code == 0 and "pdf: added" in res.stdout, res.output
    assert _git_files(ws1.root, "skills/pdf/") == PUBLISHED
    assert _tree(ws1.root / "skills" / "pdf") == PUBLISHED                 # the work tree is main
    lic = parse_skill(ws1.root / "skills" / "pdf").license
    assert lic == "Complete terms in LICENSE.txt" and (ws1.root / "skills" / "pdf" / "LICENSE.txt").is_file()

    pack = tmp_path / "pack.tar.gz"
    res = runner.invoke(app, ["skills", "export", str(pack), "--workspace", str(ws1.root), "--name", "pdf"])
    assert res.exit_code == 0, res.output
    with tarfile.open(pack) as tar:
        assert {m.name.removeprefix("pdf/") for m in tar.getmembers() if m.isfile() and m.name != "manifest.json"} \
            == set(PUBLISHED)
        manifest = json.load(tar.extractfile("manifest.json"))
    assert set(manifest["skills"][0]["files"]) == set(PUBLISHED)

    ws2 = new_ws("ws2")
    res = runner.invoke(app, ["skills", "import", str(pack), "--workspace", str(ws2.root)])
    assert res.exit_code == 0 and "pdf: added" in res.stdout, res.output
    assert _git_files(ws2.root, "skills/pdf/") == PUBLISHED

    lib = tmp_path / "library"
    settings = MemorySettings(library=str(lib), seed_skills=False, backend="memory")
    k = Knowledge(ws2, settings, task="addition", sandbox=None)
    assert k.export() == 1
    k.close()
    assert _tree(lib / "skills" / "pdf") == PUBLISHED
    ws3 = new_ws("ws3")
    assert seed_workspace(ws3, settings) == ["pdf"]
    assert _git_files(ws3.root, "skills/pdf/") == PUBLISHED

    # an update written in memory (as the miner writes one: no folder) changes SKILL.md only
    sk = parse_skill(ws3.root / "skills" / "pdf")
    v2 = sk.model_copy(update={"path": None, "description": "PDF text, tables and forms."})
    assert set(skill_files(v2)) == {"skills/pdf/SKILL.md"}
    ws3.skill_pr("pdf", 2, skill_files(v2), "Skill pdf v2: update")
    after = _git_files(ws3.root, "skills/pdf/")
    assert after.pop("SKILL.md") != PUBLISHED["SKILL.md"]
    assert after == {k_: v for k_, v in PUBLISHED.items() if k_ != "SKILL.md"}
    # retired in the library: the folder is kept whole
    SkillLibrary(lib / "skills").retire("pdf", "superseded")
    assert set(_tree(lib / "skills" / "pdf")) == set(PUBLISHED)

    # a file altered (or added) after export no longer matches the manifest: rejected, nothing written
    for change in ("alter", "add"):
        bad = tmp_path / f"{change}.tar.gz"
        with tarfile.open(pack) as tin, tarfile.open(bad, "w:gz") as tout:
            for m in tin.getmembers():
                data = tin.extractfile(m).read() if m.isfile() else None
                if change == "alter" and m.name == "pdf/assets/b.bin":
                    data = data[:-1] + b"\x01"
                tout.addfile(m, io.BytesIO(data) if data is not None else None)
            if change == "add":
                extra = tarfile.TarInfo("pdf/scripts/extra.py")
                extra.size = 2
                tout.addfile(extra, io.BytesIO(b"x\n"))
        out = SkillLibrary(tmp_path / f"fresh-{change}").import_pack(bad)
        want = "assets/b.bin" if change == "alter" else "scripts/extra.py"
        assert out["pdf"].startswith("rejected: file") and want in out["pdf"], out
        assert not (tmp_path / f"fresh-{change}" / "pdf").exists()


@pytest.mark.parametrize("case", ["git_dir", "too_many_files", "too_deep", "nested_symlink"])
def test_a_skill_folder_breaking_the_path_rules_is_refused_whole(tmp_path, case):
    from skills.library import PACK_MAX_DEPTH, SKILL_MAX_FILES

    d = _published(tmp_path / "src") / "pdf"
    if case == "git_dir":
        (d / ".git").mkdir()
        (d / ".git" / "config").write_text("[core]\n")
    elif case == "too_many_files":
        for i in range(SKILL_MAX_FILES):
            (d / "references" / f"r{i}.md").write_text("x")
    elif case == "too_deep":
        deep = d.joinpath(*[f"l{i}" for i in range(PACK_MAX_DEPTH)])
        deep.mkdir(parents=True)
        (deep / "f.md").write_text("x")
    else:
        (tmp_path / "secret").write_text("s")
        (d / "scripts" / "link.py").symlink_to(tmp_path / "secret")
    lib = SkillLibrary(tmp_path / "lib")
    with pytest.raises(SkillPackError):
        lib.import_pack(tmp_path / "src")
    assert os.listdir(lib.root) == []


def test_import_replace_makes_the_workspace_folder_exactly_the_imported_one(tmp_path):
    """`swarm skills import --replace` of a newer version: files it adds arrive, files it no
    longer has leave the workspace's git (the folder is the imported one, not a merge of both)."""
    from typer.testing import CliRunner

    from swarm.cli import app
    from swarm.workspace import Workspace

    ws = Workspace.init(tmp_path / "ws", "goal: g\n", {"lr": 0.003}, {"template": "{question}="})
    runner = CliRunner()
    for v, files in ((1, {"a.md": b"a\n", "old/b.md": b"b\n"}), (2, {"a.md": b"a2\n", "new/c.md": b"c\n"})):
        src = tmp_path / f"v{v}"
        d = make_skill(src, "tool-notes", f"swarmlab:\n  version: {v}\n")
        for rel, data in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(data)
        res = runner.invoke(app, ["skills", "import", str(src), "--workspace", str(ws.root), "--replace"])
        assert res.exit_code == 0 and "tool-notes:" in res.stdout, res.output
        got = _git_files(ws.root, "skills/tool-notes/")
        assert {k: v_ for k, v_ in got.items() if k != "SKILL.md"} == files
        assert _tree(ws.root / "skills" / "tool-notes") == got
