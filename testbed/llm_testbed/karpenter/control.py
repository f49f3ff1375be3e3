"""Set up Karpenter's objects on a cluster and change them while it runs (limits, consolidation).

The CRDs (NodePool, NodeClaim, NodeOverlay, CapacityBuffer and the kwok provider's KWOKNodeClass) are
the pinned module's own, copied into the tool's cache folder when ``llmjob tools build karpenter`` ran.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from llm_testbed.karpenter import manifests
from llm_testbed.karpenter.manifests import ConsolidationPolicy, PoolSettings
from llm_testbed.localcluster import nodes, tools
from llm_testbed.localcluster.kubectl import Kubectl

CRD_TIMEOUT_S = 60
NODEPOOL_LABEL = "karpenter.sh/nodepool"


def crds() -> list[dict[str, Any]]:
    folder = tools.files_dir("karpenter", "crds")
    return [yaml.safe_load(path.read_text()) for path in sorted(folder.glob("*.yaml"))]


def install(
    kube: Kubectl,
    pools: Mapping[nodes.NodeKind, PoolSettings],
    *,
    registration_delay: str = "0s",
) -> None:
    """Apply the CRDs (and wait until they are served), create the KWOKNodeClass and one NodePool per
    entry; objects that exist already are left as they are (a resumed cluster keeps its limits)."""
    definitions = crds()
    kube.apply(definitions)
    names = [f"crd/{d['metadata']['name']}" for d in definitions]
    kube.run("wait", "--for=condition=Established", f"--timeout={CRD_TIMEOUT_S}s", *names,
             timeout=CRD_TIMEOUT_S + 10)  # fmt: skip
    kube.create(manifests.node_class(registration_delay))
    for kind, settings in pools.items():
        kube.create(manifests.node_pool(kind, settings))


def reset_pools(kube: Kubectl, pools: Mapping[nodes.NodeKind, PoolSettings] | None = None) -> None:
    """Put the NodePools back as ``pools`` (default: both with default settings) describe them."""
    wanted = pools or manifests.default_pools()
    for kind, settings in wanted.items():
        kube.run("replace", "-f", "-", input=json.dumps(manifests.node_pool(kind, settings)))


def _kind(pool: str) -> nodes.NodeKind:
    for kind in nodes.SHAPES:
        if kind == pool:
            return kind
    raise manifests.KarpenterError(
        f"pool: unknown NodePool {pool!r}; the test bed's are {', '.join(nodes.SHAPES)}"
    )


def set_node_limit(kube: Kubectl, pool: str, limit: int | None) -> None:
    """At most ``limit`` nodes in a NodePool (None removes ``spec.limits``); Karpenter acts on it at once.

    Sets ``nodes`` and the pool's per-node resource (:data:`manifests.COUNTED_RESOURCE`) in one patch."""
    if limit is not None and limit < 0:
        raise manifests.KarpenterError(f"limit: must be >= 0 (got {limit})")
    kube.patch("nodepool", pool, {"spec": {"limits": manifests.limits(_kind(pool), limit)}})


def set_consolidation(kube: Kubectl, pool: str, policy: ConsolidationPolicy, after: str) -> None:
    """``spec.disruption`` of a NodePool: its consolidation policy and ``consolidateAfter``."""
    PoolSettings(consolidation_policy=policy, consolidate_after=after)  # validates
    kube.patch("nodepool", pool, {"spec": {"disruption": manifests.disruption(policy, after)}})


def nodeclaims(kube: Kubectl) -> list[dict[str, Any]]:
    return kube.items("nodeclaims.karpenter.sh")


def managed_nodes(kube: Kubectl, pool: str | None = None) -> list[dict[str, Any]]:
    """The nodes Karpenter launched (of one pool, or of every pool)."""
    selector = f"{NODEPOOL_LABEL}={pool}" if pool else NODEPOOL_LABEL
    return kube.items("nodes", labels=selector)
