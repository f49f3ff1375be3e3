"""What every kubelet node of one cluster shares: the local registry with the tier's images, cluster DNS
(CoreDNS) and kube-proxy. Each is a process of its own session with a pid file under the tier's folder.

- The registry (CNCF Distribution, plain HTTP on 127.0.0.1) holds the pause image, a busybox image, the
  rendezvous etcd image and whatever a test pushes (the trainer image); containerd pulls from it.
- CoreDNS answers for ``cluster.local`` from the API (Services, headless Services' pod names) on
  ``layout.DNS_ADDRESS``, an address on a bridge of its own that every pod reaches through its gateway.
- kube-proxy (iptables mode) makes ClusterIPs work in pods. One for the machine: every node shares the
  host's network namespace, so one set of rules serves them all (several would fight over the same chains).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llm_testbed.kubeletnodes import layout, network, pki
from llm_testbed.kubeletnodes.procs import Processes
from llm_testbed.local_etcd import free_port
from llm_testbed.localcluster import progress
from llm_testbed.localcluster.paths import cache_root

COREDNS_ROLE = "system:coredns"
COREDNS_RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": COREDNS_ROLE},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": COREDNS_ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": COREDNS_ROLE},
        "subjects": [{"kind": "User", "name": COREDNS_ROLE, "apiGroup": "rbac.authorization.k8s.io"}],
    },
]
KUBE_PROXY_USER = "system:kube-proxy"  # bound to system:node-proxier by the API server's default RBAC


@dataclass(frozen=True)
class SharedLayout:
    root: Path  # layout.tier_dir(cluster)

    @property
    def processes(self) -> Processes:
        """The registry, CoreDNS and kube-proxy: pids and logs under the tier's folder."""
        return Processes(self.root)

    @property
    def registry_dir(self) -> Path:
        """The registry's folder (configuration, log); its ``storage`` is :attr:`registry_storage`."""
        return self.root / "registry"

    @property
    def registry_storage(self) -> Path:
        """The registry's blobs: in the cache, kept when the cluster goes, so an image pushed once (the 6 GB
        trainer image: about 2 minutes) is there for the next cluster (a second push: under a second)."""
        return cache_root() / "kubelet-registry"

    @property
    def registry_address_file(self) -> Path:
        return self.root / "registry.address"

    @property
    def pki_dir(self) -> Path:
        return self.root / "pki"

    @property
    def corefile(self) -> Path:
        return self.root / "Corefile"


# ------------------------------------------------------------------------------------------ registry
def start_registry(shared: SharedLayout, binary: Path) -> str:
    """The tier's registry (kept running across ``cluster up`` calls); returns ``host:port``."""
    from llm_testbed.registry import LocalRegistry

    if shared.processes.running("registry") is not None and shared.registry_address_file.is_file():
        return shared.registry_address_file.read_text().strip()
    shared.registry_storage.mkdir(parents=True, exist_ok=True)
    from llm_testbed.images.podman import Podman
    from llm_testbed.kubeletnodes.images import prune_registry

    pruned = prune_registry(Podman.of_cache(), shared.registry_storage, binary)
    if pruned:
        progress.say("kubelet", f"registry: removed images the builder no longer holds: {', '.join(pruned)}")
    shared.registry_dir.mkdir(parents=True, exist_ok=True)
    link = shared.registry_dir / "storage"  # where LocalRegistry keeps its blobs
    if not link.is_symlink():
        link.symlink_to(shared.registry_storage, target_is_directory=True)
    registry = LocalRegistry(binary, shared.registry_dir).start()
    assert registry.proc is not None
    (shared.root / "pids").mkdir(parents=True, exist_ok=True)
    shared.processes.pid_file("registry").write_text(f"{registry.proc.pid}\n")
    shared.registry_address_file.write_text(registry.address + "\n")
    return registry.address


# ------------------------------------------------------------------------------------------ CoreDNS
def corefile(kubeconfig: Path, ready_port: int) -> str:
    """CoreDNS's configuration (pure): cluster.local from the API on the tier's DNS address."""
    return "\n".join(
        [
            ".:53 {",
            f"    bind {layout.DNS_ADDRESS}",
            f"    ready 127.0.0.1:{ready_port}",
            "    errors",
            f"    kubernetes {layout.CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{",
            f"        kubeconfig {kubeconfig} local",
            "        pods insecure",
            "        fallthrough in-addr.arpa ip6.arpa",
            "        ttl 5",
            "    }",
            "    cache 5",
            "    forward . /etc/resolv.conf",
            "}",
            "",
        ]
    )


def _http_ok(port: int, path: str) -> bool:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def start_coredns(shared: SharedLayout, binary: Path, kubeconfig_text: str, timeout: float = 30.0) -> int:
    pid = shared.processes.running("coredns")
    if pid is not None:
        return pid
    network.ensure_bridge(layout.DNS_INTERFACE, layout.DNS_ADDRESS, 32)
    kubeconfig = shared.root / "coredns.kubeconfig"
    kubeconfig.write_text(kubeconfig_text)
    port = free_port()
    shared.corefile.write_text(corefile(kubeconfig, port))
    proc = shared.processes.launch("coredns", [str(binary), "-conf", str(shared.corefile)])
    return shared.processes.wait_started("coredns", proc, lambda: _http_ok(port, "/ready"), timeout)


# ------------------------------------------------------------------------------------------ kube-proxy
def kube_proxy_argv(
    binary: Path, kubeconfig: Path, cluster_cidr: str, node_name: str, healthz_port: int, metrics_port: int
) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--proxy-mode=iptables",
        f"--cluster-cidr={cluster_cidr}",
        # kube-proxy waits (30 s) for a Node of its name before it starts: it takes a kubelet node's name.
        f"--hostname-override={node_name}",
        f"--healthz-bind-address=127.0.0.1:{healthz_port}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        "--conntrack-max-per-core=0",
        "--v=1",
    ]


def start_kube_proxy(
    shared: SharedLayout,
    binary: Path,
    kubeconfig_text: str,
    cluster_cidr: str,
    node_name: str,
    timeout: float = 30.0,
) -> int:
    pid = shared.processes.running("kube-proxy")
    if pid is not None:
        return pid
    kubeconfig = shared.root / "kube-proxy.kubeconfig"
    kubeconfig.write_text(kubeconfig_text)
    healthz, metrics = free_port(), free_port()
    argv = kube_proxy_argv(binary, kubeconfig, cluster_cidr, node_name, healthz, metrics)
    proc = shared.processes.launch("kube-proxy", argv)
    return shared.processes.wait_started("kube-proxy", proc, lambda: _http_ok(metrics, "/metrics"), timeout)


def client_kubeconfig(cluster_dir: Path, out_dir: Path, name: str, user: str, group: str = "") -> str:
    """A kubeconfig for ``user`` (a certificate the cluster's CA signs) against the cluster's API server."""
    from llm_testbed.kubeletnodes.configs import kubeconfig

    ca = pki.cluster_ca(cluster_dir)
    cert = pki.issue(ca, out_dir, name, user, group)
    return kubeconfig(api_server(cluster_dir), str(ca.cert), str(cert.cert), str(cert.key), user)


def api_server(cluster_dir: Path) -> str:
    """The API server's URL, from kwokctl's kubeconfig of the cluster."""
    config = yaml.safe_load((cluster_dir / "kubeconfig.yaml").read_text())
    server: str = config["clusters"][0]["cluster"]["server"]
    return server
