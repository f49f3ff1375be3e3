"""The Kueue Workload of a job: what Kueue admits (quota, gang, partial admission) before workers run.

Kueue documents that a custom job API integrates by creating a corresponding Workload. One podSet
describes the workers: ``count`` is the desired size plus the spares (``requested_count``: spares hold
nodes and count against quota like any worker), ``minCount`` is ``minReplicas`` (Kueue may admit any
size in between: partial admission; the operator then runs the training workers first, spares from
what is left), the template carries what Kueue accounts for (requests) and
what its flavor assignment matches (node selector, affinity, tolerations). A job with
``spec.scheduling.topology`` asks for its level in the podSet's ``topologyRequest`` (Kueue TAS: the
flavor needs a ``topologyName``); the operator then places the workers in the assigned domains itself
and marks them with Kueue's podset topology annotation, so Kueue counts their nodes once (as the
Workload's usage, not again as usage of pods outside TAS).
"""

from __future__ import annotations

import copy
from typing import Any

from llm_operator import labels
from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders.common import child_metadata, job_uid
from llm_operator.builders.worker import worker_pod

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
WORKLOADS = "workloads"
PODSET = "workers"
MAX_NAME = 253
TOPOLOGY_ANNOTATIONS = {
    "required": "kueue.x-k8s.io/podset-required-topology",
    "preferred": "kueue.x-k8s.io/podset-preferred-topology",
}


def queue_name(job: LLMTrainingJob) -> str | None:
    """The LocalQueue the job is submitted to, or None: the job is not managed by Kueue."""
    return job.metadata.labels.get(labels.KUEUE_QUEUE_NAME) or None


def workload_name(job: LLMTrainingJob) -> str:
    """Deterministic, and distinct for a new job of the same name (a UID prefix)."""
    suffix = "-" + job_uid(job).replace("-", "")[:8]
    return job.metadata.name[: MAX_NAME - len(suffix)] + suffix


def _requests(container: dict[str, Any]) -> dict[str, Any]:
    """Kueue accounts requests; extended resources (GPU, EFA) are set as limits only on the pod."""
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def pod_template(job: LLMTrainingJob) -> dict[str, Any]:
    """The worker pod reduced to what Kueue reads: requests and placement (no env, no volumes)."""
    pod = worker_pod(job, 0, 0)
    spec = pod["spec"]
    container = spec["containers"][0]
    requests = _requests(container)
    slim: dict[str, Any] = {"name": container["name"], "image": container["image"]}
    if requests:
        slim["resources"] = {"requests": requests, "limits": copy.deepcopy(requests)}
    template_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [slim]}
    # Init containers and native sidecars of spec.podTemplate: Kueue adds what they request.
    inits = [
        {k: copy.deepcopy(c[k]) for k in ("name", "image", "restartPolicy", "resources") if k in c}
        for c in spec.get("initContainers") or []
    ]
    if inits:
        template_spec["initContainers"] = inits
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        if spec.get(key):
            template_spec[key] = copy.deepcopy(spec[key])
    return {"metadata": {"labels": labels.selector(job.metadata.name)}, "spec": template_spec}


def requested_count(job: LLMTrainingJob) -> int:
    """Workers the Workload asks quota for: the desired size plus spec.spareReplicas (inProcess)."""
    return job.desired_replicas + job.spare_replicas


def workload(job: LLMTrainingJob, count: int, priority: int | None = None) -> dict[str, Any]:
    """The Workload for ``count`` workers; ``priority`` is the value of spec.scheduling.priorityClassName."""
    queue = queue_name(job)
    if queue is None:
        raise ValueError(f"job {job.metadata.name} has no {labels.KUEUE_QUEUE_NAME} label")
    minimum = min(job.spec.minReplicas, count)
    podset: dict[str, Any] = {"name": PODSET, "count": count, "template": pod_template(job)}
    if minimum < count:
        podset["minCount"] = minimum
    topology = job.spec.scheduling.topology
    if topology is not None:
        podset["topologyRequest"] = {topology.mode: topology.key}
    spec: dict[str, Any] = {"queueName": queue, "podSets": [podset]}
    pclass = job.spec.scheduling.priorityClassName
    if pclass:
        spec["priorityClassRef"] = {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": pclass}
        if priority is not None:
            spec["priority"] = priority
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "Workload",
        "metadata": child_metadata(job, workload_name(job), labels.ROLE_WORKER),
        "spec": spec,
    }


def place(
    pod: dict[str, Any],
    node_selector: dict[str, str],
    tolerations: list[dict[str, Any]],
    topology: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """A worker pod with the admitted flavor's node labels and tolerations added (what Kueue injects).

    The queue labels are dropped: the Workload was admitted for the whole gang, and a cluster with
    Kueue's plain-pod integration would otherwise queue every pod a second time. ``topology`` (mode,
    key) of a job with spec.scheduling.topology adds Kueue's podset topology annotation: Kueue then
    treats the pod as placed by TAS and does not count its node's resources a second time.
    """
    out = copy.deepcopy(pod)
    for key in labels.PASSTHROUGH_LABELS:
        out["metadata"].get("labels", {}).pop(key, None)
    if topology is not None:
        mode, level = topology
        out["metadata"].setdefault("annotations", {})[TOPOLOGY_ANNOTATIONS[mode]] = level
    spec = out["spec"]
    if node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **node_selector}
    if tolerations:
        present = spec.setdefault("tolerations", [])
        present += [copy.deepcopy(t) for t in tolerations if t not in present]
    return out
