"""Runtimes: platform defaults that a job names in ``spec.runtimeRef``, merged under the job's own spec.

Merge rules (pure, table-tested in tests/unit/test_runtime.py):

- a field the job sets wins over the runtime's; a field the job leaves out (or sets to null) comes
  from the runtime; a field neither sets gets the API default when the merged spec is validated;
- objects (``resources``, ``fsx``, ``rendezvous``, ``failurePolicy``, ``scheduling``,
  ``scheduling.nodeSelector``) merge field by field, with the same rule at every level;
- lists of named items merge by name, job last: ``env`` by ``name``, ``scheduling.tolerations`` by
  ``(key, effect)``, the pod template's ``imagePullSecrets``, ``volumes``, ``initContainers`` and
  ``containers`` by ``name``, ``monitoring.rules`` by ``name``; the runtime's items the job does not
  name keep their order, then come the
  job's items in the job's order (a job item replaces the runtime's item of the same name whole);
- the pod template's ``metadata.labels``, ``metadata.annotations`` and ``spec.securityContext`` merge key
  by key like any object;
- everything else is atomic: the job's value replaces the runtime's whole (``command``, ``args``,
  ``scheduling.instanceTypes``, ``scheduling.affinity``, ``failurePolicy.nonRetryableExitCodes``,
  an env item's ``valueFrom``, ``podTemplate.spec.dnsConfig``, ``podTemplate.spec.hostAliases``).

Every leaf of the merged spec remembers where it came from (``Merged.origins``), so a problem found
on the merged spec can name the field and its source: ``(spec.maxReplicas from
ClusterLLMTrainingRuntime p5)``.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, create_model

from llm_operator.api.models import (
    CLUSTER_RUNTIME_KIND,
    RUNTIME_KIND,
    RUNTIME_KINDS,
    LLMTrainingJobSpec,
)

JOB = "the job"


def _name(item: Any) -> Any:
    return item.get("name") if isinstance(item, dict) else repr(item)


_NAMED_LISTS: dict[str, Callable[[Any], Any]] = {
    "env": _name,
    "scheduling.tolerations": lambda item: (
        (item.get("key", ""), item.get("effect", "")) if isinstance(item, dict) else repr(item)
    ),
    "podTemplate.spec.imagePullSecrets": _name,
    "podTemplate.spec.volumes": _name,
    "podTemplate.spec.initContainers": _name,
    "podTemplate.spec.containers": _name,
    "monitoring.rules": _name,
}
_ATOMIC = {"scheduling.affinity", "podTemplate.spec.dnsConfig"}


def describe(kind: str, name: str) -> str:
    """How problems and conditions name a runtime: ``ClusterLLMTrainingRuntime p5``."""
    return f"{kind} {name}"


def ref_of(spec: Any) -> tuple[str, str] | None:
    """(kind, name) of a raw job spec's runtimeRef, or None; kind defaults to LLMTrainingRuntime."""
    if not isinstance(spec, dict) or not isinstance(spec.get("runtimeRef"), dict):
        return None
    ref = spec["runtimeRef"]
    return str(ref.get("kind") or RUNTIME_KIND), str(ref.get("name") or "")


@dataclass
class Merged:
    """A merged spec and where each of its fields came from."""

    spec: dict[str, Any]
    source: str
    """The runtime, as ``describe()`` names it."""
    origins: dict[str, str] = field(default_factory=dict)
    """Field path (``spec.fsx.claimName``, ``spec.env[2]``) -> JOB or ``source``."""

    def origin(self, path: str) -> str | None:
        """Where the value at ``path`` came from: the field, the fields under it, or an ancestor."""
        if path in self.origins:
            return self.origins[path]
        below = {v for k, v in self.origins.items() if k.startswith((path + ".", path + "["))}
        if len(below) == 1:
            return below.pop()
        if below:
            return f"{JOB} and {self.source}"
        probe = path
        while probe:
            if probe in self.origins:
                return self.origins[probe]
            cut = max(probe.rfind("."), probe.rfind("["))
            probe = probe[:cut] if cut > 0 else ""
        return None


