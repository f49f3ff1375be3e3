"""The jobs one operator run serves, and which of them an event wakes.

A ``RunningJobs`` is made by the start-up handler and lives in kopf's memo: kopf hands every handler the
operator's memo or a shallow copy of it per object (docs.kopf.dev, "In-memory containers"), so all
handlers share this one object and nothing is kept at module level; an operator started again in the
same process (the in-process tests, the demo) starts with nothing left over.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import kopf

from llm_operator import metrics
from llm_operator.control.controller import JobController
from llm_operator.control.endpoints import Endpoints
from llm_operator.control.ghosts import Ghosts, ListingAudit, LiveWorkers
from llm_operator.control.node_marking import NodeMarker
from llm_operator.control.scheduling_events import SchedulingEvents
from llm_operator.kube import Kube
from llm_operator.observe import NodeView, PodView
from llm_operator.policy.brake import HealthBrake
from llm_operator.settings import Settings

MEMO_KEY = "llmjob"
"""Where the start-up handler puts the ``RunningJobs`` in kopf's memo."""

JobKey = tuple[str, str]
"""(namespace, name) of a job."""

NodeHealth = tuple[bool, bool, tuple[tuple[str, str], ...]]
"""(ready, unschedulable, taints as (key, effect) and failing conditions as ("condition:<type>", "")): what
a node event must change to wake jobs (a condition that clears is room coming back, like a taint)."""


def job_facts(body: Mapping[str, Any]) -> Hashable:
    """What of a job's object a pass reads beyond its status: generation (spec and scale), labels,
    annotations, deletion. An event that changes none of it (the controller's own status write) wakes
    nobody: the controller plans from the status it decided, never from the watched one."""
    meta = body.get("metadata") or {}
    return (
        meta.get("generation"),
        tuple(sorted((meta.get("labels") or {}).items())),
        tuple(sorted((meta.get("annotations") or {}).items())),
        meta.get("deletionTimestamp"),
    )


def node_health(view: NodeView, deleted: bool) -> NodeHealth | None:
    """What of a node decides whether its event wakes anyone; None for a deleted node."""
    if deleted:
        return None
    failing = tuple(("condition:" + kind, "") for kind, _ in view.failing)
    return (view.ready, view.unschedulable, tuple((k, e) for k, e, _ in view.taints) + failing)


def node_improved(old: NodeHealth | None, new: NodeHealth | None) -> bool:
    """Whether a node can take workers it could not take before: new, Ready again, uncordoned, or a
    taint gone. Deletions and every other change only ever take room away."""
    if new is None:
        return False
    if old is None:
        return True
    return (new[0] and not old[0]) or (old[1] and not new[1]) or bool(set(old[2]) - set(new[2]))


def node_lost(old: NodeHealth | None, new: NodeHealth | None) -> bool:
    """Whether the node's workers are lost now: Ready before, and now deleted or not Ready. Their jobs pass
    at once, without waiting for the rest of the burst (``controller.COALESCE_SECONDS``)."""
    return old is not None and old[0] and (new is None or not new[0])


