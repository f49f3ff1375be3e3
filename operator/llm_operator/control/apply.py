"""Carrying out one pass's plan: the pod changes before the status write, the Events and job metrics
after it (the controller writes the status in between, ``llm_operator.control.status_writer``).

Order: failure metrics; unhealthy nodes counted and, when enabled, marked; the lost workers' live
members evicted (before the deletions: the survivors re-form without waiting for leases); deletions, then
creations (each concurrently); then, after the write, the Events and the job's gauges.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from llm_operator import metrics
from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders.worker import worker_pod
from llm_operator.control.expectations import Expectations
from llm_operator.control.kueue_sync import KueueSync
from llm_operator.control.live_evict import LiveEvictor
from llm_operator.control.node_marking import NodeMarker
from llm_operator.kube import Kube, KubeError
from llm_operator.observe import pod_view
from llm_operator.policy.placement import required_avoidance
from llm_operator.policy.refusals import (
    CONDITION,
    REFUSED_BY_OPERATOR,
    REFUSED_STATUSES,
    Refusal,
    refusal_condition,
    refusal_event,
    refusal_message,
)
from llm_operator.policy.status import degraded_condition, merge_conditions
from llm_operator.reconcile import Plan


@dataclass(frozen=True)
class Applied:
    """What the pod changes of a plan did: when they started, and the workers really created."""

    now: float
    created: list[str]
    refused: list[Refusal] = dataclasses.field(default_factory=list)
    """Workers the API server refused to create (admission): they do not exist."""
    freed: bool = False
    """A lost worker's deletion left no object and its replacement was not created yet: the next pass
    can create it at once, before the watch shows the deletion."""


REPLACEMENT_WINDOW_S = 60.0
"""A creation this long after a lost worker's deletion is not its replacement (the job shrank, then grew)."""


@dataclass(frozen=True)
class PassClock:
    """When (monotonic) the pass started, and when the first event since the last pass woke the job (None:
    a timer or a probe did); the reaction's stages are measured from them (``metrics.REACTION_STAGES``)."""

    started: float
    woken: float | None = None


def at_size(status: Mapping[str, Any], spares: int) -> bool:
    """Running with every worker and spare the job wants: more room on some node changes nothing for it,
    so a node that comes back need not wake it (``llm_operator.control.jobs``)."""
    return (
        status.get("phase") == "Running"
        and status.get("targetReplicas") == status.get("desiredReplicas")
        and int(status.get("spareReplicas") or 0) >= spares
    )


def plan_events(decided: Plan, created: list[str]) -> list[tuple[str, str, str]]:
    """The plan's Events, then one for the workers created (not while the job first starts: its status
    counts them) and one for those deleted."""
    events = list(decided.events)
    if created and not decided.starting:
        events.append(
            ("Normal", "CreatedWorkers", f"created {', '.join(created)} (attempt {decided.attempt})")
        )
    if decided.delete:
        gone = ", ".join(f"{d.pod.name} ({d.reason}{', force' if d.force else ''})" for d in decided.delete)
        events.append(("Normal", "DeletedWorkers", f"deleted {gone}"))
    return events


