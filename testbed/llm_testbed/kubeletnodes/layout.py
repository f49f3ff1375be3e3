"""Where one kubelet node keeps its files and which addresses it has (pure: no I/O).

A node's state lives under ``/var/lib/llmjob-kubelet/<cluster id>/<node>/`` rather than in the cluster's
folder under the cache: containerd, the kubelet and the shims listen on unix sockets below it, and a socket's
path is limited to 107 bytes, which a cache folder in a test's temporary directory exceeds. The cluster id
is a hash of the cluster's folder, so two caches never share a node's state.

Addresses: a node's pod CIDR is the fake node's (``nodes.pod_cidr``); its first address is the node's own,
on the node's CNI bridge, so the node's InternalIP (where kube-apiserver reaches the kubelet for logs and
exec) exists only on this machine and every node can use the kubelet's standard port.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from llm_testbed.localcluster import nodes

STATE_ROOT = Path("/var/lib/llmjob-kubelet")
CGROUP_PARENT = "llmjob-kubelet"
KUBELET_PORT = 10250
HEALTHZ_PORT = 10248
DNS_ADDRESS = "10.63.255.10"
"""Cluster DNS (CoreDNS, a process of the tier) listens here, on the tier's own dummy interface."""
DNS_INTERFACE = "llmjob-dns"
CLUSTER_DOMAIN = "cluster.local"


def cluster_id(cluster_dir: Path) -> str:
    """A short, stable id of one cluster's folder."""
    return hashlib.sha256(str(cluster_dir.resolve()).encode()).hexdigest()[:10]


def tier_dir(cluster_dir: Path) -> Path:
    """Every kubelet node of one cluster lives below this folder (and the tier's CoreDNS, kube-proxy)."""
    return STATE_ROOT / cluster_id(cluster_dir)


@dataclass(frozen=True)
class NodeLayout:
    """The files, sockets, addresses and cgroup of one kubelet node."""

    name: str
    root: Path  # tier_dir(cluster)/<name>

    @classmethod
    def of(cls, cluster_dir: Path, name: str) -> NodeLayout:
        return cls(name, tier_dir(cluster_dir) / name)

    # ----------------------------------------------------------------- containerd
    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_state(self) -> Path:
        return self.root / "run"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def registry_hosts(self) -> Path:
        """containerd's ``config_path``: one ``<registry>/hosts.toml`` per mirrored registry."""
        return self.root / "certs.d"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        """host-local IPAM's leases (kept per node: the default folder is shared by the machine)."""
        return self.root / "ipam"

    # ----------------------------------------------------------------- kubelet
    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's ``--root-dir``: pods' volumes, the device-plugin socket, checkpoints."""
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig.yaml"

    @property
    def pki_dir(self) -> Path:
        return self.root / "pki"

    @property
    def pod_logs_dir(self) -> Path:
        return self.root / "pod-logs"

    # ----------------------------------------------------------------- addresses and cgroups
    @property
    def pod_cidr(self) -> str:
        return nodes.pod_cidr(self.name)

    @property
    def ip(self) -> str:
        """The node's address: the first of its pod CIDR, on its bridge (the pods' gateway)."""
        return str(next(ipaddress.ip_network(self.pod_cidr).hosts()))

    @property
    def bridge(self) -> str:
        """The node's CNI bridge (at most 15 characters, as Linux wants)."""
        return "kl-" + hashlib.sha256(self.name.encode()).hexdigest()[:10]

    @property
    def cgroup_root(self) -> str:
        """The kubelet's ``cgroupRoot``: ``kubepods`` and every pod of this node go below it."""
        return f"/{CGROUP_PARENT}/{self.root.parent.name}-{self.name}"

    @property
    def network_name(self) -> str:
        return f"llmjob-{self.name}"
