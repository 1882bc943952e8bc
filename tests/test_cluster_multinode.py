"""A three-node Ray cluster on loopback (`ray.cluster_utils.Cluster`, every node at 127.0.0.1, each
with a custom resource naming it): trainer jobs submitted through `trainer.launch.submit`, pinned to
the two non-head nodes by those resources, run there at the same time, each writing its run into
that node's own folder; every listening socket of every process of the cluster is on 127.0.0.1.

The nodes share this machine's filesystem, so each gets its own folders and the checks look for
files where they must not be (a job writing beside the head or beside the other node fails). The
code reaches the jobs by Ray (py_modules), the config by the job's working dir; the run folder is
still a path the submitter and the node both reach (here: the same disk; on a cluster: shared
storage, docs/cluster.md).

The cluster lives in a child process with its own RAY_TMPDIR (Ray writes the "current cluster"
address file there, not in /tmp/ray where other Rays on the machine look), stopped by closing its
stdin and then, for what is left, by pid. About 60 s here.

    .venv/bin/python -m pytest tests/test_cluster_multinode.py -q -m slow
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time

import psutil
import pytest

from sandboxes.private import private_dir
from trainer.config import RunConfig

REPO = pathlib.Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xfail(
    run=False, reason="not passing yet (2026-12-05, Ray 2.60, this 2-core machine): work pinned to a node added "
    "by ray.cluster_utils.Cluster never ran — a Jobs API submit hung in the head's POST to the job agent "
    "(ServerDisconnectedError after ~160 s) and the pinned tasks did not return in 400 s; the cluster itself "
    "comes up with every listener on loopback (checked by hand). See docs/cluster.md")]

CLUSTER = r'''
import json, socket, sys
import ray
from ray.cluster_utils import Cluster
from trainer.launch import code_runtime_env

def free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

names, configs = sys.argv[1].split(","), json.loads(sys.argv[2])
dash = free()
c = Cluster(initialize_head=True, head_node_args={
    "node_ip_address": "127.0.0.1", "num_cpus": 1, "resources": {"node_head": 1},
    "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": dash,
    "dashboard_agent_listen_port": free()})
nodes = {"node_head": c.head_node.node_id}
for name in names:
    nodes[name] = c.add_node(node_ip_address="127.0.0.1", num_cpus=1, resources={name: 1}).node_id
print(json.dumps({"gcs": c.gcs_address, "dashboard": f"http://127.0.0.1:{dash}", "nodes": nodes}), flush=True)
c.connect()

@ray.remote(num_cpus=1, runtime_env=code_runtime_env())
def train(cfg):
    import trainer
    from trainer.config import RunConfig
    from trainer.loop import Trainer
    summary = Trainer(RunConfig.model_validate(cfg)).run()
    return {"node": ray.get_runtime_context().get_node_id(), "status": summary["status"], "code": trainer.__file__}

refs = {n: train.options(resources={n: 1}).remote(configs[n]) for n in names}   # both at once
print(json.dumps({n: ray.get(r, timeout=600) for n, r in refs.items()}), flush=True)
sys.stdin.read()      # until the test closes it
ray.shutdown()
c.shutdown()
'''

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


def _listeners(procs: list[psutil.Process]) -> list[tuple[str, int, str]]:
    out = []
    for p in procs:
        try:
            out += [(c.laddr.ip, c.laddr.port, p.name()) for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN]
        except psutil.Error:   # a process that ended meanwhile
            pass
    return out


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    if not box or not box[0]:
        raise AssertionError(f"no answer from the cluster in {timeout:.0f}s: {proc.stderr.read()[-3000:] if proc.poll() is not None else ''}")
    return box[0]


def test_trainer_pinned_to_nodes_runs_there_and_everything_listens_on_loopback(tmp_path):
    home = private_dir(f"/tmp/swarmlab-mn-{os.getpid()}")   # short: Ray's unix socket paths live under it
    script = home / "cluster.py"
    script.write_text(CLUSTER)
    folders = {n: tmp_path / n for n in ("node_head", "node_b", "node_c")}   # each node's own folder
    for d in folders.values():
        d.mkdir()
    configs = {n: RunConfig.parse({
        "name": f"on-{n}", "seed": 0, "threads": 1, "out_dir": str(folders[n] / "runs"), "task": {"name": "reverse"},
        "samples_per_step": 1, "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32},
        "harness": {"curriculum": {"start": 3}, "answer": {"reverse_digits": True}, "sampling": {"max_new_tokens": 6}},
        "recipe": {"steps": 5, "batch_size": 8, "eval_size": 8, "warmup_steps": 0},
        "checkpoint": {"interval": 5}}).model_dump(mode="json") for n in ("node_b", "node_c")}
    env = {**os.environ, "RAY_TMPDIR": str(home / "t"), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, str(script), "node_b,node_c", json.dumps(configs)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(home))
    root = psutil.Process(proc.pid)
    seen: set[psutil.Process] = set()
    listening: list[tuple[str, int, str]] = []

    def snapshot() -> None:   # the cluster's processes now (the tasks' workers run under the nodes' raylets)
        procs = _tree(root)
        seen.update(procs)
        listening.extend(_listeners(procs))
    try:
        info = json.loads(_first_line(proc, 240))
        snapshot()
        time.sleep(3)
        snapshot()   # the tasks' workers, starting
        done = json.loads(_first_line(proc, 400))
        snapshot()
        for node in ("node_b", "node_c"):
            assert done[node]["node"] == info["nodes"][node] and done[node]["status"] == "completed", done
            # the worker imported the code Ray shipped (py_modules), not this checkout
            assert not done[node]["code"].startswith(str(REPO)), done[node]["code"]
            run = folders[node] / "runs" / f"on-{node}"
            assert (run / "metrics.jsonl").is_file() and (run / "checkpoints" / "step_0000005.pt").is_file()
        # nothing beside the head or the other node: a run that landed elsewhere would have written there
        assert not list(folders["node_head"].iterdir())
        assert sorted(p.name for p in (folders["node_b"] / "runs").iterdir()) == ["on-node_b"]
        assert sorted(p.name for p in (folders["node_c"] / "runs").iterdir()) == ["on-node_c"]
        assert {"gcs_server", "raylet"} <= {name for _, _, name in listening}, listening
        assert len({port for _, port, _ in listening}) >= 7   # GCS, dashboard, 3 nodes' raylets and agents
        beyond = sorted({lst for lst in listening if lst[0] not in LOOPBACK})
        assert not beyond, f"listening beyond loopback: {beyond}"
    finally:
        try:
            proc.stdin.close()
            proc.wait(timeout=60)
        except (subprocess.TimeoutExpired, OSError):
            pass
        left = [p for p in _tree(root) + list(seen) if p.pid != os.getpid()]
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=10)
        shutil.rmtree(home, ignore_errors=True)
    assert not [p for p in seen if p.is_running()], "cluster processes left running"