class PlanApplier:
    """Applies one job's plans: pods through ``kube`` and the job's expectations (watches lag)."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        expect: Expectations,
        kueue: KueueSync,
        marker: NodeMarker,
        evictor: LiveEvictor,
        karpenter: bool = False,
        dress: Callable[[dict[str, Any], LLMTrainingJob], dict[str, Any]] = lambda pod, _: pod,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.expect = expect
        self.kueue = kueue
        self.marker = marker
        self.evictor = evictor
        self.karpenter = karpenter
        """Avoid nodes that repel pods by themselves with preferred terms (``builders.worker._affinity``)."""
        self.dress = dress
        """What worker pods get beyond ``worker_pod``: the etcd credentials (``control.etcd_access``)."""
        self.deleted_at: float | None = None
        """When (monotonic) the last lost workers' deletion was answered, until a replacement is created."""

    async def pods(
        self,
        job: LLMTrainingJob,
        decided: Plan,
        body: kopf.Body,
        logger: kopf.Logger,
        clock: PassClock | None = None,
        refusal: str | None = None,
    ) -> Applied:
        """Everything of the plan before its status: metrics, nodes, live members, deletions, creations.
        ``clock``: the pass's, for the stages of a reaction to a lost worker. ``refusal``: why the operator
        itself refuses the job's workers (``control.tenant_gate``): none is created, each is a refusal."""
        now = time.time()
        clock = clock or PassClock(time.monotonic())
        for signal, since in decided.lost:
            metrics.FAILURES.labels(signal).inc()
            metrics.REPLACEMENTS.inc()
            if since:
                metrics.REACTION.observe(max(0.0, now - since))
        for rule, action in decided.rules_fired:
            metrics.RULE_FIRED.labels(self.namespace, self.name, rule, action).inc()
        await self.marker.record(decided.unhealthy, body, logger)
        if decided.evict:  # before the deletions: the survivors re-form without waiting for leases
            await self.evictor.evict(job, decided.evict, body, logger)
        deleting = time.monotonic()
        answers_of_deletes = await asyncio.gather(
            *(self.kube.delete_pod(self.namespace, d.pod.name, d.pod.uid, d.force) for d in decided.delete)
        )
        deleted = time.monotonic()
        for d, left in zip(decided.delete, answers_of_deletes, strict=True):
            self.expect.expect_deleted(d.pod.uid, gone=left == "gone")
        freed = "gone" in answers_of_deletes  # the plan never creates on an index it deletes from
        pods = [
            self.kueue.place(
                self.dress(
                    worker_pod(
                        job,
                        index,
                        decided.attempt,
                        decided.avoid_nodes,
                        decided.placement,
                        required_avoidance(decided.avoid_hard, decided.avoid_failing, self.marker.enabled)
                        if self.karpenter
                        else None,
                    ),
                    job,
                ),
                job,
            )
            for index in decided.create
        ]
        creating = time.monotonic()
        answers: list[bool | Refusal] = (
            [Refusal(p["metadata"]["name"], REFUSED_BY_OPERATOR, refusal) for p in pods]
            if refusal is not None
            else list(await asyncio.gather(*(self._create(p) for p in pods)))
        )
        self._time_reaction(decided, clock, (deleting, deleted, creating, time.monotonic()), bool(pods))
        created = [a is True for a in answers]
        refused = [a for a in answers if isinstance(a, Refusal)]
        for answer, made in zip(answers, created, strict=True):
            if isinstance(answer, Refusal):  # never created: nothing to expect, the next pass tries again
                logger.warning(f"worker {answer.pod} refused: {answer.message}")
                continue
            if made:
                metrics.PODS_CREATED.inc()
        if any(d.why.stall for d in decided.delete):
            metrics.STALLS.inc()
        if decided.resize is not None:
            old, new, _ = decided.resize
            metrics.count_resize(old, new)
        made_names = [p["metadata"]["name"] for p, made in zip(pods, created, strict=True) if made]
        return Applied(now, made_names, refused, freed=freed and bool(decided.lost))

    def _time_reaction(
        self, decided: Plan, clock: PassClock, marks: tuple[float, float, float, float], created: bool
    ) -> None:
        """The stages of a reaction to a lost worker (``metrics.REACTION_STAGE_NAMES``): the pass that
        deletes it gives queued, planned and deleted; the pass that creates its replacement (the next one:
        at once when the deletion left no object, else once the watch shows it gone) gives replaced and
        created. ``marks``: deletions sent and answered, creations sent and answered (monotonic)."""
        deleting, deleted, creating, answered = marks
        if decided.lost:
            stages = [("planned", deleting - clock.started)]
            if clock.woken is not None:
                stages.append(("queued", clock.started - clock.woken))
            if decided.delete:
                stages.append(("deleted", deleted - deleting))
            metrics.observe_reaction(stages)
            self.deleted_at = deleted
        if created and self.deleted_at is not None:
            if creating - self.deleted_at <= REPLACEMENT_WINDOW_S:
                metrics.observe_reaction(
                    [("replaced", creating - self.deleted_at), ("created", answered - creating)]
                )
            self.deleted_at = None

    async def _create(self, pod: dict[str, Any]) -> bool | Refusal:
        """``Kube.create_pod``, then expected under the UID it answered until the watch shows that UID
        (``control.expectations``). A name already taken (409: the watch lags behind an earlier creation)
        is expected under the UID of the pod that holds it, read back, so no pass creates it again. A
        refusal of the pod itself (admission, quota) is a :class:`Refusal`."""
        name = pod["metadata"]["name"]
        try:
            uid = await self.kube.create_pod(pod)
        except KubeError as exc:
            if exc.status not in REFUSED_STATUSES:
                raise
            return Refusal(name, exc.status, refusal_message(exc.status, exc.reason))
        made = uid is not None
        holder = uid if made else await self.kube.pod_uid(self.namespace, name)
        view = pod_view(pod)
        if holder and view is not None:
            self.expect.expect_created(dataclasses.replace(view, uid=holder, created=time.time()))
        return made

    def announce(
        self,
        decided: Plan,
        applied: Applied,
        status: Mapping[str, Any],
        body: kopf.Body,
        logger: kopf.Logger,
        previous: Mapping[str, Any] | None = None,
    ) -> None:
        """After the status write: the Events (logged too) and the job's gauges. ``previous``: the status
        before this pass (a refusal already reported in it posts no second Event)."""
        events = plan_events(decided, applied.created)
        refusal = refusal_event((previous or {}).get("conditions") or [], _refusal_of(status))
        if refusal is not None:
            events.append(refusal)
        for _, reason, message in events:
            logger.info(f"{reason}: {message}")
        for level, reason, message in events:
            kopf.event(body, type=level, reason=reason, message=message)
        namespace, name = self.namespace, self.name
        sizes = {
            "desired": status["desiredReplicas"],
            "target": status["targetReplicas"],
            "ready": status["readyReplicas"],
            "members": status.get("members"),
            "waiting": status.get("waitingForCapacity", 0),
        }
        metrics.observe_job(namespace, name, status["phase"], sizes)
        metrics.observe_progress(namespace, name, status.get("progress"), applied.now)
        metrics.observe_topology(namespace, name, bool((status.get("topology") or {}).get("spread")))


