"""kopf registrations: indexes of worker pods and nodes, wake-ups, one daemon per job.

Level-based: every handler only records what changed and wakes the affected job's controller;
the controller recomputes everything from the indexes (so a restarted operator converges). What the
handlers share is one ``llm_operator.control.jobs.RunningJobs``, made at start-up and carried in kopf's memo.
The index and event handlers are ``async`` even where they never await: kopf runs a sync handler in a
thread pool, one thread hop per event and handler.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import kopf

from llm_operator import labels
from llm_operator.api.models import GROUP, PLURAL, VERSION
from llm_operator.builders.workload import KUEUE_GROUP, KUEUE_VERSION, WORKLOADS
from llm_operator.control.jobs import MEMO_KEY, RunningJobs, job_facts, running_jobs
from llm_operator.kopf_private import daemon_without_finalizer
from llm_operator.kube import Kube, connect
from llm_operator.loop_health import HeapFreeze, LoopWatch
from llm_operator.observe import NodeView, PodView, node_view, pod_view
from llm_operator.settings import Settings, kueue_enabled

OWNED_LABELS = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
LOOP_WATCH_KEY = "llmjob-loop-watch"
"""Where the start-up handler puts the ``LoopWatch`` in kopf's memo."""
HEAP_FREEZE_KEY = "llmjob-heap-freeze"
"""Where the start-up handler puts the ``HeapFreeze`` in kopf's memo."""


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Tune kopf, open our API client and make the operator's ``RunningJobs``."""
    settings.posting.level = logging.WARNING
    # Every replica needs its own peering priority: with equal priorities kopf pauses all of them.
    # `llmjob operator` draws it before kopf starts (its readiness check needs it); `kopf run` does not.
    if settings.peering.priority == 0:
        settings.peering.priority = secrets.randbelow(2**31 - 2) + 1
    # Resources are known up front; CRD/namespace scanning would need RBAC we do not grant.
    settings.scanning.disabled = True
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="elasticllm.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="elasticllm.dev", key="last-handled-configuration"
    )
    settings.persistence.finalizer = "elasticllm.dev/operator"
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    ours = Settings.from_env()
    settings.peering.lifetime = ours.peering_lifetime_seconds
    memo[MEMO_KEY] = RunningJobs(Kube(await connect()), ours)
    watch = LoopWatch()
    watch.start()
    memo[LOOP_WATCH_KEY] = watch
    freeze = HeapFreeze(ours.gc_thaw_seconds)
    freeze.start()
    memo[HEAP_FREEZE_KEY] = freeze


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else $KUBECONFIG as it is now (not as it was at import time)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Close our API client, stop watching the loop and thaw the heap."""
    jobs = memo.pop(MEMO_KEY, None)
    if isinstance(jobs, RunningJobs):
        await jobs.close()
    watch = memo.pop(LOOP_WATCH_KEY, None)
    if isinstance(watch, LoopWatch):
        await watch.close()
    freeze = memo.pop(HEAP_FREEZE_KEY, None)
    if isinstance(freeze, HeapFreeze):
        freeze.close()


@kopf.index("pods", labels=labels.WORKERS)
async def worker_pods(body: kopf.Body, **_: Any) -> dict[tuple[str, str], PodView] | None:
    """Worker pods by (namespace, job name)."""
    view = pod_view(dict(body))
    job = (body.get("metadata", {}).get("labels") or {}).get(labels.JOB_NAME)
    if view is None or not job:
        return None
    return {(body["metadata"]["namespace"], job): view}


@kopf.index("nodes")
async def nodes(body: kopf.Body, name: str, memo: kopf.Memo, **_: Any) -> dict[str, NodeView]:
    """Every node's health and placement facts by name."""
    return {name: node_view(dict(body), running_jobs(memo).settings.node_conditions)}


@kopf.on.event("pods", labels=labels.WORKERS)
async def pod_changed(
    body: kopf.Body, namespace: str | None, type: str | None, memo: kopf.Memo, **kwargs: Any
) -> None:
    """A worker changed: wake its job (``RunningJobs.pod_changed``; type None: a pod of a listing)."""
    meta = body.get("metadata") or {}
    job = (meta.get("labels") or {}).get(labels.JOB_NAME)
    running_jobs(memo).pod_changed(
        (namespace or "", job or ""),
        meta.get("name") or "",
        meta.get("resourceVersion"),
        type,
        kwargs["worker_pods"],
        meta.get("uid") or "",
    )


@kopf.on.event("nodes")
async def node_changed(
    body: kopf.Body, type: str, memo: kopf.Memo, logger: kopf.Logger, **kwargs: Any
) -> None:
    """A node changed: ``RunningJobs.node_event`` marks it and wakes the jobs it concerns; every job
    still passes every 30 s."""
    jobs = running_jobs(memo)
    view = node_view(dict(body), jobs.settings.node_conditions)
    await jobs.node_event(view, type == "DELETED", kwargs["worker_pods"], logger, kwargs.get("nodes"))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_changed(
    body: kopf.Body, namespace: str | None, name: str, type: str, memo: kopf.Memo, **_: Any
) -> None:
    """Spec, scale or metadata changed: wake the job's controller (its own status writes do not)."""
    running_jobs(memo).job_changed((namespace or "", name), type == "DELETED", job_facts(dict(body)))


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def run_job(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    logger: kopf.Logger,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """One long-lived loop per job, for as long as the job exists and this operator is active."""
    jobs = running_jobs(memo)
    key = (namespace or "", name)
    controller = jobs.start(key)
    try:
        pods = jobs.live(kwargs["worker_pods"])
        node_index: kopf.Index[str, NodeView] = kwargs["nodes"]
        await controller.run(body, pods, node_index, stopped, logger, kwargs.get("kueue_workloads"))
    finally:
        jobs.stop(key, controller)


async def kueue_workloads(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]] | None:
    """Kueue Workloads made by this operator, by (namespace, job name)."""
    job = (body.get("metadata", {}).get("labels") or {}).get(labels.JOB_NAME)
    if not job:
        return None
    return {(body["metadata"]["namespace"], job): dict(body)}


async def workload_changed(body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """Kueue admitted, evicted or requeued a Workload: wake its job."""
    job = (body.get("metadata", {}).get("labels") or {}).get(labels.JOB_NAME)
    running_jobs(memo).wake((namespace or "", job or ""))


if kueue_enabled():
    # Registered only with Kueue support on (the chart's kueue.enabled). Without Kueue's CRD kopf
    # warns once that workloads.kueue.x-k8s.io cannot be served and watches the rest as usual.
    kopf.index(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, labels=OWNED_LABELS)(kueue_workloads)
    kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, labels=OWNED_LABELS)(workload_changed)

daemon_without_finalizer(run_job)
