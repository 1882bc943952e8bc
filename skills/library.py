"""A folder of skill folders: load, write, retire, rank, and move skills between swarms as packs.

    lib = SkillLibrary(workspace / "skills")
    skills, errors = lib.load()                   # a broken SKILL.md is reported, never blocks the rest
    lib.write(skill, program=src)                 # <root>/<name>/: SKILL.md, program and every other file, atomically
    files = skill_tree(lib.root / "restart-crashed-job")   # {"SKILL.md": b"...", "scripts/x.py": b"..."}
    lib.retire("old-fix", "lost 3 backtests")     # status retired, version + 1; the file stays
    ranked = lib.rank(hits, utility_from_episodes(episodes, retrievals))
    lib.export_pack(Path("pack.tar.gz")); other.import_pack(Path("pack.tar.gz"))

Ranking multiplies retrieval similarity (1 - cosine distance, from the vector memory) by a
utility weight measured from episodes: a Laplace-smoothed win rate scaled so an untried skill
weighs 1.0, a skill that keeps winning approaches 2 and one that keeps losing approaches 0.

A skill is its whole folder: SKILL.md, its program, and whatever else a skill written by another
tool ships (scripts/, references/, assets/, LICENSE.txt, which its `license:` may point at).
Every file travels with the skill through write, export, import and `skill_tree` (what callers
commit to git or copy to a shared library), under the same checks: regular files and folders
only (no links, devices or fifos), no absolute paths, `..` or `.git`, at most PACK_MAX_DEPTH
levels, SKILL_MAX_FILES files, PACK_MAX_FILE bytes a file and PACK_MAX_TOTAL in all.

Writes go to a temp folder inside the root, are re-parsed there, and only then swapped in, so a
reader never sees a half-written skill and a bad skill never replaces a good one. Packs are
read member by member (never `extractall`): a member that breaks a rule rejects the whole
archive before anything is written, and the manifest's per-file digests reject a skill whose
files were altered after export. The root lives in the workspace's git repo; callers commit.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import tarfile
import tempfile
import uuid
import zlib
from importlib import metadata as importlib_metadata
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

from pydantic import BaseModel

from sandboxes.errors import SwarmlabError
from skills.skill import SKILL_FILE, Skill, SkillError, SwarmlabBlock, check_name, parse_skill

MANIFEST = "manifest.json"
PACK_FORMAT = "swarmlab-skill-pack"
PACK_FORMAT_VERSION = 1
PACK_MAX_FILE = 1 << 20          # bytes per file in a pack
PACK_MAX_TOTAL = 32 << 20        # bytes in all
PACK_MAX_DEPTH = 4               # <skill>/<dir>/<dir>/<file>
SKILL_MAX_FILES = 256            # files in one skill folder
PACK_MAX_MEMBERS = 4096          # files and folders in one pack


class SkillPackError(SwarmlabError, ValueError):
    """A pack that cannot be imported at all (unsafe or unreadable archive); nothing was written."""


class Utility(BaseModel):
    """How a skill did in the episodes that used it."""

    retrieved: int = 0
    applied: int = 0
    wins: int = 0
    losses: int = 0
    mean_effect: float | None = None

    def weight(self) -> float:
        """Ranking multiplier: 2 × Laplace-smoothed win rate (1.0 untried, → 2 winning, → 0 losing)."""
        return (self.wins + 1) / (self.wins + self.losses + 2) * 2


def utility_from_episodes(episodes: Iterable[Any], retrievals: dict[str, int]) -> dict[str, Utility]:
    """Per skill name: retrievals (from the caller's counts), episodes that used it, wins, losses
    and the mean of their finite effects. Episodes are duck-typed: `skills_used`, `won()`,
    `lost()`, `effect`."""
    out: dict[str, Utility] = {name: Utility(retrieved=int(n)) for name, n in retrievals.items()}
    effects: dict[str, list[float]] = {}
    for ep in episodes:
        won, lost = bool(ep.won()), bool(ep.lost())
        eff = getattr(ep, "effect", None)
        for name in dict.fromkeys(getattr(ep, "skills_used", None) or []):
            u = out.setdefault(name, Utility())
            u.applied += 1
            u.wins += won
            u.losses += lost and not won
            if isinstance(eff, (int, float)) and not isinstance(eff, bool) and math.isfinite(eff):
                effects.setdefault(name, []).append(float(eff))
    for name, vals in effects.items():
        out[name].mean_effect = sum(vals) / len(vals)
    return out


def seed_dir() -> Path:
    """The seed library shipped with swarmlab (hand-written skills for the common pathologies)."""
    return Path(__file__).resolve().parent / "seed"


def swarmlab_version() -> str:
    try:
        return importlib_metadata.version("swarmlab")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def is_skill_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and not p.name.startswith(".") and (p / SKILL_FILE).exists()


def _check_tree(folder: Path) -> list[str]:
    """The folder's files (posix paths relative to it, sorted) if it is regular files and folders
    only (no links, devices, fifos, no `.git`), within the depth, count and size limits."""
    total, files = 0, []
    if folder.is_symlink():
        raise SkillPackError(f"{folder}: links are not allowed in a skill")
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            rel = p.relative_to(folder)
            if p.is_symlink():
                raise SkillPackError(f"{folder.name}/{rel}: links are not allowed in a skill")
            if n in filenames and not p.is_file():
                raise SkillPackError(f"{folder.name}/{rel}: only regular files are allowed in a skill")
            if n.lower() == ".git" or "\\" in n or "\0" in n:
                raise SkillPackError(f"{folder.name}/{rel}: not a name a skill's file may have")
            if len(rel.parts) >= PACK_MAX_DEPTH:
                raise SkillPackError(f"{folder.name}/{rel}: nested deeper than {PACK_MAX_DEPTH} levels")
            if n in filenames:
                files.append(rel.as_posix())
                if len(files) > SKILL_MAX_FILES:
                    raise SkillPackError(f"{folder.name}: more than {SKILL_MAX_FILES} files")
                size = p.stat().st_size
                total += size
                if size > PACK_MAX_FILE or total > PACK_MAX_TOTAL:
                    raise SkillPackError(f"{folder.name}/{rel}: larger than the pack limits")
    return sorted(files)


def skill_tree(folder: Path | str) -> dict[str, bytes]:
    """Every file of a skill folder, {relative posix path: content}, checked as a pack member is
    (SkillPackError otherwise): what goes into git or a shared library for that skill."""
    folder = Path(folder)
    return {rel: (folder / rel).read_bytes() for rel in _check_tree(folder)}


def _file_digests(folder: Path) -> dict[str, str]:
    return {rel: hashlib.sha256(data).hexdigest() for rel, data in skill_tree(folder).items()}


class SkillLibrary:
    """Skills under `root`, one folder each, named after the skill."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ reading
    def folders(self) -> list[Path]:
        return sorted(p for p in self.root.iterdir() if is_skill_dir(p))

    def load(self) -> tuple[list[Skill], list[SkillError]]:
        """Every skill that parses (sorted by name), and an error for each that does not."""
        skills: list[Skill] = []
        errors: list[SkillError] = []
        for folder in self.folders():
            try:
                skills.append(parse_skill(folder))
            except SkillError as e:
                errors.append(e)
        return sorted(skills, key=lambda s: s.name), errors

    def get(self, name: str) -> Skill | None:
        """The skill called `name`, None if there is none; SkillError if its file is broken."""
        try:
            check_name(name)
        except ValueError:
            return None
        folder = self.root / name
        return parse_skill(folder) if is_skill_dir(folder) else None

    # ------------------------------------------------------------------ writing
    def _swap_in(self, staged: Path, name: str) -> Path:
        """Replace <root>/<name> by the staged folder (two renames; a crash between them leaves
        a hidden .old-* folder, which load() ignores)."""
        dest = self.root / name
        old = None
        if dest.exists() or dest.is_symlink():
            old = self.root / f".old-{name}-{uuid.uuid4().hex[:8]}"
            os.rename(dest, old)
        os.rename(staged, dest)
        if old is not None:
            if old.is_symlink() or old.is_file():
                old.unlink()
            else:
                shutil.rmtree(old)
        return dest

    def _stage(self) -> Path:
        return Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))

    def write(self, skill: Skill, program: str | None = None) -> Path:
        """Write `skill` (and its program) to <root>/<name>/. The folder's other files (and the
        program, when `program` is None) are those of the skill's own folder when it was read from
        one (`skill.path`), else those already at <root>/<name>/: a skill copied from another
        library arrives whole, one built in memory keeps what the folder holds. Validated by
        re-parsing first."""
        check_name(skill.name)
        sw = skill.swarmlab
        if program is not None:
            if sw is None:
                raise SkillError(skill.path, "swarmlab.program", "a program needs a swarmlab block (trigger, intervention)")
            if sw.program is None:
                skill = skill.model_copy(update={"swarmlab": sw.model_copy(update={"program": "skill.py"})})
                sw = skill.swarmlab
        staged = self._stage()
        try:
            current = self.root / skill.name
            own = skill.folder if skill.folder is not None and is_skill_dir(skill.folder) else None
            source = own if own is not None else (current if is_skill_dir(current) else None)
            if source is not None and source.resolve() != staged.resolve():
                _check_tree(source)
                shutil.rmtree(staged)
                shutil.copytree(source, staged, symlinks=True)
            (staged / SKILL_FILE).write_text(skill.to_markdown(), encoding="utf-8")
            if program is not None:
                assert sw is not None and sw.program is not None, "set above"
                (staged / sw.program).write_text(program, encoding="utf-8")
            parse_skill(staged, folder=skill.name)      # what is on disk must load before it goes live
            return self._swap_in(staged, skill.name)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise

    def retire(self, name: str, reason: str) -> Skill:
        """Mark `name` retired with `reason` (version + 1); the folder stays, rank() skips it."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"retire({name!r}): reason={reason!r} must be a non-empty string")
        skill = self.get(name)
        if skill is None:
            raise KeyError(f"no skill {name!r} in {self.root}")
        sw = skill.swarmlab or SwarmlabBlock()
        sw = sw.model_copy(update={"status": "retired", "retired_reason": reason, "version": sw.version + 1})
        self.write(skill.model_copy(update={"swarmlab": SwarmlabBlock.model_validate(sw.model_dump())}))
        out = self.get(name)
        assert out is not None, "just written"
        return out

    # ------------------------------------------------------------------ ranking
    def rank(self, hits: list[tuple[str, float]], utility: dict[str, Utility],
             n: int = 5) -> list[tuple[Skill, float]]:
        """Skills for retrieval hits (name, cosine distance), scored (1 - distance) × utility
        weight, best first; retired, missing and broken skills are left out."""
        best: dict[str, float] = {}
        for name, dist in hits:
            if isinstance(dist, (int, float)) and math.isfinite(dist):
                best[name] = min(dist, best.get(name, math.inf))
        scored: list[tuple[Skill, float]] = []
        for name, dist in best.items():
            try:
                skill = self.get(name)
            except SkillError:
                continue
            if skill is None or not skill.active:
                continue
            scored.append((skill, (1.0 - dist) * utility.get(name, Utility()).weight()))
        scored.sort(key=lambda x: (-x[1], x[0].name))
        return scored[:n]

    # ------------------------------------------------------------------ packs
    def export_pack(self, dest: Path | str, names: list[str] | None = None) -> Path:
        """A .tar.gz of the named skills (default: every one that loads), one folder each, plus
        manifest.json (names, digests, swarmlab version). `dest`: the file, or a folder for
        skills-pack.tar.gz."""
        dest = Path(dest)
        if dest.is_dir():
            dest = dest / "skills-pack.tar.gz"
        if names is None:
            skills, _ = self.load()
        else:
            skills = []
            for name in names:
                sk = self.get(name)
                if sk is None:
                    raise KeyError(f"no skill {name!r} in {self.root}")
                skills.append(sk)
        manifest = {"format": PACK_FORMAT, "format_version": PACK_FORMAT_VERSION,
                    "swarmlab_version": swarmlab_version(),
                    "skills": [{"name": s.name, "digest": s.digest(),
                                "version": s.swarmlab.version if s.swarmlab else None,
                                "status": "active" if s.active else "retired",
                                "files": _file_digests(self.root / s.name)} for s in skills]}
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with tarfile.open(tmp, "w:gz") as tar:
                data = (json.dumps(manifest, indent=2) + "\n").encode()
                info = tarfile.TarInfo(MANIFEST)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
                for s in skills:
                    folder = self.root / s.name
                    _check_tree(folder)
                    for p in sorted(folder.rglob("*")):
                        arc = f"{s.name}/{p.relative_to(folder).as_posix()}"
                        info = tar.gettarinfo(str(p), arcname=arc)
                        info.uid = info.gid = 0
                        info.uname = info.gname = ""
                        if p.is_file():
                            with open(p, "rb") as f:
                                tar.addfile(info, f)
                        else:
                            tar.addfile(info)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    def import_pack(self, src: Path | str, replace: bool = False) -> dict[str, str]:
        """Import skills from a pack (.tar.gz) or a folder of skill folders. Per skill: "added",
        "replaced", "skipped (exists)" or "rejected: <error>". Every skill is validated before
        any is written; an unsafe archive raises SkillPackError and writes nothing."""
        src = Path(src)
        with tempfile.TemporaryDirectory(prefix=".import-", dir=self.root) as tmp:
            work = Path(tmp)
            if src.is_dir():
                tree = src
                for p in sorted(tree.iterdir()):
                    if p.is_symlink():
                        raise SkillPackError(f"{p}: links are not allowed in a skill pack")
                    if is_skill_dir(p):
                        _check_tree(p)
            else:
                tree = work / "pack"
                _safe_extract(src, tree)
            manifest = _read_manifest(tree)
            digests = {e.get("name"): e.get("digest") for e in manifest.get("skills", []) if isinstance(e, dict)}
            listed = {e.get("name"): e.get("files") for e in manifest.get("skills", []) if isinstance(e, dict)}
            results: dict[str, str] = {}
            ready: list[tuple[str, Path]] = []
            for folder in sorted(p for p in tree.iterdir() if is_skill_dir(p)):
                name = folder.name
                try:
                    check_name(name)
                    skill = parse_skill(folder)
                except (SkillError, ValueError) as e:
                    results[name] = f"rejected: {e}"
                    continue
                want = digests.get(name)
                if want is not None and want != skill.digest():
                    results[name] = "rejected: digest differs from the manifest's (altered after export)"
                    continue
                files = listed.get(name)
                if isinstance(files, dict):
                    have = _file_digests(folder)
                    odd = sorted(set(have) ^ set(files)) or sorted(k for k in have if have[k] != files[k])
                    if odd:
                        results[name] = (f"rejected: file {odd[0]!r} differs from the manifest's list "
                                         "(altered, added or removed after export)")
                        continue
                ready.append((name, folder))
            for name, folder in ready:
                exists = is_skill_dir(self.root / name)
                if exists and not replace:
                    results[name] = "skipped (exists)"
                    continue
                staged = self._stage()
                shutil.rmtree(staged)
                shutil.copytree(folder, staged, symlinks=True)
                try:
                    parse_skill(staged, folder=name)
                    self._swap_in(staged, name)
                except BaseException:
                    shutil.rmtree(staged, ignore_errors=True)
                    raise
                results[name] = "replaced" if exists else "added"
        return dict(sorted(results.items()))


def _read_manifest(tree: Path) -> dict[str, Any]:
    p = tree / MANIFEST
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise SkillPackError(f"{MANIFEST}: unreadable ({e})") from None
    if not isinstance(data, dict) or data.get("format", PACK_FORMAT) != PACK_FORMAT:
        raise SkillPackError(f"{MANIFEST}: not a {PACK_FORMAT} manifest")
    return data


def _safe_extract(archive: Path, dest: Path) -> None:
    """Extract regular files and folders of `archive` into `dest`, checking every member first."""
    try:
        tar = tarfile.open(archive, "r:*")
    except (OSError, tarfile.TarError) as e:
        raise SkillPackError(f"{archive}: not a readable tar archive ({e})") from None
    with tar:
        try:
            members = tar.getmembers()
        except (OSError, tarfile.TarError, EOFError) as e:
            raise SkillPackError(f"{archive}: corrupt archive ({e})") from None
        if len(members) > PACK_MAX_MEMBERS:
            raise SkillPackError(f"{archive}: more than {PACK_MAX_MEMBERS} members")
        total = 0
        seen: set[tuple[str, ...]] = set()
        per_skill: dict[str, int] = {}
        for m in members:
            name = m.name
            parts = PurePosixPath(name).parts
            if not name or name.startswith("/") or "\\" in name or "\0" in name or ".." in parts or (parts and ":" in parts[0]):
                raise SkillPackError(f"{archive}: unsafe member path {name!r} (absolute or escaping)")
            if any(p.lower() == ".git" for p in parts):
                raise SkillPackError(f"{archive}: member {name!r}: a .git path is not allowed in a skill")
            if m.isfile() and len(parts) > 1:
                per_skill[parts[0]] = per_skill.get(parts[0], 0) + 1
                if per_skill[parts[0]] > SKILL_MAX_FILES:
                    raise SkillPackError(f"{archive}: skill {parts[0]!r} has more than {SKILL_MAX_FILES} files")
            if not (m.isfile() or m.isdir()):
                raise SkillPackError(f"{archive}: member {name!r} is a link or special file; only files and folders are allowed")
            if len(parts) > PACK_MAX_DEPTH:
                raise SkillPackError(f"{archive}: member {name!r} nested deeper than {PACK_MAX_DEPTH} levels")
            if len(parts) == 1 and m.isfile() and name != MANIFEST:
                raise SkillPackError(f"{archive}: stray top-level file {name!r}")
            key = PurePosixPath(name).parts
            if key in seen:
                raise SkillPackError(f"{archive}: member {name!r} appears twice")
            seen.add(key)
            total += m.size
            if m.size > PACK_MAX_FILE or total > PACK_MAX_TOTAL:
                raise SkillPackError(f"{archive}: member {name!r} is past the pack size limits")
        files = {PurePosixPath(m.name).parts for m in members if m.isfile()}
        clash = next((m.name for m in members if any(PurePosixPath(m.name).parts[:i] in files
                                                     for i in range(1, len(PurePosixPath(m.name).parts)))), None)
        if clash is not None:
            raise SkillPackError(f"{archive}: member {clash!r} lies under a member that is a file")
        dest.mkdir(parents=True)
        try:
            for m in members:
                target = dest.joinpath(*PurePosixPath(m.name).parts)
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                f = tar.extractfile(m)
                assert f is not None, "checked: a regular file"
                with f, open(target, "xb") as out:
                    shutil.copyfileobj(f, out)
        except (OSError, tarfile.TarError, EOFError, zlib.error) as e:
            raise SkillPackError(f"{archive}: extracting failed ({e})") from None