def _refusal_of(status: Mapping[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == CONDITION), None)


def with_refusals(
    status: Mapping[str, Any], previous: Mapping[str, Any], applied: Applied, generation: int
) -> dict[str, Any]:
    """The pass's status with condition ``WorkersRefused`` (``llm_operator.policy.refusals``) added; while
    it is True, ``Degraded`` counts the workers that exist, not the ones the plan aimed at."""
    if applied.refused and "replicas" in status:  # the plan counted them: they were never created
        status = {**status, "replicas": max(0, int(status["replicas"]) - len(applied.refused))}
    before = list(previous.get("conditions") or [])
    cond = refusal_condition(before, applied.refused, len(applied.created), generation)
    if cond is None:
        return dict(status)
    new = [cond]
    if cond["status"] == "True" and {"phase", "replicas", "targetReplicas", "desiredReplicas"} <= set(status):
        new.append(
            degraded_condition(
                str(status["phase"]),
                int(status["targetReplicas"]),
                int(status["desiredReplicas"]),
                str(cond["message"]),
                generation,
                existing=int(status["replicas"]),
            )
        )
    stamped = {c["type"]: c for c in merge_conditions(before, new, applied.now)}
    conditions = [stamped.pop(c.get("type"), c) for c in status.get("conditions") or []]
    return {**status, "conditions": [*conditions, *stamped.values()]}
