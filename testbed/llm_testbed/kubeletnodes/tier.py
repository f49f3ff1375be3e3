"""The kubelet node tier of one local cluster: its nodes and what they share, started and ended here.

``LocalCluster.up(kubelet=True)`` calls :meth:`KubeletTier.up`; ``llmjob chaos`` calls the node verbs
(:mod:`llm_testbed.kubeletnodes.chaos`). A node is a containerd and a kubelet of this machine
(:mod:`.node`), registered under a fake node's name with its labels, taints and extended resources.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from llm_testbed.kubeletnodes import configs, images, layout, network, node, pki, shared
from llm_testbed.kubeletnodes import tools as tier_tools
from llm_testbed.kubeletnodes.layout import NodeLayout
from llm_testbed.kubeletnodes.tools import TierBinaries
from llm_testbed.localcluster import marks, nodes, progress
from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.kubectl import Kubectl
from llm_testbed.localcluster.waiting import poll

ACTIVE_FILE = layout.STATE_ROOT / "active-cluster"
TIER_MARK = "kubelet-tier"
"""A file in the cluster's folder: its nodes are kubelet nodes (the tier's folder in it)."""
NODE_DIR_ANNOTATION = "elasticllm.dev/kubelet-node-dir"
NODE_RECORD = "node.json"
READY_TIMEOUT_S = 90.0
CLUSTER_CIDR = "10.64.0.0/10"  # every pod CIDR of nodes.pod_cidr
RENDEZVOUS_REPOSITORY = "coreos/etcd"  # quay.io/coreos/etcd, the operator's default rendezvous image
KUBELET_LABELS_DROPPED = ("type",)  # the fake nodes' "type: kwok"
LEASE_DURATION_S = 10
STATUS_UPDATE_S = 2


def say(message: str) -> None:
    progress.say("kubelet", message)


def is_kubelet_cluster(cluster_dir: Path) -> bool:
    return (cluster_dir / TIER_MARK).is_file()


def active_cluster() -> Path | None:
    """The folder of the kubelet cluster that holds this machine, if it still exists."""
    try:
        owner = Path(ACTIVE_FILE.read_text().strip())
    except OSError:
        return None
    return owner if is_kubelet_cluster(owner) else None


def node_labels(name: str, kind: nodes.NodeKind, zone: str) -> dict[str, str]:
    """The fake node's labels, as the kubelet registers them (pure)."""
    manifest = nodes.node_manifest(name, kind, zone)
    labels: dict[str, str] = dict(manifest["metadata"]["labels"])
    for key in KUBELET_LABELS_DROPPED:
        labels.pop(key, None)
    labels["elasticllm.dev/kubelet"] = "true"
    return labels


def node_taints(kind: nodes.NodeKind) -> list[dict[str, str]]:
    return [dict(t) for t in nodes.SHAPES[kind].taints]


def extended_resources(kind: nodes.NodeKind) -> dict[str, str]:
    """What a device plugin would advertise on such a node (``nvidia.com/gpu``, ``vpc.amazonaws.com/efa``)."""
    return dict(nodes.SHAPES[kind].extended)


