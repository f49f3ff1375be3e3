"""Every object a job should have at a given size: what `llmjob render` prints and the operator diffs."""

from __future__ import annotations

from typing import Any

from llm_operator import labels
from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders.rendezvous import rendezvous_network_policy, rendezvous_objects
from llm_operator.builders.worker import pod_group, worker_pod, workers_service
from llm_operator.policy.topology import Placement
from llm_operator.settings import Settings


def support_objects(job: LLMTrainingJob, settings: Settings) -> list[dict[str, Any]]:
    """Objects that exist for the job's whole life: headless Service, rendezvous server (and the
    NetworkPolicy that fences it), PodGroup."""
    out = [workers_service(job), *rendezvous_objects(job, settings)]
    policy = rendezvous_network_policy(job, settings)
    if policy is not None:
        out.append(policy)
    if job.spec.scheduling.gangScheduling:
        out.append(pod_group(job))
    return out


def desired_objects(job: LLMTrainingJob, settings: Settings, size: int | None = None) -> list[dict[str, Any]]:
    """Support objects plus workers 0..size-1. ``size`` defaults to what the operator creates: the
    desired replicas plus the spares (``spec.spareReplicas`` with inProcess recovery, on the indices
    after the training workers); 0 when suspended."""
    if size is None:
        size = 0 if job.spec.suspend else job.desired_replicas + job.spare_replicas
    attempt = job.status.restarts
    topology = job.spec.scheduling.topology
    # A new job's workers, as the operator makes them: the first placement (pod affinity on the key).
    first = Placement(topology.key, topology.mode) if topology is not None else None
    return [
        *support_objects(job, settings),
        *(worker_pod(job, i, attempt, (), first) for i in range(size)),
    ]


def is_spare(job: LLMTrainingJob, pod: dict[str, Any]) -> bool:
    """A worker of ``desired_objects`` on a spare's index (the indices after the desired replicas)."""
    index = (pod.get("metadata", {}).get("labels") or {}).get(labels.REPLICA_INDEX)
    return index is not None and int(index) >= job.desired_replicas
