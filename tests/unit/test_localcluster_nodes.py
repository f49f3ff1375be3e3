"""nodes.py: the fake nodes look like EKS p5.48xlarge / m5.2xlarge nodes."""

from __future__ import annotations

import pytest
from llm_testbed.localcluster import marks, nodes


def test_gpu_node_is_p5_shaped() -> None:
    node = nodes.node_manifest("gpu-node-0", "gpu", "us-west-2a")
    labels = node["metadata"]["labels"]
    assert labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert labels["topology.kubernetes.io/zone"] == "us-west-2a"
    assert labels["type"] == "kwok"
    assert labels[marks.NODE_ROLE_LABEL] == "gpu"
    for field in ("capacity", "allocatable"):
        resources = node["status"][field]
        assert resources[marks.GPU_RESOURCE] == "8"
        assert resources[marks.EFA_RESOURCE] == "32"
        assert (resources["cpu"], resources["memory"], resources["pods"]) == ("192", "2Ti", "110")
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    assert node["spec"]["podCIDR"] == nodes.pod_cidr("gpu-node-0")
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_cpu_node_has_no_gpu_and_no_taint() -> None:
    node = nodes.node_manifest("cpu-node-0", "cpu", "us-west-2b")
    assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "m5.2xlarge"
    assert marks.GPU_RESOURCE not in node["status"]["allocatable"]
    assert "taints" not in node["spec"]
    assert node["spec"]["podCIDRs"] == [node["spec"]["podCIDR"]]


def test_cluster_nodes_counts_names_and_zones() -> None:
    made = nodes.cluster_nodes(3, 2)
    names = [n["metadata"]["name"] for n in made]
    assert names == ["gpu-node-0", "gpu-node-1", "gpu-node-2", "cpu-node-0", "cpu-node-1"]
    gpu_zones = {n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in made[:3]}
    assert gpu_zones == {nodes.GPU_ZONE}, "EFA: every GPU node in one AZ"
    cpu_zones = [n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in made[3:]]
    assert cpu_zones == list(nodes.CPU_ZONES)


def test_node_ips_and_pod_ranges_are_stable_and_distinct() -> None:
    names = [nodes.node_name(kind, i) for kind in ("gpu", "cpu") for i in range(32)]
    ips = [nodes.node_ip(n) for n in names]
    cidrs = [nodes.pod_cidr(n) for n in names]
    assert len(set(ips)) == len(ips)
    assert len(set(cidrs)) == len(cidrs)
    assert not {c.rsplit(".", 1)[0] for c in cidrs} & {ip.rsplit(".", 1)[0] for ip in ips}
    assert nodes.node_ip("gpu-node-0") == nodes.node_ip("gpu-node-0")
    assert all(ip.startswith("10.") for ip in ips)


def test_negative_counts_are_rejected() -> None:
    with pytest.raises(ValueError, match="node counts must be >= 0"):
        nodes.cluster_nodes(-1, 2)


def test_gpu_nodes_carry_eks_topology_labels_in_blocks() -> None:
    made = nodes.cluster_nodes(5, 1)
    blocks = [n["metadata"]["labels"].get(nodes.BLOCK_LABEL) for n in made]
    assert blocks == ["nn-l3-0", "nn-l3-0", "nn-l3-0", "nn-l3-1", "nn-l3-1", None]
    labels = made[0]["metadata"]["labels"]
    assert all(level in labels for level in nodes.TOPOLOGY_LEVELS)
    assert nodes.block_of("gpu-node-7") == "nn-l3-2"
