"""spec.podTemplate on the local control plane: workers with a ServiceAccount (its token mounted), a second
volume and a native sidecar, through a node loss.

The nodes are kwok's fake p5.48xlarge nodes (the local pod runner does not run init containers): the
apiserver's admission mounts the ServiceAccount token, kwok reports the sidecar running, and the test
checks the lost worker is replaced with the same pod settings while its sidecar never holds it up.
"""

from __future__ import annotations

from typing import Any

import pytest
from llm_testbed.localcluster import chaos

from tests.support.wait import wait_for

from .kube_helpers import apply, running_workers, workers
from .test_elasticity import TIMEOUT, pod_named, replaced, start, status_when

pytestmark = pytest.mark.cluster
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
POD_TEMPLATE = {
    "metadata": {"labels": {"cost-center": "research"}, "annotations": {"sidecar.istio.io/inject": "false"}},
    "spec": {
        "serviceAccountName": "trainer-s3",
        "volumes": [{"name": "settings", "configMap": {"name": "trainer-settings"}}],
        "initContainers": [
            {"name": "log-shipper", "image": "fluent/fluent-bit:3.0", "restartPolicy": "Always"}
        ],
        "containers": [
            {"name": "trainer", "volumeMounts": [{"name": "settings", "mountPath": "/etc/trainer"}]}
        ],
    },
}


def _check_pod_settings(pod: dict[str, Any]) -> None:
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "trainer-s3"
    assert pod["metadata"]["labels"]["cost-center"] == "research"
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    (trainer,) = spec["containers"]
    mounts = {m["mountPath"]: m["name"] for m in trainer["volumeMounts"]}
    assert mounts["/etc/trainer"] == "settings" and mounts["/dev/shm"] == "dshm"
    assert mounts[TOKEN_PATH].startswith("kube-api-access-"), "the ServiceAccount token is mounted"
    assert [c["name"] for c in spec["initContainers"]] == ["log-shipper"]
    assert spec["initContainers"][0]["restartPolicy"] == "Always"


def _sidecar_running(pod: dict[str, Any]) -> bool:
    states = pod.get("status", {}).get("initContainerStatuses") or []
    return any(s["name"] == "log-shipper" and "running" in (s.get("state") or {}) for s in states)


def test_service_account_volume_and_sidecar_through_a_node_loss(
    cluster: Any, namespace: str, operator: Any
) -> None:
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "trainer-s3", "namespace": namespace},
    }
    settings = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "trainer-settings", "namespace": namespace},
        "data": {"optimizer": "adamw"},
    }
    for doc in (account, settings):
        assert apply(cluster, doc).returncode == 0
    pods = start(cluster, namespace, 3, replicas=3, podTemplate=POD_TEMPLATE)
    for pod in pods:
        _check_pod_settings(pod)
    wait_for(
        lambda: all(_sidecar_running(p) for p in running_workers(cluster, namespace, "llama")),
        TIMEOUT,
        "every worker's sidecar running",
    )
    victim = pod_named(pods, "-worker-1")
    chaos.node_not_ready(victim["spec"]["nodeName"], kube=cluster.kube, wait=False)
    now = wait_for(replaced(cluster, namespace, victim), TIMEOUT, "lost worker replaced, sidecar and all")
    assert victim["spec"]["nodeName"] not in {p["spec"]["nodeName"] for p in now}
    st = status_when(cluster, namespace, "Running at 3 again", phase="Running", readyReplicas=3)
    assert st["restarts"] == 1
    for pod in workers(cluster, namespace, "llama"):
        if not pod["metadata"].get("deletionTimestamp"):
            _check_pod_settings(pod)
    assert all(_sidecar_running(p) for p in running_workers(cluster, namespace, "llama"))
