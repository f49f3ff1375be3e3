"""Manifests of the fake nodes (pure: no I/O). kwok answers for them as their kubelet.

GPU nodes look like EKS p5.48xlarge nodes (8 H100 behind the NVIDIA device plugin, 32 EFA interfaces
behind the EFA device plugin, the GPU AMI's NoSchedule taint); CPU nodes look like m5.2xlarge nodes,
untainted, where rendezvous servers and other small pods land.

GPU nodes carry EKS's network topology labels (``topology.k8s.aws/network-node-layer-1..3``, as on p5
nodes): one layer-1 and one layer-2 domain, and layer-3 blocks of ``BLOCK_SIZE`` nodes by the number in
the node's name (``gpu-node-0..2`` in ``nn-l3-0``, ``gpu-node-3..5`` in ``nn-l3-1``, ...), so the
default 4 GPU nodes form a block of 3 and a block of 1 and an added ``gpu-node-<i>`` joins block i // 3.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from llm_testbed.localcluster import marks

NodeKind = Literal["gpu", "cpu"]
REGION = "us-west-2"


@dataclass(frozen=True)
class NodeShape:
    """What an instance type offers to pods (capacity == allocatable: no reservations are modelled)."""

    instance_type: str
    cpu: str
    memory: str
    pods: str
    ephemeral_storage: str
    extended: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()

    def resources(self) -> dict[str, str]:
        return {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods,
            "ephemeral-storage": self.ephemeral_storage,
            **self.extended,
        }


P5_48XLARGE = NodeShape(
    instance_type="p5.48xlarge",
    cpu="192",
    memory="2Ti",
    pods="110",
    ephemeral_storage="28Ti",
    extended={marks.GPU_RESOURCE: "8", marks.EFA_RESOURCE: "32"},
    labels={
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "vpc.amazonaws.com/efa.present": "true",
        "karpenter.sh/capacity-type": "on-demand",
    },
    taints=({"key": marks.GPU_TAINT_KEY, "value": "true", "effect": "NoSchedule"},),
)

M5_2XLARGE = NodeShape(
    instance_type="m5.2xlarge",
    cpu="8",
    memory="32Gi",
    pods="58",
    ephemeral_storage="100Gi",
    labels={"karpenter.sh/capacity-type": "on-demand"},
)

SHAPES: dict[NodeKind, NodeShape] = {"gpu": P5_48XLARGE, "cpu": M5_2XLARGE}
GPU_ZONE = f"{REGION}a"  # EFA traffic stays in one AZ: every GPU node shares it
CPU_ZONES = (f"{REGION}a", f"{REGION}b")


def node_name(kind: NodeKind, index: int) -> str:
    """Deterministic names: ``gpu-node-0``, ``cpu-node-1``..."""
    return f"{kind}-node-{index}"


def default_zone(kind: NodeKind, index: int) -> str:
    return GPU_ZONE if kind == "gpu" else CPU_ZONES[index % len(CPU_ZONES)]


_STANDARD_NAME = re.compile(r"^(gpu|cpu)-node-(\d+)$")


def _slot(name: str) -> tuple[int, int]:
    """(kind slot, index): 0/1 for ``gpu-node-<i>``/``cpu-node-<i>``, 2 and a hash for other names."""
    m = _STANDARD_NAME.match(name)
    if m and int(m.group(2)) < 2048:
        return (0 if m.group(1) == "gpu" else 1), int(m.group(2))
    return 2, int.from_bytes(hashlib.sha256(name.encode()).digest()[:2], "big") % 2048


TOPOLOGY_LEVELS = tuple(f"topology.k8s.aws/network-node-layer-{n}" for n in (1, 2, 3))
BLOCK_LABEL = TOPOLOGY_LEVELS[-1]
BLOCK_SIZE = 3


def block_of(name: str) -> str:
    """The layer-3 block (value of ``BLOCK_LABEL``) of a GPU node, by the number in its name."""
    m = _STANDARD_NAME.match(name)
    index = int(m.group(2)) if m else _slot(name)[1]
    return f"nn-l3-{index // BLOCK_SIZE}"


def topology_labels(name: str, block: str | None = None) -> dict[str, str]:
    """EKS network topology labels of a GPU node (see the module's docstring); ``block`` overrides the
    layer-3 block that the name gives (Karpenter's nodes, named at random, share one)."""
    layer3 = block or block_of(name)
    return {TOPOLOGY_LEVELS[0]: "nn-l1-0", TOPOLOGY_LEVELS[1]: "nn-l2-0", BLOCK_LABEL: layer3}


def node_ip(name: str) -> str:
    """A stable private address per node (10.128.0.0/10), like a node's VPC address on EKS."""
    kind, index = _slot(name)
    return f"10.{128 + kind * 16 + index // 254}.0.{1 + index % 254}"


def pod_cidr(name: str) -> str:
    """A stable /24 per node (10.64.0.0/10) from which kwok gives the node's pods their IPs."""
    kind, index = _slot(name)
    return f"10.{64 + kind * 8 + index // 256}.{index % 256}.0/24"


def node_manifest(name: str, kind: NodeKind, zone: str) -> dict[str, Any]:
    """A Node object that kwok will manage, with capacity and allocatable set at creation."""
    shape = SHAPES[kind]
    resources = shape.resources()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": shape.instance_type,
                "topology.kubernetes.io/region": REGION,
                "topology.kubernetes.io/zone": zone,
                marks.NODE_ROLE_LABEL: kind,
                **shape.labels,
                **(topology_labels(name) if kind == "gpu" else {}),
            },
        },
        "spec": {
            "podCIDR": pod_cidr(name),
            "podCIDRs": [pod_cidr(name)],
            **({"taints": [dict(t) for t in shape.taints]} if shape.taints else {}),
        },
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
            "addresses": [
                {"type": "InternalIP", "address": node_ip(name)},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def cluster_nodes(gpu_nodes: int, cpu_nodes: int) -> list[dict[str, Any]]:
    """The nodes ``llmjob cluster up --nodes N --cpu-nodes M`` creates."""
    if gpu_nodes < 0 or cpu_nodes < 0:
        raise ValueError(f"node counts must be >= 0 (got --nodes {gpu_nodes}, --cpu-nodes {cpu_nodes})")
    wanted: list[tuple[NodeKind, int]] = [("gpu", gpu_nodes), ("cpu", cpu_nodes)]
    return [
        node_manifest(node_name(kind, i), kind, default_zone(kind, i))
        for kind, count in wanted
        for i in range(count)
    ]
