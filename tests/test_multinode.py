"""Three Ray nodes on loopback, each with its own scratch folder, and run storage between the swarm
and its jobs: a shared-filesystem assumption fails these tests.

- `ray.cluster_utils.Cluster`: a head (no trainer resource) and two nodes declaring `trainer`, all at
  127.0.0.1 with token auth on; every listener of every Ray process is on loopback (asserted);
- the swarm controller runs in this process against the cluster by address, with the goal's
  `swarm.storage` a `file://` folder that stands for a remote store and `swarm.job_resources`
  `{trainer: 1}`: the live job and its backtest arms run on the non-head nodes (their logs name the
  node's scratch folder), and an audit hook asserts that the controller's process never opens,
  lists or removes anything under any node's scratch folder;
- answers truncated by the goal's own setting: the truncation detector, a backtest whose arms fork
  the live run's checkpoint from the storage, an applied fix, the target reached;
- a healthy goal whose node is removed mid-run: the job is started again on the other node,
  resumes from the newest checkpoint on the storage, one restart, the target reached.

Each takes minutes on 2 cores (`slow`).

    .venv/bin/python -m pytest tests/test_multinode.py -q -m slow
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
import pytest

from trainer.loopback_cluster import loopback_cluster  # before ray: its servers on loopback
from trainer.runlog import read_jsonl

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_swarm import merge, tiny_goal, truncated_goal  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1500)]

DENIED: list[str] = []          # folders the controller's process must never touch
TOUCHED: list[tuple[str, str]] = []
_WATCHED = {"open", "os.listdir", "os.scandir", "os.remove", "os.unlink", "os.rename", "os.replace", "shutil.rmtree",
            "os.mkdir", "os.rmdir"}


def _audit(event: str, args: tuple) -> None:
    if DENIED and event in _WATCHED and args:
        p = args[0]
        if isinstance(p, (str, bytes, os.PathLike)):
            s = os.fsdecode(p) if not isinstance(p, str) else p
            if any(s.startswith(d) for d in DENIED):
                TOUCHED.append((event, s))


sys.addaudithook(_audit)   # an audit hook cannot be removed: it does nothing while DENIED is empty


@pytest.fixture(scope="module")
def cluster():
    """The three nodes, their scratch folders and the token; shut down by the fixture."""
    with loopback_cluster({n: {"num_cpus": 4, "resources": {"trainer": 3}} for n in ("b", "c")}, head_cpus=1) as lc:
        yield {"cluster": lc.cluster, "url": lc.url, "scratch": lc.scratch, "nodes": lc.nodes, "root": lc.root}


def _ray_pids() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _listeners_beyond_loopback(pids: set[int]) -> list[str]:
    out = subprocess.run(["ss", "-ltnupH"], capture_output=True, text=True).stdout.splitlines()
    loopback = ("127.0.0.1", "[::ffff:127.0.0.1]", "[::1]")
    return [line for line in out if any(f"pid={pid}," in line for pid in pids)
            and line.split()[4].rsplit(":", 1)[0] not in loopback]


def _client(url: str):
    from ray.job_submission import JobSubmissionClient

    token = pathlib.Path(os.environ["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    return JobSubmissionClient(url, headers={"Authorization": f"Bearer {token}"})


def _scratch_of(client, job_id: str) -> str | None:
    """The scratch folder a job's log names (trainer/run_storage.py prints it first)."""
    try:
        logs = client.get_job_logs(job_id)
    except Exception:   # a job of a removed node: its log went with it
        return None
    for line in logs.splitlines():
        if line.startswith('{"run_storage"'):
            return json.loads(line)["scratch"]
    return None


def _goal(g: dict[str, Any], storage: str):
    from swarm.goal import Goal

    g = merge(g, {"budget": {"wall_s": 900, "worker_cpu_s": 3000},
                  "swarm": {"storage": storage, "job_resources": {"trainer": 1}, "stale_heartbeat_s": 30.0}})
    return Goal.parse(g)


def _run(ws, goal, url) -> dict[str, Any]:
    from swarm.controller import Controller

    return Controller.create(ws, goal, jobs="ray", ray_address=url).run()


def _placements(client, scratch: dict[str, pathlib.Path]) -> dict[str, str]:
    """Each swarmlab job's node, by the scratch folder its log names."""
    out = {}
    for j in client.list_jobs():
        if not (j.submission_id or "").startswith("swarmlab-"):
            continue
        s = _scratch_of(client, j.submission_id) or ""
        out[j.submission_id] = next((n for n, d in scratch.items() if s.startswith(str(d))), f"unknown: {s!r}")
    return out


