"""Sandboxes for untrusted code: Docker and local (bubblewrap / rlimits) backends behind one interface.

    from sandboxes import Limits, make_sandbox
    sb = make_sandbox("auto")                       # docker if an engine answers, else local
    res = sb.run_python("print(6 * 7)", limits=Limits(wall_seconds=2))
    assert res.ok and res.stdout == b"42\\n"

See `sandboxes/base.py` for the interface, `local.py` / `docker_backend.py` for what each backend
isolates, `image.py` for the Docker base image, `pool.py` for concurrent runs.
"""
from sandboxes.base import (
    ExecRequest,
    ExecResult,
    ImageBuildError,
    Isolation,
    Limits,
    ResourceUsage,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
    StopReason,
)
from sandboxes.factory import SandboxConfig, make_sandbox
from sandboxes.pool import PoolStats, SandboxPool

__all__ = [
    "ExecRequest",
    "ExecResult",
    "ImageBuildError",
    "Isolation",
    "Limits",
    "PoolStats",
    "ResourceUsage",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxPool",
    "SandboxUnavailable",
    "StopReason",
    "make_sandbox",
]
