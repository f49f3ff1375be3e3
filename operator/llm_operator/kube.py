"""The few Kubernetes API calls the operator makes (kubernetes_asyncio, raw responses for speed)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, Literal

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from llm_operator.api.models import (
    CLUSTER_RUNTIME_KIND,
    CLUSTER_RUNTIME_PLURAL,
    GROUP,
    PLURAL,
    RUNTIME_PLURAL,
    VERSION,
)
from llm_operator.observe import parse_time
from llm_operator.policy.unschedulable import SchedulingEvent

_NodeMark = tuple[dict[str, str | None], list[dict[str, Any]]]
"""A node mark's change: the label patch (None removes) and the node's whole new taint list."""

MERGE_PATCH = "application/merge-patch+json"
LIST_PAGE = 500
"""Pods per page of a consistent list (the audits of ``control.ghosts``): one JSON decode never holds the
event loop for a whole namespace of workers."""


async def connect() -> client.ApiClient:
    """An API client from the in-cluster service account, or else the kubeconfig."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        # The library reads $KUBECONFIG once, at import; read it now (tests and the demo set it later).
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
    return client.ApiClient()


class KubeError(Exception):
    """The apiserver answered with an error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason[:500]}")
        self.status = status
        self.reason = reason
        """The answer's body (a ``Status`` object as JSON) or the client's reason."""


async def _checked(call: Any) -> int:
    """Await a raw (``_preload_content=False``) call, raise KubeError on a non-2xx answer, release it.

    kubernetes_asyncio only checks the status when it decodes the body; raw responses must be checked here.
    """
    return (await _answered(call))[0]


async def _answered(call: Any) -> tuple[int, bytes]:
    """``_checked``, with the answer's body."""
    try:
        response = await call
    except ApiException as exc:
        raise KubeError(int(exc.status or 0), str(exc.reason)) from exc
    try:
        status = int(response.status)
        body = await response.read()  # read to the end so the connection goes back to the pool
        if not 200 <= status <= 299:
            raise KubeError(status, body.decode(errors="replace"))
        return status, body
    finally:
        response.release()


Deleted = Literal["gone", "terminating", "absent"]
"""What a pod deletion left: no object (its name is free), an object that terminates (a grace period or
a finalizer), or nothing to delete (gone already, or the name belongs to a newer pod)."""


def deleted_state(body: bytes) -> Deleted:
    """``gone`` or ``terminating`` from a DELETE's answer: the object as deleted, or a ``Status``."""
    try:
        obj = json.loads(body)
    except ValueError:
        return "terminating"  # unreadable: assume the name is still taken
    if not isinstance(obj, dict) or obj.get("kind") == "Status":
        return "gone" if isinstance(obj, dict) and obj.get("status") == "Success" else "terminating"
    meta = obj.get("metadata") or {}
    grace = meta.get("deletionGracePeriodSeconds")
    return "gone" if not meta.get("finalizers") and grace in (None, 0) else "terminating"


