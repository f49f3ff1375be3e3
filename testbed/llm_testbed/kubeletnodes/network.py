"""The host side of the kubelet tier's network: Linux bridges that exist only on this machine.

Each node has its CNI bridge, made here before the kubelet starts (the CNI bridge plugin then finds it),
because the bridge carries the node's own address (``NodeLayout.ip``, the pods' gateway), which the kubelet
binds to. Cluster DNS gets a bridge of its own with one address (this kernel has no ``dummy`` links). Pods
reach each other from bridge to bridge through the host's routing (IP forwarding on); nothing is
masqueraded and no route leads off the machine.
"""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

from llm_testbed.localcluster.errors import LocalClusterError

SYSCTLS = {
    "net/ipv4/ip_forward": "1",
    # Pod -> ClusterIP -> pod on the same bridge goes through iptables (kube-proxy's rules).
    "net/bridge/bridge-nf-call-iptables": "1",
}


class NetworkError(LocalClusterError):
    """An ``ip`` command failed; the message names it and carries its error."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result


def link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def ensure_bridge(name: str, address: str, prefix: int) -> None:
    """The bridge ``name`` exists, is up and holds ``address/prefix`` (idempotent)."""
    if not link_exists(name):
        _ip("link", "add", name, "type", "bridge")
    cidr = f"{address}/{prefix}"
    if cidr not in _ip("-o", "addr", "show", "dev", name).stdout:
        _ip("addr", "add", cidr, "dev", name)
    _ip("link", "set", name, "up")


def delete_link(name: str) -> None:
    if link_exists(name):
        _ip("link", "del", name)


def address_in_use(address: str) -> str | None:
    """The link that holds ``address`` on this machine, or ``None``."""
    out = _ip("-o", "addr", "show").stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] == "inet" and fields[3].split("/")[0] == address:
            return fields[1]
    return None


def prefix_of(cidr: str) -> int:
    return ipaddress.ip_network(cidr).prefixlen


def enable_forwarding(proc_sys: Path = Path("/proc/sys")) -> None:
    """IP forwarding and bridge netfilter on (machine-wide: both only matter to bridged traffic)."""
    for key, value in SYSCTLS.items():
        path = proc_sys / key
        if not path.exists():
            raise NetworkError(f"{path} is missing: the kernel lacks what the kubelet tier's network needs")
        if path.read_text().strip() != value:
            path.write_text(value)
