"""Choose and build a sandbox backend from config.

`kind`: "docker", "local", or "auto" (the default): Docker when an engine answers and has the
image, else local (bubblewrap, else util-linux `unshare` namespaces). Where none of them works the
sandbox is refused (`SandboxUnavailable` naming each backend tried and why it failed) unless the
caller allows the plain subprocess (`allow_plain=True`, or the process's opt-in from a goal's
`sandbox: unsafe_plain`; see `sandboxes.base.plain_opted_in`). The choice and its reason are
logged, and `describe()` on the sandbox gives the resolved configuration for the run log.

    from sandboxes import SandboxConfig, make_sandbox
    sb = make_sandbox("auto", limits=Limits(wall_seconds=5))
    sb = SandboxConfig.from_dict({"kind": "local", "isolation": "bwrap"}).build()
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Literal

from sandboxes.base import DEFAULT_IMAGE, Limits, Sandbox, SandboxUnavailable

log = logging.getLogger(__name__)

SandboxKind = Literal["auto", "docker", "local"]
KINDS = ("auto", "docker", "local")
LocalIsolation = Literal["auto", "bwrap", "unshare", "plain"]
ISOLATIONS = ("auto", "bwrap", "unshare", "plain")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    kind: SandboxKind = "auto"             # docker | local | auto (docker if an engine answers, else local)
    limits: Limits = dataclasses.field(default_factory=Limits)  # default limits of every run
    image: str = DEFAULT_IMAGE             # docker: the image (built by sandboxes.image.build_base_image)
    docker_base_url: str | None = None     # docker: engine address; None = DOCKER_HOST or the default socket
    isolation: LocalIsolation = "auto"     # local: bwrap / unshare required, plain forced, auto (bwrap, then unshare)
    python: str | None = None              # local: interpreter path (None: the system python3)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"sandbox.kind={self.kind!r} must be one of {', '.join(KINDS)}")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"sandbox.isolation={self.isolation!r} must be one of {', '.join(ISOLATIONS)}")
        if isinstance(self.limits, dict):
            object.__setattr__(self, "limits", Limits(**self.limits))
        if not isinstance(self.limits, Limits):
            raise ValueError(f"sandbox.limits={self.limits!r} must be a Limits or a dict of its fields")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SandboxConfig":
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"sandbox config: unknown fields {sorted(unknown)}")
        return cls(**data)

    def build(self) -> Sandbox:
        return make_sandbox(self.kind, limits=self.limits, image=self.image, docker_base_url=self.docker_base_url,
                            isolation=self.isolation, python=self.python)


def make_sandbox(kind: SandboxKind = "auto", *, limits: Limits | None = None, image: str = DEFAULT_IMAGE,
                 docker_base_url: str | None = None, isolation: LocalIsolation = "auto",
                 python: str | None = None, allow_plain: bool | None = None) -> Sandbox:
    """Build the sandbox `kind` names. "docker" raises `SandboxUnavailable` (saying why) when no
    engine answers or the image is missing; "local" when the isolation asked for does not work
    (for "auto": neither bubblewrap nor unshare, and plain not allowed); "auto" likewise, naming
    Docker's reason too. `allow_plain` None: the process's opt-in (`plain_opted_in`)."""
    if kind not in KINDS:
        raise ValueError(f"sandbox kind={kind!r} must be one of {', '.join(KINDS)}")
    from sandboxes.docker_backend import DockerSandbox, docker_status
    from sandboxes.local import LocalSandbox

    docker_why = None
    if kind == "auto":
        ok, why = docker_status(image, docker_base_url, timeout=3.0)
        if ok:
            kind = "docker"
            log.info("sandbox: auto -> docker (%s)", why)
        else:
            kind, docker_why = "local", why
            log.info("sandbox: auto -> local (%s)", why)
    if kind == "docker":
        return DockerSandbox(limits, image=image, base_url=docker_base_url)
    try:
        return LocalSandbox(limits, isolation=isolation, python=python, allow_plain=allow_plain)
    except SandboxUnavailable as e:
        if docker_why is None:
            raise
        raise SandboxUnavailable(f"docker: {docker_why}; {e}") from None
