"""The few Kubernetes API calls the operator makes (kubernetes_asyncio, raw responses for speed)."""

from __future__ import annotations

import os
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from llm_operator.api.models import GROUP, PLURAL, VERSION

MERGE_PATCH = "application/merge-patch+json"


async def connect() -> client.ApiClient:
    """An API client from the in-cluster service account, or else the kubeconfig."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        # The library reads $KUBECONFIG once, at import; read it now (tests and the demo set it later).
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
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
        body: Any = obj  # the client serialises plain dicts as they are
        resp: Any
        try:
            if kind == "Pod":
                resp = await self.core.create_namespaced_pod(ns, body, _preload_content=False)
            elif kind == "Service":
                resp = await self.core.create_namespaced_service(ns, body, _preload_content=False)
            elif kind == "Deployment":
                resp = await self.apps.create_namespaced_deployment(ns, body, _preload_content=False)
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
        options: dict[str, Any] = {"preconditions": {"uid": uid}} if uid else {}
        if force:
            options["gracePeriodSeconds"] = 0
        body: Any = options
        extra: dict[str, Any] = {"grace_period_seconds": 0} if force else {}
        try:
            resp = await self.core.delete_namespaced_pod(
                name,
                namespace,
                body=body,
                _preload_content=False,
                **extra,
            )
        except ApiException as exc:
            if exc.status in (404, 409):  # gone already, or the name now belongs to a newer pod
                return False
            raise
        await _release(resp)
        return True

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch the status subresource (None values clear fields)."""
        patch: Any = self.custom.patch_namespaced_custom_object_status  # typed stubs lack _content_type
        resp = await patch(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": status},
            **{"_content_type": MERGE_PATCH, "_preload_content": False},
        )
        await _release(resp)
