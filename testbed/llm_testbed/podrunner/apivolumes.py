"""Fill a pod's API-backed volumes (:mod:`.projected`): read the ConfigMaps and Secrets, request the
ServiceAccount tokens (TokenRequest, bound to the pod) and write the files into the volume folders.

Written once, before the first container starts: later ConfigMap changes and token rotation (a
kubelet refreshes at 80 % of the token's life) are not followed; tokens live ``expirationSeconds``
(the apiserver extends the kube-api-access one to a year), far beyond a test.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llm_testbed.podrunner import projected
from llm_testbed.podrunner.kube import ApiError, Kube

PLURAL = {"configMap": "configmaps", "secret": "secrets"}


async def write(kube: Kube, pod: Mapping[str, Any], volume_dirs: Mapping[str, str | None]) -> None:
    """Write every API-backed volume's files; :class:`projected.SourceMissing` while one is missing."""
    ns = pod["metadata"]["namespace"]
    account = pod.get("spec", {}).get("serviceAccountName") or "default"
    for vs in projected.sources(pod):
        objects: dict[tuple[str, str], dict[str, bytes] | None] = {}
        for ref in vs.objects:
            obj = await kube.get(f"/api/v1/namespaces/{ns}/{PLURAL[ref.kind]}/{ref.name}")
            objects[(ref.kind, ref.name)] = None if obj is None else projected.object_data(ref.kind, obj)
        tokens: dict[projected.TokenRef, str] = {}
        for t in vs.tokens:
            try:
                tokens[t] = await kube.create_token(
                    ns, account, audience=t.audience, seconds=t.expiration_s, pod=pod
                )
            except ApiError as exc:
                if exc.status != 404:
                    raise
                raise projected.SourceMissing(
                    f"volume {vs.name}: ServiceAccount {account} not found"
                ) from None
        content = projected.files(pod, vs, objects, tokens)
        folder = volume_dirs.get(vs.name)
        if folder is not None:
            _write_files(Path(folder), content)


def _write_files(folder: Path, content: Mapping[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for rel, data in content.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o644)
        tmp.replace(path)
