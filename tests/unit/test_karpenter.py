"""The test bed's Karpenter, without a cluster: catalog, NodePools, process options, tool group."""

from __future__ import annotations

from pathlib import Path

import pytest
from llm_testbed.karpenter import catalog, control, daemon, manifests
from llm_testbed.karpenter.manifests import KarpenterError, PoolSettings
from llm_testbed.localcluster import marks, nodes, tools
from llm_testbed.localcluster.cli import build_parser
from llm_testbed.localcluster.kubectl import Kubectl

# What Karpenter puts on every node it launches itself (from the NodeClaim and the chosen offering).
SET_BY_KARPENTER = {
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/zone",
    catalog.CAPACITY_TYPE_LABEL,
}


def _entry(name: str) -> dict[str, object]:
    return next(t for t in catalog.instance_types() if t["name"] == name)


def test_p5_entry_is_an_eks_p5_node_offered_on_demand_and_spot_in_the_gpu_zone() -> None:
    p5 = _entry("p5.48xlarge")
    assert p5["resources"] == {
        "cpu": "192", "memory": "2Ti", "pods": "110", "ephemeral-storage": "28Ti",
        marks.GPU_RESOURCE: "8", marks.EFA_RESOURCE: "32",
    }  # fmt: skip
    offered = {
        tuple(r["values"][0] for r in o["Requirements"])  # type: ignore[index]
        for o in p5["offerings"]  # type: ignore[attr-defined]
    }
    assert offered == {("on-demand", nodes.GPU_ZONE), ("spot", nodes.GPU_ZONE)}


def test_spot_is_cheaper_and_cpu_nodes_come_in_both_cpu_zones() -> None:
    for name, prices in catalog.PRICES.items():
        assert prices["spot"] < prices["on-demand"], name
    zones = {o["Requirements"][1]["values"][0] for o in _entry("m5.2xlarge")["offerings"]}  # type: ignore[attr-defined]
    assert zones == set(nodes.CPU_ZONES)


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_karpenter_nodes_carry_every_label_and_taint_of_the_static_fake_nodes(kind: nodes.NodeKind) -> None:
    pool = manifests.node_pool(kind)
    static = nodes.node_manifest(nodes.node_name(kind, 0), kind, nodes.default_zone(kind, 0))
    template = pool["spec"]["template"]
    assert set(static["metadata"]["labels"]) <= set(template["metadata"]["labels"]) | SET_BY_KARPENTER
    assert template["spec"].get("taints", []) == static["spec"].get("taints", [])
    [instance] = [r for r in template["spec"]["requirements"] if r["key"] == manifests.INSTANCE_TYPE_LABEL]
    assert instance["values"] == [static["metadata"]["labels"][manifests.INSTANCE_TYPE_LABEL]]


def test_pool_settings_become_limits_capacity_types_and_disruption() -> None:
    policy = "WhenEmptyOrUnderutilized"
    settings = PoolSettings(3, ("spot",), consolidation_policy=policy, consolidate_after="5s")
    spec = manifests.node_pool("gpu", settings)["spec"]
    assert spec["limits"] == {"nodes": "3", marks.GPU_RESOURCE: "24"}  # GPUs: also inside one batch
    assert manifests.node_pool("cpu", PoolSettings(node_limit=2))["spec"]["limits"] == {
        "nodes": "2",
        "cpu": "16",
    }
    assert spec["disruption"] == {"consolidationPolicy": policy, "consolidateAfter": "5s"}
    requirements = spec["template"]["spec"]["requirements"]
    [capacity] = [r for r in requirements if r["key"] == catalog.CAPACITY_TYPE_LABEL]
    assert capacity["values"] == ["spot"]
    assert "limits" not in manifests.node_pool("gpu")["spec"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node_limit": -1}, "node_limit: must be >= 0"),
        ({"capacity_types": ("reserved",)}, "capacity_types: use one or more of on-demand, spot"),
        ({"capacity_types": ()}, "capacity_types: use one or more"),
        ({"consolidation_policy": "Always"}, "consolidation_policy: use WhenEmpty or WhenEmptyOrUnder"),
    ],
)
def test_bad_pool_settings_name_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(KarpenterError, match=message):
        PoolSettings(**kwargs)  # type: ignore[arg-type]


def test_process_environment_names_catalog_ports_and_gates_without_leader_election(tmp_path: Path) -> None:
    settings = daemon.ProcessSettings(feature_gates={"NodeRepair": True, "SpotToSpotConsolidation": False})
    env = daemon.environment(tmp_path / "kubeconfig", tmp_path, {"metrics": 21000, "health": 21001}, settings)
    assert env["KUBECONFIG"] == str(tmp_path / "kubeconfig")
    assert env["INSTANCE_TYPES_FILE_PATH"] == str(tmp_path / "instance-types.json")
    assert env["DISABLE_LEADER_ELECTION"] == "true"
    assert (env["METRICS_PORT"], env["HEALTH_PROBE_PORT"]) == ("21000", "21001")
    assert env["FEATURE_GATES"] == "NodeRepair=true,SpotToSpotConsolidation=false"


def test_karpenter_tool_group_pins_its_toolchain_in_the_cache_key(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.setenv("LLMJOB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tools, "_go_version", lambda: pytest.fail("the pinned toolchain is not asked for"))
    [group] = [g for g in tools.GROUPS if g.name == "karpenter"]
    assert group.commands == {"karpenter": "sigs.k8s.io/karpenter/kwok"}
    assert tools.go_env(group)["GOTOOLCHAIN"] == tools.GO_TOOLCHAIN
    other = tools.ToolGroup(group.name, group.version, group.commands, group.ldflags, "go1.27.4", group.files)
    assert tools.group_dir(other) != tools.group_dir(group)
    assert "karpenter" in tools.ALL_TOOLS  # CI's background build (`tools build`, all tools) includes it


def test_cluster_up_karpenter_flag_leaves_the_gpu_node_count_to_the_cluster() -> None:
    args = build_parser().parse_args(["cluster", "up", "--karpenter"])
    assert (args.karpenter, args.nodes) == (True, None)
    args = build_parser().parse_args(["cluster", "up", "--karpenter", "--nodes", "2"])
    assert args.nodes == 2


def test_a_limit_on_an_unknown_pool_is_a_clear_error() -> None:
    with pytest.raises(KarpenterError, match="pool: unknown NodePool 'tpu'; the test bed's are gpu, cpu"):
        control.set_node_limit(Kubectl(Path("/nonexistent/kubectl")), "tpu", 3)
