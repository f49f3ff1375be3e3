"""Real Karpenter (the kwok provider of the upstream core) on a run-pods local cluster.

The loop an autoscaled EKS cluster lives on: a Pending GPU pod makes Karpenter launch a p5.48xlarge node,
kwok-controller makes that node Ready like every fake node, the pod runner runs the pod on it, and once
the pod is gone Karpenter's consolidation removes the empty node.

The pod belongs to a Deployment of one, as every real workload's pod has an owner: a node Karpenter launches
starts with its ``karpenter.sh/unregistered:NoExecute`` taint, and when the scheduler binds the pod right
after Karpenter removed it, kube-controller-manager's taint-eviction controller may still see the taint and
delete the pod (CI, 2026-12-07: "Deleting pod" 16 ms after "registered nodeclaim"). An owner replaces it,
on the same node; a bare pod was simply gone and the test waited for it in vain.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from llm_testbed.karpenter import GPU_POOL, control
from llm_testbed.localcluster import chaos, marks, nodes
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.localcluster.kubectl import Kubectl
from support.wait import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.tools("karpenter"), pytest.mark.timeout(300)]

LAUNCH_TIMEOUT_S = 120.0
CONSOLIDATION_TIMEOUT_S = 120.0
GREETING = "training worker started"


def _gpu_deployment(name: str) -> dict[str, Any]:
    """One GPU pod, owned by a Deployment (see the module's docstring)."""
    request = {marks.GPU_RESOURCE: "8", marks.EFA_RESOURCE: "32", "cpu": "1", "memory": "1Gi"}
    labels = {"app": name}
    pod_spec = {
        "terminationGracePeriodSeconds": 5,
        "tolerations": [{"key": marks.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "main",
                "image": "python:3.11",
                "command": ["python", "-u", "-c", f"import time; print({GREETING!r}); time.sleep(3600)"],
                "resources": {"requests": request, "limits": request},
            }
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def _pods(kube: Kubectl, ns: str, app: str) -> list[dict[str, Any]]:
    """The app's pods that are not being deleted."""
    found = kube.items("pods", labels=f"app={app}", namespace=ns)
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


class Milestones:
    """When each step of the launch was first seen (seconds after the pod was created)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.seen: dict[str, float] = {}

    def mark(self, name: str, reached: bool) -> bool:
        if reached and name not in self.seen:
            self.seen[name] = time.monotonic() - self.start
        return name in self.seen


def test_gpu_pod_gets_a_p5_node_and_the_empty_node_is_consolidated(
    karpenter_cluster: LocalCluster, karpenter_namespace: str
) -> None:
    kube = karpenter_cluster.kube
    ns = karpenter_namespace
    assert not control.managed_nodes(kube), "the test starts with no Karpenter node"
    control.set_consolidation(kube, GPU_POOL, "WhenEmpty", "1s")

    karpenter_cluster.kubectl(
        "create", "--namespace", ns, "-f", "-", input=json.dumps(_gpu_deployment("worker"))
    )
    t = Milestones()

    def launched() -> dict[str, Any] | None:
        t.mark("nodeclaim", bool(control.nodeclaims(kube)))
        gpu_nodes = control.managed_nodes(kube, GPU_POOL)
        t.mark("node", bool(gpu_nodes))
        t.mark("node Ready", any(chaos.is_ready(n) for n in gpu_nodes))
        pods = _pods(kube, ns, "worker")
        t.mark("pod bound", any(p["spec"].get("nodeName") for p in pods))
        running = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
        return running[0] if t.mark("pod Running", bool(running)) else None

    pod = wait_for(launched, LAUNCH_TIMEOUT_S, "Karpenter to launch a node and the pod to run there")
    assert len(control.nodeclaims(kube)) == 1, "one node for one pod"
    node_name = pod["spec"]["nodeName"]
    node = kube.get("node", node_name)
    assert node is not None
    labels = node["metadata"]["labels"]
    assert labels["node.kubernetes.io/instance-type"] == nodes.P5_48XLARGE.instance_type
    assert labels["karpenter.sh/nodepool"] == GPU_POOL
    assert labels["karpenter.sh/capacity-type"] == "on-demand"
    assert labels["topology.kubernetes.io/zone"] == nodes.GPU_ZONE
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels[marks.NODE_ROLE_LABEL] == "gpu"
    assert all(level in labels for level in nodes.TOPOLOGY_LEVELS)
    taints = {(x["key"], x.get("value"), x["effect"]) for x in node["spec"].get("taints", [])}
    assert (marks.GPU_TAINT_KEY, "true", "NoSchedule") in taints
    allocatable = node["status"]["allocatable"]
    assert allocatable[marks.GPU_RESOURCE] == "8" and allocatable[marks.EFA_RESOURCE] == "32"
    # The pod runner really runs it: its process wrote to the container's log.
    log = karpenter_cluster.pod_log(ns, pod["metadata"]["name"], "main")
    wait_for(lambda: log.is_file() and GREETING in log.read_text(), timeout=30, what="the worker's output")

    karpenter_cluster.kubectl("delete", "deployment", "worker", "--namespace", ns, "--wait=false")
    gone_from = time.monotonic()
    wait_for(
        lambda: kube.get("node", node_name) is None and not control.nodeclaims(kube),
        timeout=CONSOLIDATION_TIMEOUT_S,
        what=f"consolidation to remove the empty node {node_name} and its NodeClaim",
    )
    steps = ", ".join(f"{name} +{at:.1f}s" for name, at in t.seen.items())
    removed = time.monotonic() - gone_from
    print(f"\nkarpenter launch: {steps}; empty node removed {removed:.1f}s after the workload's delete")
