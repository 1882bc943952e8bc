"""A multi-node Ray cluster on one machine, every node at 127.0.0.1: for tests and benchmarks of
what runs across nodes (placement, run storage, a node lost mid-run).

    with loopback_cluster({"b": {"num_cpus": 4, "resources": {"trainer": 3}}, "c": {...}}) as lc:
        Controller.create(ws, goal, jobs="ray", ray_address=lc.url)   # jobs reach it by address

`ray.cluster_utils.Cluster`: a head (dashboard and Jobs API on 127.0.0.1, no custom resource) and
one node per entry, each with its own scratch folder (`SWARMLAB_SCRATCH_DIR` in its environment).
Token auth is on: a new token in the cluster's folder, named by `RAY_AUTH_MODE` and
`RAY_AUTH_TOKEN_PATH` in this process's environment while the cluster runs (jobs and clients made
here inherit it). Import this module before `ray`: it sets `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`,
which Ray reads once on import and which keeps every node's servers on loopback (docs/cluster.md).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shutil
import tempfile
from typing import Any, Iterator

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

SET_VARS = ("RAY_TMPDIR", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


@dataclasses.dataclass
class LoopbackCluster:
    cluster: Any                        # ray.cluster_utils.Cluster
    url: str                            # the dashboard / Jobs API
    nodes: dict[str, Any]               # name -> the node (Cluster.remove_node takes it)
    scratch: dict[str, pathlib.Path]    # name -> its scratch folder ("head" too)
    root: pathlib.Path                  # everything of the cluster's: temp dir, token, scratch


@contextlib.contextmanager
def loopback_cluster(nodes: dict[str, dict[str, Any]], head_cpus: int = 1) -> Iterator[LoopbackCluster]:
    """Start the cluster: `nodes` maps a name to `num_cpus` and `resources` of that node. On exit
    it is shut down, the processes it started are waited for (a late writer would leave files in
    the folder removed next), the environment is restored and its folder removed."""
    import psutil

    from trainer.launch import _free_port, new_token

    root = pathlib.Path(tempfile.mkdtemp(prefix="lc", dir="/tmp"))   # short: unix socket paths under it
    (root / "ray").mkdir()
    saved = {k: os.environ.get(k) for k in SET_VARS}
    os.environ["RAY_TMPDIR"] = str(root)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(new_token(root / "token"))
    scratch = {n: root / f"scratch-{n}" for n in ("head", *nodes)}
    c = None
    try:
        from ray.cluster_utils import Cluster

        dash = _free_port()
        c = Cluster(initialize_head=True, head_node_args={
            "node_ip_address": "127.0.0.1", "num_cpus": head_cpus, "include_dashboard": True,
            "dashboard_host": "127.0.0.1", "dashboard_port": dash, "dashboard_agent_listen_port": _free_port(),
            "temp_dir": str(root / "t"), "env_vars": {"SWARMLAB_SCRATCH_DIR": str(scratch["head"])}})
        added = {n: c.add_node(node_ip_address="127.0.0.1", num_cpus=spec.get("num_cpus", 1),
                               resources=dict(spec.get("resources") or {}), dashboard_agent_listen_port=_free_port(),
                               env_vars={"SWARMLAB_SCRATCH_DIR": str(scratch[n])}) for n, spec in nodes.items()}
        c.wait_for_nodes()
        yield LoopbackCluster(c, f"http://127.0.0.1:{dash}", added, scratch, root)
    finally:
        kids = psutil.Process().children(recursive=True)
        if c is not None:
            c.shutdown()
        psutil.wait_procs(kids, timeout=15)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(root, ignore_errors=True)
