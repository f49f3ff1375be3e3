"""Reads of the API server over one kept-alive HTTPS connection, for the test bed's polls.

A test that waits for a condition reads the same object again and again. As a kubectl process per read, that
cost ~42 ms of CPU each (Go start-up, discovery cache), 5,242 reads in one integration tier: 15 % of its CPU,
beside the API server's own share (docs/decisions.md, CI4). :class:`ApiReader` answers the same questions
(``kubectl get KIND [NAME]`` with label and field selectors) from the API directly: kinds are resolved by
discovery (plural, singular, short name, ``plural.group``), as kubectl resolves them, and list items carry
their ``kind`` and ``apiVersion``, as kubectl prints them. Writes stay with kubectl.

The kubeconfig is read by kubernetes_asyncio's loader (certificates as files or data, tokens); a reader is
kept per kubeconfig file and made again when that file changes (a cluster restarted under the same name).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import ssl
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from llm_testbed.localcluster.errors import LocalClusterError

TIMEOUT_S = 30.0


class ApiReadError(LocalClusterError):
    """The API server answered a read with an error (or could not be reached)."""

    def __init__(self, what: str, status: int, message: str) -> None:
        self.status = status
        super().__init__(
            f"reading {what} failed (HTTP {status}): {message}" if status else f"{what}: {message}"
        )

    @property
    def not_found(self) -> bool:
        return self.status == 404


@dataclass(frozen=True)
class Resource:
    """One API resource as discovery lists it."""

    group_version: str  # "v1", "apps/v1"
    plural: str
    kind: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None = None) -> str:
        root = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        ns = f"/namespaces/{urllib.parse.quote(namespace)}" if self.namespaced and namespace else ""
        tail = f"/{urllib.parse.quote(name)}" if name else ""
        return f"{root}{ns}/{self.plural}{tail}"


def _connection_settings(kubeconfig: Path) -> client.Configuration:
    cfg = client.Configuration()
    asyncio.run(config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg))
    return cfg


class ApiReader:
    """GETs against one API server; thread-safe (one connection, one lock)."""

    def __init__(self, kubeconfig: Path) -> None:
        cfg = _connection_settings(kubeconfig)
        url = urllib.parse.urlsplit(str(cfg.host))
        self._host = url.hostname or "127.0.0.1"
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._tls: ssl.SSLContext | None = None
        if url.scheme == "https":
            self._tls = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
            if not cfg.verify_ssl:
                self._tls.check_hostname = False
                self._tls.verify_mode = ssl.CERT_NONE
            if cfg.cert_file:
                self._tls.load_cert_chain(cfg.cert_file, cfg.key_file)
        token = (cfg.api_key or {}).get("BearerToken") or (cfg.api_key or {}).get("authorization")
        self._headers = {"Accept": "application/json"} | ({"Authorization": token} if token else {})
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._resources: dict[str, Resource] = {}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- HTTP ----------------------------------------------------------------------------------------------

    def _connect(self) -> http.client.HTTPConnection:
        if self._tls is not None:
            return http.client.HTTPSConnection(self._host, self._port, timeout=TIMEOUT_S, context=self._tls)
        return http.client.HTTPConnection(self._host, self._port, timeout=TIMEOUT_S)

    def _get(self, path: str, what: str) -> tuple[int, bytes]:
        with self._lock:
            for attempt in (1, 2):  # a kept connection the server closed meanwhile is opened again, once
                if self._conn is None:
                    self._conn = self._connect()
                try:
                    self._conn.request("GET", path, headers=self._headers)
                    resp = self._conn.getresponse()
                    return resp.status, resp.read()
                except (OSError, http.client.HTTPException) as exc:
                    self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise ApiReadError(what, 0, f"API server {self._host}:{self._port}: {exc}") from exc
        raise AssertionError("unreachable")

    def _json(self, path: str, what: str) -> dict[str, Any] | None:
        """The decoded body; ``None`` for a 404."""
        status, body = self._get(path, what)
        if status == 404:
            return None
        if status >= 400:
            try:
                message = str(json.loads(body).get("message", ""))
            except ValueError:
                message = body[:300].decode(errors="replace")
            raise ApiReadError(what, status, message)
        data: dict[str, Any] = json.loads(body)
        return data

    # -- discovery -----------------------------------------------------------------------------------------

    def _discover(self) -> dict[str, Resource]:
        found: dict[str, Resource] = {}
        versions = ["v1"]
        groups = (self._json("/apis", "API groups") or {}).get("groups", [])
        versions += [g["preferredVersion"]["groupVersion"] for g in groups]
        for gv in versions:
            root = "/api/v1" if gv == "v1" else f"/apis/{gv}"
            listing = self._json(root, f"resources of {gv}") or {}
            group = gv.rpartition("/")[0]
            for r in listing.get("resources", []):
                if "/" in r["name"]:  # a subresource (pods/log)
                    continue
                res = Resource(gv, r["name"], r["kind"], bool(r["namespaced"]))
                names = {r["name"], r.get("singularName") or r["kind"].lower(), *r.get("shortNames", [])}
                for n in names:  # core, then the first group, win a shared short name, as in kubectl
                    found.setdefault(n, res)
                    if group:
                        found[f"{n}.{group}"] = res
        return found

    def resource(self, kind: str) -> Resource:
        """The resource ``kind`` names: plural, singular, short name or ``plural.group`` (as in kubectl)."""
        key = kind.lower()
        if key not in self._resources:
            self._resources = self._discover()  # a CRD installed since the last look
        if key not in self._resources:
            raise ApiReadError(kind, 0, f'the server does not have a resource type "{kind}"')
        return self._resources[key]

    # -- reads ---------------------------------------------------------------------------------------------

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """One object, or ``None`` when it does not exist (``namespace`` ``None``: ``default``)."""
        res = self.resource(kind)
        return self._json(res.path(namespace or "default", name), f"{kind} {name}")

    def items(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        labels: str | None = None,
        fields: str | None = None,
        all_namespaces: bool = False,
    ) -> list[dict[str, Any]]:
        """The objects of ``kind`` (comma-separated kinds: each in turn), with ``kind`` and ``apiVersion``
        set on each; ``namespace`` ``None`` without ``all_namespaces`` is ``default``, as in kubectl."""
        out: list[dict[str, Any]] = []
        for one in kind.split(","):
            res = self.resource(one)
            query = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v}
            path = res.path(None if all_namespaces else (namespace or "default"))
            if query:
                path += "?" + urllib.parse.urlencode(query)
            listing = self._json(path, f"{one} list") or {}
            for item in listing.get("items", []):
                out.append({"kind": res.kind, "apiVersion": res.group_version, **item})
        return out


_readers: dict[tuple[str, int], ApiReader] = {}
_readers_lock = threading.Lock()


def reader_for(kubeconfig: Path | None) -> ApiReader:
    """The reader of ``kubeconfig`` (``None``: ``$KUBECONFIG``), made again when the file changed."""
    if kubeconfig is None and not os.environ.get("KUBECONFIG"):
        raise LocalClusterError(
            "KUBECONFIG is not set: run `llmjob cluster up` and export the path it prints"
        )
    path = kubeconfig if kubeconfig is not None else Path(os.environ["KUBECONFIG"])
    try:
        key = (str(path.resolve()), path.stat().st_mtime_ns)
    except OSError as exc:
        raise LocalClusterError(f"kubeconfig {path} cannot be read: {exc.strerror}") from exc
    with _readers_lock:
        if key not in _readers:
            for old in [k for k in _readers if k[0] == key[0]]:  # that file's earlier cluster
                _readers.pop(old).close()
            _readers[key] = ApiReader(path)
        return _readers[key]
