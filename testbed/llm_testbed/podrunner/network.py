"""Pod IPs on loopback and the hosts file each pod sees as /etc/hosts (pure: the machine-wide claims on
addresses are :mod:`ipclaims`, passed in).

Every pod gets its own address in 127.1.0.0/16 (Linux routes all of 127.0.0.0/8 to ``lo``, so any
process can bind and reach it, and nothing leaves the machine). DNS is a per-pod hosts file:

- the pod itself: ``<hostname>.<subdomain>.<ns>.svc.cluster.local``, ``<hostname>.<subdomain>.<ns>.svc``
  and ``<hostname>`` (or its name), and ``localhost``, all on its own IP (the first name is what
  ``socket.getfqdn()`` returns, so torchrun advertises a name every other pod resolves);
- every other running pod with a ``subdomain``, under the same names (headless-Service hostnames);
- every Service ``<svc>.<ns>.svc.cluster.local``, ``<svc>.<ns>.svc`` (and ``<svc>`` in the pod's own
  namespace): the IPs of the ready pods it selects (headless) or the first of them (ClusterIP).
"""

from __future__ import annotations

import ipaddress
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

POD_NETWORK = ipaddress.IPv4Network("127.1.0.0/16")
CLUSTER_DOMAIN = "cluster.local"


def first_address(cluster: str) -> int:
    """Where the runner of ``cluster`` starts handing out addresses: a /24 of its own, by its name.

    Two pod-runner clusters on one machine (one test session's process and Karpenter clusters, both alive
    to its end) would otherwise give their first pods the same address, and the second rendezvous etcd
    could not bind 127.1.0.1:2379."""
    return 254 * (zlib.crc32(cluster.encode()) % 250)


class Claims(Protocol):
    """Who else may hold an address: ``take`` claims it (False: held elsewhere), ``release`` gives it back."""

    def take(self, ip: str) -> bool: ...

    def release(self, ip: str) -> None: ...


class NoClaims:
    """Nobody else hands out these addresses (one runner alone, or a test of the pool itself)."""

    def take(self, ip: str) -> bool:
        return True

    def release(self, ip: str) -> None:
        pass


class IpPool:
    """Hands out pod IPs round-robin (a freed address is reused as late as possible), each one claimed in
    ``claims`` first, so that runners sharing the network never hand out the same address at once."""

    def __init__(
        self, network: ipaddress.IPv4Network = POD_NETWORK, start: int = 0, claims: Claims | None = None
    ) -> None:
        self._hosts = [str(ip) for ip in network.hosts() if not str(ip).endswith((".0", ".255"))]
        self._used: set[str] = set()
        self._next = start % len(self._hosts)
        self._claims: Claims = claims or NoClaims()

    def _claim(self, ip: str) -> bool:
        if ip in self._used or not self._claims.take(ip):
            return False
        self._used.add(ip)
        return True

    def take(self, wanted: str | None = None) -> str:
        """A free address (``wanted`` if it is free, ours and not claimed elsewhere)."""
        if wanted and wanted in self._hosts_set and self._claim(wanted):
            return wanted
        for _ in range(len(self._hosts)):
            ip = self._hosts[self._next]
            self._next = (self._next + 1) % len(self._hosts)
            if self._claim(ip):
                return ip
        raise RuntimeError(f"no free pod IP left in {POD_NETWORK}")

    def release(self, ip: str) -> None:
        if ip in self._used:
            self._used.discard(ip)
            self._claims.release(ip)

    @property
    def _hosts_set(self) -> set[str]:
        return set(self._hosts)


@dataclass(frozen=True)
class PodEntry:
    """What the hosts files need to know of one running pod."""

    namespace: str
    name: str
    ip: str
    hostname: str
    subdomain: str
    labels: Mapping[str, str]
    ready: bool


def pod_entry(pod: Mapping[str, Any], ip: str, ready: bool) -> PodEntry:
    meta, spec = pod["metadata"], pod.get("spec", {})
    return PodEntry(
        namespace=meta["namespace"],
        name=meta["name"],
        ip=ip,
        hostname=str(spec.get("hostname") or meta["name"]),
        subdomain=str(spec.get("subdomain") or ""),
        labels=dict(meta.get("labels", {}) or {}),
        ready=ready,
    )


def pod_names(entry: PodEntry) -> list[str]:
    """DNS names of a pod, fully qualified first."""
    if entry.subdomain:
        base = f"{entry.hostname}.{entry.subdomain}.{entry.namespace}.svc"
        return [f"{base}.{CLUSTER_DOMAIN}", base]
    return []


def selects(service: Mapping[str, Any], entry: PodEntry) -> bool:
    selector = (service.get("spec", {}) or {}).get("selector") or {}
    if not selector or service["metadata"]["namespace"] != entry.namespace:
        return False
    return all(entry.labels.get(k) == v for k, v in selector.items())


def service_addresses(service: Mapping[str, Any], pods: Iterable[PodEntry]) -> list[str]:
    """Ready pods behind ``service``: all of them when headless, else the first (by name)."""
    chosen = sorted((p for p in pods if p.ready and selects(service, p)), key=lambda p: p.name)
    headless = (service.get("spec", {}) or {}).get("clusterIP") == "None"
    return [p.ip for p in (chosen if headless else chosen[:1])]


def hosts_text(
    me: PodEntry, pods: Iterable[PodEntry], services: Iterable[Mapping[str, Any]], extra: Iterable[str] = ()
) -> str:
    """The pod's hosts file; ``extra``: lines of the runner's own (the API server's Service)."""
    pods = list(pods)
    lines = ["# written by the llmjob local pod runner", *extra]
    own = [*pod_names(me), me.hostname]
    if me.name != me.hostname:
        own.append(me.name)
    lines.append(f"{me.ip} {' '.join(own)} localhost")
    for other in sorted(pods, key=lambda p: (p.namespace, p.name)):
        if other.ip == me.ip:
            continue
        names = pod_names(other)
        if names:
            lines.append(f"{other.ip} {' '.join(names)}")
    for svc in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
        name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
        names = [f"{name}.{ns}.svc.{CLUSTER_DOMAIN}", f"{name}.{ns}.svc", f"{name}.{ns}"]
        if ns == me.namespace:
            names.append(name)
        for ip in service_addresses(svc, pods):
            lines.append(f"{ip} {' '.join(names)}")
    return "\n".join(lines) + "\n"
