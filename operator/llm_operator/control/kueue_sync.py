"""The operator's side of Kueue admission for one job: the I/O around the pure builder and reader.

Before a pass: make sure the job's Workload exists (and its ``spec.active`` follows ``spec.suspend``),
read Kueue's verdict. After a pass: release the quota when the job finished (Workload ``Finished``),
and after an eviction, once every worker has stopped, clear the admission so Kueue requeues the
Workload (what Kueue's own job integrations do).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from llm_operator import labels
from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders.workload import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    WORKLOADS,
    place,
    queue_name,
    requested_count,
    workload,
    workload_name,
)
from llm_operator.kube import MERGE_PATCH, Kube, KubeError
from llm_operator.observe import PodView
from llm_operator.policy.admission import QUEUED, Admission, flavor_placement, read
from llm_operator.policy.status import MESSAGE_LIMIT, condition, set_condition

TERMINAL = ("Succeeded", "Failed")
NOT_INSTALLED = (
    "the job has a kueue.x-k8s.io/queue-name label but the apiserver has no workloads.kueue.x-k8s.io/v1beta2:"
    " install Kueue, or remove the label"
)


def released(
    workload_body: Mapping[str, Any], evicted_reason: str, message: str, now: float
) -> dict[str, Any]:
    """The status patch that hands an evicted Workload back to Kueue's queue (admission cleared)."""
    status = workload_body.get("status") or {}
    generation = int((workload_body.get("metadata") or {}).get("generation") or 0)
    message = message[:MESSAGE_LIMIT]
    conditions = list(status.get("conditions") or [])
    requeue = evicted_reason in ("Preempted", "NodeFailures")
    for cond in (
        condition("Requeued", requeue, evicted_reason, message, generation),
        condition("QuotaReserved", False, "Pending", message, generation),
        condition("Admitted", False, "NoReservation", "The workload has no reservation", generation),
    ):
        conditions = set_condition(conditions, cond, now)
    return {
        "metadata": {"resourceVersion": (workload_body.get("metadata") or {}).get("resourceVersion")},
        "status": {"admission": None, "conditions": conditions},
    }


def finished(workload_body: Mapping[str, Any], phase: str, message: str, now: float) -> dict[str, Any]:
    """The status patch that marks a Workload Finished (Kueue then releases its quota)."""
    status = workload_body.get("status") or {}
    generation = int((workload_body.get("metadata") or {}).get("generation") or 0)
    cond = condition("Finished", True, phase, (message or f"job {phase}")[:MESSAGE_LIMIT], generation)
    return {
        "metadata": {"resourceVersion": (workload_body.get("metadata") or {}).get("resourceVersion")},
        "status": {"conditions": set_condition(list(status.get("conditions") or []), cond, now)},
    }


