"""Docker backend: one fresh container per run, removed afterwards whatever happened.

Each container: `--network none`; memory (and swap, equal: no swap) limited to `memory_bytes`
plus the supervisor's share; `--cpus`; `--pids-limit`; read-only root; a tmpfs work dir /work and
a tmpfs /tmp of `disk_bytes` each; uid 65534 (not root); every capability dropped;
no-new-privileges; rlimits for file size, open files and core dumps; no logging driver (output
travels over the attach stream and is capped inside); `oom_score_adj` 1000 so the kernel's OOM
killer picks it before anything on the host.

The container's command is the supervisor (`sandboxes/supervisor.py`) as PID 1. The host attaches
to the container's stdin/stdout before starting it, sends the request, closes stdin, and reads
the one result line — bounded in size and in time (`wall_seconds` + `host_grace_seconds`, which
covers container start). If that deadline passes the host kills the container and reports
TIMEOUT; the engine's OOM flag turns a silent kill into MEMORY.

The image has to exist on the engine: `sandboxes.image.build_base_image()` builds it locally
(debootstrap + docker import); on a cluster with a registry any image with `python3` will do.

    from sandboxes.docker_backend import DockerSandbox
    sb = DockerSandbox()                        # raises SandboxUnavailable (with the reason) if unusable
    sb.run_python("print(1)").stdout            # b"1\\n"
"""
from __future__ import annotations

import logging
import socket
import struct
import time
from typing import Any

from sandboxes.base import (
    DEFAULT_IMAGE, ExecRequest, ExecResult, Isolation, Limits, ResourceUsage, Sandbox, SandboxUnavailable, StopReason,
    error_result,
)
from sandboxes.protocol import SUPERVISOR_SOURCE, encode_request, find_result, max_result_bytes, new_nonce, to_result

log = logging.getLogger(__name__)

LABEL = "org.swarmlab.sandbox"
SUPERVISOR_MEMORY = 48 << 20  # cgroup headroom for the supervisor next to the code's memory_bytes
SUPERVISOR_PIDS = 8


def docker_status(image: str | None = DEFAULT_IMAGE, base_url: str | None = None,
                  timeout: float = 5.0) -> tuple[bool, str]:
    """(usable, why): whether an engine answers and, if `image` is given, has that image."""
    try:
        import docker
    except ImportError as e:  # pragma: no cover - docker is a declared dependency
        return False, f"the docker SDK is not installed: {e}"
    try:
        if base_url:
            client = docker.DockerClient(base_url=base_url, timeout=timeout)
        else:
            client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as e:
        return False, f"no Docker engine answers ({type(e).__name__}: {e})"
    try:
        if image:
            try:
                client.api.inspect_image(image)
            except docker.errors.ImageNotFound:
                return False, (f"the engine has no image {image!r}; build it with "
                               "sandboxes.image.build_base_image() (`swarm sandbox build-image`)")
        return True, "engine answers" + (f" and has {image}" if image else "")
    finally:
        client.close()


def _demux(buf: bytes) -> tuple[bytes, bytes]:
    """Split Docker's multiplexed attach stream (8-byte frame headers) into stdout and stderr."""
    out, err, i = bytearray(), bytearray(), 0
    while i + 8 <= len(buf):
        kind, size = buf[i], struct.unpack(">I", buf[i + 4:i + 8])[0]
        frame = buf[i + 8:i + 8 + size]
        (err if kind == 2 else out).extend(frame)
        i += 8 + size
    return bytes(out), bytes(err)


