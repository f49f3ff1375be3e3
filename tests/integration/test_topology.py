"""Topology-aware placement without Kueue: the real kube-scheduler on 4 fake p5 nodes in two layer-3
blocks (``nn-l3-0``: gpu-node-0..2, ``nn-l3-1``: gpu-node-3; llm_testbed.localcluster.nodes).

A 2-worker job lands in the 3-node block; a lost worker's replacement goes to that block's free node,
not to the free node of the other block; when the block is full the mode's fallback happens
(required: wait, shrink after the pending timeout, grow back into the block; preferred: spread with a
Warning Event). The Kueue path is in test_kueue.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from llm_testbed.localcluster import chaos, nodes

from tests.support.wait import wait_for

from .kube_helpers import apply, job_manifest, live_workers, status, wait_events

pytestmark = pytest.mark.cluster
TIMEOUT = 60
HOME = "nn-l3-0"
OTHER = "nn-l3-1"
OTHER_NODE = "gpu-node-3"


def topology_job(namespace: str, mode: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("gpusPerNode", 8)
    topology = {"key": nodes.BLOCK_LABEL, "mode": mode}
    spec["scheduling"] = {"instanceTypes": ["p5.48xlarge"], "topology": topology}
    spec.setdefault("minReplicas", 1)
    spec.setdefault("maxReplicas", 2)
    return job_manifest("llama", namespace, **spec)


def wait_gpus_free(cluster: Any) -> None:
    def free() -> bool:
        pods = cluster.kube.items("pods", all_namespaces=True, labels="elasticllm.dev/role=worker")
        return not [p for p in pods if p["spec"].get("nodeName", "").startswith("gpu-")]

    wait_for(free, TIMEOUT, "GPU nodes free of earlier workers")


def running(cluster: Any, namespace: str, size: int) -> list[dict[str, Any]] | None:
    """The Running, ready workers once the job runs exactly ``size`` of them (None before)."""
    s = status(cluster, namespace, "llama")
    pods = [
        p for p in live_workers(cluster, namespace, "llama") if p.get("status", {}).get("phase") == "Running"
    ]
    return pods if s.get("phase") == "Running" and s.get("readyReplicas") == size == len(pods) else None


def blocks(pods: list[dict[str, Any]]) -> list[str]:
    return sorted(nodes.block_of(p["spec"]["nodeName"]) for p in pods)


def lose(cluster: Any, pod: dict[str, Any]) -> str:
    node: str = pod["spec"]["nodeName"]
    chaos.node_not_ready(node, kube=cluster.kube, wait=False)
    return node


def test_required_block_replacement_shrink_and_growth(cluster: Any, namespace: str, operator: Any) -> None:
    wait_gpus_free(cluster)
    policy = {"nodeFailureGraceSeconds": 0, "resizeCooldownSeconds": 0, "pendingTimeoutSeconds": 3}
    spec = {"failurePolicy": policy}
    assert apply(cluster, topology_job(namespace, "required", **spec)).returncode == 0
    first = wait_for(lambda: running(cluster, namespace, 2), TIMEOUT, "job Running at 2")
    assert blocks(first) == [HOME, HOME], "the first workers share the block with room for both"
    topo = status(cluster, namespace, "llama")["topology"]
    assert topo == {
        "key": nodes.BLOCK_LABEL,
        "domain": HOME,
        "domains": [{"name": HOME, "workers": 2}],
        "spread": False,
    }
    # A loss: the replacement takes the block's free node, not gpu-node-3 (free, other block).
    lost = lose(cluster, first[0])

    def replaced() -> list[dict[str, Any]] | None:
        pods = running(cluster, namespace, 2)
        return pods if pods and lost not in {p["spec"]["nodeName"] for p in pods} else None

    second = wait_for(replaced, TIMEOUT, "the lost worker replaced")
    assert blocks(second) == [HOME, HOME]
    # Another loss: the block is full (two nodes lost, one survivor). The replacement waits there,
    # then the job shrinks to what runs (pendingTimeoutSeconds 3) and does not grow into gpu-node-3.
    lose(cluster, second[0])

    def shrunk() -> dict[str, Any] | None:
        s = status(cluster, namespace, "llama")
        return s if s.get("targetReplicas") == 1 and s.get("phase") == "Running" else None

    st = wait_for(shrunk, TIMEOUT, "job shrunk to 1 in the full block")
    assert st["topology"]["domains"] == [{"name": HOME, "workers": 1}]
    wait_events(cluster, namespace, "Shrunk")
    assert OTHER_NODE not in {p["spec"].get("nodeName") for p in live_workers(cluster, namespace, "llama")}
    # Growth: a node of the block comes back; the job grows into it (gpu-node-3 stayed free all along).
    chaos.node_ready(lost, kube=cluster.kube)
    grown = wait_for(lambda: running(cluster, namespace, 2), TIMEOUT, "job grown back to 2")
    assert blocks(grown) == [HOME, HOME]
    wait_events(cluster, namespace, "Grown")  # grew by the sizing rule


def test_preferred_spreads_with_a_warning_when_the_block_is_full(
    cluster: Any, namespace: str, operator: Any
) -> None:
    wait_gpus_free(cluster)
    doc = topology_job(namespace, "preferred", minReplicas=1, maxReplicas=3)
    assert apply(cluster, doc).returncode == 0
    first = wait_for(lambda: running(cluster, namespace, 3), TIMEOUT, "job Running at 3")
    assert blocks(first) == [HOME, HOME, HOME]
    lose(cluster, first[0])  # the block's three nodes: two used, one lost

    def spread() -> list[dict[str, Any]] | None:
        pods = running(cluster, namespace, 3)
        return pods if pods and OTHER in blocks(pods) else None

    assert blocks(wait_for(spread, TIMEOUT, "the replacement placed in the other block")) == [
        HOME,
        HOME,
        OTHER,
    ]

    def spread_status() -> dict[str, Any] | None:
        topo: dict[str, Any] = status(cluster, namespace, "llama").get("topology") or {}
        return topo if topo.get("spread") else None

    topo = wait_for(spread_status, TIMEOUT, "status.topology.spread")
    assert topo["domains"] == [{"name": HOME, "workers": 2}, {"name": OTHER, "workers": 1}]
    warnings = wait_events(cluster, namespace, "TopologySpread")
    assert warnings[0]["type"] == "Warning" and nodes.BLOCK_LABEL in warnings[0]["message"]
