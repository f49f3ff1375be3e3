"""The config file handed to ``kwokctl create cluster --config``: kwokctl options and our Stages.

kwok's own options keep kwokctl's defaults (a partial KwokConfiguration would zero the rest); pod IPs
come from each node's ``spec.podCIDR`` (see :mod:`nodes`), not from kwok's small default range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from llm_testbed.localcluster import tools

STAGES_RESOURCE = "kwok-stages.yaml"
CONFIG_API = "config.kwok.x-k8s.io/v1alpha1"

# kube-controller-manager: controllers a training cluster never exercises here stay off (2 cores), by
# their canonical names (an unknown name stops kube-controller-manager). Kept on: node lifecycle
# (NotReady, taints, marking pods not ready), taint eviction, pod GC, namespaces, garbage collection,
# deployments/replicasets (rendezvous servers), jobs, services/endpoint slices, service accounts,
# disruption budgets (evictions), ClusterRole aggregation, service CIDRs and the root CA publisher
# (kube-root-ca.crt in every namespace: the ca.crt of a pod's kube-api-access volume).
DISABLED_CONTROLLERS = (
    "cronjob-controller",
    "horizontal-pod-autoscaler-controller",
    "statefulset-controller",
    "daemonset-controller",
    "resourcequota-controller",
    "replicationcontroller-controller",
    "endpointslice-mirroring-controller",
    "persistentvolume-expander-controller",
    "persistentvolume-attach-detach-controller",
    "ephemeral-volume-controller",
    "ttl-controller",
    "ttl-after-finished-controller",
    "certificatesigningrequest-signing-controller",
    "certificatesigningrequest-approving-controller",
    "certificatesigningrequest-cleaner-controller",
    "podcertificaterequest-cleaner-controller",
    "storageversion-garbage-collector-controller",
    "resourceclaim-controller",
    "device-taint-eviction-controller",
    "selinux-warning-controller",
    "volumeattributesclass-protection-controller",
    "legacy-serviceaccount-token-cleaner-controller",
)


# One scheduler and one controller-manager per cluster, so no leader election: with it on, each exits for
# good ("leaderelection lost") once kube-apiserver or etcd is away longer than its renew deadline (10 s),
# and every pod after that stays Pending. A control-plane fault test caused exactly that on a CI machine.
NO_LEADER_ELECTION = {"key": "leader-elect", "value": "false"}


@dataclass(frozen=True)
class KwokctlSettings:
    """What varies between clusters; everything else is fixed for a lean, fast local control plane."""

    ports: dict[str, int] = field(default_factory=dict)  # kwokctl option (ports.PORT_OPTIONS) -> port
    node_monitor_period_ms: int = 1000  # how fast NotReady nodes are noticed (default 5s)
    node_monitor_grace_period_ms: int = 40000
    node_lease_duration_s: int = 8
    """kwok renews every node's Lease each quarter of this; a node given back (chaos.node_ready) is
    Ready again within that quarter."""
    run_pods: bool = False  # the local pod runner acts for pods: kwok keeps only the node Stages
    audit_policy: str = ""  # kube-apiserver audit policy file; the log goes to logs/audit.log (benchmarks)
    kubelet_client_pki: str = ""
    """The cluster's pki folder when its nodes are real kubelets (``--kubelet``): kube-apiserver presents the
    admin certificate there to them (logs, exec), and kwok manages only nodes annotated as fake: not these."""


def stages_text() -> str:
    """The Stage documents shipped with the package (they replace kwok's built-in ones)."""
    return resources.files("llm_testbed.localcluster").joinpath("data", STAGES_RESOURCE).read_text()


def stages() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(stages_text()) if doc]


def node_stages_text() -> str:
    """Only the Node Stages: with ``run_pods`` kwok leaves every pod to the local pod runner."""
    nodes = [s for s in stages() if s["spec"]["resourceRef"]["kind"] == "Node"]
    return yaml.safe_dump_all(nodes, sort_keys=False)


def kwokctl_configuration(settings: KwokctlSettings) -> dict[str, Any]:
    controllers = ",".join(["*", *(f"-{name}" for name in DISABLED_CONTROLLERS)])
    options: dict[str, Any] = {
        "runtime": "binary",
        "kubeVersion": tools.KUBE_VERSION,
        "etcdVersion": tools.ETCD_VERSION.lstrip("v"),
        "kwokVersion": tools.KWOK_VERSION,
        "bindAddress": "127.0.0.1",
        "securePort": True,
        "quietPull": True,
        "disableQPSLimits": True,
        "kubeControllerManagerNodeMonitorPeriodMilliseconds": settings.node_monitor_period_ms,
        "kubeControllerManagerNodeMonitorGracePeriodMilliseconds": settings.node_monitor_grace_period_ms,
        "nodeLeaseDurationSeconds": settings.node_lease_duration_s,
        "heartbeatFactor": 1,  # kwokctl multiplies the three timings above by 5 unless told otherwise
    }
    options.update(settings.ports)
    if settings.audit_policy:
        options["kubeAuditPolicy"] = settings.audit_policy
    return {
        "apiVersion": CONFIG_API,
        "kind": "KwokctlConfiguration",
        "options": options,
        "componentsPatches": [
            {
                "name": "kube-controller-manager",
                "extraArgs": [
                    {"key": "controllers", "value": controllers},
                    NO_LEADER_ELECTION,
                    # Taint lost nodes NoExecute at once (default 0.1 node/s: one node every 10 s).
                    {"key": "node-eviction-rate", "value": "100"},
                    {"key": "secondary-node-eviction-rate", "value": "100"},
                ],
            },
            {"name": "kube-scheduler", "extraArgs": [NO_LEADER_ELECTION]},
            *_kubelet_tier_patches(settings.kubelet_client_pki),
        ],
    }


def _kubelet_tier_patches(pki: str) -> list[dict[str, Any]]:
    """kube-apiserver reaches real kubelets; kwok (by default it manages every node) keeps off them."""
    if not pki:
        return []
    args = [
        {"key": "kubelet-client-certificate", "value": f"{pki}/admin.crt"},
        {"key": "kubelet-client-key", "value": f"{pki}/admin.key"},
        # A kubelet node's name is not in any resolver here; its InternalIP is on its bridge.
        {"key": "kubelet-preferred-address-types", "value": "InternalIP"},
    ]
    kwok_args = [
        {"key": "manage-all-nodes", "value": "false"},
        {"key": "manage-nodes-with-annotation-selector", "value": "kwok.x-k8s.io/node=fake"},
    ]
    return [
        {"name": "kube-apiserver", "extraArgs": args},
        {"name": "kwok-controller", "extraArgs": kwok_args},
    ]


def render(settings: KwokctlSettings) -> str:
    """The whole multi-document config file."""
    head = yaml.safe_dump(kwokctl_configuration(settings), sort_keys=False)
    return f"{head}---\n{node_stages_text() if settings.run_pods else stages_text()}"
