"""Build the Docker sandbox's base image locally: no registry is needed (or reachable here).

Recipe (`ImageRecipe`): `debootstrap --variant=minbase --include=python3 bookworm ROOTFS [MIRROR]`,
apt's package cache and lists removed, then `tar -C ROOTFS -c . | docker import` with the recipe
recorded in the image's labels (`org.swarmlab.sandbox.recipe`, `...recipe-digest`). An image of the
same name whose digest label matches the recipe is reused; `force=True` rebuilds. The root
filesystem tarball can be cached by recipe digest (`cache_dir`), so a fresh engine (CI starts one
per run) imports it in seconds instead of bootstrapping again. On a cluster with a registry, point
`DockerSandbox(image=...)` at any image that has `python3` and skip this.

Needs root (debootstrap), `debootstrap` and `tar`, and a reachable Debian mirror: by default the
one this host's apt sources use for the suite, else debootstrap's own default.

    python -m sandboxes.image            # build (or reuse) the default image, print what it did
    from sandboxes.image import build_base_image
    info = build_base_image()            # ImageInfo(name='swarmlab-sandbox:bookworm', built=..., ...)
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from sandboxes.base import DEFAULT_IMAGE, ImageBuildError, SandboxUnavailable

log = logging.getLogger(__name__)

LABEL_RECIPE = "org.swarmlab.sandbox.recipe"
LABEL_DIGEST = "org.swarmlab.sandbox.recipe-digest"


@dataclasses.dataclass(frozen=True)
class ImageRecipe:
    """How the base image is made. `mirror` None: the host's apt source for `suite`, if any, else
    debootstrap's default."""

    suite: str = "bookworm"
    variant: str = "minbase"
    include: tuple[str, ...] = ("python3",)
    mirror: str | None = None
    trim: bool = True  # drop apt's package cache and lists (~90 MB) from the image

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9.-]*", self.suite):
            raise ValueError(f"recipe.suite={self.suite!r} is not a Debian suite name")
        if self.variant not in ("minbase", "buildd", "fakechroot", "-"):
            raise ValueError(f"recipe.variant={self.variant!r} must be minbase, buildd, fakechroot or -")
        object.__setattr__(self, "include", tuple(self.include))
        for pkg in self.include:
            if not pkg or not all(c.isalnum() or c in "+-." for c in pkg):
                raise ValueError(f"recipe.include has an invalid package name {pkg!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "variant": self.variant, "include": list(self.include), "mirror": self.mirror,
                "trim": self.trim}

    @property
    def digest(self) -> str:
        # The mirror does not change what is built, only where it comes from.
        key = {k: v for k, v in self.to_dict().items() if k != "mirror"}
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def debootstrap_argv(self, rootfs: str, mirror: str | None) -> list[str]:
        argv = ["debootstrap", f"--variant={self.variant}"]
        if self.include:
            argv.append("--include=" + ",".join(self.include))
        argv += [self.suite, rootfs]
        if mirror:
            argv.append(mirror)
        return argv


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    name: str
    id: str
    recipe: ImageRecipe
    built: bool        # False: an image with this recipe already existed and was reused
    seconds: float     # time this call took
    from_cache: bool = False  # the rootfs came from the tarball cache (no debootstrap)


def host_debian_mirror(suite: str, root: str = "/etc/apt") -> str | None:
    """The URI this host's apt sources use for `suite`, or None (deb822 and one-line formats)."""
    paths = sorted(glob.glob(os.path.join(root, "sources.list.d", "*.sources")))
    for path in paths:
        try:
            text = pathlib.Path(path).read_text()
        except OSError:
            continue
        for stanza in text.split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    k, _, v = line.partition(":")
                    fields[k.strip().lower()] = v.strip()
            if suite in fields.get("suites", "").split() and "deb" in fields.get("types", "").split():
                uris = fields.get("uris", "").split()
                if uris and fields.get("enabled", "yes").lower() != "no":
                    return uris[0]
    lists = [os.path.join(root, "sources.list"), *sorted(glob.glob(os.path.join(root, "sources.list.d", "*.list")))]
    for path in lists:
        try:
            lines = pathlib.Path(path).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split("#", 1)[0].split()
            if len(parts) >= 3 and parts[0] == "deb":
                rest = [p for p in parts[1:] if not p.startswith("[")]
                if len(rest) >= 2 and rest[1] == suite:
                    return rest[0]
    return None


def _client(client: Any = None) -> Any:
    if client is not None:
        return client
    try:
        import docker

        c = docker.from_env(timeout=300)
        c.ping()
        return c
    except Exception as e:
        raise SandboxUnavailable(f"no Docker engine answers: {e}") from None


def find_image(name: str, client: Any = None) -> dict[str, Any] | None:
    """The image's inspect data, or None when the engine has no image of that name."""
    import docker

    c = _client(client)
    try:
        return c.api.inspect_image(name)
    except docker.errors.ImageNotFound:
        return None


