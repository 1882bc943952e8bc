"""Two (or more) gloo ranks on loopback, each a process running a test file as a script:
`python SCRIPT RANK WORLD PORT ARGS...`. Shared by the data-parallel tests."""
from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(script: str, args: list[str], world: int = 2, **env: str) -> list[subprocess.Popen]:
    """One process per rank, rank 0 first, on a free loopback port."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": str(REPO), **env}
    port = free_port()
    return [subprocess.Popen([sys.executable, script, str(r), str(world), str(port), *args],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]


def end_rank() -> None:
    """End a worker whose results are written: leave the process group, then exit without the
    interpreter's teardown. torch 2.13's gloo can abort a rank there ("terminate called without an
    active exception", SIGABRT) after every collective has finished and the group was destroyed,
    in a few percent of runs here; its exit code would then fail a test whose ranks all did their part."""
    import torch.distributed

    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def wait(procs: list[subprocess.Popen], timeout: float) -> None:
    """Every rank ended with 0; a rank still running after `timeout` seconds (a collective another
    rank never joined) kills them all and fails the test."""
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("a rank hung (a collective one rank never joined?)") from None
        assert p.returncode == 0, err[-3000:]
