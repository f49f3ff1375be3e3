"""kopf registrations: indexes of worker pods and nodes, wake-ups, one daemon per job.

Level-based: every handler only records what changed and wakes the affected job's controller;
the controller recomputes everything from the indexes (so a restarted operator converges).
The index and event handlers are ``async`` although they never await: kopf runs a sync handler in a
thread pool (a hop per event and handler), about 8 % of the operator's time at 1,000 jobs x 8 workers
(docs/benchmarks.md, "Operator at 1,000 jobs").
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from typing import Any

import kopf

from llm_operator import labels, metrics
from llm_operator.api.models import GROUP, PLURAL, VERSION
from llm_operator.builders.workload import KUEUE_GROUP, KUEUE_VERSION, WORKLOADS
from llm_operator.controller import JobController
from llm_operator.ghosts import Ghosts, LiveWorkers
from llm_operator.kube import Kube, connect
from llm_operator.observe import NodeView, PodView, node_view, pod_view
from llm_operator.settings import Settings, kueue_enabled

WORKER_LABELS = {labels.ROLE: labels.ROLE_WORKER, labels.MANAGED_BY: labels.MANAGED_BY_VALUE}

NodeHealth = tuple[bool, bool, tuple[tuple[str, str], ...]]
"""(ready, unschedulable, taints as (key, effect)): what a node event must change to wake jobs."""

_controllers: dict[tuple[str, str], JobController] = {}
_node_health: dict[str, NodeHealth | None] = {}
_state: dict[str, Any] = {}
_ghosts = Ghosts()
"""Worker pods the index holds although they are gone (``llm_operator.ghosts``)."""


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Tune kopf and open our API client."""
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
    _state["kube"] = Kube(await connect())
    _state["settings"] = ours


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else $KUBECONFIG as it is now (not as it was at import time)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    """Close our API client."""
    kube = _state.pop("kube", None)
    if kube is not None:
        await kube.api.close()


@kopf.index("pods", labels=WORKER_LABELS)
async def worker_pods(body: kopf.Body, **_: Any) -> dict[tuple[str, str], PodView] | None:
    """Worker pods by (namespace, job name)."""
    view = pod_view(dict(body))
    job = (body.get("metadata", {}).get("labels") or {}).get(labels.JOB_NAME)
    if view is None or not job:
        return None
    return {(body["metadata"]["namespace"], job): view}


@kopf.index("nodes")
async def nodes(body: kopf.Body, name: str, **_: Any) -> dict[str, NodeView]:
    """Every node's health and placement facts by name."""
    return {name: node_view(dict(body))}


@kopf.on.event("pods", labels=WORKER_LABELS)
async def pod_changed(body: kopf.Body, namespace: str | None, type: str | None, **_: Any) -> None:
    """A worker changed: wake its job. A pod from a listing (type None: kopf re-listed after a watch
    gap) wakes every job once per listing, to audit the index for pods deleted in the gap."""
    if type is None and _ghosts.note_listed():
        for other in list(_controllers.values()):
            other.wake.set()
    job = (body.get("metadata", {}).get("labels") or {}).get(labels.JOB_NAME)
    controller = _controllers.get((namespace or "", job or ""))
    if controller is not None:
        controller.wake.set()


def node_improved(old: NodeHealth | None, new: NodeHealth | None) -> bool:
    """Whether a node can take workers it could not take before: new, Ready again, uncordoned, or a
    taint gone. Deletions and every other change only ever take room away."""
    if new is None:
        return False
    if old is None:
        return True
    return (new[0] and not old[0]) or (old[1] and not new[1]) or bool(set(old[2]) - set(new[2]))


@kopf.on.event("nodes")
async def node_changed(body: kopf.Body, name: str, type: str, **kwargs: Any) -> None:
    """A node's health, taints or schedulability changed (not a heartbeat): wake the jobs it concerns.

    Those with a worker on it, always, and when the node gained room every job that is not at its size
    (it may grow). Waking all 1,000 jobs for every node event put 1,000 passes in front of the one job
    that lost a worker (docs/benchmarks.md, "Operator at 1,000 jobs"); every job still passes every 30 s.
    """
    view = node_view(dict(body))
    summary: NodeHealth | None = (
        None
        if type == "DELETED"
        else (view.ready, view.unschedulable, tuple((k, e) for k, e, _ in view.taints))
    )
    old = _node_health.get(name)
    if old == summary:
        return
    if type == "DELETED":
        _node_health.pop(name, None)
    else:
        _node_health[name] = summary
    improved = node_improved(old, summary)
    pods = LiveWorkers(kwargs["worker_pods"], _ghosts)
    on_node = {key for key, views in pods.items() if any(v.node == name for v in views)}
    for key, controller in list(_controllers.items()):
        if key in on_node or (improved and not controller.at_size):
            controller.wake.set()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_changed(namespace: str | None, name: str, type: str, **_: Any) -> None:
    """Spec or scale changed: wake the job's controller."""
    key = (namespace or "", name)
    controller = _controllers.get(key)
    if type == "DELETED":
        metrics.forget_job(*key)
        if controller is not None:
            controller.deleted = True  # no finalizer: end the loop ourselves; children go by ownerReferences
    if controller is not None:
        controller.wake.set()


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def run_job(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    logger: kopf.Logger,
    **kwargs: Any,
) -> None:
    """One long-lived loop per job, for as long as the job exists and this operator is active."""
    key = (namespace or "", name)
    controller = JobController(_state["kube"], _state["settings"], *key, ghosts=_ghosts)
    _controllers[key] = controller
    try:
        pods = LiveWorkers(kwargs["worker_pods"], _ghosts)
        node_index: kopf.Index[str, NodeView] = kwargs["nodes"]
        controller.workloads = kwargs.get("kueue_workloads")
        await controller.run(body, pods, node_index, stopped, logger)
    finally:
        if _controllers.get(key) is controller:
            del _controllers[key]


async def kueue_workloads(body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict[str, Any]] | None:
    """Kueue Workloads made by this operator, by (namespace, job name)."""
    job = (body.get("metadata", {}).get("labels") or {}).get(labels.JOB_NAME)
    if not job:
        return None
    return {(body["metadata"]["namespace"], job): dict(body)}


async def workload_changed(body: kopf.Body, namespace: str | None, **_: Any) -> None:
    """Kueue admitted, evicted or requeued a Workload: wake its job."""
    job = (body.get("metadata", {}).get("labels") or {}).get(labels.JOB_NAME)
    controller = _controllers.get((namespace or "", job or ""))
    if controller is not None:
        controller.wake.set()


if kueue_enabled():
    # Registered only with Kueue support on (the chart's kueue.enabled). Without Kueue's CRD kopf
    # warns once that workloads.kueue.x-k8s.io cannot be served and watches the rest as usual.
    _owned = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
    kopf.index(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, labels=_owned)(kueue_workloads)
    kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, labels=_owned)(workload_changed)


def _daemon_without_finalizer() -> None:
    """kopf gives every daemon a finalizer; ours needs none (children are garbage-collected through
    ownerReferences and the loop ends on the DELETED event), and a finalizer would block job and
    namespace deletion whenever the operator is down. See docs/decisions.md."""
    spawning = kopf.get_default_registry()._spawning
    spawning._handlers = [
        dataclasses.replace(h, requires_finalizer=False) if h.fn is run_job else h for h in spawning._handlers
    ]


_daemon_without_finalizer()
