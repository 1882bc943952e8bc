"""Sandbox interface, protocol, pool, factory and image recipe (no sandbox needed for most).

Backends themselves, and hostile programs against them, are in test_sandboxes_backends.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from sandboxes import (
    ExecRequest, Isolation, Limits, SandboxConfig, SandboxPool, SandboxUnavailable, StopReason, make_sandbox,
)
from sandboxes.fake import FakeSandbox, ok_result
from sandboxes.image import DEFAULT_IMAGE, ImageRecipe, host_debian_mirror
from sandboxes.local import LocalSandbox
from sandboxes.pool import percentile
from sandboxes.protocol import encode_request, find_result, to_result

NO_ENGINE = "unix:///nonexistent/docker.sock"


# --------------------------------------------------------------------------- limits and requests


def test_limits_validate_and_name_the_field():
    assert Limits().wall_seconds == 10.0
    for field, bad in [("wall_seconds", 0), ("cpu_seconds", float("inf")), ("memory_bytes", 1.5),
                       ("pids", 0), ("output_bytes", -1), ("memory_bytes", 1 << 20), ("open_files", 3),
                       ("cpus", -1)]:
        with pytest.raises(ValueError, match=field):
            Limits(**{field: bad})
    assert Limits().replace(pids=4).pids == 4


def test_requests_normalise_and_reject_escapes():
    r = ExecRequest(["echo", "hi"], files={"a/./b.txt": "text", "c.bin": b"\0"}, collect=["*.txt"])
    assert r.argv == ("echo", "hi") and r.files == {"a/b.txt": b"text", "c.bin": b"\0"}
    assert r.collect == ("*.txt",)
    for bad in ["../x", "/abs", "a/../../x", ".", "a\\b", "nul\0"]:
        with pytest.raises(ValueError, match="file path"):
            ExecRequest(["true"], files={bad: "x"})
    with pytest.raises(ValueError, match="argv"):
        ExecRequest([])
    with pytest.raises(ValueError, match="argv"):
        ExecRequest([""])
    with pytest.raises(ValueError, match="env entry"):
        ExecRequest(["true"], env={"A=B": "x"})
    with pytest.raises(ValueError, match="collect"):
        ExecRequest(["true"], collect="*")
    with pytest.raises(ValueError, match="content"):
        ExecRequest(["true"], files={"x": 3})


# --------------------------------------------------------------------------- protocol


def test_request_carries_no_host_environment(monkeypatch):
    monkeypatch.setenv("SWARM_TEST_SECRET", "leaky")
    payload = encode_request(ExecRequest(["env"], env={"MINE": "1"}), Limits(), workdir="/work", nonce="n", nproc=8)
    obj = json.loads(payload)
    assert b"leaky" not in payload and obj["env"]["MINE"] == "1" and obj["env"]["HOME"] == "/work"
    assert set(obj["env"]) == {"PATH", "LANG", "PYTHONDONTWRITEBYTECODE", "HOME", "TMPDIR", "MINE"}
    assert obj["limits"]["nproc"] == 8


def test_find_result_needs_the_nonce():
    good = {"reason": "exit", "exit_code": 0, "stdout": "aGk=", "usage": {"wall_seconds": 0.5}}
    stream = b"banner\n" + b"\nabc " + json.dumps(good).encode() + b"\n"
    assert find_result(stream, "abc") == good
    assert find_result(stream, "other") is None
    assert find_result(b"\nabc {not json\n", "abc") is None
    res = to_result(good, Isolation.BWRAP, None, 1.0)
    assert res.ok and res.stdout == b"hi" and res.usage.wall_seconds == 0.5
    assert to_result({"reason": "weird"}, Isolation.BWRAP, None, 1.0).reason is StopReason.ERROR


# --------------------------------------------------------------------------- pool


def test_percentile():
    assert percentile([3.0], 95) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 95) == 95


def test_pool_keeps_order_counts_reasons_and_turns_failures_into_results():
    outcomes = [ok_result(f"{i}") for i in range(5)] + [RuntimeError("backend broke")]
    sb = FakeSandbox(outcomes)
    with SandboxPool(sb, workers=3) as pool:
        results = pool.map([ExecRequest(["job", str(i)]) for i in range(6)])
    assert len(sb.calls) == 6
    assert sorted(r.stdout for r in results[:5]) == [b"0", b"1", b"2", b"3", b"4"]
    assert results[5].reason is StopReason.ERROR and "backend broke" in results[5].detail
    stats = pool.last_stats
    assert stats.executions == 6 and stats.reasons == {"exit": 5, "error": 1} and stats.workers == 3
    assert stats.throughput > 0 and stats.latency_p50 <= stats.latency_p95
    assert "6 runs on 3 workers" in stats.line()
    with pytest.raises(ValueError, match="workers=0"):
        SandboxPool(sb, workers=0)
    with pytest.raises(ValueError, match="sandbox="):
        SandboxPool(object())


def test_pool_overlaps_slow_runs():
    def slow(req):
        time.sleep(0.3)
        return ok_result("done")

    sb = FakeSandbox([slow] * 6)
    with SandboxPool(sb, workers=6) as pool:
        t0 = time.monotonic()
        pool.map([ExecRequest(["x"])] * 6)
        assert time.monotonic() - t0 < 1.2
        # The script is used up: the backend raises, and the future holds an ERROR result.
        assert pool.submit(ExecRequest(["x"])).result().reason is StopReason.ERROR
    assert pool.total_executions == 6


# --------------------------------------------------------------------------- factory


def test_make_sandbox_choices():
    with pytest.raises(ValueError, match="kind='vm'"):
        make_sandbox("vm")
    # plain allowed: the choice is what is tested, whether or not this machine can isolate
    local = make_sandbox("local", limits=Limits(pids=8), allow_plain=True)
    assert isinstance(local, LocalSandbox) and local.limits.pids == 8
    auto = make_sandbox("auto", docker_base_url=NO_ENGINE, allow_plain=True)
    assert isinstance(auto, LocalSandbox)
    assert make_sandbox("local", isolation="plain").isolation is Isolation.PLAIN
    with pytest.raises(SandboxUnavailable, match="no Docker engine answers"):
        make_sandbox("docker", docker_base_url=NO_ENGINE)


@pytest.mark.docker
def test_auto_prefers_docker_when_an_engine_answers():
    from sandboxes.docker_backend import DockerSandbox, docker_status

    ok, why = docker_status()
    if not ok:
        pytest.skip(f"docker: {why}")
    sb = make_sandbox("auto")
    assert isinstance(sb, DockerSandbox) and sb.describe()["image"] == DEFAULT_IMAGE
    sb.close()


def test_sandbox_config():
    cfg = SandboxConfig.from_dict({"kind": "local", "isolation": "plain", "limits": {"wall_seconds": 3}})
    assert cfg.limits == Limits(wall_seconds=3)
    sb = cfg.build()
    assert sb.isolation is Isolation.PLAIN and sb.limits.wall_seconds == 3
    d = sb.describe()
    assert d["isolation"] == "plain" and d["warning"] and d["limits"]["wall_seconds"] == 3
    with pytest.raises(ValueError, match="unknown fields"):
        SandboxConfig.from_dict({"kind": "local", "colour": 1})
    with pytest.raises(ValueError, match="sandbox.kind"):
        SandboxConfig(kind="vm")
    with pytest.raises(ValueError, match="isolation"):
        SandboxConfig(isolation="chroot")


def test_local_sandbox_options_are_validated():
    with pytest.raises(ValueError, match="isolation='jail'"):
        LocalSandbox(isolation="jail")
    with pytest.raises(ValueError, match="host_grace_seconds"):
        LocalSandbox(isolation="plain", host_grace_seconds=0)


def test_docker_status_explains_why_not():
    from sandboxes.docker_backend import docker_status

    ok, why = docker_status(base_url=NO_ENGINE)
    assert not ok and "no Docker engine answers" in why


@pytest.mark.docker
def test_docker_status_names_a_missing_image():
    from sandboxes.docker_backend import DockerSandbox, docker_status

    ok, why = docker_status(image=None)
    if not ok:
        pytest.skip(f"docker: {why}")
    ok, why = docker_status(image="swarmlab-no-such-image:0")
    assert not ok and "build_base_image" in why
    with pytest.raises(SandboxUnavailable, match="no image"):
        DockerSandbox(image="swarmlab-no-such-image:0")
    with pytest.raises(ValueError, match="never runs as root"):
        DockerSandbox(user="0:0")


# --------------------------------------------------------------------------- image recipe


def test_recipe_digest_and_debootstrap_command():
    r = ImageRecipe()
    assert r.debootstrap_argv("/x", None) == ["debootstrap", "--variant=minbase", "--include=python3", "bookworm", "/x"]
    assert r.digest == ImageRecipe(mirror="http://mirror.invalid/debian").digest  # the mirror is not the content
    assert r.digest != ImageRecipe(include=("python3", "coreutils")).digest
    assert ImageRecipe(mirror="http://m.invalid/d").debootstrap_argv("/x", "http://m.invalid/d")[-1] == "http://m.invalid/d"
    with pytest.raises(ValueError, match="suite"):
        ImageRecipe(suite="Bookworm; rm -rf")
    with pytest.raises(ValueError, match="include"):
        ImageRecipe(include=("python3", "a b"))
    with pytest.raises(ValueError, match="variant"):
        ImageRecipe(variant="huge")


def test_host_mirror_from_apt_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "other.sources").write_text(
        "Types: deb\nURIs: http://other.invalid/x\nSuites: nodistro\nComponents: main\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror-a.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror-a.invalid/debian-security\nSuites: bookworm-security\n")
    assert host_debian_mirror("bookworm", str(tmp_path)) == "http://mirror-a.invalid/debian"
    assert host_debian_mirror("bookworm-security", str(tmp_path)) == "http://mirror-a.invalid/debian-security"
    assert host_debian_mirror("trixie", str(tmp_path)) is None
    (tmp_path / "sources.list").write_text("# comment\ndeb [arch=amd64] http://mirror-b.invalid/debian trixie main\n")
    assert host_debian_mirror("trixie", str(tmp_path)) == "http://mirror-b.invalid/debian"


def test_image_module_cli_reports_errors_in_one_line():
    env = {**os.environ, "DOCKER_HOST": NO_ENGINE}
    p = subprocess.run([sys.executable, "-m", "sandboxes.image"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 1 and p.stderr.strip().startswith("error: no Docker engine answers")
    assert "Traceback" not in p.stderr


@pytest.mark.docker
def test_build_base_image_reuses_a_matching_image():
    from sandboxes.docker_backend import docker_status
    from sandboxes.image import build_base_image, find_image

    ok, why = docker_status(image=None)
    if not ok:
        pytest.skip(f"docker: {why}")
    if find_image(DEFAULT_IMAGE) is None:
        build_base_image()
    info = build_base_image()
    assert not info.built and info.seconds < 10 and info.id.startswith("sha256:")
    labels = find_image(DEFAULT_IMAGE)["Config"]["Labels"]
    assert json.loads(labels["org.swarmlab.sandbox.recipe"])["include"] == ["python3"]


@pytest.mark.slow
@pytest.mark.docker
def test_build_base_image_from_scratch_then_from_cache(tmp_path):
    from sandboxes.docker_backend import DockerSandbox, docker_status
    from sandboxes.image import build_base_image, find_image

    ok, why = docker_status(image=None)
    if not ok:
        pytest.skip(f"docker: {why}")
    name = "swarmlab-sandbox-test:scratch"
    try:
        first = build_base_image(name, force=True, cache_dir=tmp_path)
        assert first.built and not first.from_cache
        assert list(tmp_path.glob("rootfs-*.tar"))
        again = build_base_image(name, force=True, cache_dir=tmp_path)
        assert again.built and again.from_cache and again.seconds < first.seconds
        res = DockerSandbox(image=name).run_python("import sys; print(sys.version_info[0])")
        assert res.ok and res.stdout == b"3\n"
    finally:
        import docker

        if find_image(name) is not None:
            docker.from_env().images.remove(name, force=True)
