"""Real Kueue on the local control plane: the pinned manager as a local process, its CRDs and queues.

The manager is the upstream ``sigs.k8s.io/kueue`` binary built by ``llmjob tools build`` (tool
``kueue``). Its CRDs and webhook manifests are copied from the pinned module beside the binary when the
tool builds (``crds/``, ``webhook/``; never into this repository): nothing here needs the Go module cache.
What differs from an in-cluster install, and why:

- No Service can reach a local process, so every webhook (Kueue's validating/mutating webhooks for its
  own kinds and the CRD conversion webhooks) is registered with a ``url`` on 127.0.0.1 instead of a
  ``service``. Webhooks of the job integrations (batch Job, pods, JobSet, ...) are not registered: no
  integration is enabled (our jobs create their Workloads themselves).
- Kueue's internal certificate management expects a Secret and certificate files mounted by the
  kubelet. We make a CA and a serving certificate (valid for the in-cluster service name and for
  127.0.0.1), store them in that Secret and write the files ourselves; Kueue's rotator accepts them and
  injects the CA into the webhook configurations and CRDs, as it does in a cluster.
- Leader election is off (one manager), metrics and health probes are not served.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llm_testbed.localcluster import marks, nodes
from llm_testbed.localcluster.kubectl import Kubectl, KubectlError
from llm_testbed.localcluster.ports import is_free
from llm_testbed.localcluster.tools import ensure, files_dir

API = "kueue.x-k8s.io/v1beta2"
NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"  # noqa: S105 (a Secret's name)
FLAVOR = "p5-48xlarge"
CLUSTER_QUEUE = "gpu-cluster-queue"
LOCAL_QUEUE = "gpu-queue"
# Topology-aware scheduling (TAS): a Topology of the GPU nodes' EKS network levels (lowest: layer-3
# blocks; no hostname level, see docs/platform.md), a flavor that names it, a queue of its own.
TOPOLOGY = "p5-network"
TAS_FLAVOR = "p5-48xlarge-tas"
TAS_CLUSTER_QUEUE = "gpu-tas-cluster-queue"
TAS_LOCAL_QUEUE = "gpu-tas-queue"
GPUS_PER_NODE = 8
QUOTA_NODES = 4
# Kueue rejects a workload that requests a resource its ClusterQueue does not cover: cover what
# workers request, with quotas that never bind except the GPUs.
COVERED = ("cpu", "memory", marks.GPU_RESOURCE, marks.EFA_RESOURCE)
CONVERSION_CRDS = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")


class KueueError(RuntimeError):
    """Kueue could not be started or set up; the message says what failed."""


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise KueueError(f"openssl {args[0]} failed: {result.stderr.strip()[-300:]}")


def make_certs(folder: Path) -> dict[str, bytes]:
    """A CA (SAN ``kueue-ca``: Kueue's rotator checks it) and a serving cert for the service and 127.0.0.1."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = folder / "ca.key", folder / "ca.crt"
    key, csr, crt = folder / "tls.key", folder / "tls.csr", folder / "tls.crt"
    ext = folder / "san.ext"
    # PKCS#1 keys: Kueue's rotator parses the CA key with x509.ParsePKCS1PrivateKey.
    _openssl("genrsa", "-traditional", "-out", str(ca_key), "2048")
    _openssl("genrsa", "-traditional", "-out", str(key), "2048")
    _openssl(
        "req", "-x509", "-key", str(ca_key), "-days", "3650", "-subj", "/O=kueue/CN=kueue-ca",
        "-addext", "subjectAltName=DNS:kueue-ca", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,digitalSignature", "-out", str(ca_crt),
    )  # fmt: skip
    _openssl("req", "-new", "-key", str(key), "-subj", f"/CN={SERVICE}", "-out", str(csr))
    ext.write_text(
        f"subjectAltName=DNS:{SERVICE}.{NAMESPACE}.svc,DNS:localhost,IP:127.0.0.1\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "3650", "-extfile", str(ext), "-out", str(crt),
    )  # fmt: skip
    return {name: (folder / name).read_bytes() for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def crds(folder: Path, url: str, ca: bytes) -> list[dict[str, Any]]:
    """Kueue's CRDs (``folder``: the tool build's copy of its ``config/components/crd/bases``); the
    multi-version ones convert through the local manager's conversion webhook."""
    out = []
    for path in sorted(folder.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERSION_CRDS:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": f"{url}/convert", "caBundle": _b64(ca)},
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def webhook_configurations(folder: Path, url: str, ca: bytes) -> list[dict[str, Any]]:
    """Kueue's own admission webhooks (its kinds only; ``folder``: the tool build's copy of its
    ``config/components/webhook``), pointed at the local manager."""
    out = []
    docs = yaml.safe_load_all((folder / "manifests.yaml").read_text())
    for doc in docs:
        if not doc:
            continue
        kept = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if "-kueue-x-k8s-io-" not in path:
                continue
            hook["clientConfig"] = {"url": url + path, "caBundle": _b64(ca)}
            kept.append(hook)
        kind = "mutating" if doc["kind"].startswith("Mutating") else "validating"
        doc["metadata"] = {"name": f"kueue-{kind}-webhook-configuration"}
        doc["webhooks"] = kept
        out.append(doc)
    return out


def configuration(port: int, cert_dir: Path) -> dict[str, Any]:
    """The manager's config file (config.kueue.x-k8s.io/v1beta2)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "health": {"healthProbeBindAddress": "0"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        # The visibility API server needs in-cluster delegated authentication: not available to a
        # local process (Kueue exits when it cannot start it).
        "featureGates": {"VisibilityOnDemand": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": SERVICE,
            "webhookSecretName": SECRET,
        },
        # An empty list is defaulted to batch/job; name it: Kueue manages Jobs only with a queue label
        # (and, without its job webhooks registered here, only after they were created).
        "integrations": {"frameworks": ["batch/job"]},
    }


def queue_objects(
    gpu_nodes: int = QUOTA_NODES, preemption: bool = True, namespace: str | None = None
) -> list[dict[str, Any]]:
    """ResourceFlavor for the fake p5 nodes, a ClusterQueue with ``gpu_nodes`` nodes' GPUs, a LocalQueue."""
    flavor = {
        "apiVersion": API,
        "kind": "ResourceFlavor",
        "metadata": {"name": FLAVOR},
        "spec": {
            "nodeLabels": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
            "tolerations": [{"key": marks.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    quotas = {
        "cpu": "100000",
        "memory": "1000Ti",
        marks.GPU_RESOURCE: str(gpu_nodes * GPUS_PER_NODE),
        marks.EFA_RESOURCE: "100000",
    }
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": list(COVERED),
                "flavors": [
                    {"name": FLAVOR, "resources": [{"name": r, "nominalQuota": quotas[r]} for r in COVERED]}
                ],
            }
        ],
    }
    if preemption:
        spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    objects: list[dict[str, Any]] = [
        flavor,
        {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE}, "spec": spec},
    ]
    if namespace:
        objects.append(local_queue(namespace))
    return objects


def local_queue(
    namespace: str, name: str = LOCAL_QUEUE, cluster_queue: str = CLUSTER_QUEUE
) -> dict[str, Any]:
    """A LocalQueue in ``namespace`` feeding the ClusterQueue."""
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }


def topology_objects(namespace: str, gpu_nodes: int = QUOTA_NODES) -> list[dict[str, Any]]:
    """Topology (the fake p5 nodes' network levels), a flavor naming it, a ClusterQueue with
    ``gpu_nodes`` nodes' GPUs on that flavor and a LocalQueue ``TAS_LOCAL_QUEUE`` in ``namespace``."""
    topology = {
        "apiVersion": API,
        "kind": "Topology",
        "metadata": {"name": TOPOLOGY},
        "spec": {"levels": [{"nodeLabel": level} for level in nodes.TOPOLOGY_LEVELS]},
    }
    flavor, queue = queue_objects(gpu_nodes, preemption=False)
    flavor["metadata"]["name"] = TAS_FLAVOR
    flavor["spec"]["topologyName"] = TOPOLOGY
    queue["metadata"]["name"] = TAS_CLUSTER_QUEUE
    queue["spec"]["resourceGroups"][0]["flavors"][0]["name"] = TAS_FLAVOR
    return [topology, flavor, queue, local_queue(namespace, TAS_LOCAL_QUEUE, TAS_CLUSTER_QUEUE)]


@dataclass
class Kueue:
    """One Kueue manager process serving one local cluster."""

    kube: Kubectl
    workdir: Path
    binary: Path | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    installed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.workdir / "kueue.log"

    def start(self, timeout: float = 120.0) -> None:
        """Install CRDs, certificates and webhooks, start the manager, wait until a queue is Active."""
        self.binary = self.binary or ensure(["kueue"])["kueue"]
        self.port = self.port or _free_port()
        url = f"https://127.0.0.1:{self.port}"
        cert_dir = self.workdir / "certs"
        certs = make_certs(cert_dir)
        ca = certs["ca.crt"]
        self.kube.apply(crds(files_dir("kueue", "crds"), url, ca))
        self._wait(lambda: self._crds_established(), timeout, "Kueue CRDs established")
        self.kube.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "data": {k: _b64(v) for k, v in certs.items()},
        }
        hooks = webhook_configurations(files_dir("kueue", "webhook"), url, ca)
        self.kube.apply([secret, *hooks])
        self.installed = hooks
        config_path = self.workdir / "kueue-config.yaml"
        config_path.write_text(yaml.safe_dump(configuration(self.port, cert_dir)))
        log = self.log_path.open("wb")
        env = dict(os.environ)
        if self.kube.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kube.kubeconfig)
        self.proc = subprocess.Popen(
            [str(self.binary), f"--config={config_path}", "--zap-log-level=2"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self._wait(self._webhook_listening, timeout, "Kueue's webhook server listening")

    def set_up_queues(
        self, namespace: str, gpu_nodes: int = QUOTA_NODES, timeout: float = 60.0, topology: bool = False
    ) -> None:
        """Flavor, ClusterQueue and a LocalQueue in ``namespace``; wait until Kueue reports them Active.

        ``topology``: the TAS set instead (``topology_objects``: LocalQueue ``TAS_LOCAL_QUEUE``)."""
        if topology:
            objects = topology_objects(namespace, gpu_nodes)
            cluster_queue, queue = TAS_CLUSTER_QUEUE, TAS_LOCAL_QUEUE
        else:
            objects = queue_objects(gpu_nodes, namespace=namespace)
            cluster_queue, queue = CLUSTER_QUEUE, LOCAL_QUEUE
        self._wait(lambda: self._apply_ok(objects), timeout, "Kueue queues accepted by its webhooks")
        self._wait(
            lambda: _condition(self.kube.get("clusterqueue", cluster_queue) or {}, "Active") == "True",
            timeout,
            f"ClusterQueue {cluster_queue} Active",
        )
        self._wait(
            lambda: _condition(self.kube.get("localqueue", queue, namespace) or {}, "Active") == "True",
            timeout,
            f"LocalQueue {queue} Active",
        )

    def stop(self) -> None:
        """Remove the webhooks (they would block API calls once nobody serves them), stop the manager."""
        for hook in self.installed:
            self.kube.run(
                "delete", hook["kind"].lower(), hook["metadata"]["name"], "--ignore-not-found", check=False
            )
        self.installed = []
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.proc = None

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no kueue log)"

    # -- helpers -------------------------------------------------------------------------------------

    def _alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise KueueError(f"kueue exited with {self.proc.returncode}:\n{self.log_tail()}")

    def _wait(self, probe: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._alive()
            if probe():
                return
            if time.monotonic() > deadline:
                raise KueueError(f"timed out after {timeout:.0f}s waiting for {what}:\n{self.log_tail()}")
            time.sleep(0.2)

    def _crds_established(self) -> bool:
        names = [f"{plural}.kueue.x-k8s.io" for plural in ("workloads", "clusterqueues", "localqueues")]
        return all(_condition(self.kube.get("crd", n) or {}, "Established") == "True" for n in names)

    def _webhook_listening(self) -> bool:
        return not is_free(self.port)

    def _apply_ok(self, objects: list[dict[str, Any]]) -> bool:
        try:
            self.kube.apply(objects)
        except KubectlError:
            return False
        return True


def _condition(obj: dict[str, Any], ctype: str) -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return str(cond.get("status"))
    return None


def _free_port() -> int:
    for port in range(29600, 29999):
        if is_free(port):
            return port
    raise KueueError("no free port for Kueue's webhook server in 29600-29999")


@contextlib.contextmanager
def running(kube: Kubectl, workdir: Path | None = None) -> Iterator[Kueue]:
    """Start Kueue, yield it, stop it (for fixtures and scripts)."""
    folder = workdir or Path(tempfile.mkdtemp(prefix="kueue-"))
    kueue = Kueue(kube, folder)
    try:
        kueue.start()
        yield kueue
    finally:
        kueue.stop()
        if workdir is None:
            shutil.rmtree(folder, ignore_errors=True)