class Kube:
    """Create/delete children and write job status. Idempotent where the API allows it."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.networking = client.NetworkingV1Api(api)

    async def create(self, obj: dict[str, Any]) -> bool:
        """Create an object; False when it already exists (deterministic names make that success)."""
        ns = obj["metadata"]["namespace"]
        kind = obj["kind"]
        body: Any = obj  # the client serialises plain dicts as they are
        call: Any
        if kind == "Pod":
            call = self.core.create_namespaced_pod(ns, body, _preload_content=False)
        elif kind == "Service":
            call = self.core.create_namespaced_service(ns, body, _preload_content=False)
        elif kind == "Deployment":
            call = self.apps.create_namespaced_deployment(ns, body, _preload_content=False)
        elif kind == "Secret":  # the job's etcd credentials: the operator creates Secrets, never reads them
            call = self.core.create_namespaced_secret(ns, body, _preload_content=False)
        elif kind == "NetworkPolicy":
            call = self.networking.create_namespaced_network_policy(ns, body, _preload_content=False)
        else:
            group, version = obj["apiVersion"].split("/")
            plural = kind.lower() + "s"
            call = self.custom.create_namespaced_custom_object(
                group, version, ns, plural, body, _preload_content=False
            )
        try:
            await _checked(call)
        except KubeError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def create_pod(self, pod: dict[str, Any]) -> str | None:
        """Create a pod: the UID the API server gave it, None when its name is taken (409)."""
        body: Any = pod
        call = self.core.create_namespaced_pod(pod["metadata"]["namespace"], body, _preload_content=False)
        try:
            _, answer = await _answered(call)
        except KubeError as exc:
            if exc.status == 409:
                return None
            raise
        return str((json.loads(answer).get("metadata") or {}).get("uid") or "")

    async def pod_uid(self, namespace: str, name: str) -> str | None:
        """The UID of the pod ``name`` (one GET), None when there is none or it is being deleted."""
        try:
            _, answer = await _answered(
                self.core.read_namespaced_pod(name, namespace, _preload_content=False)
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        meta = json.loads(answer).get("metadata") or {}
        return None if meta.get("deletionTimestamp") else str(meta.get("uid") or "") or None

    async def delete_pod(self, namespace: str, name: str, uid: str, force: bool) -> Deleted:
        """Delete one pod by name and UID (never a newer pod of the same name); grace 0 when forced."""
        options: dict[str, Any] = {"preconditions": {"uid": uid}} if uid else {}
        if force:
            options["gracePeriodSeconds"] = 0
        body: Any = options
        extra: dict[str, Any] = {"grace_period_seconds": 0} if force else {}
        call = self.core.delete_namespaced_pod(name, namespace, body=body, _preload_content=False, **extra)
        try:
            _, answer = await _answered(call)
        except KubeError as exc:
            if exc.status in (404, 409):  # gone already, or the name now belongs to a newer pod
                return "absent"
            raise
        return deleted_state(answer) if force else "terminating"

    async def running_pods(self, namespace: str, selector: dict[str, str]) -> list[tuple[str, str]]:
        """(UID, IP) of the Running pods whose labels match ``selector``."""
        labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        try:
            pods: Any = await self.core.list_namespaced_pod(namespace, label_selector=labels)
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), str(exc.reason)) from exc
        return [
            (str(p.metadata.uid), str(p.status.pod_ip))
            for p in pods.items
            if p.status is not None
            and p.status.phase == "Running"
            and p.status.pod_ip
            and p.metadata.deletion_timestamp is None
        ]

    async def failed_scheduling(self, namespace: str) -> list[SchedulingEvent]:
        """The namespace's ``FailedScheduling`` events of pods (one LIST with field selectors)."""
        try:
            listed: Any = await self.core.list_namespaced_event(
                namespace, field_selector="reason=FailedScheduling,involvedObject.kind=Pod"
            )
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), str(exc.reason)) from exc
        out = []
        for item in listed.items:
            source = (item.source.component if item.source is not None else None) or item.reporting_component
            when = (
                item.last_timestamp
                or item.event_time
                or item.first_timestamp
                or item.metadata.creation_timestamp
            )
            out.append(
                SchedulingEvent(
                    pod=str(item.involved_object.name or ""),
                    source=str(source or ""),
                    message=str(item.message or ""),
                    time=parse_time(when) or 0.0,
                )
            )
        return out

    async def pod_uids(self, namespace: str, selector: dict[str, str]) -> set[str]:
        """UIDs of the pods whose labels match ``selector``, by a consistent read (no resourceVersion:
        the answer holds every pod that existed when it was asked; ``control.ghosts`` relies on that).
        Read in pages of ``LIST_PAGE`` pods; the pages after the first come from the first one's snapshot."""
        labels = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        uids: set[str] = set()
        token = ""
        while True:
            page = await self._pod_page(namespace, labels, token)
            uids.update(str(item["metadata"]["uid"]) for item in page.get("items") or [])
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return uids

    async def _pod_page(self, namespace: str, labels: str, token: str) -> dict[str, Any]:
        """One page of a pod list, decoded (``token``: the page before's ``continue``, "": the first page)."""
        try:
            response: Any = await self.core.list_namespaced_pod(
                namespace, label_selector=labels, limit=LIST_PAGE, _continue=token, _preload_content=False
            )
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), str(exc.reason)) from exc
        try:
            body = await response.read()
            if not 200 <= int(response.status) <= 299:
                raise KubeError(int(response.status), body.decode(errors="replace"))
        finally:
            response.release()
        page: dict[str, Any] = json.loads(body)
        return page

    async def get_runtime(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A runtime object (LLMTrainingRuntime in ``namespace``, or ClusterLLMTrainingRuntime); None: 404."""
        try:
            if kind == CLUSTER_RUNTIME_KIND:
                body: Any = await self.custom.get_cluster_custom_object(
                    GROUP, VERSION, CLUSTER_RUNTIME_PLURAL, name
                )
            else:
                body = await self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, RUNTIME_PLURAL, name
                )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubeError(int(exc.status or 0), str(exc.reason)) from exc
        return dict(body)

    async def namespace_labels(self, name: str) -> dict[str, str]:
        """The labels of a namespace (the tenant policy's privileged label; RBAC: get namespaces)."""
        _, body = await _answered(self.core.read_namespace(name, _preload_content=False))
        labels = (json.loads(body).get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}

    async def mark_node(self, name: str, key: str, value: str) -> bool:
        """Label the node ``key=value`` and add the taint ``key=value:NoSchedule`` (once). False: the node
        is gone or already carries the taint."""

        def marked(labels: dict[str, str], taints: list[dict[str, Any]]) -> _NodeMark | None:
            if any(t.get("key") == key for t in taints):
                return None
            return {key: value}, [*taints, {"key": key, "value": value, "effect": "NoSchedule"}]

        return await self._remark_node(name, marked)

    async def unmark_node(self, name: str, key: str, value: str) -> bool:
        """Remove the label and the taint ``key`` that ``mark_node`` put, only while the label still reads
        ``value`` (a person's mark, or another one, stays). False: gone, or not so marked."""

        def unmarked(labels: dict[str, str], taints: list[dict[str, Any]]) -> _NodeMark | None:
            if labels.get(key) != value:
                return None
            return {key: None}, [t for t in taints if t.get("key") != key]

        return await self._remark_node(name, unmarked)

    async def _remark_node(
        self, name: str, change: Callable[[dict[str, str], list[dict[str, Any]]], _NodeMark | None]
    ) -> bool:
        """Read the node, let ``change`` decide its label patch and whole new taint list (None: nothing to
        do), and write both guarded by the node's resourceVersion (a conflict is retried once). False: the
        node is gone or ``change`` found nothing to do."""
        for _ in range(2):
            try:
                node: Any = await self.core.read_node(name)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise KubeError(int(exc.status or 0), str(exc.reason)) from exc
            taints = [
                {k: v for k, v in t.to_dict().items() if v is not None and k != "time_added"}
                for t in (node.spec.taints or [])
            ]
            decided = change(dict(node.metadata.labels or {}), taints)
            if decided is None:
                return False
            labels, new_taints = decided
            patch: Any = {
                "metadata": {"labels": labels, "resourceVersion": node.metadata.resource_version},
                "spec": {"taints": new_taints},
            }
            try:
                call: Any = self.core.patch_node  # typed stubs lack _content_type
                await _checked(call(name, patch, **{"_content_type": MERGE_PATCH, "_preload_content": False}))
            except KubeError as exc:
                if exc.status == 409:
                    continue
                if exc.status == 404:
                    return False
                raise
            return True
        return False

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch the status subresource (None values clear fields)."""
        patch: Any = self.custom.patch_namespaced_custom_object_status  # typed stubs lack _content_type
        await _checked(
            patch(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": status},
                **{"_content_type": MERGE_PATCH, "_preload_content": False},
            )
        )
