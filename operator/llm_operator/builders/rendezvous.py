"""The operator-managed rendezvous server: etcd (for etcd-v3) or a TCPStore pod (for c10d).

It runs off the workers, so losing any worker (worker-0 included) never loses the rendezvous.
"""

from __future__ import annotations

import copy
from typing import Any

from llm_operator import labels
from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders.common import RESTRICTED_SECURITY_CONTEXT, child_labels, child_metadata
from llm_operator.settings import C10D_PORT, ETCD_CLIENT_PORT, Settings


def managed(job: LLMTrainingJob) -> bool:
    """True when the operator must run a rendezvous server (no endpoint given)."""
    return not job.spec.rendezvous.endpoint


def port(job: LLMTrainingJob) -> int:
    """Port of the rendezvous server for the job's backend."""
    return ETCD_CLIENT_PORT if job.spec.rendezvous.backend == "etcd-v3" else C10D_PORT


def endpoint(job: LLMTrainingJob) -> str:
    """host:port the workers use: the given endpoint, or the managed server's Service DNS name."""
    if not managed(job):
        return job.spec.rendezvous.endpoint
    host = f"{labels.rendezvous_name(job.metadata.name)}.{job.metadata.namespace}.svc"
    return f"{host}:{port(job)}"


def _placement(job: LLMTrainingJob, settings: Settings) -> dict[str, Any]:
    """Prefer nodes without GPUs; tolerate GPU taints so a GPU-only cluster still works.

    A lost node evicts the server after the job's ``nodeFailureGraceSeconds`` (the rule its workers follow),
    not the cluster default of 300 s: until its Deployment replaces it, no worker can re-rendezvous.
    """
    grace = job.spec.failurePolicy.nodeFailureGraceSeconds
    preferred: list[dict[str, Any]] = [
        {
            "weight": 100,
            "preference": {
                "matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]
            },
        }
    ]
    if job.spec.scheduling.instanceTypes:
        preferred.append(
            {
                "weight": 50,
                "preference": {
                    "matchExpressions": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "NotIn",
                            "values": list(job.spec.scheduling.instanceTypes),
                        }
                    ]
                },
            }
        )
    out: dict[str, Any] = {
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "vpc.amazonaws.com/efa", "operator": "Exists", "effect": "NoSchedule"},
            *(
                {"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": grace}
                for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
            ),
        ],
    }
    if settings.rendezvous_node_selector:
        out["nodeSelector"] = dict(settings.rendezvous_node_selector)
    if job.spec.scheduling.priorityClassName:
        out["priorityClassName"] = job.spec.scheduling.priorityClassName
    return out


def _etcd_container(job: LLMTrainingJob, settings: Settings) -> dict[str, Any]:
    host = endpoint(job).rsplit(":", 1)[0]
    return {
        "name": "etcd",
        "image": settings.rendezvous_image,
        "command": ["etcd"],
        "args": [
            "--name=rdzv",
            "--data-dir=/var/run/etcd/data",
            f"--listen-client-urls=http://0.0.0.0:{ETCD_CLIENT_PORT}",
            f"--advertise-client-urls=http://{host}:{ETCD_CLIENT_PORT}",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=rdzv=http://127.0.0.1:2380",
            "--auto-compaction-mode=revision",
            "--auto-compaction-retention=1000",
            "--quota-backend-bytes=1073741824",
        ],
        "ports": [{"name": "client", "containerPort": ETCD_CLIENT_PORT}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": ETCD_CLIENT_PORT}, "periodSeconds": 2},
        "livenessProbe": {
            "httpGet": {"path": "/livez", "port": ETCD_CLIENT_PORT},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/var/run/etcd"}],
        "securityContext": copy.deepcopy(RESTRICTED_SECURITY_CONTEXT),
    }


def _c10d_container(job: LLMTrainingJob) -> dict[str, Any]:
    return {
        "name": "tcpstore",
        "image": job.spec.image,
        "imagePullPolicy": job.spec.imagePullPolicy,
        "command": ["python", "-m", "llm_elastic.rendezvous.tcpstore_server", "--port", str(C10D_PORT)],
        "ports": [{"name": "c10d", "containerPort": C10D_PORT}],
        "readinessProbe": {"tcpSocket": {"port": C10D_PORT}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}},
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
    }


def server_selector(job: LLMTrainingJob) -> dict[str, str]:
    """Labels that select the job's rendezvous server pod."""
    return {labels.JOB_NAME: job.metadata.name, labels.ROLE: labels.ROLE_RENDEZVOUS}


def rendezvous_objects(job: LLMTrainingJob, settings: Settings) -> list[dict[str, Any]]:
    """Deployment + Service of the managed rendezvous server; nothing when an endpoint is given."""
    if not managed(job):
        return []
    name = labels.rendezvous_name(job.metadata.name)
    pod_labels = child_labels(job, labels.ROLE_RENDEZVOUS)
    selector = server_selector(job)
    etcd = job.spec.rendezvous.backend == "etcd-v3"
    pod_spec: dict[str, Any] = {
        **_placement(job, settings),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "containers": [_etcd_container(job, settings) if etcd else _c10d_container(job)],
    }
    if etcd:
        pod_spec["volumes"] = [{"name": "data", "emptyDir": {}}]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(job, name, labels.ROLE_RENDEZVOUS),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(job, name, labels.ROLE_RENDEZVOUS),
        "spec": {
            "selector": selector,
            "ports": [{"name": "rendezvous", "port": port(job), "targetPort": port(job)}],
        },
    }
    return [deployment, service]


NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Set by the apiserver on every namespace: selects a namespace by its name."""


def rendezvous_network_policy(job: LLMTrainingJob, settings: Settings) -> dict[str, Any] | None:
    """A NetworkPolicy that admits, on the rendezvous port only, this job's workers and the operator's pods.

    Every other pod of the cluster is refused (once a NetworkPolicy selects a pod, ingress not listed is
    denied). None when the job brings its own endpoint (no managed server to protect).
    """
    if not managed(job):
        return None
    peers: list[dict[str, Any]] = [{"podSelector": {"matchLabels": labels.selector(job.metadata.name)}}]
    if settings.operator_pod_labels:
        peers.append(
            {
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: settings.operator_namespace}},
                "podSelector": {"matchLabels": dict(settings.operator_pod_labels)},
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(job, labels.rendezvous_name(job.metadata.name), labels.ROLE_RENDEZVOUS),
        "spec": {
            "podSelector": {"matchLabels": server_selector(job)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": port(job)}]}],
        },
    }
