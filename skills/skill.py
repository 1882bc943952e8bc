"""One skill: a SKILL.md (YAML front matter + markdown body) in a folder named after it.

The format is the Agent Skills convention: `name` and `description` are required, `license`,
`compatibility`, `metadata` (str -> str) and `allowed-tools` are optional. A skill written that
way by any tool loads here as retrievable text. Our own skills add a typed `swarmlab:` block: the
diagnosis the skill answers, a declarative trigger (skills/trigger.py), the intervention (kind,
dotted fields, static values, risk), where it was learnt and an optional program file:

    ---
    name: raise-max-new-tokens-on-truncation
    description: Answers cut off at max_new_tokens; raise the limit.
    swarmlab:
      version: 1
      status: active
      diagnosis: truncation
      trigger: {diagnosis: truncation}
      intervention: {kind: harness_edit, fields: [harness.sampling.max_new_tokens], risk: medium}
      task_families: []
      episodes: []
    ---
    ## When it applies ...

    sk = parse_skill(Path("skills/seed/raise-max-new-tokens-on-truncation"))
    sk.signature()          # "truncation|harness_edit|harness.sampling.max_new_tokens"

Unknown top-level keys are kept (`extra`) and written back; everything we know is checked, and a
bad file raises `SkillError` naming the file and the field. Inside `swarmlab:` unknown keys are
errors (a typo there would silently disable a trigger). `Skill.metadata` (the Agent Skills map)
is the attribute `meta`, because `metadata()` is the flat dict a vector store indexes.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sandboxes.errors import SwarmlabError
from skills.trigger import TriggerSpec
from trainer.config import parse_yaml

SKILL_FILE = "SKILL.md"
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
NAME_MAX = 64
DESCRIPTION_MAX = 1024
FIELD_RE = re.compile(r"^(recipe|harness)(\.[A-Za-z0-9_]+)+$")
PROGRAM_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.py$")
# agents.domain.InterventionKind's values (tests check they agree; no import, so skills stay a leaf)
KINDS: tuple[str, ...] = ("recipe_edit", "harness_edit", "data_change", "restart", "rollback", "distill")
Kind = Literal["recipe_edit", "harness_edit", "data_change", "restart", "rollback", "distill"]
DOCUMENT_BODY_CHARS = 1000
_FRONT_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools", "swarmlab"}
# pydantic adds the member type of a union to an error's location; field paths leave it out
_SUBFIELD_RE = re.compile(r"^([a-z_][a-z0-9_.]*): (.+)$", re.S)
_TYPE_PARTS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after", "function-before"}


class SkillError(SwarmlabError, ValueError):
    """A skill file that cannot be used. `path`: the file; `field`: the dotted front-matter field
    (or "front matter" when the file's structure is wrong; None when the whole file is)."""

    def __init__(self, path: Path | str | None, field: str | None, message: str) -> None:
        self.path = Path(path) if path is not None else None
        self.field = field
        self.detail = message
        where = str(path) if path is not None else "<skill>"
        super().__init__(f"{where}: field '{field}': {message}" if field else f"{where}: {message}")


def check_name(name: str) -> str:
    """`name` if it is a valid skill name (also a safe folder name), else ValueError."""
    if not isinstance(name, str) or not (1 <= len(name) <= NAME_MAX) or not NAME_RE.match(name):
        raise ValueError(f"{name!r} is not a skill name: 1..{NAME_MAX} chars of a-z, 0-9 and single inner hyphens")
    return name


class InterventionSpec(BaseModel):
    """What the skill does: an intervention of `kind` on `fields`, with `changes` known in advance."""

    model_config = ConfigDict(strict=True, extra="forbid")

    kind: Kind = Field(description="one of " + ", ".join(KINDS))
    fields: list[str] = Field(default_factory=list, description="dotted recipe.*/harness.* fields it changes")
    changes: dict[str, Any] = Field(default_factory=dict,
                                    description="static values for some fields; the others the operator computes")
    risk: Literal["low", "medium", "high"] = Field("medium", description="low | medium | high")

    @field_validator("fields")
    @classmethod
    def _fields(cls, v: list[str]) -> list[str]:
        bad = [f for f in v if not FIELD_RE.match(f)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a dotted recipe.* or harness.* field")
        if len(set(v)) != len(v):
            raise ValueError(f"{v!r} lists a field twice")
        return v

    @model_validator(mode="after")
    def _changes_in_fields(self) -> "InterventionSpec":
        stray = sorted(set(self.changes) - set(self.fields))
        if stray:
            raise ValueError(f"changes: sets {stray}, which fields {self.fields} do not list")
        return self


class SwarmlabBlock(BaseModel):
    """Our typed part of the front matter. Every key is known; a typo is an error."""

    model_config = ConfigDict(strict=True, extra="forbid")

    version: int = Field(1, ge=1, description="bumped on every rewrite (retire, re-mine)")
    status: Literal["active", "retired"] = Field("active", description="active | retired")
    retired_reason: str | None = Field(None, description="why it was retired (required when retired)")
    diagnosis: str | None = Field(None, description="the detector finding this skill answers")
    trigger: TriggerSpec | None = Field(None, description="declarative trigger (skills/trigger.py)")
    intervention: InterventionSpec | None = Field(None, description="what it does")
    task_families: list[str] = Field(default_factory=list, description="where it was learnt ([] = any)")
    episodes: list[str] = Field(default_factory=list, description="ids of the episodes it came from")
    program: str | None = Field(None, description="program file in the skill's folder (trigger/propose)")

    @field_validator("program")
    @classmethod
    def _program(cls, v: str | None) -> str | None:
        if v is not None and not PROGRAM_RE.match(v):
            raise ValueError(f"{v!r} must be a .py file name in the skill's folder (no slashes)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "SwarmlabBlock":
        if self.status == "retired" and not self.retired_reason:
            raise ValueError("retired_reason: required when status is 'retired'")
        if self.diagnosis is not None and self.trigger is not None:
            names = self.trigger.diagnosis_names()
            if names and self.diagnosis not in names:
                raise ValueError(f"trigger.diagnosis: {names} does not include the skill's diagnosis {self.diagnosis!r}")
        return self


class Skill(BaseModel):
    """A parsed skill. Equality is content (front matter + body), not where it was read from."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    name: str = Field(description="lowercase a-z0-9 and hyphens, 1..64 chars; equals the folder name")
    description: str = Field(description="what it does and when to use it, 1..1024 chars")
    body: str = Field("", description="the markdown after the front matter")
    license: str | None = None
    compatibility: str | None = None
    meta: dict[str, str] = Field(default_factory=dict, alias="metadata", description="Agent Skills metadata map")
    allowed_tools: str | list[str] | None = Field(None, alias="allowed-tools")
    extra: dict[str, Any] = Field(default_factory=dict, description="unknown top-level keys, kept as they are")
    swarmlab: SwarmlabBlock | None = None
    path: Path | None = Field(None, exclude=True, description="the SKILL.md it was read from")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        if not v.strip() or len(v) > DESCRIPTION_MAX:
            raise ValueError(f"must be 1..{DESCRIPTION_MAX} characters (got {len(v)})")
        return v

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Skill):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    # ------------------------------------------------------------------ views
    @property
    def active(self) -> bool:
        return self.swarmlab is None or self.swarmlab.status == "active"

    @property
    def folder(self) -> Path | None:
        return self.path.parent if self.path is not None else None

    def signature(self) -> str | None:
        """diagnosis|kind|fields, as agents.domain.Intervention.signature() spells the same fix."""
        sw = self.swarmlab
        if sw is None or sw.diagnosis is None or sw.intervention is None:
            return None
        return f"{sw.diagnosis}|{sw.intervention.kind}|{','.join(sorted(sw.intervention.fields))}"

    def program_path(self) -> Path | None:
        sw = self.swarmlab
        if sw is None or sw.program is None or self.path is None:
            return None
        return self.path.parent / sw.program

    def program_source(self) -> str | None:
        p = self.program_path()
        try:
            return p.read_text("utf-8") if p is not None else None
        except (OSError, UnicodeDecodeError):
            return None

    def document(self) -> str:
        """The text a vector store embeds for retrieval."""
        lines = [f"{self.name}: {self.description}"]
        sw = self.swarmlab
        if sw is not None and sw.diagnosis:
            lines.append(f"diagnosis: {sw.diagnosis}")
        if sw is not None and sw.intervention is not None:
            iv = sw.intervention
            what = f"intervention: {iv.kind} on {', '.join(iv.fields) or 'the job'} (risk {iv.risk})"
            if iv.changes:
                what += "; sets " + ", ".join(f"{k}={v!r}" for k, v in iv.changes.items())
            lines.append(what)
        if sw is not None and sw.task_families:
            lines.append(f"learnt on: {', '.join(sw.task_families)}")
        lines.append(self.body.strip()[:DOCUMENT_BODY_CHARS])
        return "\n".join(x for x in lines if x)

    def metadata(self) -> dict[str, str | int | bool]:
        """Flat scalars for a vector store's metadata (no None: "" or 0 where absent)."""
        sw = self.swarmlab
        iv = sw.intervention if sw is not None else None
        return {
            "name": self.name,
            "status": sw.status if sw is not None else "active",
            "diagnosis": (sw.diagnosis if sw is not None else None) or "",
            "kind": iv.kind if iv is not None else "",
            "signature": self.signature() or "",
            "task_families": ",".join(sw.task_families) if sw is not None else "",
            "has_program": bool(sw is not None and sw.program),
            "version": sw.version if sw is not None else 0,
        }

    def front_matter(self) -> dict[str, Any]:
        front: dict[str, Any] = {"name": self.name, "description": self.description}
        for key, val in (("license", self.license), ("compatibility", self.compatibility),
                         ("metadata", self.meta or None), ("allowed-tools", self.allowed_tools)):
            if val is not None:
                front[key] = val
        front.update(self.extra)
        if self.swarmlab is not None:
            front["swarmlab"] = self.swarmlab.model_dump(exclude_none=True)
        return front

    def to_markdown(self) -> str:
        """SKILL.md text; parse_skill_text(to_markdown(s)) == s."""
        head = yaml.safe_dump(self.front_matter(), sort_keys=False, allow_unicode=True, width=100,
                              default_flow_style=False)
        return f"---\n{head}---\n{self.body}"

    def digest(self) -> str:
        """sha256 over the canonical SKILL.md text and the program's source (if any)."""
        h = hashlib.sha256(self.to_markdown().encode("utf-8"))
        src = self.program_source()
        if src is not None:
            h.update(b"\0program\0" + src.encode("utf-8"))
        return h.hexdigest()


# ---------------------------------------------------------------------- parsing


def _field_path(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and (p in _TYPE_PARTS or "[" in p))]
    return ".".join(parts)


def _located(err: dict[str, Any]) -> tuple[str, str]:
    """(field path, message). A model-level check names its sub-field as 'field: message'."""
    where = _field_path(err["loc"])
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    m = _SUBFIELD_RE.match(msg)
    if err.get("type") == "value_error" and m:
        return ".".join(x for x in (where, m.group(1)) if x), m.group(2)
    return where, _describe(err)


def _describe(err: dict[str, Any]) -> str:
    kind, val = err.get("type", ""), err.get("input")
    if kind == "missing":
        return "required, missing"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "literal_error":
        return f"{val!r} is not one of {err.get('ctx', {}).get('expected', '')}"
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if kind.endswith("_type") or kind in ("model_type", "dict_type", "list_type"):
        return f"{val!r} ({type(val).__name__}): {msg.lower()}"
    if isinstance(val, (dict, list)) or kind == "value_error":
        return msg
    return f"{val!r}: {msg.lower()}"


def _split_front_matter(text: str, where: Path | str | None) -> tuple[str, str]:
    text = text.removeprefix("\ufeff").replace("\r\n", "\n")
    lines = text.split("\n")
    if not lines or lines[0].rstrip() != "---":
        raise SkillError(where, "front matter", "the file must start with a '---' line (YAML front matter)")
    for i in range(1, len(lines)):
        if lines[i].rstrip() == "---":
            return "\n".join(lines[1:i]), "\n".join(lines[i + 1 :])
    raise SkillError(where, "front matter", "no closing '---' line after the YAML front matter")


def parse_skill_text(text: str, *, path: Path | str | None = None, folder: str | None = None) -> Skill:
    """Parse SKILL.md text. `folder`: the skill's folder name, which `name` must equal (if given)."""
    head, body = _split_front_matter(text, path)
    try:
        front = parse_yaml(head) if head.strip() else {}
    except yaml.YAMLError as e:
        raise SkillError(path, "front matter", f"unparsable YAML: {' '.join(str(e).split())}") from None
    if not isinstance(front, dict):
        raise SkillError(path, "front matter", f"must be a YAML mapping, got {type(front).__name__}")
    odd = [k for k in front if not isinstance(k, str)]
    if odd:
        raise SkillError(path, "front matter", f"keys must be strings, got {odd[0]!r}")
    data = {k: v for k, v in front.items() if k in _FRONT_KEYS}
    data["extra"] = {k: v for k, v in front.items() if k not in _FRONT_KEYS}
    data["body"] = body
    if path is not None:
        data["path"] = Path(path)
    try:
        skill = Skill.model_validate(data)
    except ValidationError as e:
        located = [_located(err) for err in e.errors()]
        field, msg = located[0]
        others = {f for f, _ in located} - {field}
        more = f" (also wrong: {', '.join(sorted(others))})" if others else ""
        raise SkillError(path, field or None, msg + more) from None
    if folder is not None and skill.name != folder:
        raise SkillError(path, "name", f"{skill.name!r} must equal the skill's folder name {folder!r}")
    return skill


def skill_file(path: Path | str) -> Path:
    """The SKILL.md of `path` (a skill folder or the file itself)."""
    p = Path(path)
    return p / SKILL_FILE if p.is_dir() else p


def parse_skill(path: Path | str, *, folder: str | None = None) -> Skill:
    """Parse a skill folder (or its SKILL.md). The name must equal the folder's name (or `folder`),
    and a declared program must be a regular file in the folder."""
    md = skill_file(path)
    try:
        text = md.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SkillError(md, None, f"cannot read: {e}") from None
    skill = parse_skill_text(text, path=md, folder=folder if folder is not None else md.parent.name)
    prog = skill.program_path()
    if prog is not None and (prog.is_symlink() or not prog.is_file()):
        raise SkillError(md, "swarmlab.program", f"{prog.name!r} is not a regular file in {md.parent}")
    return skill
