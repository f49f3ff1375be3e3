"""The few API calls the runner makes, as raw JSON over kubernetes_asyncio's HTTP session.

Objects stay plain dicts (no model classes): lists, one watch stream per resource, status merge
patches and the final delete that a kubelet makes once a pod's containers are gone.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config


class ApiError(RuntimeError):
    def __init__(self, status: int, text: str) -> None:
        self.status = status
        super().__init__(f"HTTP {status}: {text[:300]}")


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    @classmethod
    async def connect(cls, kubeconfig: Path) -> Kube:
        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        return cls(client.ApiClient(configuration=cfg))

    async def close(self) -> None:
        await self.api.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | aiohttp.ClientTimeout = 30.0,
    ) -> Any:
        resp = await self.api.call_api(
            path,
            method,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=timeout,
        )
        return resp

    async def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        resp = await self._request(method, path, **kwargs)
        try:
            text = await resp.text()
        finally:
            resp.release()
        if not 200 <= resp.status <= 299:
            raise ApiError(resp.status, text)
        data: dict[str, Any] = json.loads(text)
        return data

    async def list(self, path: str) -> tuple[list[dict[str, Any]], str]:
        """Every object at ``path`` and the list's resourceVersion (to watch from)."""
        data = await self.json("GET", path)
        return data.get("items", []), data["metadata"]["resourceVersion"]

    async def watch(self, path: str, resource_version: str) -> AsyncIterator[dict[str, Any]]:
        """Watch events (``{"type", "object"}``) from ``resource_version`` until the server ends it."""
        query = {"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": "600"}  # fmt: skip
        timeout = aiohttp.ClientTimeout(connect=10.0, sock_connect=10.0, sock_read=700.0)
        resp = await self._request("GET", path, query=query, timeout=timeout)
        try:
            if resp.status != 200:
                raise ApiError(resp.status, await resp.text())
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.release()

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.json("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def patch_pod_status(self, namespace: str, name: str, uid: str, status: Mapping[str, Any]) -> None:
        """Merge-patch a pod's status; the uid makes it fail (409/422) on a new pod of the same name."""
        await self.json(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            body={"metadata": {"uid": uid}, "status": dict(status)},
            content_type="application/merge-patch+json",
        )

    @property
    def server(self) -> str:
        """The apiserver's URL (``https://HOST:PORT``)."""
        return str(self.api.configuration.host)

    async def create_token(
        self, namespace: str, account: str, *, audience: str | None, seconds: int, pod: Mapping[str, Any]
    ) -> str:
        """A ServiceAccount token from the TokenRequest API, bound to ``pod`` (as a kubelet asks for one)."""
        meta = pod["metadata"]
        spec: dict[str, Any] = {
            "expirationSeconds": seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
        }
        if audience:
            spec["audiences"] = [audience]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
        data = await self.json("POST", path, body=body)
        return str(data["status"]["token"])

    async def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """Finish a graceful deletion (what a kubelet does once the containers are gone)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": uid}}  # fmt: skip
        try:
            await self.json("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body)
        except ApiError as exc:
            if exc.status not in (404, 409):  # gone already, or a new pod of that name
                raise
