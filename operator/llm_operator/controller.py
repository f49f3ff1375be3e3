"""The per-job control loop: wake on any relevant change, plan, apply, write status once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import kopf

from llm_operator import labels, metrics
from llm_operator.api.models import API_VERSION, CLUSTER_RUNTIME_KIND, KIND, LLMTrainingJob
from llm_operator.api.runtime import describe, merge, ref_of
from llm_operator.api.validate import validate
from llm_operator.builders import rendezvous
from llm_operator.builders.desired import support_objects
from llm_operator.builders.worker import live_prefix, worker_pod
from llm_operator.expectations import Expectations
from llm_operator.ghosts import Ghosts, audit_due
from llm_operator.kube import Kube, KubeError
from llm_operator.kueue_sync import KueueSync
from llm_operator.live_evict import evict_pods
from llm_operator.observe import NodeView, PodView, pod_view
from llm_operator.policy.status import merge_conditions
from llm_operator.progress import ProgressTracker, metrics_url, probe, probe_interval, probe_targets
from llm_operator.reconcile import Plan, plan
from llm_operator.settings import Settings

RESYNC_SECONDS = 30.0
MIN_WAIT = 0.02
COALESCE_SECONDS = 0.05
PROBE_IDLE_SECONDS = 10.0
"""How often a job without hang detection re-reads its spec (progressTimeoutSeconds may be set later)."""
RUNTIME_RETRY_SECONDS = 10.0
"""How often a job whose runtime is missing (or whose merged spec is invalid) looks again."""
RUNTIME_CONDITION = "RuntimeResolved"


class JobController:
    """Owns one job while the operator runs it (one per kopf daemon)."""

    def __init__(
        self, kube: Kube, settings: Settings, namespace: str, name: str, ghosts: Ghosts | None = None
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.namespace = namespace
        self.name = name
        self.wake = asyncio.Event()
        self.expect = Expectations()
        self.last_status: dict[str, Any] | None = None
        """The status this controller decided last (the next pass starts from it)."""
        self.written: dict[str, Any] | None = None
        """The status last written successfully."""
        self.support_generation = -1
        self.deleted = False
        self.kueue = KueueSync(kube, settings.kueue)
        self.workloads: Mapping[Any, Iterable[dict[str, Any]]] | None = None
        """The operator's index of Kueue Workloads by (namespace, job); None when Kueue support is off."""
        self.progress = ProgressTracker(settings.progress_seconds)
        """What the metrics probes saw (hang detection and status.progress; an input of every pass)."""
        self.runtime: dict[str, Any] | None = None
        """The copy of the runtime (spec.runtimeRef) this job runs with; recorded as status.runtime."""
        self.runtime_checked: tuple[Any, ...] | None = None
        """(generation, runtime resourceVersion) whose merged spec was last found valid."""
        self.runtime_problem = ""
        """The runtime problem last reported (one Event per new problem)."""
        self._probe_timeout: tuple[Any, int] | None = None
        self.ghosts = ghosts if ghosts is not None else Ghosts()
        """Pods the index holds that are gone (shared by every controller; see ``llm_operator.ghosts``)."""
        self.audited_at = time.monotonic()
        """When this job's slice of the pod index was last checked for ghosts (it starts fresh: kopf
        starts the controllers once the initial listing is indexed)."""
        self.at_size = False
        """The last pass found the job Running with every worker and spare it wants: more room on some
        node changes nothing for it, so a node that comes back need not wake it (handlers.node_changed)."""

    def job_from(self, body: Mapping[str, Any]) -> LLMTrainingJob:
        """The job as last seen, with the status this controller wrote last (watches lag behind).

        A job with spec.runtimeRef is its own spec merged over the runtime's copy (``resolve_runtime``).
        """
        data = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
        data["status"] = self.last_status if self.last_status is not None else dict(body.get("status") or {})
        if self.runtime is not None and ref_of(data.get("spec")) is not None:
            source = describe(self.runtime["kind"], self.runtime["name"])
            data["spec"] = merge(self.runtime.get("spec") or {}, dict(data["spec"]), source).spec
        return LLMTrainingJob.model_validate(data)

    def runnable(self, body: Mapping[str, Any]) -> bool:
        """False while the job names a runtime that is not resolved yet."""
        return ref_of(body.get("spec")) is None or self.runtime is not None

    async def resolve_runtime(self, body: kopf.Body, logger: kopf.Logger) -> bool:
        """Make sure a job with spec.runtimeRef has its runtime's copy and a valid merged spec.

        The runtime is read once per job (and again only when spec.runtimeRef names another one): the
        copy lives in status.runtime, so editing or deleting the runtime never changes a job that already
        uses it, and an operator restart finds the same copy (docs/decisions.md, R3). False: no pass
        (condition RuntimeResolved=False and a Warning Event say why).
        """
        spec = dict(body.get("spec") or {})
        ref = ref_of(spec)
        if ref is None:
            self.runtime = None
            return True
        kind, name = ref
        status = self.last_status if self.last_status is not None else dict(body.get("status") or {})
        snapshot = self.runtime if self.runtime is not None else status.get("runtime")
        if not isinstance(snapshot, dict) or (snapshot.get("kind"), snapshot.get("name")) != ref:
            self.runtime = None
            found = await self.kube.get_runtime(kind, self.namespace, name)
            if found is None:
                where = "" if kind == CLUSTER_RUNTIME_KIND else f" in namespace {self.namespace}"
                message = (
                    f"spec.runtimeRef: {describe(kind, name)} not found{where}; no workers until it exists"
                )
                await self.report_runtime(body, "RuntimeNotFound", message, logger)
                return False
            snapshot = {
                "kind": kind,
                "name": name,
                "resourceVersion": str((found.get("metadata") or {}).get("resourceVersion") or ""),
                "spec": found.get("spec") or {},
            }
        generation = (body.get("metadata") or {}).get("generation")
        checked = (generation, snapshot.get("kind"), snapshot.get("name"), snapshot.get("resourceVersion"))
        if checked != self.runtime_checked:
            manifest = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            result = validate(manifest, snapshot)
            if result.problems:
                self.runtime = None
                await self.report_runtime(body, "InvalidSpec", "; ".join(result.problems), logger)
                return False
            self.runtime_checked = checked
        self.runtime = snapshot
        self.runtime_problem = ""
        return True

    async def report_runtime(self, body: kopf.Body, reason: str, message: str, logger: kopf.Logger) -> None:
        """Condition RuntimeResolved=False in the status (one write) and a Warning Event per new problem."""
        status = self.last_status if self.last_status is not None else dict(body.get("status") or {})
        generation = int((body.get("metadata") or {}).get("generation") or 0)
        old = list(status.get("conditions") or [])
        condition = {
            "type": RUNTIME_CONDITION,
            "status": "False",
            "reason": reason,
            "message": message[:32768],
            "observedGeneration": generation,
        }
        record = {
            "phase": status.get("phase") or "Pending",
            "reason": reason,
            "message": message[:32768],
            "observedGeneration": generation,
            "conditions": [
                *(c for c in old if c.get("type") != RUNTIME_CONDITION),
                *merge_conditions(old, [condition], time.time()),
            ],
        }
        self.last_status = {**status, **record}
        previous = self.written if self.written is not None else dict(body.get("status") or {})
        if _changed(previous, record):
            await self.kube.patch_job_status(self.namespace, self.name, record)
            self.written = {**previous, **record}
        if message != self.runtime_problem:
            self.runtime_problem = message
            logger.warning(f"{reason}: {message}")
            kopf.event(body, type="Warning", reason=reason, message=message)

    async def run(
        self,
        body: kopf.Body,
        pods: Mapping[Any, Iterable[PodView]],
        nodes: Mapping[Any, Iterable[NodeView]],
        stopped: kopf.DaemonStopped,
        logger: kopf.Logger,
    ) -> None:
        """Reconcile until the daemon is stopped; sleep until woken or a deadline in the plan."""
        prober = asyncio.create_task(self.probe_progress(body, pods, stopped, logger))
        try:
            await self._loop(body, pods, nodes, stopped, logger)
        finally:
            prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prober

    async def probe_progress(
        self,
        body: kopf.Body,
        pods_index: Mapping[Any, Iterable[PodView]],
        stopped: kopf.DaemonStopped,
        logger: kopf.Logger,
    ) -> None:
        """Sample the trainer metrics of one or two running workers every interval: for hang detection
        (a quarter of progressTimeoutSeconds, 5-30 s) and for status.progress (half its update interval,
        so every update has a sample at most that old).

        Runs beside the reconcile loop so a slow endpoint never delays a pass; passes read the result.
        """
        while not stopped and not self.deleted:
            interval = PROBE_IDLE_SECONDS
            try:
                runnable = self.runnable(body)
                timeout = self.progress_timeout(body) if runnable else 0
                every = [probe_interval(timeout)] if timeout > 0 else []
                if self.settings.progress_seconds > 0 and runnable:
                    every.append(self.settings.progress_seconds / 2)
                if every:
                    interval = min(every)
                    targets = probe_targets(pods_index.get((self.namespace, self.name), ()))
                    samples = await probe([metrics_url(p) for p in targets])
                    metrics.PROGRESS_PROBES.labels("answered").inc(len(samples))
                    metrics.PROGRESS_PROBES.labels("failed").inc(len(targets) - len(samples))
                    first = self.progress.latest is None
                    self.progress.record(samples, time.time())
                    if first and self.progress.latest is not None:
                        self.wake.set()  # the first progress: no need to wait for the next pass
            except Exception as exc:  # never let the prober die silently: the pass would see stale data
                logger.warning(f"progress probe of {self.namespace}/{self.name} failed: {exc}")
            await asyncio.sleep(interval)

    def progress_timeout(self, body: kopf.Body) -> int:
        """failurePolicy.progressTimeoutSeconds of the job as it runs (runtime merged), validated once per
        spec generation and runtime copy: the prober asks every few seconds (bench/scale.py)."""
        key = ((body.get("metadata") or {}).get("generation"), self.runtime_checked if self.runtime else None)
        if self._probe_timeout is None or self._probe_timeout[0] != key:
            self._probe_timeout = (key, self.job_from(body).spec.failurePolicy.progressTimeoutSeconds)
        return self._probe_timeout[1]

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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=max(MIN_WAIT, timeout))
            if self.wake.is_set():
                # Events come in bursts (a node loss touches every pod on it): one pass for the burst.
                await asyncio.sleep(COALESCE_SECONDS)
            self.wake.clear()
            if stopped or self.deleted:
                break
            started = time.perf_counter()
            try:
                timeout = await self.reconcile(body, pods, nodes, logger)
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
    ) -> float:
        """One pass; returns seconds until the next pass is due without any event."""
        if not await self.resolve_runtime(body, logger):
            return RUNTIME_RETRY_SECONDS
        job = self.job_from(body)
        if self.support_generation != job.metadata.generation:
            for obj in support_objects(job, self.settings):
                await self.kube.create(obj)
            self.support_generation = job.metadata.generation
        audit_at = await self.audit_index(pods_index, logger)
        observed = list(pods_index.get((self.namespace, self.name), ()))
        mine = self.expect.apply(observed)
        nodes = {view.name: view for views in nodes_index.values() for view in views}
        everyone = AllWorkers(pods_index, (self.namespace, self.name), mine)
        now = time.time()
        workload = self.kueue.workload_of(self.workloads, job)
        admission = await self.kueue.admission(job, workload)
        decided = plan(job, mine, nodes, everyone, now, self.progress.progress(), admission)
        await self.apply(job, decided, body, logger)
        await self.kueue.after(job, workload, admission, mine, decided.status, time.time())
        due = [RESYNC_SECONDS]
        if decided.requeue_at is not None:
            due.append(decided.requeue_at - time.time())
        if audit_at is not None:
            due.append(audit_at - time.monotonic())
        return max(MIN_WAIT, min(due))

    async def audit_index(
        self, pods_index: Mapping[Any, Iterable[PodView]], logger: kopf.Logger
    ) -> float | None:
        """Check this job's slice of the pod index against a consistent list when due (after a re-list
        of the pods, and every ``index_audit_seconds``); pods gone from the list become ghosts, filtered
        out of every read. Returns when (monotonic) the next audit is due, None: only after a re-list."""
        every = self.settings.index_audit_seconds
        due = audit_due(self.ghosts.listed_at, self.audited_at, time.monotonic(), every)
        if due is None or due > time.monotonic():
            return due
        indexed = list(pods_index.get((self.namespace, self.name), ()))
        existing = await self.kube.pod_uids(self.namespace, labels.selector(self.name))
        self.audited_at = time.monotonic()
        found = self.ghosts.record(indexed, existing)
        if found:
            metrics.INDEX_GHOSTS.inc(len(found))
            names = ", ".join(sorted(p.name for p in found))
            logger.warning(f"IndexGhosts: {names} deleted during a watch gap; no longer counted")
        return audit_due(self.ghosts.listed_at, self.audited_at, self.audited_at, every)

    async def apply(self, job: LLMTrainingJob, decided: Plan, body: kopf.Body, logger: kopf.Logger) -> None:
        """Deletions, then creations (concurrently), then one status write and the events."""
        now = time.time()
        for signal, since in decided.lost:
            metrics.FAILURES.labels(signal).inc()
            metrics.REPLACEMENTS.inc()
            if since:
                metrics.REACTION.observe(max(0.0, now - since))
        for node, check in decided.unhealthy:
            metrics.UNHEALTHY_NODES.labels(check).inc()
            if self.settings.mark_unhealthy_nodes:
                await self.mark_node(node, check, body, logger)
        if decided.evict:  # before the deletions: the survivors re-form without waiting for leases
            await self.evict_live_members(job, decided.evict, body, logger)
        await asyncio.gather(
            *(self.kube.delete_pod(self.namespace, d.pod.name, d.pod.uid, d.force) for d in decided.delete)
        )
        for d in decided.delete:
            self.expect.expect_deleted(d.pod.uid)
        pods = [
            self.kueue.place(
                worker_pod(job, index, decided.attempt, decided.avoid_nodes, decided.placement), job
            )
            for index in decided.create
        ]
        created = await asyncio.gather(*(self.kube.create(p) for p in pods))
        for pod, made in zip(pods, created, strict=True):
            view = pod_view(pod)
            if view is not None:  # not in the watch yet: created just now
                self.expect.expect_created(dataclasses.replace(view, created=now))
            if made:
                metrics.PODS_CREATED.inc()
        if any(d.reason == "Stalled" for d in decided.delete):
            metrics.STALLS.inc()
        if decided.resize is not None:
            old, new, reason = decided.resize
            metrics.RESIZES.labels("up" if new > old else "down").inc()
        status = {**decided.status, "runtime": self.runtime}
        self.at_size = (
            status.get("phase") == "Running"
            and status.get("targetReplicas") == status.get("desiredReplicas")
            and int(status.get("spareReplicas") or 0) >= job.spec.spareReplicas
        )
        # The decision stands even if the write fails (pods were already changed): the next pass plans
        # from it and writes it again.
        self.last_status = status
        previous = self.written if self.written is not None else dict(body.get("status") or {})
        if _changed(previous, status):
            await self.kube.patch_job_status(self.namespace, self.name, status)
            self.written = status
        events = list(decided.events)
        made_names = [p["metadata"]["name"] for p, made in zip(pods, created, strict=True) if made]
        if made_names:
            events.append(
                ("Normal", "CreatedWorkers", f"created {', '.join(made_names)} (attempt {decided.attempt})")
            )
        if decided.delete:
            gone = ", ".join(
                f"{d.pod.name} ({d.reason}{', force' if d.force else ''})" for d in decided.delete
            )
            events.append(("Normal", "DeletedWorkers", f"deleted {gone}"))
        for _, reason, message in events:
            logger.info(f"{reason}: {message}")
        for level, reason, message in events:
            kopf.event(body, type=level, reason=reason, message=message)
        metrics.observe_job(
            self.namespace,
            self.name,
            status["phase"],
            status["desiredReplicas"],
            status["targetReplicas"],
            status["readyReplicas"],
        )
        metrics.observe_progress(self.namespace, self.name, status.get("progress"), now)
        metrics.observe_topology(
            self.namespace, self.name, bool((status.get("topology") or {}).get("spread"))
        )

    async def mark_node(self, node: str, check: str, body: kopf.Body, logger: kopf.Logger) -> None:
        """Opt-in: label and taint the node so no workload lands there; best effort (an Event on failure)."""
        try:
            marked = await self.kube.mark_node(node, labels.UNHEALTHY_NODE, check)
        except KubeError as exc:
            message = f"could not mark node {node} unhealthy: {exc}"
            logger.warning(f"NodeMarkFailed: {message}")
            kopf.event(body, type="Warning", reason="NodeMarkFailed", message=message)
            return
        if marked:
            metrics.NODES_MARKED.inc()
            logger.info(f"NodeMarked: {node} labelled and tainted {labels.UNHEALTHY_NODE}={check}")

    async def live_etcd(self, job: LLMTrainingJob) -> str:
        """host:port of the job's etcd as the operator reaches it (see llm_operator.live_evict)."""
        if not rendezvous.managed(job):
            return job.spec.rendezvous.endpoint
        ips = await self.kube.running_pod_ips(self.namespace, rendezvous.server_selector(job))
        return f"{ips[0]}:{rendezvous.port(job)}" if ips else rendezvous.endpoint(job)

    async def evict_live_members(
        self, job: LLMTrainingJob, pods: list[str], body: kopf.Body, logger: kopf.Logger
    ) -> None:
        """Best effort: on failure the members' leases remove them a few seconds later."""
        started = time.monotonic()
        try:
            address = await self.live_etcd(job)
            deleted = await evict_pods(address, live_prefix(job), pods)
        except (RuntimeError, KubeError) as exc:
            message = f"could not evict the live members of {', '.join(pods)}: {exc}; their leases expire"
            logger.warning(f"LiveEvictionFailed: {message}")
            kopf.event(body, type="Warning", reason="LiveEvictionFailed", message=message)
            return
        metrics.LIVE_EVICTIONS.inc(deleted)
        logger.info(
            f"LiveMembersEvicted: {deleted} member(s) of {', '.join(pods)} at {address}"
            f" in {1000 * (time.monotonic() - started):.0f} ms"
        )


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


def _changed(previous: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return any(previous.get(k) != v for k, v in new.items())
