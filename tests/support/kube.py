"""Small builders and probes for tests that talk to the local cluster."""

from __future__ import annotations

import json
from typing import Any

from llm_testbed.localcluster import marks
from llm_testbed.localcluster.chaos import condition
from llm_testbed.localcluster.cluster import LocalCluster

GPU_TOLERATION = {"key": marks.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def pod_manifest(
    name: str,
    *,
    gpus: int = 0,
    efa: int = 0,
    node: str | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A one-container pod; ``gpus``/``efa`` become limits, ``node`` pins it by hostname label."""
    limits = {k: str(v) for k, v in ((marks.GPU_RESOURCE, gpus), (marks.EFA_RESOURCE, efa)) if v}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "containers": [{"name": "main", "image": "busybox:1.36", "resources": {"limits": limits}}],
        "tolerations": tolerations if tolerations is not None else [GPU_TOLERATION],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def create(cluster: LocalCluster, namespace: str, obj: dict[str, Any]) -> None:
    cluster.kubectl("create", "--namespace", namespace, "-f", "-", input=json.dumps(obj))


def get_pod(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    return cluster.kube.get("pod", name, namespace)


def pod_running_ready(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod once it is Running, Ready and has an IP; ``None`` before."""
    pod = get_pod(cluster, namespace, name)
    if pod is None:
        return None
    status = pod.get("status", {})
    ok = status.get("phase") == "Running" and condition(pod, "Ready") == "True" and status.get("podIP")
    return pod if ok else None


def node(cluster: LocalCluster, name: str) -> dict[str, Any] | None:
    return cluster.kube.get("node", name)