class RunningJobs:
    """The controllers of the jobs this operator runs (one per kopf daemon), what they share, and the
    wake-up routing of every event: handlers only record what changed and wake the jobs it concerns."""

    def __init__(self, kube: Kube, settings: Settings) -> None:
        self.kube = kube
        self.settings = settings
        self.controllers: dict[JobKey, JobController] = {}
        self.node_health: dict[str, NodeHealth | None] = {}
        """Each node's health as last seen: node events that change none of it (heartbeats) wake nobody."""
        self.job_facts: dict[JobKey, Hashable] = {}
        """Each job's ``job_facts`` as last seen: events that change none of them wake nobody."""
        self.pod_versions: dict[tuple[str, str], str | None] = {}
        """Each worker pod's resourceVersion as last seen, by (namespace, pod): a listing that brings a pod
        unchanged wakes nobody for it."""
        self.ghosts = Ghosts()
        """Worker pods the index holds although they are gone (``llm_operator.control.ghosts``)."""
        self.listing_audit = ListingAudit(kube, self.ghosts, self.wake)
        """Audits the whole index after a listing of the pods, and wakes the jobs that had a ghost."""
        self.endpoints = Endpoints()
        """The one HTTP client of every controller's periodic requests to pods (probes, generation reads)."""
        self.scheduling = SchedulingEvents(kube.failed_scheduling)
        """One read of a namespace's FailedScheduling events for all its jobs' probers."""
        self.brake = HealthBrake(settings.health_brake)
        """The one brake on node marking and health replacements (``llm_operator.policy.brake``)."""
        self.marker = NodeMarker(kube, settings.mark_unhealthy_nodes, self.brake)
        """Marks unhealthy nodes, for every workload, shared by every job's controller
        (``llm_operator.control.node_marking``)."""

    def live(self, pods_index: Mapping[Any, Iterable[PodView]]) -> LiveWorkers:
        """The worker index without its ghosts."""
        return LiveWorkers(pods_index, self.ghosts)

    def start(self, key: JobKey) -> JobController:
        """A new controller for the job, the one its events wake from now on."""
        controller = JobController(
            self.kube,
            self.settings,
            *key,
            ghosts=self.ghosts,
            endpoints=self.endpoints,
            scheduling=self.scheduling,
            marker=self.marker,
        )
        self.controllers[key] = controller
        return controller

    def stop(self, key: JobKey, controller: JobController) -> None:
        """The job's loop ended: forget its controller (unless a newer one took its place)."""
        if self.controllers.get(key) is controller:
            del self.controllers[key]

    def wake(self, key: JobKey) -> None:
        controller = self.controllers.get(key)
        if controller is not None:
            controller.wake_up()

    def pod_changed(
        self,
        key: JobKey,
        pod: str,
        version: str | None,
        kind: str | None,
        pods_index: Mapping[Any, Iterable[PodView]],
        uid: str = "",
    ) -> None:
        """A worker pod's event (``kind``: kopf's event type, None for a pod of a listing): wake its job,
        unless a listing brought the pod unchanged (the same resourceVersion as its last event). The
        first pod of a listing also starts one audit of the whole index (``ghosts.ListingAudit``) for pods
        deleted while the watch was away: it wakes only the jobs that had one, never every job (their
        passes would queue in front of a job that lost a worker)."""
        ident = (key[0], pod)
        if kind == "DELETED":
            self.pod_versions.pop(ident, None)
            controller = self.controllers.get(key)
            if controller is not None and uid:  # settles its creation even if no pass saw it exist
                controller.expect.watched_deleted(uid)
            self.wake(key)
            return
        known = self.pod_versions.get(ident)
        self.pod_versions[ident] = version
        if kind is None:
            if self.ghosts.note_listed():
                self.listing_audit.listed(pods_index)
            if version is not None and known == version:
                return
        self.wake(key)

    async def node_event(
        self,
        view: NodeView,
        deleted: bool,
        pods_index: Mapping[Any, Iterable[PodView]],
        logger: kopf.Logger,
        nodes_index: Mapping[Any, Iterable[NodeView]] | None = None,
    ) -> None:
        """A node changed (heartbeats change nothing here): with node marking on, first mark or unmark it
        for its platform conditions (``NodeMarker.follow_conditions``), then wake the jobs it concerns
        (:meth:`node_changed`)."""
        health = node_health(view, deleted)
        if nodes_index is not None:  # the brake decides which failing conditions are obeyed
            nodes = {v.name: v for views in nodes_index.values() for v in views}
            self.marker.see(nodes)
            self.brake.filter_nodes(nodes, self.marker.marked(), time.time())
        if health is not None and self.node_health.get(view.name) != health:
            await self.marker.follow_conditions(view, self.settings.node_conditions.keys(), logger)
        self.node_changed(view.name, health, pods_index)

    async def close(self) -> None:
        """Stop an audit in flight and close the API and HTTP clients (the operator stops)."""
        await self.listing_audit.close()
        await self.endpoints.close()
        await self.kube.api.close()

    def node_changed(
        self, name: str, health: NodeHealth | None, pods_index: Mapping[Any, Iterable[PodView]]
    ) -> None:
        """Wake the jobs with a worker on the node, always, and when the node gained room every job that
        is not at its size (it may grow). Never every job: their passes would queue in front of the job
        that lost a worker."""
        old = self.node_health.get(name)
        if old == health:
            return
        if health is None:
            self.node_health.pop(name, None)
        else:
            self.node_health[name] = health
        improved, lost = node_improved(old, health), node_lost(old, health)
        on_node = {key for key, views in self.live(pods_index).items() if any(v.node == name for v in views)}
        for key, controller in list(self.controllers.items()):
            if key in on_node or (improved and not controller.at_size):
                controller.wake_up(urgent=lost)  # lost: only the jobs on the node are woken

    def job_changed(self, key: JobKey, deleted: bool, facts: Hashable = None) -> None:
        """Spec, scale or metadata changed (``facts``, see :func:`job_facts`; None: always): wake the job's
        controller. Deleted: end its loop (no finalizer; the children go by ownerReferences) and drop its
        metrics."""
        if not deleted and facts is not None:
            if self.job_facts.get(key) == facts:
                return
            self.job_facts[key] = facts
        if deleted:
            self.job_facts.pop(key, None)
            metrics.forget_job(*key)
            controller = self.controllers.get(key)
            if controller is not None:
                controller.job_deleted()
        self.wake(key)


def running_jobs(memo: Mapping[str, Any]) -> RunningJobs:
    """The ``RunningJobs`` of this operator run, from any handler's memo."""
    jobs = memo.get(MEMO_KEY)
    if not isinstance(jobs, RunningJobs):
        raise RuntimeError(f"no {MEMO_KEY!r} in kopf's memo: the operator's start-up handler did not run")
    return jobs
