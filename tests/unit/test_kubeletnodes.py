"""The kubelet node tier's pure parts: node layout and addresses, configuration files, labels, images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from llm_testbed.kubeletnodes import configs, images, layout, shared, tier
from llm_testbed.kubeletnodes.layout import NodeLayout
from llm_testbed.kubeletnodes.node import has_capability
from llm_testbed.localcluster import marks


def test_node_layout_keeps_sockets_short_and_addresses_on_the_node_bridge(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 120) / "clusters" / "c"
    node = NodeLayout.of(deep, "gpu-node-12")
    assert node.root.parent == layout.tier_dir(deep)
    assert len(str(node.containerd_socket)) < 108  # a unix socket's path limit, whatever the cache's path
    assert node.pod_cidr == "10.64.12.0/24"
    assert node.ip == "10.64.12.1"
    assert len(node.bridge) <= 15 and node.bridge != NodeLayout.of(deep, "gpu-node-13").bridge
    assert node.cgroup_root.startswith(f"/{layout.CGROUP_PARENT}/")
    assert layout.tier_dir(deep) != layout.tier_dir(tmp_path / "other")


def test_kubelet_config_allows_cgroup_v1_and_authenticates_the_api_server(tmp_path: Path) -> None:
    node = NodeLayout.of(tmp_path, "gpu-node-0")
    taint = {"key": marks.GPU_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
    config = yaml.safe_load(configs.kubelet_config(node, "/pki/ca.crt", [taint]))
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs" and config["cgroupRoot"] == node.cgroup_root
    assert config["address"] == config["healthzBindAddress"] == node.ip
    assert config["containerRuntimeEndpoint"] == f"unix://{node.containerd_socket}"
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authentication"]["x509"] == {"clientCAFile": "/pki/ca.crt"}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["clusterDNS"] == [layout.DNS_ADDRESS] and config["registerWithTaints"] == [taint]
    # image GC off (threshold 100, no maximum age): the kubelet's own switch (see configs.kubelet_config)
    assert config["imageGCHighThresholdPercent"] == 100 and "imageMaximumGCAge" not in config
    argv = configs.kubelet_argv("/bin/kubelet", node, {"b": "2", "a": "1"})
    assert f"--node-ip={node.ip}" in argv and "--node-labels=a=1,b=2" in argv


def test_containerd_config_is_per_node_and_mirrors_registries(tmp_path: Path) -> None:
    node = NodeLayout.of(tmp_path, "cpu-node-1")
    text = configs.containerd_config(node, "127.0.0.1:5000/llmjob/pause:abc", "/usr/lib/cni")
    for expected in (
        f'root = "{node.containerd_root}"',
        f'state = "{node.containerd_state}"',
        f'address = "{node.containerd_socket}"',
        'sandbox = "127.0.0.1:5000/llmjob/pause:abc"',
        f'config_path = "{node.registry_hosts}"',
        "restrict_oom_score_adj = false",
        "SystemdCgroup = false",
    ):
        assert expected in text
    restricted = configs.containerd_config(node, "p", "/c", restrict_oom_score_adj=True)
    assert "restrict_oom_score_adj = true" in restricted
    assert 'server = "http://127.0.0.1:5000"' in configs.registry_hosts("127.0.0.1:5000")
    cni = json.loads(configs.cni_config(node))
    bridge = cni["plugins"][0]
    assert bridge["bridge"] == node.bridge and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.72.1.0/24", "gateway": "10.72.1.1"}]]
    assert bridge["ipam"]["dataDir"] == str(node.cni_data_dir)


def test_capability_bit_is_read_from_the_bounding_set(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapBnd:\t000001fffeffffff\n")  # this VM: every capability but SYS_RESOURCE
    assert not has_capability(24, status) and has_capability(21, status)


def test_kubelet_nodes_carry_the_fake_nodes_labels_taints_and_resources() -> None:
    labels = tier.node_labels("gpu-node-1", "gpu", "us-west-2a")
    assert "type" not in labels and labels["elasticllm.dev/kubelet"] == "true"
    assert labels[marks.NODE_ROLE_LABEL] == "gpu" and labels["topology.kubernetes.io/zone"] == "us-west-2a"
    assert tier.node_taints("gpu") == [{"key": marks.GPU_TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
    assert tier.node_taints("cpu") == []
    assert tier.extended_resources("gpu") == {marks.GPU_RESOURCE: "8", marks.EFA_RESOURCE: "32"}


def test_scratch_images_and_corefile(tmp_path: Path) -> None:
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF static")
    image = images.ScratchImage("llmjob/pause", {"/pause": binary}, ("/pause",))
    first = image.tag()
    binary.write_bytes(b"\x7fELF static, rebuilt")
    assert image.tag() != first  # a new binary is a new tag: never a stale pull
    assert images.containerfile(("/pause",)) == 'FROM scratch\nCOPY rootfs/ /\nENTRYPOINT ["/pause"]\n'
    assert images.is_static(binary)
    binary.write_bytes(b"\x7fELF /lib64/ld-linux-x86-64.so.2")
    assert not images.is_static(binary)
    corefile = shared.corefile(Path("/k/coredns.kubeconfig"), 8181)
    assert f"bind {layout.DNS_ADDRESS}" in corefile and "kubernetes cluster.local" in corefile
    assert "kubeconfig /k/coredns.kubeconfig local" in corefile and "ready 127.0.0.1:8181" in corefile


def test_a_kubelet_cluster_lets_the_api_server_reach_kubelets_and_keeps_kwok_off_them() -> None:
    from llm_testbed.localcluster import kwokconfig

    plain = kwokconfig.kwokctl_configuration(kwokconfig.KwokctlSettings())
    assert {p["name"] for p in plain["componentsPatches"]} == {"kube-controller-manager", "kube-scheduler"}
    config = kwokconfig.kwokctl_configuration(kwokconfig.KwokctlSettings(kubelet_client_pki="/c/pki"))
    patches = {p["name"]: {a["key"]: a["value"] for a in p["extraArgs"]} for p in config["componentsPatches"]}
    assert patches["kube-apiserver"] == {
        "kubelet-client-certificate": "/c/pki/admin.crt",
        "kubelet-client-key": "/c/pki/admin.key",
        "kubelet-preferred-address-types": "InternalIP",
    }
    assert patches["kwok-controller"]["manage-all-nodes"] == "false"


def test_the_registry_drops_only_built_images_the_builder_no_longer_holds_and_the_disk_is_checked(
    tmp_path: Path,
) -> None:
    from llm_testbed.kubeletnodes import workload

    tags = tmp_path / "docker/registry/v2/repositories" / images.BUILT_NAMESPACE
    for repository, tag in [("trainer", "old"), ("trainer", "new"), ("operator", "gone")]:
        (tags / repository / "_manifests/tags" / tag).mkdir(parents=True)
    stale = images.stale_tags(tmp_path, {"trainer": {"new"}})  # nothing of the operator: left alone
    assert [(p.parents[2].name, p.name) for p in stale] == [("trainer", "old")]
    gib = workload.GIB
    assert workload.room_needed(6 * gib, 3, pushed=True) == 18 * gib + workload.PULL_SPARE
    assert workload.room_needed(6 * gib, 3, pushed=False) == 21 * gib + workload.PULL_SPARE
    huge = 10**6 * gib
    with pytest.raises(workload.NoRoomError) as refused:
        workload.check_room("localhost/t:k", huge, 3, pushed=True)
    assert f"needs about {(3 * huge + workload.PULL_SPARE) / gib:.1f} GiB free" in str(refused.value)
    assert "3 node(s) each unpack their own copy of localhost/t:k" in str(refused.value)