class KueueSync:
    """Kueue admission of one job (nothing happens for a job without the queue-name label)."""

    def __init__(self, kube: Kube, enabled: bool = True) -> None:
        self.kube = kube
        self.enabled = enabled
        """False (LLMJOB_KUEUE=false): the queue label is only passed on to the pods, as without Kueue."""
        self.flavors: dict[str, tuple[dict[str, str], list[dict[str, Any]]]] = {}
        self.node_selector: dict[str, str] = {}
        self.tolerations: list[dict[str, Any]] = []

    @staticmethod
    def workload_of(
        index: Mapping[Any, Iterable[dict[str, Any]]] | None, job: LLMTrainingJob
    ) -> dict[str, Any] | None:
        """This job's Workload from the operator's index (matched by name: a new job gets a new one)."""
        if index is None:
            return None
        name = workload_name(job)
        for body in index.get((job.metadata.namespace, job.metadata.name), ()):
            if (body.get("metadata") or {}).get("name") == name:
                return body
        return None

    async def admission(self, job: LLMTrainingJob, body: dict[str, Any] | None) -> Admission | None:
        """Kueue's verdict for the job; creates its Workload the first time. None: not a Kueue job."""
        if not self.enabled or queue_name(job) is None:
            return None
        if body is None:
            if job.status.phase in TERMINAL:
                return Admission("Finished", reason="Finished")
            priority = await self._priority(job.spec.scheduling.priorityClassName)
            try:
                await self.kube.create(workload(job, requested_count(job), priority))
            except KubeError as exc:
                if exc.status != 404:
                    raise
                return Admission("Queued", reason="KueueNotInstalled", message=NOT_INSTALLED)
            return QUEUED
        active = (body.get("spec") or {}).get("active", True) is not False
        if active == job.spec.suspend:  # suspend/resume goes through Kueue: deactivate, reactivate
            await self._patch(body, {"spec": {"active": not job.spec.suspend}}, status=False)
        verdict = read(body)
        if verdict.state == "Queued" and verdict.requested != requested_count(job):
            # Scaled while waiting: podSets may change until quota is reserved (then they are immutable).
            podsets = workload(job, requested_count(job))["spec"]["podSets"]
            await self._patch(body, {"spec": {"podSets": podsets}}, status=False)
        if verdict.admitted:
            await self._placement(verdict.flavors)
        return verdict

    def place(self, pod: dict[str, Any], job: LLMTrainingJob) -> dict[str, Any]:
        """A worker pod with the admitted flavor's placement (unchanged for jobs without Kueue)."""
        if not self.enabled or queue_name_of(pod) is None:
            return pod
        topology = job.spec.scheduling.topology
        request = (topology.mode, topology.key) if topology is not None else None
        return place(pod, self.node_selector, self.tolerations, request)

    async def after(
        self,
        job: LLMTrainingJob,
        body: dict[str, Any] | None,
        verdict: Admission | None,
        pods: list[PodView],
        status: Mapping[str, Any],
        now: float,
    ) -> None:
        """Finish the Workload of a finished job; requeue an evicted one once its workers are gone."""
        if verdict is None or body is None:
            return
        phase = str(status.get("phase", ""))
        if phase in TERMINAL and verdict.state != "Finished":
            await self._patch(body, finished(body, phase, str(status.get("message") or ""), now), status=True)
            return
        if verdict.state == "Evicted" and not verdict.cleared and all(p.terminal for p in pods):
            await self._patch(body, released(body, verdict.reason, verdict.message, now), status=True)

    async def _placement(self, flavors: tuple[str, ...]) -> None:
        selector: dict[str, str] = {}
        tolerations: list[dict[str, Any]] = []
        for name in flavors:
            if name not in self.flavors:
                flavor = await self.kube.custom.get_cluster_custom_object(
                    KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", name
                )
                self.flavors[name] = flavor_placement(flavor)
            more_selector, more_tolerations = self.flavors[name]
            selector.update(more_selector)
            tolerations += [t for t in more_tolerations if t not in tolerations]
        self.node_selector, self.tolerations = selector, tolerations

    async def _priority(self, name: str) -> int | None:
        if not name:
            return None
        try:
            pclass = await client.SchedulingV1Api(self.kube.api).read_priority_class(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return int(pclass.value)

    async def _patch(self, body: Mapping[str, Any], patch: dict[str, Any], *, status: bool) -> None:
        meta = body.get("metadata") or {}
        call: Any = (
            self.kube.custom.patch_namespaced_custom_object_status
            if status
            else self.kube.custom.patch_namespaced_custom_object
        )
        try:
            await call(
                KUEUE_GROUP,
                KUEUE_VERSION,
                meta.get("namespace"),
                WORKLOADS,
                meta.get("name"),
                patch,
                _content_type=MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status in (404, 409):  # gone, or changed since we read it: the next pass sees the new one
                return
            raise


def queue_name_of(pod: Mapping[str, Any]) -> str | None:
    """The queue label a pod was built with (the job's, passed through)."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(labels.KUEUE_QUEUE_NAME)
