"""The KubeRay manifest in examples/cluster/rayjob.yaml names only fields KubeRay's RayJob API has,
sets the ones docs/cluster.md promises (entrypoint, runtime env, shutdownAfterJobFinishes,
ttlSecondsAfterFinished, activeDeadlineSeconds, HTTP submission mode), and carries a run config the
trainer accepts, an entrypoint that runs the trainer on it, and a runtime env Ray accepts.

The field names are the JSON tags of KubeRay's Go API types, copied from ray-project/kuberay
(ray-operator/apis/ray/v1/rayjob_types.go at commit 0057210ed5a94e830c864af372577328c3542b44:
`RayJobSpec`; ray-operator/apis/ray/v1/raycluster_types.go at commit
026f143324c0b7c3cce38db3003b5d45e236fc2e: `RayClusterSpec`, `HeadGroupSpec`, `WorkerGroupSpec`).
No Kubernetes here: this checks names, types and cross-field rules, not a cluster's admission.

    .venv/bin/python -m pytest tests/test_cluster_manifest.py -q
"""
from __future__ import annotations

import pathlib
import shlex

import yaml

from trainer.config import RunConfig

MANIFEST = pathlib.Path(__file__).resolve().parent.parent / "examples" / "cluster" / "rayjob.yaml"

# RayJobSpec's json tags (rayjob_types.go)
RAYJOB_SPEC = {
    "activeDeadlineSeconds", "backoffLimit", "rayClusterSpec", "submitterPodTemplate", "metadata",
    "clusterSelector", "submitterConfig", "managedBy", "deletionStrategy", "entrypoint", "runtimeEnvYAML",
    "jobId", "submissionMode", "entrypointResources", "entrypointNumCpus", "entrypointNumGpus",
    "ttlSecondsAfterFinished", "shutdownAfterJobFinishes", "suspend", "schedule",
}
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "InteractiveMode"}   # JobSubmissionMode constants
# RayClusterSpec, HeadGroupSpec, WorkerGroupSpec json tags (raycluster_types.go); required = no omitempty
RAYCLUSTER_SPEC = {"headGroupSpec", "workerGroupSpecs", "rayVersion", "enableInTreeAutoscaling",
                   "autoscalerOptions", "headServiceAnnotations", "suspend"}
HEAD_GROUP = {"serviceType", "headService", "enableIngress", "rayStartParams", "template"}
HEAD_GROUP_REQUIRED = {"rayStartParams", "template"}
WORKER_GROUP = {"groupName", "replicas", "minReplicas", "maxReplicas", "numOfHosts", "rayStartParams",
                "template", "scaleStrategy"}
WORKER_GROUP_REQUIRED = {"groupName", "minReplicas", "maxReplicas", "rayStartParams", "template"}


def _docs() -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text())}


def test_rayjob_names_only_kuberay_fields_and_sets_the_promised_ones():
    job = _docs()["RayJob"]
    assert job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    assert set(spec) <= RAYJOB_SPEC, f"not RayJob fields: {set(spec) - RAYJOB_SPEC}"
    for field in ("entrypoint", "runtimeEnvYAML", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished",
                  "activeDeadlineSeconds", "submissionMode"):
        assert field in spec, field
    assert spec["submissionMode"] == "HTTPMode" and spec["submissionMode"] in SUBMISSION_MODES
    # types as the Go API declares them; TTL only acts with shutdownAfterJobFinishes (its comment)
    assert spec["shutdownAfterJobFinishes"] is True
    assert isinstance(spec["ttlSecondsAfterFinished"], int) and spec["ttlSecondsAfterFinished"] >= 0
    assert isinstance(spec["activeDeadlineSeconds"], int) and spec["activeDeadlineSeconds"] > 0
    assert isinstance(spec.get("entrypointNumCpus", 0), (int, float))
    assert isinstance(spec["runtimeEnvYAML"], str)   # a YAML string, not a mapping

    cluster = spec["rayClusterSpec"]
    assert set(cluster) <= RAYCLUSTER_SPEC, set(cluster) - RAYCLUSTER_SPEC
    head = cluster["headGroupSpec"]
    assert HEAD_GROUP_REQUIRED <= set(head) <= HEAD_GROUP, set(head)
    assert all(isinstance(v, str) for v in head["rayStartParams"].values())   # map[string]string
    for group in cluster["workerGroupSpecs"]:
        assert WORKER_GROUP_REQUIRED <= set(group) <= WORKER_GROUP, set(group)
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
        assert group["minReplicas"] <= group.get("replicas", group["minReplicas"]) <= group["maxReplicas"]


def test_the_job_runs_the_trainer_on_a_config_it_accepts_with_an_env_ray_accepts():
    from ray.runtime_env import RuntimeEnv

    docs = _docs()
    spec = docs["RayJob"]["spec"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[1:3] == ["-m", "trainer.entry"] and len(argv) == 4
    # the config file the entrypoint names is the ConfigMap's key, mounted in every Ray pod
    mount, key = argv[3].rsplit("/", 1)
    cfg = RunConfig.parse(yaml.safe_load(docs["ConfigMap"]["data"][key]))
    assert cfg.out_dir == "/runs"
    cluster = spec["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for pod in pods:
        mounts = {m["name"]: m["mountPath"] for c in pod["spec"]["containers"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        config_vol = [n for n, v in volumes.items() if v.get("configMap", {}).get("name") == docs["ConfigMap"]["metadata"]["name"]]
        assert config_vol and mounts[config_vol[0]] == mount
        runs_vol = [n for n, p in mounts.items() if p == cfg.out_dir]
        assert runs_vol and "persistentVolumeClaim" in volumes[runs_vol[0]], "the run folder must outlive the pods"
    env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert isinstance(env, dict)
    RuntimeEnv(**env)   # Ray's own validation of the runtime env's fields
