"""`swarm skills ...`: the skill library of a workspace (list, show, export, import), registered on
the main CLI (`swarm/cli.py`) as a sub-app."""
from __future__ import annotations

import pathlib
from typing import Optional

import typer

from sandboxes.text import clean_text
from swarm.cli_base import DEFAULT_WS, WS_HELP, err, fail, out

skills_app = typer.Typer(no_args_is_help=True, help="the skill library (skills/ in the workspace's git)")
LIB_HELP = "a shared library folder (as memory.library in the goal); default: the goal's, $SWARMLAB_LIBRARY, or the workspace's own"


def _skills_ctx(workspace: str, library: Optional[str]):
    """(Workspace, SkillLibrary of its skills/, Memory over the logs). The memory is opened with the
    in-process index (built from the logs), so a controller running on the chroma index is not disturbed."""
    import yaml

    from memory import Memory, library_root
    from skills import SkillLibrary
    from swarm.workspace import Workspace

    try:
        ws = Workspace.open(workspace)
    except ValueError as e:
        fail(str(e))
    if library is None:
        goal = ws.root / ".swarm" / "private" / "goal.yaml"
        if goal.is_file():
            library = ((yaml.safe_load(goal.read_text()) or {}).get("memory") or {}).get("library")
    return ws, SkillLibrary(ws.root / "skills"), Memory.open(library_root(ws.root, library), backend="memory")


@skills_app.command("list")
def skills_list(
    workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP),
    library: Optional[str] = typer.Option(None, help=LIB_HELP),
    all_: bool = typer.Option(False, "--all", help="retired skills too"),
) -> None:
    """Skills with their trigger, intervention and utility (retrieved, applied, wins, losses, mean effect)."""
    from skills import utility_from_episodes
    from swarm.live import fit_table

    ws, lib, mem = _skills_ctx(workspace, library)
    skills, errors = lib.load()
    util = utility_from_episodes(mem.episodes(), mem.retrievals())
    rows = []
    for sk in skills:
        if not sk.active and not all_:
            continue
        sw, u = sk.swarmlab, util.get(sk.name)
        iv = sw.intervention if sw is not None else None
        rows.append([sk.name, "active" if sk.active else "retired", str(sw.version if sw else "-"), (sw and sw.diagnosis) or "-",
                  f"{iv.kind} {','.join(iv.fields)}" if iv is not None else "-",
                  *(str(getattr(u, k)) if u is not None else "0" for k in ("retrieved", "applied", "wins", "losses")),
                  f"{u.mean_effect:+.3f}" if u is not None and u.mean_effect is not None else "-"])
        rows[-1] = [clean_text(c, newlines=False) for c in rows[-1]]   # names and text from others' libraries
    out.print(fit_table(out, ["name", "status", "v", "diagnosis", "intervention", "retrieved", "applied", "wins", "losses",
                              "mean effect"], rows, keep=("name",)))
    for e in errors:
        from rich.markup import escape

        err.print(f"[yellow]skipped:[/] {escape(clean_text(e, newlines=False))}", highlight=False, soft_wrap=True)
    mem.close()


def _skills_root(workspace: str) -> pathlib.Path:
    """WORKSPACE/skills, which must exist: reading a library never creates one."""
    root = pathlib.Path(workspace) / "skills"
    if not root.is_dir():
        fail(f"no skills folder in workspace {workspace!r} ({str(root)!r} not found)")
    return root


@skills_app.command("show")
def skills_show(name: str = typer.Argument(..., help="skill name"), workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP)) -> None:
    """Print a skill's SKILL.md."""
    from skills import SkillLibrary

    try:
        sk = SkillLibrary(_skills_root(workspace)).get(name)
    except ValueError as e:   # a SKILL.md that does not parse
        fail(str(e))
    if sk is None:
        fail(f"no skill {name!r} in {workspace}/skills (see `swarm skills list --all`)")
    out.print(clean_text(sk.to_markdown()), markup=False, highlight=False)


@skills_app.command("export")
def skills_export(
    pack: str = typer.Argument(..., help="the .tar.gz to write"),
    workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP),
    name: Optional[list[str]] = typer.Option(None, help="only these skills (repeatable)"),
) -> None:
    """Write a skill pack (one folder per skill + manifest.json) for another workspace."""
    from skills import SkillLibrary

    try:
        path = SkillLibrary(_skills_root(workspace)).export_pack(pathlib.Path(pack), names=name or None)
    except KeyError as e:
        fail(str(e.args[0]))
    except (ValueError, OSError) as e:
        fail(str(e))
    out.print(f"wrote {path}")


@skills_app.command("import")
def skills_import(
    pack: str = typer.Argument(..., help="a skill pack (.tar.gz) or a folder of skill folders"),
    workspace: str = typer.Option(DEFAULT_WS, help=WS_HELP),
    replace: bool = typer.Option(False, help="replace skills of the same name"),
) -> None:
    """Import skills into the workspace: every skill is validated first (nothing is written if one
    is malformed or the archive is unsafe), then each new or replaced skill lands as a merged PR."""
    import tempfile

    from skills import SkillLibrary
    from swarm.knowledge import skill_files
    from swarm.workspace import Workspace

    try:
        ws = Workspace.open(workspace)
    except ValueError as e:
        fail(str(e))
    current = SkillLibrary(ws.root / "skills")
    with tempfile.TemporaryDirectory() as d:
        staged = SkillLibrary(pathlib.Path(d) / "skills")
        try:
            for sk in current.load()[0]:
                staged.write(sk, sk.program_source())
            result = staged.import_pack(pathlib.Path(pack), replace=replace)
        except (ValueError, OSError) as e:
            fail(str(e))
        bad = {k: v for k, v in result.items() if v.startswith("rejected")}
        if bad:
            fail("; ".join(f"{k}: {v}" for k, v in bad.items()))
        for nm, what in result.items():
            if what in ("added", "replaced"):
                sk = staged.get(nm)
                version = sk.swarmlab.version if sk.swarmlab is not None else 1
                ws.skill_pr(nm, version, skill_files(sk), f"Skill {nm} v{version}: imported from {pathlib.Path(pack).name}",
                            replace=True)    # the imported folder, whole: files the old version had go
            out.print(f"{nm}: {what}")