def test_a_swarm_run_on_three_nodes_meets_its_jobs_only_on_storage(cluster, tmp_path, clean_git_home):
    storage = tmp_path / "storage"
    # answers cut off by the goal's own max_new_tokens: the truncation detector, a backtest, the fix
    goal = _goal(truncated_goal(approval={"auto": ["low", "medium"]}), f"file://{storage}")
    ws = tmp_path / "ws"
    assert not _listeners_beyond_loopback(_ray_pids())
    DENIED[:] = [str(d) for d in cluster["scratch"].values()]
    TOUCHED.clear()
    try:
        summary = _run(ws, goal, cluster["url"])
    finally:
        DENIED.clear()
    assert summary["reached"] is True and summary["reason"] == "target_met", summary
    assert not TOUCHED, f"the controller touched a node's scratch folder: {TOUCHED[:5]}"
    assert not _listeners_beyond_loopback(_ray_pids())
    client = _client(cluster["url"])
    where = _placements(client, cluster["scratch"])
    arms = {j: n for j, n in where.items() if "-bt-" in j}
    live = {j: n for j, n in where.items() if j.startswith("swarmlab-train-")}
    assert live and arms, where
    assert set(where.values()) <= {"b", "c"}, where            # never the head node
    # the backtest's arms forked the live run's checkpoint from the storage and wrote their runs there
    assert summary["interventions"], summary
    key = next(storage.iterdir())
    arm_runs = [p for p in key.iterdir() if p.name.startswith("bt-")]
    assert arm_runs and all((p / "streams" / "metrics.jsonl").is_dir() for p in arm_runs)
    # the controller's run folders hold the rows and manifests, never a weights file
    sdir = ws / ".swarm"
    assert not list(sdir.rglob("*.pt")), list(sdir.rglob("*.pt"))[:3]
    assert [r for r in read_jsonl(sdir / "runs" / "train" / "metrics.jsonl") if "heldout_acc" in r]
    assert list((sdir / "runs" / "train" / "checkpoints").glob("*.json"))
    # the scratch folders of finished jobs are gone
    assert not any(list(d.rglob("metrics.jsonl")) for d in cluster["scratch"].values() if d.exists())


def test_a_node_removed_mid_run_is_survived_from_the_storage(cluster, tmp_path, clean_git_home):
    storage = tmp_path / "storage"
    goal = _goal(tiny_goal(perturbations=[], run={"checkpoint": {"interval": 10, "keep_last": 4}}), f"file://{storage}")
    ws = tmp_path / "ws"
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.setdefault("summary", _run(ws, goal, cluster["url"])), daemon=True)
    t.start()
    client = _client(cluster["url"])
    ckdir = ws / ".swarm" / "runs" / "train" / "checkpoints"
    deadline = time.time() + 300
    victim = None
    while time.time() < deadline and victim is None:
        steps = [json.loads(m.read_text())["step"] for m in ckdir.glob("step_*.json")] if ckdir.is_dir() else []
        if steps and max(steps) >= 20:
            running = [j for j in client.list_jobs() if (j.submission_id or "").startswith("swarmlab-train-")
                       and str(j.status.value) == "RUNNING"]
            if running:
                s = _scratch_of(client, running[0].submission_id) or ""
                victim = next((n for n, d in cluster["scratch"].items() if s.startswith(str(d))), None)
                saved_step = max(steps)
        time.sleep(0.5)
    assert victim in ("b", "c"), f"the live job never ran on a trainer node with a checkpoint stored ({victim})"
    cluster["cluster"].remove_node(cluster["nodes"][victim])
    t.join(900)
    assert not t.is_alive(), "the controller did not finish"
    summary = out["summary"]
    assert summary["reached"] is True and summary["restarts"] == 1, summary
    events = read_jsonl(ws / ".swarm" / "runs" / "train" / "events.jsonl")
    resumes = [e for e in events if e["event"] == "resume"]
    assert resumes and resumes[-1]["step"] >= saved_step, (resumes, saved_step)
    where = _placements(client, cluster["scratch"])
    lives = [n for j, n in sorted(where.items()) if j.startswith("swarmlab-train-") and j.endswith("-r1")]
    assert lives and lives[0] not in (victim, "head"), where
