"""The binaries and host packages of the kubelet node tier.

Built (``localcluster.tools``): containerd, its runc shim and our pause (group ``containerd``), kubelet and
kube-proxy (group ``kubenode``), CoreDNS (group ``coredns``), the registry and etcd. Installed from Debian
(:mod:`llm_testbed.host_packages`): runc, the CNI plugins, iptables (kube-proxy), busybox-static (the test
image) and podman (builds the images the tier pushes to its registry).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llm_testbed import host_packages
from llm_testbed.kubeletnodes import configs
from llm_testbed.kubeletnodes.node import NodeBinaries
from llm_testbed.localcluster import progress
from llm_testbed.localcluster import tools as cluster_tools
from llm_testbed.localcluster.paths import cache_root

TIER_TOOLS = (
    "containerd",
    "containerd-shim-runc-v2",
    "pause",
    "kubelet",
    "kube-proxy",
    "coredns",
    "registry",
    "etcd",
)
HOST_COMMANDS: dict[str, str] = {
    "runc": "runc",
    f"{configs.CNI_BIN_DIRS[0]}/bridge": "containernetworking-plugins",
    "iptables": "iptables",
    "podman": "podman",
    "/bin/busybox": "busybox-static",
}
"""Command (or absolute path) -> the Debian package that provides it."""


@dataclass(frozen=True)
class TierBinaries:
    containerd: Path
    shim: Path
    pause: Path
    kubelet: Path
    kube_proxy: Path
    coredns: Path
    registry: Path
    etcd: Path
    cni_bin_dir: str

    def of_node(self) -> NodeBinaries:
        return NodeBinaries(self.containerd, self.shim, self.kubelet, self.cni_bin_dir)


def _say(message: str) -> None:
    progress.say("kubelet", message)


def cni_bin_dir() -> str:
    for folder in configs.CNI_BIN_DIRS:
        if Path(folder, "bridge").is_file():
            return folder
    return configs.CNI_BIN_DIRS[0]


def ensure_host_commands() -> None:
    host_packages.ensure_commands(HOST_COMMANDS, host_packages.logged_run(cache_root() / "logs", _say), _say)


def binaries() -> TierBinaries:
    """Every binary of the tier (building what is missing) and the host packages (installing them)."""
    ensure_host_commands()
    found = cluster_tools.ensure(TIER_TOOLS)
    return TierBinaries(
        containerd=found["containerd"],
        shim=found["containerd-shim-runc-v2"],
        pause=found["pause"],
        kubelet=found["kubelet"],
        kube_proxy=found["kube-proxy"],
        coredns=found["coredns"],
        registry=found["registry"],
        etcd=found["etcd"],
        cni_bin_dir=cni_bin_dir(),
    )
