"""The Karpenter v1 examples in deploy/examples/karpenter/ say what docs/platform.md says they do.

Real Karpenter's API server accepts the NodePools (tests/integration/test_karpenter_elastic.py); this checks
the choices the docs rest on, which no schema holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "deploy" / "examples" / "karpenter"
NODEPOOL = ("karpenter.sh/v1", "NodePool")
NODECLASS = ("karpenter.k8s.aws/v1", "EC2NodeClass")


def _objects() -> list[dict[str, Any]]:
    return [d for path in sorted(FOLDER.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


def _of(kind: tuple[str, str]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in _objects() if (o["apiVersion"], o["kind"]) == kind}


def _requirement(pool: dict[str, Any], key: str) -> list[str]:
    found = [r["values"] for r in pool["spec"]["template"]["spec"]["requirements"] if r["key"] == key]
    return found[0] if found else []


def _gpu(pool: dict[str, Any]) -> bool:
    return "nvidia.com/gpu" in pool["spec"].get("limits", {}) or any(
        t.startswith("p") for t in _requirement(pool, "node.kubernetes.io/instance-type")
    )


def test_the_folder_holds_a_gpu_and_a_cpu_pool_each_with_its_node_class() -> None:
    pools, classes = _of(NODEPOOL), _of(NODECLASS)
    assert set(pools) == {"gpu-training", "cpu-system"}
    for name, pool in pools.items():
        ref = pool["spec"]["template"]["spec"]["nodeClassRef"]
        assert (ref["group"], ref["kind"]) == ("karpenter.k8s.aws", "EC2NodeClass"), name
        assert ref["name"] in classes, f"{name} names EC2NodeClass {ref['name']}, which the folder lacks"


@pytest.mark.parametrize("name", ["gpu-training"])
def test_a_training_pool_never_expires_its_nodes_and_never_consolidates_a_busy_one(name: str) -> None:
    """Expiry is forceful in Karpenter v1 (do-not-disrupt does not hold it): a training node must not have
    an age limit, or the operator moves a worker off every node that reaches it."""
    pool = _of(NODEPOOL)[name]
    spec = pool["spec"]["template"]["spec"]
    assert _gpu(pool)
    assert spec["expireAfter"] == "Never"
    assert pool["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in spec["taints"]
    assert "terminationGracePeriod" not in spec, "a drained worker keeps its own grace (docs/platform.md)"


def test_a_reservation_selector_comes_with_the_reserved_capacity_type() -> None:
    pools, classes = _of(NODEPOOL), _of(NODECLASS)
    for pool in pools.values():
        node_class = classes[pool["spec"]["template"]["spec"]["nodeClassRef"]["name"]]
        if node_class["spec"].get("capacityReservationSelectorTerms"):
            assert "reserved" in _requirement(pool, "karpenter.sh/capacity-type"), pool["metadata"]["name"]


def test_the_gpu_node_class_is_ready_for_efa() -> None:
    """Two security groups (the nodes' and EFA's self-referencing one) reach every EFA interface Karpenter
    attaches; the AMI alias lets Karpenter take the NVIDIA variant."""
    node_class = _of(NODECLASS)["gpu-training"]["spec"]
    assert len(node_class["securityGroupSelectorTerms"]) == 2
    assert node_class["amiSelectorTerms"][0]["alias"].startswith("al2023@")
    assert node_class["capacityReservationSelectorTerms"]


def test_the_cpu_pool_takes_no_gpu_work_and_keeps_rendezvous_servers_in_place() -> None:
    pool = _of(NODEPOOL)["cpu-system"]
    assert not _gpu(pool) and not pool["spec"]["template"]["spec"].get("taints")
    assert pool["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert _requirement(pool, "karpenter.sh/capacity-type") == ["on-demand"]
