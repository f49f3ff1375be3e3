"""How many more workers of a job the cluster's nodes could take right now."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders.worker import INSTANCE_TYPE_LABEL, tolerations
from llm_operator.observe import NodeView, PodView
from llm_operator.policy.health import node_lost_since


def _tolerated(taint: tuple[str, str, float | None], tolerations: list[dict[str, Any]]) -> bool:
    key, effect, _ = taint
    if effect == "PreferNoSchedule":
        return True
    for tol in tolerations:
        key_ok = tol.get("key") == key or (not tol.get("key") and tol.get("operator") == "Exists")
        effect_ok = not tol.get("effect") or tol.get("effect") == effect
        if key_ok and effect_ok:
            return True
    return False


def fits(job: LLMTrainingJob, node: NodeView) -> bool:
    """Could a worker of this job land on this node, ignoring what already runs there?"""
    if not node.ready or node.unschedulable or node_lost_since(node) is not None:
        return False
    tols = tolerations(job)
    if not all(_tolerated(t, tols) for t in node.taints if t[1] in ("NoSchedule", "NoExecute")):
        return False
    if any(node.label(k) != v for k, v in job.spec.scheduling.nodeSelector.items()):
        return False
    types = job.spec.scheduling.instanceTypes
    if types and node.label(INSTANCE_TYPE_LABEL) not in types:
        return False
    return node.allocatable_gpus >= job.spec.gpusPerNode


def free_nodes(
    job: LLMTrainingJob,
    nodes: Iterable[NodeView],
    all_workers: Iterable[PodView],
    job_workers: Iterable[PodView],
    avoid: Iterable[str] = (),
) -> list[NodeView]:
    """Nodes that fit the job and have room: GPUs left for GPU jobs, no worker of this job for CPU jobs.
    ``avoid``: nodes the job's new workers must not use (bad or found unhealthy)."""
    used_gpus: dict[str, int] = {}
    for pod in all_workers:
        if pod.node and not pod.terminal:
            used_gpus[pod.node] = used_gpus.get(pod.node, 0) + pod.gpus
    own_nodes = {pod.node for pod in job_workers if pod.node and not pod.terminal} | set(avoid)
    out = []
    for node in nodes:
        if not fits(job, node) or node.name in own_nodes:
            continue
        if node.allocatable_gpus - used_gpus.get(node.name, 0) >= job.spec.gpusPerNode:
            out.append(node)
    return out


def free_slots(
    job: LLMTrainingJob,
    nodes: Iterable[NodeView],
    all_workers: Iterable[PodView],
    job_workers: Iterable[PodView],
    avoid: Iterable[str] = (),
    domain: tuple[str, str] | None = None,
) -> int:
    """How many free nodes (``free_nodes``) there are; with ``domain`` (label key, value), only those
    in that topology domain."""
    found = free_nodes(job, nodes, all_workers, job_workers, avoid)
    if domain is not None:
        key, value = domain
        found = [n for n in found if n.label(key) == value]
    return len(found)
