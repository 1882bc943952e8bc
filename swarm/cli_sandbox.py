"""`swarm sandbox ...`: build the sandbox image, say which sandbox backends run here; registered on
the main CLI (`swarm/cli.py`) as a sub-app."""
from __future__ import annotations

import pathlib
from typing import Optional

import typer

from sandboxes.text import clean_text
from swarm.cli_base import fail, out

sandbox_app = typer.Typer(no_args_is_help=True, help="sandboxes for untrusted code")


@sandbox_app.command("build-image")
def sandbox_build_image(
    name: str = typer.Option("swarmlab-sandbox:bookworm", help="image name:tag"),
    force: bool = typer.Option(False, help="rebuild even if an image with the same recipe exists"),
    cache_dir: str = typer.Option(str(pathlib.Path.home() / ".cache" / "swarmlab" / "sandbox"),
                                  help="where the debootstrapped rootfs tarball is cached"),
    suite: str = typer.Option("bookworm", help="Debian suite of the rootfs"),
    include: str = typer.Option("python3", help="comma-separated Debian packages to include"),
    mirror: Optional[str] = typer.Option(None, help="Debian mirror URL (default: the host's apt source)"),
) -> None:
    """Build the Docker sandbox's base image locally (debootstrap + docker import; nothing is pulled).
    Clusters with a registry can instead point the Docker backend at any image with python3."""
    from sandboxes.base import SandboxError
    from sandboxes.image import ImageRecipe, build_base_image

    try:
        recipe = ImageRecipe(suite=suite, include=tuple(x for x in include.split(",") if x), mirror=mirror)
    except (ValueError, TypeError) as e:
        fail(f"invalid image recipe: {e}")
    try:
        info = build_base_image(name, recipe, force=force, cache_dir=cache_dir)
    except SandboxError as e:
        fail(str(e), code=1)
    what = "built" if info.built else "already present"
    out.print(f"{info.name} ({info.id[:19]}) {what} in {info.seconds:.1f}s")


@sandbox_app.command("status")
def sandbox_status() -> None:
    """Which sandbox backends can run here."""
    from sandboxes.docker_backend import docker_status

    from sandboxes import SandboxUnavailable
    from sandboxes.local import LocalSandbox

    ok, why = docker_status()
    out.print(f"docker: {'available' if ok else 'unavailable'} ({why})", markup=False, highlight=False)
    for kind in ("bwrap", "unshare"):
        try:
            LocalSandbox(isolation=kind)
            out.print(f"{kind}: available", markup=False, highlight=False)
        except SandboxUnavailable as e:
            out.print(f"{kind}: unavailable ({clean_text(e, newlines=False)})", markup=False, highlight=False)
