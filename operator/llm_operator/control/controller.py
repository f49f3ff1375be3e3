"""The per-job control loop: wake on any relevant change, plan, apply, write status once.

A pass: resolve the job's runtime (``runtime_resolution``), create its support objects once per
generation, audit its slice of the pod index (``ghosts``), gather what ``plan()`` needs (pods with this
controller's expectations, nodes, every job's workers, the progress the ``prober`` saw, Kueue's
verdict), plan, carry out the pod changes (``apply``), write the status (``status_writer``, the only
writer), then the Events and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import kopf

from llm_operator import metrics
from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders.desired import support_objects
from llm_operator.control.apply import PassClock, PlanApplier, at_size, with_refusals
from llm_operator.control.endpoints import Endpoints
from llm_operator.control.etcd_access import EtcdAccess
from llm_operator.control.expectations import Expectations
from llm_operator.control.ghosts import Ghosts, IndexAudit
from llm_operator.control.kueue_sync import KueueSync
from llm_operator.control.live_evict import LiveEvictor
from llm_operator.control.node_marking import NodeMarker, braked
from llm_operator.control.prober import ProgressProber
from llm_operator.control.scheduling_events import SchedulingEvents
from llm_operator.control.status_writer import StatusWriter
from llm_operator.control.tenant_gate import TenantGate
from llm_operator.kube import Kube
from llm_operator.observe import NodeView, PodView
from llm_operator.policy.brake import HealthBrake
from llm_operator.reconcile import plan
from llm_operator.runtime_resolution import RuntimeResolver, unresolved_status
from llm_operator.settings import Settings

RESYNC_SECONDS = 30.0
MIN_WAIT = 0.02
COALESCE_SECONDS = 0.05
RUNTIME_RETRY_SECONDS = 10.0
"""How often a job whose runtime is missing (or whose merged spec is invalid) looks again."""


class JobController:
    """Owns one job while the operator runs it (one per kopf daemon): wires its parts and runs the loop."""

    def __init__(
        self,
        kube: Kube,
        settings: Settings,
        namespace: str,
        name: str,
        ghosts: Ghosts | None = None,
        endpoints: Endpoints | None = None,
        scheduling: SchedulingEvents | None = None,
        marker: NodeMarker | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.namespace = namespace
        self.name = name
        self.wake = asyncio.Event()
        self.deleted = False
        self.support_generation = -1
        self.expect = Expectations()
        self.status = StatusWriter(kube, namespace, name)
        self.runtime = RuntimeResolver(kube, namespace, name)
        self.etcd = EtcdAccess(kube, namespace, settings.etcd_auth)
        """The job's etcd credentials: its Secret, its user in its etcd, the token of the operator's calls."""
        self.live = LiveEvictor(kube, namespace, endpoints, access=self.etcd)
        self.prober = ProgressProber(
            (namespace, name),
            settings.progress_seconds,
            self.runtime,
            self.status,
            self.wake,
            self.live.generation_pods,
            scheduling.read if scheduling is not None else kube.failed_scheduling,
            endpoints,
        )
        self.ghosts = ghosts if ghosts is not None else Ghosts()
        """Pods the index holds that are gone (shared by every controller; see
        ``llm_operator.control.ghosts``)."""
        self.audit = IndexAudit(kube, namespace, name, self.ghosts, settings.index_audit_seconds)
        self.kueue = KueueSync(kube, settings.kueue)
        self.workloads: Mapping[Any, Iterable[dict[str, Any]]] | None = None
        """The operator's index of Kueue Workloads by (namespace, job); None when Kueue support is off."""
        self.marker = marker or NodeMarker(
            kube, settings.mark_unhealthy_nodes, HealthBrake(settings.health_brake)
        )
        """Marks unhealthy nodes through the operator's one brake (shared by every job: ``control.jobs``)."""
        self.tenants = TenantGate(kube, settings.tenant_policy, namespace)
        """The tenant rules on the spec this job runs (``control.tenant_gate``)."""
        self.applier = PlanApplier(
            kube,
            namespace,
            name,
            self.expect,
            self.kueue,
            self.marker,
            self.live,
            settings.karpenter,
            self.etcd.dress,
        )
        self.at_size = False
        """The last pass found the job Running with every worker and spare it wants (``apply.at_size``):
        a node that comes back need not wake it (``llm_operator.control.jobs``)."""
        self.replace_now = False
        """The last pass deleted a lost worker and its name is free already (``apply.Applied.freed``): the
        next pass runs at once and creates the replacement, before the watch shows the deletion."""
        self.woken_at: float | None = None
        """When (monotonic) the first event since the last pass started woke the job (``apply.PassClock``)."""
        self.urgent = False
        """A node of one of its workers was lost since the last pass began: no coalescing (``wake_up``)."""

    def wake_up(self, urgent: bool = False) -> None:
        """An event concerns the job: run a pass soon. ``urgent``: one of its workers' node was lost (deleted,
        or no longer Ready): the pass runs at once, the burst of pod events that follows gets its own."""
        if self.woken_at is None:
            self.woken_at = time.monotonic()
        self.urgent = self.urgent or urgent
        self.wake.set()

    def job_deleted(self) -> None:
        """The job is gone: the loop ends at its next wake-up."""
        self.deleted = True

    def job_from(self, body: Mapping[str, Any]) -> LLMTrainingJob:
        """The job as last seen, with the status this controller decided last, its runtime merged."""
        return self.runtime.job(body, self.status.current(body))

    async def run(
        self,
        body: kopf.Body,
        pods: Mapping[Any, Iterable[PodView]],
        nodes: Mapping[Any, Iterable[NodeView]],
        stopped: kopf.DaemonStopped,
        logger: kopf.Logger,
        workloads: Mapping[Any, Iterable[dict[str, Any]]] | None = None,
    ) -> None:
        """Reconcile until the daemon is stopped; sleep until woken or a deadline in the plan.
        ``workloads``: the operator's index of Kueue Workloads (None with Kueue support off)."""
        self.workloads = workloads
        prober = asyncio.create_task(self.prober.run(body, pods, stopped, lambda: self.deleted, logger))
        try:
            await self._loop(body, pods, nodes, stopped, logger)
            if self.deleted:  # its user and role in the shared etcd go with it
                await self._forget_etcd_user(body, logger)
        finally:
            prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prober

    async def _forget_etcd_user(self, body: kopf.Body, logger: kopf.Logger) -> None:
        try:
            job = self.job_from(body)
        except Exception as exc:  # a job whose runtime never resolved made no etcd user
            logger.debug(f"no etcd user to delete for {self.namespace}/{self.name}: {exc}")
            return
        await self.etcd.forget(job)

    async def _loop(
        self,
        body: kopf.Body,
        pods: Mapping[Any, Iterable[PodView]],
        nodes: Mapping[Any, Iterable[NodeView]],
        stopped: kopf.DaemonStopped,
        logger: kopf.Logger,
    ) -> None:
        timeout = 0.0
        while not stopped and not self.deleted:
            if self.replace_now:  # a lost worker's name is free: its replacement waits for nothing
                self.replace_now = False
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=max(MIN_WAIT, timeout))
                if self.wake.is_set() and not self.urgent:
                    # Events come in bursts (a node loss touches every pod on it): one pass for the burst.
                    await asyncio.sleep(COALESCE_SECONDS)
            self.wake.clear()
            self.urgent = False
            if stopped or self.deleted:
                break
            started = time.perf_counter()
            clock = PassClock(time.monotonic(), self.woken_at)
            self.woken_at = None
            try:
                timeout = await self.reconcile(body, pods, nodes, logger, clock)
            except Exception as exc:  # keep the loop alive: retry with backoff, visible in metrics and events
                metrics.RECONCILE_ERRORS.inc()
                logger.exception(f"reconcile of {self.namespace}/{self.name} failed: {exc}")
                timeout = 5.0
            finally:
                metrics.RECONCILES.inc()
                metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    async def reconcile(
        self,
        body: kopf.Body,
        pods_index: Mapping[Any, Iterable[PodView]],
        nodes_index: Mapping[Any, Iterable[NodeView]],
        logger: kopf.Logger,
        clock: PassClock | None = None,
    ) -> float:
        """One pass; returns seconds until the next pass is due without any event. ``clock``: when the pass
        started and what woke it (the stages of a reaction, ``apply.PassClock``)."""
        problem = await self.runtime.resolve(body, self.status.current(body))
        if problem is not None:
            current = self.status.current(body)
            generation = int((body.get("metadata") or {}).get("generation") or 0)
            record = unresolved_status(current, generation, problem, time.time())
            await self.status.write(body, {**current, **record}, record)
            self.runtime.report(problem, body, logger)
            return RUNTIME_RETRY_SECONDS
        job = self.job_from(body)
        refused = await self.tenants.refusal(job, self.runtime.version())  # then nothing is made at all
        if refused is None and self.support_generation != job.metadata.generation:
            for obj in support_objects(job, self.settings):
                await self.kube.create(obj)
            self.support_generation = job.metadata.generation
        etcd_retry = (
            await self.etcd.ensure(job, lambda: self.live.running_etcd(job)) if refused is None else None
        )
        audit_at = await self.audit.run(pods_index, logger)
        observed = list(pods_index.get((self.namespace, self.name), ()))
        for uid, pod in self.expect.overdue():  # the watch never showed them: ask, never assume them gone
            self.expect.confirm(uid, await self.kube.pod_uid(self.namespace, pod) == uid)
        mine = self.expect.apply(observed)
        nodes = {view.name: view for views in nodes_index.values() for view in views}
        self.marker.see(nodes)
        nodes, held = self.marker.brake.filter_nodes(nodes, self.marker.marked(), time.time())
        for report in held:
            braked(report, body, logger)
        everyone = AllWorkers(pods_index, (self.namespace, self.name), mine)
        now = time.time()
        workload = self.kueue.workload_of(self.workloads, job)
        admission = await self.kueue.admission(job, workload)
        decided = plan(job, mine, nodes, everyone, now, self.prober.tracker.progress(), admission)
        previous = self.status.current(body)
        applied = await self.applier.pods(job, decided, body, logger, clock, refused)
        self.replace_now = applied.freed
        status = with_refusals(
            {**decided.status, "runtime": self.runtime.copy}, previous, applied, job.metadata.generation
        )
        self.at_size = at_size(status, job.spec.spareReplicas)
        await self.status.write(body, status)
        self.applier.announce(decided, applied, status, body, logger, previous)
        await self.kueue.after(job, workload, admission, mine, decided.status, time.time())
        due = [RESYNC_SECONDS]
        if etcd_retry is not None:
            due.append(etcd_retry)
        if decided.requeue_at is not None:
            due.append(decided.requeue_at - time.time())
        if audit_at is not None:
            due.append(audit_at - time.monotonic())
        if self.status.due is not None:  # a held counter change (``status_writer``)
            due.append(self.status.due - time.monotonic())
        return max(MIN_WAIT, min(due))


class AllWorkers:
    """Every job's workers as one pass sees them: the index's for the other jobs, ``mine`` (with this
    controller's expectations) for its own. Lazy and re-iterable: a pass walks it only when the job could
    grow (capacity), so 1,000 jobs of 8 workers do not copy 8,000 views per pass (bench/scale.py)."""

    def __init__(
        self, pods_index: Mapping[Any, Iterable[PodView]], own: tuple[str, str], mine: Iterable[PodView]
    ) -> None:
        self.pods_index = pods_index
        self.own = own
        self.mine = mine

    def __iter__(self) -> Iterator[PodView]:
        for key, views in self.pods_index.items():
            if key != self.own:
                yield from views
        yield from self.mine
