"""The configuration files of one kubelet node (pure: text in, text out).

- containerd 2.x (config version 3): its own root, state and socket; CRI with runc through cgroupfs; the
  sandbox image and every registry mirrored to the test bed's local registry (``certs.d/<host>/hosts.toml``),
  so nothing is pulled from outside;
- CNI: a bridge per node, host-local addresses from the node's pod CIDR, loopback, portmap;
- the kubelet (KubeletConfiguration v1beta1): this machine's cgroups are v1 (hybrid), which kubelet 1.36
  refuses unless ``failCgroupV1: false``; swap is not checked; x509 + webhook authentication and webhook
  authorization as on a real node (kube-apiserver presents the cluster's admin certificate).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from llm_testbed.kubeletnodes.layout import (
    CLUSTER_DOMAIN,
    DNS_ADDRESS,
    HEALTHZ_PORT,
    KUBELET_PORT,
    NodeLayout,
)

RUNC = "/usr/sbin/runc"
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
PAUSE_REPOSITORY = "llmjob/pause"


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for the characters used here


def containerd_config(
    node: NodeLayout, sandbox_image: str, cni_bin_dir: str, *, restrict_oom_score_adj: bool = False
) -> str:
    """containerd's ``config.toml`` for ``node``.

    ``restrict_oom_score_adj``: no container gets an OOM score below containerd's own. Needed where root
    lacks CAP_SYS_RESOURCE (this VM's bounding set): runc then cannot lower a process's score, and the pause
    container's -998 fails every sandbox ("nsexec: failed to update /proc/self/oom_score_adj").
    """
    cri_images = "plugins.'io.containerd.cri.v1.images'"
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    runc = f"{cri_runtime}.containerd.runtimes.runc"
    q = _toml_string
    return "\n".join(
        [
            "version = 3",
            f"root = {q(str(node.containerd_root))}",
            f"state = {q(str(node.containerd_state))}",
            "[grpc]",
            f"  address = {q(str(node.containerd_socket))}",
            "[ttrpc]",
            f"  address = {q(str(node.containerd_socket) + '.ttrpc')}",
            "[metrics]",
            '  address = ""',
            f"[{cri_images}]",
            '  snapshotter = "overlayfs"',
            # Each node keeps its own copy of every image: without the compressed layers once unpacked
            # (2.7 GiB of the trainer's 5.6) three nodes fit where two did (docs/decisions.md KL8).
            "  discard_unpacked_layers = true",
            f"[{cri_images}.pinned_images]",
            f"  sandbox = {q(sandbox_image)}",
            f"[{cri_images}.registry]",
            f"  config_path = {q(str(node.registry_hosts))}",
            f"[{cri_runtime}]",
            "  enable_unprivileged_ports = true",
            f"  restrict_oom_score_adj = {'true' if restrict_oom_score_adj else 'false'}",
            "  netns_mounts_under_state_dir = true",
            f"[{runc}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{runc}.options]",
            f"  BinaryName = {q(RUNC)}",
            "  SystemdCgroup = false",
            f"[{cri_runtime}.cni]",
            f"  bin_dirs = [{q(cni_bin_dir)}]",
            f"  conf_dir = {q(str(node.cni_conf_dir))}",
            "[plugins.'io.containerd.grpc.v1.cri']",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            "",
        ]
    )


def registry_hosts(registry: str) -> str:
    """``hosts.toml`` that sends every pull of one registry's images to the local registry (plain HTTP)."""
    return "\n".join(
        [
            f'server = "http://{registry}"',
            f'[host."http://{registry}"]',
            '  capabilities = ["pull", "resolve"]',
            "  skip_verify = true",
            "",
        ]
    )


def cni_config(node: NodeLayout) -> str:
    """The node's CNI network list: its own bridge, host-local addresses from its pod CIDR."""
    conf: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "name": node.network_name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": node.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(node.cni_data_dir),
                    "ranges": [[{"subnet": node.pod_cidr, "gateway": node.ip}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


def kubelet_config(
    node: NodeLayout,
    ca_file: str,
    taints: list[dict[str, str]],
    *,
    lease_duration_s: int = 20,
    status_update_s: int = 4,
) -> str:
    """The kubelet's KubeletConfiguration for ``node``."""
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "address": node.ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": node.ip,
        "healthzPort": HEALTHZ_PORT,
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        "imageServiceEndpoint": f"unix://{node.containerd_socket}",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": ca_file},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [DNS_ADDRESS],
        "failSwapOn": False,
        "memorySwap": {"swapBehavior": "NoSwap"},
        "registerNode": True,
        "registerWithTaints": taints,
        "nodeStatusUpdateFrequency": f"{status_update_s}s",
        "nodeLeaseDurationSeconds": lease_duration_s,
        # Every node's file system is this machine's one disk: a share of it (1% = 2.6 GB here) evicted every
        # pod of every node at once while other work filled the disk; only a nearly full disk should.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "512Mi",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "512Mi",
        },
        # No image garbage collection: the node's image store lies on that same shared disk, so a full disk
        # elsewhere would make it delete the 5.7 GiB trainer image under a test. And its first pass, right at
        # start, can run before cAdvisor's first sample of "/" under load: cAdvisor v0.56.2 then indexes an
        # empty list and the kubelet exits (GetFsInfo, "index out of range [0]"; seen on a restarted kubelet
        # in a cold CI run). 100 with no maximum age turns the image GC manager off (kubelet.go).
        "imageGCHighThresholdPercent": 100,
        "serializeImagePulls": False,
        "maxPods": 110,
        "podLogsDir": str(node.pod_logs_dir),
        "shutdownGracePeriod": "0s",
        "containerLogMaxSize": "10Mi",
        "kubeAPIQPS": 50,
        "kubeAPIBurst": 100,
    }
    return yaml.safe_dump(config, sort_keys=False)


def kubeconfig(server: str, ca_file: str, cert_file: str, key_file: str, user: str) -> str:
    """A kubeconfig with one client certificate (the node's, or CoreDNS's and kube-proxy's)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": ca_file}}],
        "users": [{"name": user, "user": {"client-certificate": cert_file, "client-key": key_file}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    return yaml.safe_dump(config, sort_keys=False)


def kubelet_argv(kubelet: str, node: NodeLayout, labels: dict[str, str], *, verbosity: int = 1) -> list[str]:
    """The kubelet's command line (what a KubeletConfiguration cannot say)."""
    return [
        kubelet,
        f"--config={node.kubelet_config}",
        f"--kubeconfig={node.kubeconfig}",
        f"--root-dir={node.kubelet_dir}",
        f"--cert-dir={node.pki_dir}",
        f"--hostname-override={node.name}",
        f"--node-ip={node.ip}",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        f"--v={verbosity}",
    ]