class KubeletTier:
    """The tier of the cluster whose kwokctl folder is ``cluster_dir``."""

    def __init__(self, cluster_dir: Path, kube: Kubectl, binaries: TierBinaries | None = None) -> None:
        self.cluster_dir = cluster_dir
        self.kube = kube
        self._binaries = binaries
        self.shared = shared.SharedLayout(layout.tier_dir(cluster_dir))

    @property
    def binaries(self) -> TierBinaries:
        if self._binaries is None:
            self._binaries = tier_tools.binaries()
        return self._binaries

    def layout(self, name: str) -> NodeLayout:
        return NodeLayout.of(self.cluster_dir, name)

    def node_names(self) -> list[str]:
        root = self.shared.root
        return sorted(p.parent.name for p in root.glob(f"*/{NODE_RECORD}")) if root.is_dir() else []

    # ------------------------------------------------------------------ shared parts
    def registry(self) -> str:
        return shared.start_registry(self.shared, self.binaries.registry)

    def claim_machine(self) -> None:
        """One kubelet cluster per machine: node bridges, pod CIDRs and the DNS address are the machine's.
        Raises naming the cluster that holds them (a claim whose cluster folder is gone is stale)."""
        owner = active_cluster()
        if owner is not None and owner != self.cluster_dir.resolve():
            raise LocalClusterError(
                f"another kubelet cluster runs on this machine ({owner}): one at a time (node bridges, "
                "pod CIDRs and the DNS address are the machine's); `llmjob cluster down` that one first"
            )
        taken = network.address_in_use(layout.DNS_ADDRESS)
        if taken is not None and taken != layout.DNS_INTERFACE:
            raise LocalClusterError(f"{layout.DNS_ADDRESS} (cluster DNS) is already on link {taken}")
        ACTIVE_FILE.parent.mkdir(parents=True, exist_ok=True)
        ACTIVE_FILE.write_text(f"{self.cluster_dir.resolve()}\n")

    def start_shared(self) -> str:
        """Registry with the tier's images and CoreDNS; returns the sandbox image's name."""
        self.claim_machine()
        (self.cluster_dir / TIER_MARK).write_text(f"{self.shared.root}\n")
        network.enable_forwarding()
        registry = self.registry()
        podman = _podman()
        sandbox = images.publish(
            podman, images.ScratchImage(images.PAUSE, {"/pause": self.binaries.pause}, ("/pause",)), registry
        )
        (self.shared.root / "sandbox-image").write_text(sandbox + "\n")
        self.kube.apply(shared.COREDNS_RBAC)
        shared.start_coredns(
            self.shared,
            self.binaries.coredns,
            shared.client_kubeconfig(self.cluster_dir, self.shared.pki_dir, "coredns", shared.COREDNS_ROLE),
        )
        return sandbox

    def start_kube_proxy(self, node_name: str) -> int:
        """kube-proxy for the machine, named after a registered node (it waits for a Node of its name)."""
        return shared.start_kube_proxy(
            self.shared,
            self.binaries.kube_proxy,
            shared.client_kubeconfig(
                self.cluster_dir, self.shared.pki_dir, "kube-proxy", shared.KUBE_PROXY_USER
            ),
            CLUSTER_CIDR,
            node_name,
        )

    def publish_test_images(self, rendezvous_tag: str) -> dict[str, str]:
        """busybox and the rendezvous etcd in the registry; returns their pullable names."""
        registry, podman = self.registry(), _podman()
        etcd = images.ScratchImage(
            RENDEZVOUS_REPOSITORY, {"/usr/local/bin/etcd": self.binaries.etcd}, ("/usr/local/bin/etcd",),
            {"/bin/etcd": "../usr/local/bin/etcd"},
        )  # fmt: skip
        return {
            "busybox": images.publish(podman, images.busybox_image(), registry),
            "etcd": images.publish(podman, etcd, registry, f"{RENDEZVOUS_REPOSITORY}:{rendezvous_tag}"),
        }

    def publish_built_image(self, local: str) -> str:
        """An image `make images` built, pushed to the registry; returns the name pods use (unchanged)."""
        return images.publish_built(_podman(), local, self.registry())

    def sandbox_image(self) -> str:
        return (self.shared.root / "sandbox-image").read_text().strip()

    # ------------------------------------------------------------------ nodes
    def up(self, wanted: list[tuple[str, nodes.NodeKind, str]]) -> list[str]:
        started = time.monotonic()
        self.start_shared()
        names = [self.add_node(name, kind, zone, wait=False) for name, kind, zone in wanted]
        for name in names:
            self.wait_ready(name)
        if names:
            self.start_kube_proxy(names[0])
        say(f"{len(names)} kubelet node(s) Ready in {time.monotonic() - started:.1f}s: {', '.join(names)}")
        return names

    def add_node(self, name: str, kind: nodes.NodeKind, zone: str, *, wait: bool = True) -> str:
        """Start containerd and the kubelet of a new node (or of a stopped one) and register it."""
        n = self.layout(name)
        n.root.mkdir(parents=True, exist_ok=True)
        record = n.root / NODE_RECORD
        record.write_text(
            json.dumps({"cluster_dir": str(self.cluster_dir), "kind": kind, "zone": zone}) + "\n"
        )
        ca = pki.cluster_ca(self.cluster_dir)
        cert = pki.issue(ca, n.pki_dir, "node", f"system:node:{name}", "system:nodes")
        kubeconfig = configs.kubeconfig(
            shared.api_server(self.cluster_dir),
            str(ca.cert),
            str(cert.cert),
            str(cert.key),
            f"system:node:{name}",
        )
        kubelet_config = configs.kubelet_config(
            n,
            str(ca.cert),
            node_taints(kind),
            lease_duration_s=LEASE_DURATION_S,
            status_update_s=STATUS_UPDATE_S,
        )
        node.write_files(
            n, self.binaries.of_node(), sandbox_image=self.sandbox_image(), registry=self.registry(),
            mirrored=images.MIRRORED_REGISTRIES, kubelet_config=kubelet_config, kubeconfig=kubeconfig,
        )  # fmt: skip
        node.start_containerd(n, self.binaries.of_node())
        self.start_kubelet(name)
        if wait:
            self.wait_ready(name)
        return name

    def _record(self, name: str) -> dict[str, Any]:
        record = self.layout(name).root / NODE_RECORD
        if not record.is_file():
            raise LocalClusterError(f"{name} is not a kubelet node of this cluster (no {record})")
        data: dict[str, Any] = json.loads(record.read_text())
        return data

    def start_kubelet(self, name: str) -> int:
        record = self._record(name)
        n = self.layout(name)
        node.start_containerd(n, self.binaries.of_node())
        return node.start_kubelet(
            n, self.binaries.of_node(), node_labels(name, record["kind"], record["zone"])
        )

    def wait_ready(self, name: str, timeout: float = READY_TIMEOUT_S) -> None:
        """Until the Node is Ready, annotated with its folder and advertises its extended resources."""
        n, kind = self.layout(name), self._record(name)["kind"]

        def kubelet_running() -> None:
            exited = node.kubelet_exited(n)
            if exited is not None:
                raise LocalClusterError(f"the kubelet of node {name} exited:\n{exited}")

        def registered() -> dict[str, Any] | None:
            kubelet_running()
            return self.kube.get("node", name)

        poll(registered, timeout=timeout, what=f"kubelet node {name} to register", interval=0.3)
        self.kube.run("annotate", "node", name, f"{NODE_DIR_ANNOTATION}={n.root}", "--overwrite")
        self.advertise(name, kind)

        def ready() -> bool:
            kubelet_running()  # an exited kubelet is an error now, not a wait until the deadline
            obj = self.kube.get("node", name)
            if obj is None:
                return False
            capacity = obj.get("status", {}).get("capacity", {})
            if any(capacity.get(k) != v for k, v in extended_resources(kind).items()):
                self.advertise(name, kind)
                return False
            return _ready(obj)

        poll(ready, timeout=timeout, what=f"kubelet node {name} to be Ready", interval=0.3)

    def advertise(self, name: str, kind: nodes.NodeKind) -> None:
        """Put the node's extended resources into its status capacity (the kubelet keeps them there and
        derives allocatable), as a device plugin would."""
        resources = extended_resources(kind)
        if resources:
            self.kube.patch(
                "node", name, {"status": {"capacity": resources}}, patch_type="merge", subresource="status"
            )

    def stop_kubelet(self, name: str) -> bool:
        """The kubelet stops; containerd and the node's containers go on (a partition)."""
        self._record(name)
        return node.processes(self.layout(name)).stop("kubelet")

    def kill_node(self, name: str) -> int:
        """Kill the node's kubelet, containerd and containers at once, then remove its files."""
        n = self.layout(name)
        killed = node.kill_all(n)
        node.remove_files(n)
        return killed

    def process_states(self) -> dict[str, str]:
        """``running``/``stopped`` of each shared process and of each node's containerd and kubelet."""
        states = {
            p: "running" if self.shared.processes.running(p) is not None else "stopped"
            for p in ("registry", "coredns", "kube-proxy")
        }
        for name in self.node_names():
            for process in node.PROCESSES:
                alive = node.running_pid(self.layout(name), process) is not None
                states[f"{process}/{name}"] = "running" if alive else "stopped"
        return states

    def collect_logs(self, dest: Path) -> list[Path]:
        """Copy the logs of the shared processes, of every node and of the pods still on it (call before
        :meth:`down`). Only the known log folders are read: a walk of the whole tier met containerd's
        snapshots while a container was being removed (FileNotFoundError)."""
        copied = []
        root = self.shared.root
        found = [*root.glob("logs/*.log"), *root.glob("*/logs/*.log"), *root.glob("*/pod-logs/*/*/*.log")]
        for log in sorted(found):
            relative = log.relative_to(root)
            target = dest / str(relative).replace("/logs/", "-").replace("logs/", "")
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(log, target)
            except FileNotFoundError:  # a pod's log, gone with its pod
                continue
            copied.append(target)
        return copied

    def down(self) -> None:
        """Every node killed and removed, the shared processes stopped, the tier's folder deleted."""
        for name in self.node_names():
            self.kill_node(name)
        proxy = self.shared.processes.running("kube-proxy")
        proxy_binary = Path(f"/proc/{proxy}/exe").resolve() if proxy is not None else None
        for process in ("kube-proxy", "coredns", "registry"):
            self.shared.processes.stop(process, timeout=5.0)
        if proxy_binary is not None and proxy_binary.is_file():  # its KUBE-* chains go with it
            subprocess.run([str(proxy_binary), "--cleanup"], capture_output=True, check=False, timeout=60)
        network.delete_link(layout.DNS_INTERFACE)
        shutil.rmtree(self.shared.root, ignore_errors=True)
        (self.cluster_dir / TIER_MARK).unlink(missing_ok=True)
        if active_cluster() == self.cluster_dir.resolve():
            ACTIVE_FILE.unlink(missing_ok=True)


def _ready(obj: dict[str, Any]) -> bool:
    from llm_testbed.localcluster.chaos import is_ready

    return is_ready(obj)


def _podman() -> Any:
    from llm_testbed.images.podman import Podman

    return Podman.of_cache()


__all__ = ["KubeletTier", "TierBinaries", "is_kubelet_cluster", "marks"]
