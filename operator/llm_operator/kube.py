"""The few Kubernetes API calls the operator makes (kubernetes_asyncio, raw responses for speed)."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from llm_operator.api.models import GROUP, PLURAL, VERSION

MERGE_PATCH = "application/merge-patch+json"


async def connect() -> client.ApiClient:
    """An API client from the in-cluster service account, or else the kubeconfig."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        await config.load_kube_config()
    return client.ApiClient()


async def _release(response: Any) -> None:
    release = getattr(response, "release", None)
    if release is not None:
        result = release()
        if hasattr(result, "__await__"):
            await result


class Kube:
    """Create/delete children and write job status. Idempotent where the API allows it."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    async def create(self, obj: dict[str, Any]) -> bool:
        """Create an object; False when it already exists (deterministic names make that success)."""
        ns = obj["metadata"]["namespace"]
        kind = obj["kind"]
        try:
            if kind == "Pod":
                resp = await self.core.create_namespaced_pod(ns, obj, _preload_content=False)
            elif kind == "Service":
                resp = await self.core.create_namespaced_service(ns, obj, _preload_content=False)
            elif kind == "Deployment":
                resp = await self.apps.create_namespaced_deployment(ns, obj, _preload_content=False)
            else:
                group, version = obj["apiVersion"].split("/")
                plural = kind.lower() + "s"
                resp = await self.custom.create_namespaced_custom_object(
                    group, version, ns, plural, obj, _preload_content=False
                )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        await _release(resp)
        return True

    async def delete_pod(self, namespace: str, name: str, uid: str, force: bool) -> bool:
        """Delete one pod by name and UID (never a newer pod of the same name); grace 0 when forced."""
        body: dict[str, Any] = {"preconditions": {"uid": uid}} if uid else {}
        if force:
            body["gracePeriodSeconds"] = 0
        try:
            resp = await self.core.delete_namespaced_pod(
                name,
                namespace,
                body=body,
                grace_period_seconds=0 if force else None,
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status in (404, 409):  # gone already, or the name now belongs to a newer pod
                return False
            raise
        await _release(resp)
        return True

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch the status subresource (None values clear fields)."""
        resp = await self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": status},
            _content_type=MERGE_PATCH,
            _preload_content=False,
        )
        await _release(resp)