class DockerSandbox(Sandbox):
    """Runs each request in a new container of `image`; see the module docstring.

    `client`: a `docker.DockerClient` (default: from the environment, or `base_url`).
    `user`: uid:gid inside the container. `host_grace_seconds`: time beyond `wall_seconds` the host
    waits (container create/start included) before killing the container itself."""

    isolation = Isolation.DOCKER

    def __init__(self, limits: Limits | None = None, *, image: str = DEFAULT_IMAGE, client: Any = None,
                 base_url: str | None = None, python: str = "python3", user: str = "65534:65534",
                 host_grace_seconds: float = 20.0, check_image: bool = True) -> None:
        super().__init__(limits)
        if host_grace_seconds <= 0:
            raise ValueError(f"host_grace_seconds={host_grace_seconds!r} must be > 0")
        if not user or user.split(":")[0] in ("0", "root"):
            raise ValueError(f"user={user!r}: the sandbox never runs as root")
        import docker

        self._docker = docker
        try:
            self.client = client or (docker.DockerClient(base_url=base_url, timeout=60) if base_url
                                     else docker.from_env(timeout=60))
            self.client.ping()
        except Exception as e:
            raise SandboxUnavailable(f"no Docker engine answers ({type(e).__name__}: {e})") from None
        self.image, self.python, self.user = image, python, user
        self.host_grace_seconds = host_grace_seconds
        if check_image:
            try:
                self.client.api.inspect_image(image)
            except docker.errors.ImageNotFound:
                raise SandboxUnavailable(
                    f"the engine has no image {image!r}; build it with sandboxes.image.build_base_image() "
                    "(`swarm sandbox build-image`)") from None

    def _host_config(self, limits: Limits) -> dict[str, Any]:
        Ulimit = self._docker.types.Ulimit
        LogConfig = self._docker.types.LogConfig
        mem = limits.memory_bytes + SUPERVISOR_MEMORY
        uid, _, gid = self.user.partition(":")
        # Docker's tmpfs defaults to noexec; code may build and run a binary in its work dir.
        tmpfs_opts = f"rw,exec,nosuid,nodev,size={limits.disk_bytes},uid={uid},gid={gid or uid},mode=0700"
        return self.client.api.create_host_config(
            network_mode="none",
            read_only=True,
            tmpfs={"/work": tmpfs_opts, "/tmp": tmpfs_opts},
            mem_limit=mem,
            memswap_limit=mem,
            nano_cpus=int(limits.cpus * 1e9),
            pids_limit=limits.pids + SUPERVISOR_PIDS,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            ulimits=[
                Ulimit(name="fsize", soft=limits.file_bytes, hard=limits.file_bytes),
                Ulimit(name="nofile", soft=limits.open_files, hard=limits.open_files),
                Ulimit(name="core", soft=0, hard=0),
            ],
            log_config=LogConfig(type="none"),
            ipc_mode="private",
            oom_score_adj=1000,
            auto_remove=False,
        )

    def _execute(self, request: ExecRequest, limits: Limits) -> ExecResult:
        started = time.monotonic()
        nonce = new_nonce()
        payload = encode_request(request, limits, workdir="/work", nonce=nonce, nproc=None)
        api = self.client.api
        cid = api.create_container(
            self.image, command=[self.python, "-I", "-S", "-c", SUPERVISOR_SOURCE], user=self.user,
            working_dir="/work", stdin_open=True, detach=False, tty=False, network_disabled=True,
            environment={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
            labels={LABEL: "1"}, host_config=self._host_config(limits),
        )["Id"]
        timed_out = overflow = False
        raw = bytearray()
        try:
            sock = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            conn: socket.socket = getattr(sock, "_sock", sock)
            try:
                api.start(cid)
                deadline = started + limits.wall_seconds + self.host_grace_seconds
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                conn.sendall(payload)
                conn.shutdown(socket.SHUT_WR)
                cap = max_result_bytes(limits) + (1 << 16)
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        timed_out = True
                        break
                    conn.settimeout(remaining)
                    try:
                        chunk = conn.recv(1 << 16)
                    except socket.timeout:
                        timed_out = True
                        break
                    if not chunk:
                        break
                    raw += chunk
                    if len(raw) > cap:
                        overflow = True
                        break
            finally:
                try:
                    sock.close()
                except OSError:
                    pass
            if timed_out or overflow:
                try:
                    api.kill(cid)
                except self._docker.errors.APIError:
                    pass
            try:
                api.wait(cid, timeout=max(5.0, self.host_grace_seconds))
            except Exception:
                api.kill(cid)
            state = api.inspect_container(cid).get("State") or {}
        finally:
            try:
                api.remove_container(cid, force=True)
            except self._docker.errors.NotFound:
                pass
            except Exception:
                log.exception("could not remove sandbox container %s", cid[:12])
        host_wall = time.monotonic() - started
        out, err = _demux(bytes(raw))
        result = find_result(out, nonce)
        if result is not None:
            res = to_result(result, self.isolation, None, host_wall)
            if state.get("OOMKilled") and res.reason in (StopReason.KILLED, StopReason.EXIT):
                res = _replace(res, reason=StopReason.MEMORY, detail=f"OOM-killed at the memory limit ({res.detail})")
            return res
        if state.get("OOMKilled"):
            return ExecResult(StopReason.MEMORY, None, usage=ResourceUsage(host_wall), isolation=self.isolation,
                              detail="the container was OOM-killed before it could report")
        if timed_out:
            return ExecResult(StopReason.TIMEOUT, None, usage=ResourceUsage(host_wall), isolation=self.isolation,
                              detail="no report within wall_seconds + host grace; the host killed the container")
        why = "result larger than its bound" if overflow else f"container exit status {state.get('ExitCode')}"
        tail = err.decode("utf-8", "replace").strip()[-500:]
        return error_result(f"container ended without a result ({why}): {tail}", self.isolation, started)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(image=self.image, user=self.user)
        return d

    def close(self) -> None:
        self.client.close()


def _replace(res: ExecResult, **kw: Any) -> ExecResult:
    import dataclasses

    return dataclasses.replace(res, **kw)


def remove_stale_containers(client: Any = None) -> int:
    """Remove every container this backend labelled (left by a killed host process). Returns how many."""
    import docker

    c = client or docker.from_env()
    n = 0
    for ctr in c.containers.list(all=True, filters={"label": LABEL}):
        ctr.remove(force=True)
        n += 1
    return n
