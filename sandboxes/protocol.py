"""Host side of the supervisor protocol (see `sandboxes/supervisor.py`): encode a request, find and
decode the result line, turn it into an `ExecResult`.

The supervisor's stdout carries one line, `<nonce> <JSON>`; the nonce is fresh per run, so nothing
else that reaches that stream (a runtime's banner, say) can be mistaken for a result.
"""
from __future__ import annotations

import base64
import json
import pathlib
import secrets
from typing import Any

from sandboxes.base import DEFAULT_ENV, ExecRequest, ExecResult, Isolation, Limits, ResourceUsage, StopReason

SUPERVISOR_SOURCE = (pathlib.Path(__file__).with_name("supervisor.py")).read_text()


def new_nonce() -> str:
    return secrets.token_hex(16)


def encode_request(req: ExecRequest, limits: Limits, *, workdir: str, nonce: str, nproc: int | None) -> bytes:
    """The JSON request for the supervisor. `nproc`: RLIMIT_NPROC for the command, or None where a
    cgroup limits processes instead (Docker)."""
    env = {**DEFAULT_ENV, "HOME": workdir, "TMPDIR": "/tmp", **req.env}
    lim = limits.to_dict()
    lim["nproc"] = nproc
    payload = {
        "argv": list(req.argv),
        "files": {p: base64.b64encode(d).decode("ascii") for p, d in req.files.items()},
        "stdin": base64.b64encode(req.stdin).decode("ascii"),
        "env": env,
        "workdir": workdir,
        "limits": lim,
        "collect": list(req.collect),
        "nonce": nonce,
    }
    return json.dumps(payload).encode("ascii")


def max_result_bytes(limits: Limits) -> int:
    """Upper bound of a well-formed result line: base64 of both streams and the files, plus slack."""
    return (2 * limits.output_bytes + limits.collect_bytes) * 4 // 3 + (1 << 20)


def find_result(stdout: bytes, nonce: str) -> dict[str, Any] | None:
    marker = b"\n" + nonce.encode("ascii") + b" "
    at = stdout.rfind(marker)
    if at < 0:
        return None
    line = stdout[at + len(marker):].split(b"\n", 1)[0]
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def to_result(payload: dict[str, Any], isolation: Isolation, warning: str | None, host_wall: float) -> ExecResult:
    usage = payload.get("usage") or {}
    try:
        reason = StopReason(payload.get("reason"))
    except ValueError:
        reason = StopReason.ERROR
    return ExecResult(
        reason=reason,
        exit_code=payload.get("exit_code"),
        stdout=base64.b64decode(payload.get("stdout") or ""),
        stderr=base64.b64decode(payload.get("stderr") or ""),
        stdout_truncated=bool(payload.get("stdout_truncated")),
        stderr_truncated=bool(payload.get("stderr_truncated")),
        files={k: base64.b64decode(v) for k, v in (payload.get("files") or {}).items()},
        files_skipped=dict(payload.get("files_skipped") or {}),
        usage=ResourceUsage(
            wall_seconds=float(usage.get("wall_seconds", host_wall)),
            cpu_seconds=usage.get("cpu_seconds"),
            max_rss_bytes=usage.get("max_rss_bytes"),
        ),
        isolation=isolation,
        warning=warning,
        detail=str(payload.get("detail") or ""),
    )
