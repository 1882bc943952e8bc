"""What `start_head` turns off on a private head, and `quiet=False` (Ray's own defaults, what
benchmarks/ray_head_cpu.py compares against) leaving it on.

The command line and the environment of `ray start` are built by pure functions (`_head_command`,
`_env`): checked here without Ray. One test marked `ray` starts both heads and reads the real
processes: a log monitor only without `quiet`, and the raylet's environment (token files under
pytest's tmp_path).
"""
from __future__ import annotations

import psutil
import pytest

from trainer.launch import AUTH_DIR_ENV, HEAD_QUIET_ENV, _env, _head_command, _head_processes, start_head, stop_head

LOG_MONITOR_OFF = "--include-log-monitor=false"


@pytest.fixture
def clean_env(monkeypatch):
    """No quiet setting of the caller's own in the environment (a caller's setting wins)."""
    for k in HEAD_QUIET_ENV:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_quiet_command_turns_the_log_monitor_off():
    cmd = _head_command(6379, 8265, 52365, "/tmp/x/r", num_cpus=2)
    assert cmd[1:3] == ["start", "--head"]
    assert LOG_MONITOR_OFF in cmd
    for flag in ("--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", "--port=6379",
                 "--dashboard-port=8265", "--dashboard-agent-listen-port=52365", "--temp-dir=/tmp/x/r",
                 "--disable-usage-stats", "--num-cpus=2"):
        assert flag in cmd, flag


def test_ray_defaults_command_differs_only_by_the_log_monitor():
    quiet = _head_command(6379, 8265, 52365, "/tmp/x/r")
    loud = _head_command(6379, 8265, 52365, "/tmp/x/r", quiet=False)
    assert LOG_MONITOR_OFF not in loud
    assert [a for a in quiet if a != LOG_MONITOR_OFF] == loud
    assert not any(a.startswith("--num-cpus") for a in loud)   # Ray counts the CPUs when none is given


def test_quiet_env_sets_the_quiet_defaults(clean_env):
    env = _env()
    for k, v in HEAD_QUIET_ENV.items():
        assert env[k] == v
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_ray_defaults_env_leaves_them_to_ray(clean_env):
    env = _env(quiet=False)
    assert not set(HEAD_QUIET_ENV) & set(env)
    # loopback only and usage stats off are not among the quiet settings: kept either way
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_callers_own_setting_wins(clean_env):
    clean_env.setenv("REPORTER_UPDATE_INTERVAL_MS", "1234")
    assert _env()["REPORTER_UPDATE_INTERVAL_MS"] == "1234"
    assert _env(quiet=False)["REPORTER_UPDATE_INTERVAL_MS"] == "1234"


def _kinds(head) -> tuple[bool, dict[str, str]]:
    """Whether the head runs a log monitor, and its raylet's environment."""
    log_monitor, raylet_env = False, {}
    for p in _head_processes(head):
        try:
            line = " ".join(p.cmdline())
            if "log_monitor.py" in line:
                log_monitor = True
            if "raylet/raylet" in line:
                raylet_env = p.environ()
        except psutil.Error:
            pass
    return log_monitor, raylet_env


@pytest.mark.ray
def test_start_head_quiet_and_ray_defaults(clean_env, tmp_path):
    clean_env.setenv(AUTH_DIR_ENV, str(tmp_path / "ray-auth"))   # the heads' token files
    for quiet in (True, False):
        head = start_head(num_cpus=1, quiet=quiet)   # its temp dir: short (unix socket paths), removed by stop_head
        try:
            log_monitor, env = _kinds(head)
        finally:
            stop_head(head)
        assert env, "the raylet's environment was not readable"
        assert log_monitor is not quiet
        for k, v in HEAD_QUIET_ENV.items():
            assert env.get(k) == (v if quiet else None), (quiet, k, env.get(k))
        assert env["RAY_AUTH_MODE"] == "token"
