"""``llmjob chaos`` node verbs with their real meaning on kubelet nodes (``localcluster.chaos`` calls these
when the node is one of the cluster's kubelet nodes).

- ``node-not-ready``: the kubelet process stops; containerd and the containers run on (a partition). The
  node lifecycle controller notices the missing heartbeats, marks the node NotReady/Unknown and taints it.
- ``node-ready``: the kubelet runs again and reports the node Ready.
- ``delete-node``: kubelet, containerd, shims and containers are SIGKILLed at once, the node's files go,
  then the Node object (an instance that terminated).
- ``add-node``: a new kubelet node joins.
"""

from __future__ import annotations

import time
from pathlib import Path

from llm_testbed.kubeletnodes.tier import KubeletTier, is_kubelet_cluster
from llm_testbed.localcluster import nodes
from llm_testbed.localcluster.kubectl import Kubectl
from llm_testbed.localcluster.waiting import poll


def tier_of(kube: Kubectl) -> KubeletTier | None:
    """The kubelet tier of the cluster ``kube`` talks to (its kubeconfig lies in the cluster's folder)."""
    if kube.kubeconfig is None:
        return None
    cluster_dir = Path(kube.kubeconfig).resolve().parent
    return KubeletTier(cluster_dir, kube) if is_kubelet_cluster(cluster_dir) else None


def owns(tier: KubeletTier | None, node: str) -> bool:
    return tier is not None and node in tier.node_names()


def node_not_ready(tier: KubeletTier, node: str, *, wait: bool, timeout: float) -> float:
    """Stop the node's kubelet; with ``wait``, until the node lifecycle controller has tainted the node."""
    from llm_testbed.localcluster.chaos import LOST_NODE_TAINTS

    died_at = time.time()
    tier.stop_kubelet(node)
    if wait:

        def tainted() -> bool:
            obj = tier.kube.get("node", node) or {}
            keys = {t["key"] for t in obj.get("spec", {}).get("taints", []) or []}
            return bool(keys & set(LOST_NODE_TAINTS))

        poll(tainted, timeout=timeout, what=f"node {node} to be tainted not-ready/unreachable", interval=0.2)
    return died_at


def node_ready(tier: KubeletTier, node: str, *, wait: bool, timeout: float) -> None:
    tier.start_kubelet(node)
    if wait:
        tier.wait_ready(node, timeout=timeout)


def delete_node(tier: KubeletTier, node: str, *, wait: bool, timeout: float) -> None:
    tier.kill_node(node)
    tier.kube.run(
        "delete", "node", node, "--ignore-not-found", f"--wait={'true' if wait else 'false'}",
        f"--timeout={int(timeout)}s", timeout=timeout + 10,
    )  # fmt: skip


def add_node(
    tier: KubeletTier, name: str, kind: nodes.NodeKind, zone: str, *, wait: bool, timeout: float
) -> str:
    tier.add_node(name, kind, zone, wait=False)
    if wait:
        tier.wait_ready(name, timeout=timeout)
    return name