def _mark(origins: dict[str, str], value: Any, path: str, source: str) -> None:
    if isinstance(value, dict) and path.removeprefix("spec.") not in _ATOMIC and value:
        for key, item in value.items():
            _mark(origins, item, f"{path}.{key}", source)
    else:
        origins[path] = source
        if isinstance(value, list):
            for i in range(len(value)):
                origins[f"{path}[{i}]"] = source


def _merge(base: Any, over: Any, rel: str, merged: Merged) -> Any:
    path = f"spec.{rel}" if rel else "spec"
    if over is None:
        _mark(merged.origins, base, path, merged.source)
        return copy.deepcopy(base)
    if base is None:
        _mark(merged.origins, over, path, JOB)
        return copy.deepcopy(over)
    if isinstance(base, dict) and isinstance(over, dict) and rel not in _ATOMIC:
        out: dict[str, Any] = {}
        for key in [*base, *(k for k in over if k not in base)]:
            value = _merge(base.get(key), over.get(key), f"{rel}.{key}" if rel else key, merged)
            if value is not None:
                out[key] = value
        return out
    if isinstance(base, list) and isinstance(over, list) and rel in _NAMED_LISTS:
        name = _NAMED_LISTS[rel]
        named = {name(item) for item in over}
        items = [
            *((merged.source, item) for item in base if name(item) not in named),
            *((JOB, item) for item in over),
        ]
        merged.origins[path] = f"{JOB} and {merged.source}"
        for i, (source, item) in enumerate(items):
            merged.origins[f"{path}[{i}]"] = source
            _mark(merged.origins, item, f"{path}[{i}]", source)
        return [copy.deepcopy(item) for _, item in items]
    _mark(merged.origins, over, path, JOB)
    return copy.deepcopy(over)


def merge(runtime_spec: dict[str, Any], job_spec: dict[str, Any], source: str) -> Merged:
    """The job's spec over the runtime's (see the module docstring); inputs are not changed."""
    merged = Merged(spec={}, source=source)
    merged.spec = _merge(runtime_spec or {}, job_spec or {}, "", merged) or {}
    return merged


_FIELD = re.compile(r"\bspec(?:\.[A-Za-z][A-Za-z0-9]*)+")


def annotate(path: str, message: str, merged: Merged | None) -> str:
    """``message`` with the source of each field it names (the field at ``path`` first)."""
    if merged is None:
        return message
    fields = [path] if path.startswith("spec.") else []
    fields += [f for f in _FIELD.findall(message) if f not in fields and not path.startswith(f + "[")]
    notes = []
    for name in fields:
        origin = merged.origin(name)
        where = f"set by neither {JOB} nor {merged.source}" if origin is None else f"from {origin}"
        note = f"{name} {where}"
        if note not in notes:
            notes.append(note)
    return f"{message} ({'; '.join(notes)})" if notes else message


@functools.cache
def runtime_spec_model() -> type[BaseModel]:
    """A job's spec with every top-level field optional and without defaults: a runtime's spec."""
    fields: dict[str, Any] = {}
    for name, info in LLMTrainingJobSpec.model_fields.items():
        if name == "runtimeRef":
            continue
        loose = copy.copy(info)
        loose.default = None
        loose.default_factory = None
        fields[name] = (Optional[info.annotation], loose)  # noqa: UP045 (a runtime value, not a hint)
    model: type[BaseModel] = create_model(
        "LLMTrainingRuntimeSpec", __config__=ConfigDict(extra="forbid", populate_by_name=True), **fields
    )
    return model


def runtime_key(doc: dict[str, Any], namespace: str = "") -> tuple[str, str, str]:
    """(kind, namespace, name) of a runtime document; namespace "" when cluster-scoped."""
    kind = str(doc.get("kind"))
    meta = doc.get("metadata") or {}
    ns = "" if kind == CLUSTER_RUNTIME_KIND else str(meta.get("namespace") or namespace or "default")
    return kind, ns, str(meta.get("name") or "")


def is_runtime(doc: Any) -> bool:
    """A runtime document of our API group."""
    return isinstance(doc, dict) and doc.get("kind") in RUNTIME_KINDS
