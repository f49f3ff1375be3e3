"""Small readers and writers of the integration tests (the API read directly, kubectl for writes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from llm_operator import labels
from llm_testbed.localcluster.apireader import ApiReadError

from tests.support.wait import wait_for


def apply(cluster: Any, doc: dict[str, Any], *extra: str) -> Any:
    return cluster.kubectl("apply", "-f", "-", *extra, input=yaml.safe_dump(doc), check=False)


def job(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    """The job, or ``{}`` while it is missing or the API server does not answer (a control-plane fault)."""
    try:
        return cluster.kube.get("llmtrainingjobs", name, namespace) or {}
    except ApiReadError:
        return {}


def status(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    data: dict[str, Any] = job(cluster, namespace, name).get("status") or {}
    return data


def events(cluster: Any, namespace: str, reason: str = "", *, fields: str = "") -> list[dict[str, Any]]:
    """The Events in ``namespace`` (of ``reason``, and that the field selector ``fields`` picks), read once:
    for an Event that a synchronous call posted, or to show one is absent. An Event that tells of a change
    another process made is waited for (:func:`wait_events`)."""
    selector = ",".join(s for s in (f"reason={reason}" if reason else "", fields) if s)
    return cluster.kube.items("events", namespace, fields=selector or None)


EVENT_TIMEOUT_S = 30.0


def wait_events(
    cluster: Any,
    namespace: str,
    reason: str,
    where: Callable[[dict[str, Any]], bool] = lambda _: True,
    timeout: float = EVENT_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """The Events of ``reason`` in ``namespace`` that ``where`` keeps, once there is one. An Event is posted
    after the change it tells of (the operator writes its status first and kopf posts Events from a queue; a
    kubelet's and Kueue's recorders are asynchronous too), so a test that saw the change waits for it."""

    def found() -> list[dict[str, Any]]:
        return [e for e in events(cluster, namespace, reason) if where(e)]

    return wait_for(found, timeout, f"an Event {reason} in namespace {namespace}")


def workers(cluster: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    """The job's worker pods; ``[]`` while the API server does not answer (a control-plane fault)."""
    try:
        return cluster.kube.items("pods", namespace, labels=f"{labels.JOB_NAME}={name},{labels.ROLE}=worker")
    except ApiReadError:
        return []


def live_workers(cluster: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    return [p for p in workers(cluster, namespace, name) if not p["metadata"].get("deletionTimestamp")]


def running_workers(cluster: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        p for p in live_workers(cluster, namespace, name) if p.get("status", {}).get("phase") == "Running"
    ]


REACT_AT_ONCE = {"nodeFailureGraceSeconds": 0, "resizeCooldownSeconds": 0}
"""The test bed's jobs react to a lost node and resize at once: a test's own ``failurePolicy`` adds to this,
and names a grace or a cooldown only where it tests one (the API's 30 s grace, waited out by tests that
set other fields, was a third of their time)."""


def job_manifest(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "minReplicas": 2,
        "maxReplicas": 4,
        "image": "ghcr.io/elasticllm/llm-trainer:test",
        "gpusPerNode": 0,
    }
    body.update(spec)
    body["failurePolicy"] = {**REACT_AT_ONCE, **(spec.get("failurePolicy") or {})}
    return {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }
