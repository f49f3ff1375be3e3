"""The KWOKNodeClass and NodePools of the test bed's Karpenter (pure: no I/O).

Two NodePools, one per node kind, so each launches nodes that look like the static fake nodes of that
kind (:mod:`llm_testbed.localcluster.nodes`): the labels and taints that EKS's GPU AMI and device plugins
put on a node come from the pool's template, the instance type, zone and capacity type from the
offering Karpenter picked (:mod:`.catalog`).

- ``gpu``: ``p5.48xlarge``, tainted ``nvidia.com/gpu=true:NoSchedule``, GPU/EFA labels and the EKS
  network topology labels (every Karpenter node in one layer-3 block, ``BLOCK``);
- ``cpu``: ``m5.2xlarge``, untainted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from llm_testbed.karpenter import catalog
from llm_testbed.localcluster import marks, nodes
from llm_testbed.localcluster.errors import LocalClusterError

API = "karpenter.sh/v1"
NODE_CLASS_API = "karpenter.kwok.sh/v1alpha1"
NODE_CLASS = "default"
GPU_POOL = "gpu"
CPU_POOL = "cpu"
BLOCK = "nn-l3-karpenter"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ConsolidationPolicy = Literal["WhenEmpty", "WhenEmptyOrUnderutilized"]
CONSOLIDATION_POLICIES: tuple[str, ...] = get_args(ConsolidationPolicy)


class KarpenterError(LocalClusterError):
    """Karpenter could not be set up or started; the message says what failed."""


@dataclass(frozen=True)
class PoolSettings:
    """What a test or a user may change in a NodePool (also at run time: :mod:`.control`)."""

    node_limit: int | None = None
    """``spec.limits.nodes``: at most this many nodes of the pool (None: no limit)."""
    capacity_types: tuple[str, ...] = ("on-demand",)
    """``karpenter.sh/capacity-type`` values the pool may launch (spot is cheaper: it wins when allowed)."""
    consolidation_policy: ConsolidationPolicy = "WhenEmpty"
    consolidate_after: str = "30s"
    """How long a node must stay empty (or underused) before consolidation removes it, or ``Never``."""

    def __post_init__(self) -> None:
        if self.node_limit is not None and self.node_limit < 0:
            raise KarpenterError(f"node_limit: must be >= 0 (got {self.node_limit})")
        unknown = [c for c in self.capacity_types if c not in catalog.CAPACITY_TYPES]
        if unknown or not self.capacity_types:
            allowed = ", ".join(catalog.CAPACITY_TYPES)
            raise KarpenterError(f"capacity_types: use one or more of {allowed} (got {unknown or 'none'})")
        if self.consolidation_policy not in CONSOLIDATION_POLICIES:
            allowed = " or ".join(CONSOLIDATION_POLICIES)
            raise KarpenterError(f"consolidation_policy: use {allowed} (got {self.consolidation_policy!r})")


def default_pools() -> dict[nodes.NodeKind, PoolSettings]:
    """One pool per node kind, each with the default settings."""
    return {kind: PoolSettings() for kind in nodes.SHAPES}


def node_class(registration_delay: str = "0s") -> dict[str, Any]:
    """The KWOKNodeClass both pools use; ``registration_delay`` models an instance's boot time."""
    return {
        "apiVersion": NODE_CLASS_API,
        "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_CLASS},
        "spec": {"nodeRegistrationDelay": registration_delay},
    }


# Karpenter v1.15.0 enforces ``limits.nodes`` between provisioning batches only: inside one batch it
# subtracts each new node's instance capacity from what the limits leave, and that capacity has no "nodes"
# entry, so one batch of N pods launched N nodes under a limit of 1 (seen in the test bed). A limit on a
# resource every node of the pool has holds inside a batch too: a node limit is written as both.
COUNTED_RESOURCE: dict[nodes.NodeKind, str] = {"gpu": marks.GPU_RESOURCE, "cpu": "cpu"}


def limits(kind: nodes.NodeKind, node_limit: int | None) -> dict[str, str] | None:
    """``spec.limits`` of at most ``node_limit`` nodes of ``kind`` (None: no limit)."""
    if node_limit is None:
        return None
    resource = COUNTED_RESOURCE[kind]
    per_node = int(nodes.SHAPES[kind].resources()[resource])
    return {"nodes": str(node_limit), resource: str(node_limit * per_node)}


def disruption(policy: ConsolidationPolicy, after: str) -> dict[str, str]:
    return {"consolidationPolicy": policy, "consolidateAfter": after}


def template_labels(kind: nodes.NodeKind) -> dict[str, str]:
    """What the static fake nodes of ``kind`` carry beyond what Karpenter sets itself."""
    shape = nodes.SHAPES[kind]
    labels = {
        "type": "kwok",
        "topology.kubernetes.io/region": nodes.REGION,
        marks.NODE_ROLE_LABEL: kind,
        **{k: v for k, v in shape.labels.items() if k != catalog.CAPACITY_TYPE_LABEL},
    }
    if kind == "gpu":
        labels.update(nodes.topology_labels("", block=BLOCK))
    return labels


def _within(key: str, values: list[str]) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": values}


def node_pool(kind: nodes.NodeKind, settings: PoolSettings | None = None) -> dict[str, Any]:
    """The NodePool of one node kind (named after it)."""
    s = settings or PoolSettings()
    shape = nodes.SHAPES[kind]
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"labels": template_labels(kind)},
            "spec": {
                "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": NODE_CLASS},
                "requirements": [
                    _within(INSTANCE_TYPE_LABEL, [shape.instance_type]),
                    _within(catalog.CAPACITY_TYPE_LABEL, list(s.capacity_types)),
                ],
                **({"taints": [dict(t) for t in shape.taints]} if shape.taints else {}),
            },
        },
        "disruption": disruption(s.consolidation_policy, s.consolidate_after),
    }
    pool_limits = limits(kind, s.node_limit)
    if pool_limits is not None:
        spec["limits"] = pool_limits
    return {"apiVersion": API, "kind": "NodePool", "metadata": {"name": kind}, "spec": spec}