def _debootstrap(recipe: ImageRecipe, rootfs: str) -> None:
    if os.geteuid() != 0:
        raise ImageBuildError("debootstrap needs root; run the build as root (CI: scripts/ci_sandbox.sh start)")
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed (Debian package: debootstrap)")
    mirror = recipe.mirror or host_debian_mirror(recipe.suite)
    argv = recipe.debootstrap_argv(rootfs, mirror)
    log.info("building sandbox rootfs: %s", " ".join(argv))
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        tail = (p.stdout + p.stderr).strip().splitlines()[-5:]
        raise ImageBuildError(f"{' '.join(argv)} failed with status {p.returncode}: {' | '.join(tail)}")


def _trim(rootfs: str) -> None:
    """Remove downloaded packages and package lists: the sandbox never runs apt."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*"):
        for path in glob.glob(os.path.join(rootfs, pattern)):
            if os.path.isfile(path) and not os.path.islink(path) and not path.endswith("/lock"):
                os.unlink(path)


def _tar(rootfs: str, out: str) -> None:
    p = subprocess.run(["tar", "--numeric-owner", "-C", rootfs, "-cf", out, "."], capture_output=True, text=True)
    if p.returncode != 0:
        raise ImageBuildError(f"tar of the rootfs failed: {p.stderr.strip()[-500:]}")


def build_base_image(name: str = DEFAULT_IMAGE, recipe: ImageRecipe | None = None, *, force: bool = False,
                     cache_dir: str | os.PathLike | None = None, client: Any = None) -> ImageInfo:
    """Build the sandbox base image `name` from `recipe` (defaults: bookworm minbase + python3), or
    reuse an existing image whose recipe-digest label matches. `cache_dir`: keep the rootfs
    tarball there keyed by recipe digest and import from it when present. `client`: a
    `docker.DockerClient` (default: from the environment).

    Raises `SandboxUnavailable` when no engine answers and `ImageBuildError` when a step fails."""
    recipe = recipe or ImageRecipe()
    t0 = time.monotonic()
    c = _client(client)
    existing = find_image(name, c)
    labels = ((existing or {}).get("Config") or {}).get("Labels") or {}
    if existing and not force and labels.get(LABEL_DIGEST) == recipe.digest:
        log.info("sandbox image %s exists (recipe %s); not rebuilding", name, recipe.digest)
        return ImageInfo(name, existing["Id"], recipe, built=False, seconds=time.monotonic() - t0)
    repo, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "latest")
    cached = pathlib.Path(cache_dir) / f"rootfs-{recipe.digest}.tar" if cache_dir else None
    with tempfile.TemporaryDirectory(prefix="swarm-image-") as work:
        if cached is not None and cached.is_file():
            tarball, from_cache = str(cached), True
        else:
            rootfs = os.path.join(work, "rootfs")
            _debootstrap(recipe, rootfs)
            if recipe.trim:
                _trim(rootfs)
            tarball, from_cache = os.path.join(work, "rootfs.tar"), False
            _tar(rootfs, tarball)
            shutil.rmtree(rootfs, ignore_errors=True)
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                tmp = cached.with_suffix(".tar.partial")
                shutil.copyfile(tarball, tmp)
                os.replace(tmp, cached)
        changes = [
            f"LABEL {LABEL_RECIPE}={json.dumps(json.dumps(recipe.to_dict()))}",
            f"LABEL {LABEL_DIGEST}={recipe.digest}",
            "ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8",
            'CMD ["python3"]',
        ]
        try:
            with open(tarball, "rb") as f:
                c.api.import_image(src=f, repository=repo, tag=tag, changes=changes)
        except Exception as e:
            raise ImageBuildError(f"docker import of {name} failed: {e}") from None
    info = find_image(name, c)
    if info is None:
        raise ImageBuildError(f"docker import reported success but {name} is not in the engine")
    log.info("built sandbox image %s (%s) in %.1fs", name, info["Id"][:19], time.monotonic() - t0)
    return ImageInfo(name, info["Id"], recipe, built=True, seconds=time.monotonic() - t0, from_cache=from_cache)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build (or reuse) the Docker sandbox base image.")
    ap.add_argument("--name", default=DEFAULT_IMAGE)
    ap.add_argument("--suite", default=ImageRecipe.suite)
    ap.add_argument("--include", default=",".join(ImageRecipe().include), help="comma-separated packages")
    ap.add_argument("--mirror", default=None)
    ap.add_argument("--cache-dir", default=None, help="keep/reuse the rootfs tarball here")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        recipe = ImageRecipe(suite=args.suite, include=tuple(p for p in args.include.split(",") if p),
                             mirror=args.mirror)
        info = build_base_image(args.name, recipe, force=args.force, cache_dir=args.cache_dir)
    except (ValueError, ImageBuildError, SandboxUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"name": info.name, "id": info.id, "built": info.built, "from_cache": info.from_cache,
                      "seconds": round(info.seconds, 1), "recipe": info.recipe.to_dict(),
                      "digest": info.recipe.digest}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
