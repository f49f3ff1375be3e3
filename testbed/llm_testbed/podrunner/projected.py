"""Volumes whose files come from the API: ``configMap``, ``secret``, ``downwardAPI`` and ``projected``
(``serviceAccountToken``, ``configMap``, ``secret``, ``downwardAPI`` sources) (pure: no I/O).

:func:`sources` says what each such volume needs (objects to read, tokens to request, fields); once
:mod:`.apivolumes` fetched them, :func:`files` gives the volume's files (relative path -> bytes). The
apiserver's ``kube-api-access-*`` volume is one of these (token, ``kube-root-ca.crt``'s ca.crt, the
namespace), so a container reaches the API with its ServiceAccount as in a cluster.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_testbed.podrunner.plan import PlanError, field_value

API_VOLUME_KINDS = ("configMap", "secret", "downwardAPI", "projected")
DEFAULT_TOKEN_SECONDS = 3600


class SourceMissing(PlanError):
    """A ConfigMap or Secret the volume needs does not exist (yet): the pod waits, as on a kubelet."""


@dataclass(frozen=True)
class ObjectRef:
    """Keys of a ConfigMap or Secret as files: ``items`` (key, path) or every key when None."""

    kind: str  # "configMap" | "secret"
    name: str
    items: tuple[tuple[str, str], ...] | None = None
    optional: bool = False


@dataclass(frozen=True)
class TokenRef:
    path: str
    audience: str | None
    expiration_s: int


@dataclass(frozen=True)
class VolumeSources:
    name: str
    objects: list[ObjectRef] = field(default_factory=list)
    tokens: list[TokenRef] = field(default_factory=list)
    fields: list[tuple[str, str]] = field(default_factory=list)  # (path, fieldRef.fieldPath)


def _object(kind: str, src: Mapping[str, Any]) -> ObjectRef:
    name = str(src.get("name") or src.get("secretName") or "")
    items = src.get("items")
    pairs = tuple((str(i["key"]), str(i["path"])) for i in items) if items else None
    return ObjectRef(kind, name, pairs, bool(src.get("optional", False)))


def _fields(volume: str, src: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for item in src.get("items") or []:
        if "fieldRef" not in item:
            raise PlanError(f"volume {volume}: downwardAPI item {item.get('path')!r}: only fieldRef is "
                            "supported by the local pod runner")  # fmt: skip
        out.append((str(item["path"]), str(item["fieldRef"]["fieldPath"])))
    return out


def sources(pod: Mapping[str, Any]) -> list[VolumeSources]:
    """What each API-backed volume of the pod needs."""
    out = []
    for vol in pod.get("spec", {}).get("volumes", []) or []:
        name = str(vol["name"])
        kind = next((k for k in API_VOLUME_KINDS if k in vol), None)
        if kind is None:
            continue
        src = vol[kind] or {}
        if kind in ("configMap", "secret"):
            out.append(VolumeSources(name, objects=[_object(kind, src)]))
        elif kind == "downwardAPI":
            out.append(VolumeSources(name, fields=_fields(name, src)))
        else:
            vs = VolumeSources(name)
            for part in src.get("sources") or []:
                if "serviceAccountToken" in part:
                    t = part["serviceAccountToken"]
                    expiry = int(t.get("expirationSeconds", DEFAULT_TOKEN_SECONDS))
                    vs.tokens.append(TokenRef(str(t["path"]), t.get("audience"), expiry))
                elif "configMap" in part or "secret" in part:
                    k = "configMap" if "configMap" in part else "secret"
                    vs.objects.append(_object(k, part[k]))
                elif "downwardAPI" in part:
                    vs.fields.extend(_fields(name, part["downwardAPI"]))
                else:
                    raise PlanError(f"volume {name}: projected source {next(iter(part), '?')} is not "
                                    "supported by the local pod runner")  # fmt: skip
            out.append(vs)
    return out


def object_data(kind: str, obj: Mapping[str, Any]) -> dict[str, bytes]:
    """A ConfigMap's ``data`` + ``binaryData`` or a Secret's ``data``, as bytes per key."""
    out: dict[str, bytes] = {}
    if kind == "configMap":
        out.update({k: str(v).encode() for k, v in (obj.get("data") or {}).items()})
        out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    else:
        out.update({k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()})
        out.update({k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()})
    return out


def files(
    pod: Mapping[str, Any],
    vs: VolumeSources,
    objects: Mapping[tuple[str, str], Mapping[str, bytes] | None],
    tokens: Mapping[TokenRef, str],
) -> dict[str, bytes]:
    """The volume's files. ``objects``: (kind, name) -> data (None: no such object); ``tokens``: issued."""
    out: dict[str, bytes] = {}
    for ref in vs.objects:
        data = objects.get((ref.kind, ref.name))
        if data is None:
            if ref.optional:
                continue
            raise SourceMissing(f"volume {vs.name}: {ref.kind} {ref.name} not found")
        for key, path in ref.items if ref.items is not None else [(k, k) for k in data]:
            if key not in data:
                if ref.optional:
                    continue
                raise SourceMissing(f"volume {vs.name}: {ref.kind} {ref.name} has no key {key!r}")
            out[path] = data[key]
    for token in vs.tokens:
        out[token.path] = tokens[token].encode()
    for path, field_path in vs.fields:
        out[path] = field_value(pod, field_path, "", "").encode()
    for path in out:
        if path.startswith("/") or ".." in path.split("/"):
            raise PlanError(f"volume {vs.name}: path {path!r} must be relative, without '..'")
    return out
