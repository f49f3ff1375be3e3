"""Label and annotation keys the operator writes and reads (documented in docs/api.md)."""

from __future__ import annotations

PREFIX = "elasticllm.dev"
JOB_NAME = f"{PREFIX}/job-name"
ROLE = f"{PREFIX}/role"
REPLICA_INDEX = f"{PREFIX}/replica-index"
ATTEMPT = f"{PREFIX}/attempt"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "elastic-llm-operator"

ROLE_WORKER = "worker"
ROLE_RENDEZVOUS = "rendezvous"
WORKERS = {ROLE: ROLE_WORKER, MANAGED_BY: MANAGED_BY_VALUE}
"""Every job's worker pods (the operator's pod index and watch, and the audit after a listing)."""

# Passed from the job to its pods so Kueue admits and accounts for them.
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
PASSTHROUGH_LABELS = (KUEUE_QUEUE_NAME, "kueue.x-k8s.io/priority-class")

# Gang scheduling (scheduler-plugins coscheduling / PodGroup v1alpha1).
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"

# Node health (opt-in, LLMJOB_MARK_UNHEALTHY_NODES): a node a worker found unhealthy gets this label and a
# NoSchedule taint with the same key, value = the failed check, so no workload lands there any more.
UNHEALTHY_NODE = f"{PREFIX}/unhealthy"

# On a worker pod created with required "not on this node" terms: the node names, comma-separated. A
# pod's affinity is immutable, so a Pending worker whose avoided node is usable again is re-created
# without the term (policy.placement.stale_avoidance).
AVOIDED_NODES = f"{PREFIX}/avoided-nodes"

# On every worker pod unless its podTemplate says otherwise: Karpenter never consolidates, drifts or expires
# a node away from under a training worker (a voluntary disruption of a node that runs one waits for it).
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"

# On a worker pod pinned to its job's survivors' domain (spec.scheduling.topology): the domain (a value of
# the topology key), for people and tools; the operator reads the node's label, not this.
TOPOLOGY_DOMAIN = f"{PREFIX}/topology-domain"

# Test and chaos tooling: kwok stages turn a pod annotated with this into Failed/Succeeded.
FAKE_EXIT_CODE = f"{PREFIX}/fake-exit-code"


def worker_name(job: str, index: int) -> str:
    """Deterministic worker pod name: a restarted operator finds what it made."""
    return f"{job}-worker-{index}"


def workers_service_name(job: str) -> str:
    """Headless Service that gives each worker a stable DNS name."""
    return f"{job}-workers"


def rendezvous_name(job: str) -> str:
    """Rendezvous server Deployment/Pod and Service."""
    return f"{job}-rdzv"


def selector(job: str) -> dict[str, str]:
    """Labels that select a job's worker pods."""
    return {JOB_NAME: job, ROLE: ROLE_WORKER}


def selector_string(job: str) -> str:
    """The worker selector as a string (status.selector, for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in selector(job).items())
