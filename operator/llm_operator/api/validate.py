"""Validate an LLMTrainingJob manifest exactly as the apiserver would, without one.

Two layers, in the apiserver's order: the schema (types, bounds, enums, unknown fields; here through
the pydantic models the schema is generated from), then every ``x-kubernetes-validations`` CEL rule
of the generated CRD, evaluated with cel-python on the defaulted object. Each problem is one line
naming the field.

A job with ``spec.runtimeRef`` is checked after its runtime's spec is merged under its own
(``llm_operator.api.runtime``): the line then also says where each named field came from, the job or
the runtime. The operator checks what it runs the same way.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from pydantic import ValidationError

from llm_operator.api import crd
from llm_operator.api.models import API_VERSION, KIND, RUNTIME_KINDS, LLMTrainingJob
from llm_operator.api.rules import DETAILS, FSX_VOLUME, QUANTITY_PATTERN, SHM_VOLUME
from llm_operator.api.runtime import Merged, annotate, describe, merge, ref_of, runtime_spec_model

Problem = tuple[str, str]
"""(field path, one-line message)."""


@dataclass(frozen=True)
class Result:
    """A validated job (None when invalid) and the problems found."""

    job: LLMTrainingJob | None
    problems: list[str]
    merged: Merged | None = None
    """The merged spec and its origins, for a job with spec.runtimeRef whose runtime was found."""


def _loc(parts: tuple[int | str, ...]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("int", "str"):  # the branch names of a Quantity union
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


def pydantic_problems(error: ValidationError, prefix: str = "") -> list[Problem]:
    """One (path, line) per field of a pydantic error; ``prefix`` is the path of the validated object."""
    seen: dict[str, Problem] = {}
    for item in error.errors(include_url=False):
        where = _loc(tuple(item["loc"]))
        if prefix:
            where = f"{prefix}.{where}" if where else prefix
        kind = item["type"]
        if kind == "extra_forbidden":
            message = "unknown field"
        elif kind == "missing":
            message = "required field is missing"
        else:
            message = item["msg"]
            if "input" in item and not isinstance(item["input"], dict | list):
                message += f" (got {item['input']!r})"
        if where in seen and where.endswith(
            ("cpu", "memory", "sharedMemory", "ephemeralStorage", "minSharedMemory")
        ):
            continue  # one line per quantity, not one per union branch
        seen.setdefault(where, (where, f"{where}: {message}"))
    return list(seen.values())


_QUANTITY = re.compile(QUANTITY_PATTERN)


def _quantity_problems(job: LLMTrainingJob) -> list[Problem]:
    res = job.spec.resources
    fields = {
        "spec.resources.cpu": res.cpu,
        "spec.resources.memory": res.memory,
        "spec.resources.ephemeralStorage": res.ephemeralStorage,
        "spec.sharedMemory": job.spec.sharedMemory,
        "spec.healthCheck.minSharedMemory": job.spec.healthCheck.minSharedMemory,
    }
    return [
        (name, f"{name}: {value!r} is not a Kubernetes quantity (e.g. 64Gi, 500m, 180)")
        for name, value in fields.items()
        if isinstance(value, str) and not _QUANTITY.match(value)
    ]


def _pod_template_problems(job: LLMTrainingJob) -> list[Problem]:
    """What CEL cannot see in spec.podTemplate: mounts of volumes that do not exist, two containers with
    one name in initContainers."""
    template = job.spec.podTemplate
    if template is None:
        return []
    spec = template.spec
    base = "spec.podTemplate.spec"
    volumes = {v.name for v in spec.volumes} | {SHM_VOLUME} | ({FSX_VOLUME} if job.spec.fsx else set())
    problems: list[Problem] = []
    mounts = [(f"{base}.containers[{i}].volumeMounts", c.volumeMounts) for i, c in enumerate(spec.containers)]
    for i, init in enumerate(spec.initContainers):
        raw = (init.model_extra or {}).get("volumeMounts") or []
        mounts.append((f"{base}.initContainers[{i}].volumeMounts", raw))
    for where, items in mounts:
        for j, mount in enumerate(items):
            name = mount.name if not isinstance(mount, dict) else str(mount.get("name"))
            if name not in volumes:
                problems.append(
                    (f"{where}[{j}]", f"{where}[{j}].name: {name} names no volume of {base}.volumes")
                )
    names = [c.name for c in spec.initContainers]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append((f"{base}.initContainers", f"{base}.initContainers: two containers named {name}"))
    return problems


@functools.lru_cache(maxsize=256)
def _program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _evaluate(expression: str, value: Any) -> Any:
    return _program(expression).evaluate({"self": json_to_cel(value)})


def _rules_at(schema: dict[str, Any], value: Any, path: str) -> Iterator[Problem]:
    for rule in schema.get("x-kubernetes-validations", []):
        where = f"{path}{rule.get('fieldPath', '')}"
        try:
            ok = bool(_evaluate(rule["rule"], value))
        except Exception as exc:  # a rule that cannot be evaluated is itself a finding
            yield where, f"{path or '<root>'}: rule {rule['rule']!r} could not be evaluated: {exc}"
            continue
        if ok:
            continue
        static = f"{where}: {rule.get('message', 'failed ' + rule['rule'])}"
        expression = DETAILS.get(rule["rule"]) or rule.get("messageExpression")
        try:
            yield where, str(_evaluate(expression, value)) if expression else static
        except Exception:  # a detail that needs a field the value lacks (a runtime's partial spec)
            yield where, rule.get("message") or static


def _walk(schema: dict[str, Any], value: Any, path: str) -> Iterator[Problem]:
    if value is None:
        return
    yield from _rules_at(schema, value, path)
    if isinstance(value, dict):
        for key, prop in schema.get("properties", {}).items():
            if key in value:
                yield from _walk(prop, value[key], f"{path}.{key}" if path else key)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                yield from _walk(extra, item, f"{path}[{key}]")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _walk(schema["items"], item, f"{path}[{i}]")


@functools.lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    return crd.openapi_schema()


def runtime_cel_problems(kind: str, spec: dict[str, Any]) -> list[Problem]:
    """The runtime CRD's CEL rules on a runtime's spec as written."""
    return list(_walk(crd.input_spec(kind), spec, "spec"))


def cel_problems(job: LLMTrainingJob) -> list[Problem]:
    """Every CEL rule of the CRD evaluated on the defaulted job (metadata, spec)."""
    data = {
        "apiVersion": job.apiVersion,
        "kind": job.kind,
        "metadata": {"name": job.metadata.name, "namespace": job.metadata.namespace},
        "spec": job.spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }
    schema = {k: v for k, v in _schema().items() if k != "properties"}
    schema["properties"] = {"spec": _schema()["properties"]["spec"]}
    return list(_walk(schema, data, ""))


def _result(problems: list[Problem], merged: Merged | None, job: LLMTrainingJob | None = None) -> Result:
    # A rule on every spec and its stricter twin on a job's own spec may both fail: one line each.
    lines = list(dict.fromkeys(annotate(path, message, merged) for path, message in problems))
    return Result(None if lines else job, lines, merged)


def validate(manifest: Any, runtime: dict[str, Any] | None = None) -> Result:
    """Validate one job manifest (a parsed YAML document).

    ``runtime`` is the runtime object its ``spec.runtimeRef`` names (None: not found); a job without
    runtimeRef ignores it. With one, the checks run on the merged spec.
    """
    if not isinstance(manifest, dict):
        return Result(None, [f"manifest must be a mapping (an object), got {type(manifest).__name__}"])
    problems: list[str] = []
    if manifest.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion ({manifest.get('apiVersion')!r}) must be {API_VERSION}")
    if manifest.get("kind") != KIND:
        problems.append(f"kind ({manifest.get('kind')!r}) must be {KIND}")
    if problems:
        return Result(None, problems)
    body = {k: v for k, v in manifest.items() if k != "status"}
    merged = None
    ref = ref_of(body.get("spec"))
    if ref is not None:
        kind, name = ref
        if runtime is None:
            return Result(None, [f"spec.runtimeRef: {describe(kind, name)} not found"])
        merged = merge(runtime.get("spec") or {}, body["spec"], describe(kind, name))
        body["spec"] = merged.spec
    try:
        job = LLMTrainingJob.model_validate(body)
    except ValidationError as exc:
        return _result(pydantic_problems(exc), merged)
    return _result(_quantity_problems(job) + _pod_template_problems(job) + cel_problems(job), merged, job)


def validate_runtime(doc: dict[str, Any]) -> list[str]:
    """Problems of one runtime document on its own: its spec's types and bounds, and the runtime CRD's
    CEL rules on what it sets (rules across a job and its runtime are checked on the merged spec)."""
    problems: list[Problem] = []
    if doc.get("apiVersion") != API_VERSION:
        problems.append(("apiVersion", f"apiVersion ({doc.get('apiVersion')!r}) must be {API_VERSION}"))
    kind = str(doc.get("kind"))
    if kind not in RUNTIME_KINDS:
        problems.append(("kind", f"kind ({kind!r}) must be one of {', '.join(RUNTIME_KINDS)}"))
        return [m for _, m in problems]
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        problems.append(("metadata.name", "metadata.name: required field is missing"))
    spec = doc.get("spec") or {}
    if not isinstance(spec, dict):
        return [*(m for _, m in problems), "spec: must be a mapping (an object)"]
    if "runtimeRef" in spec:
        problems.append(("spec.runtimeRef", "spec.runtimeRef: unknown field (a runtime cannot name another)"))
        spec = {k: v for k, v in spec.items() if k != "runtimeRef"}
    try:
        runtime_spec_model().model_validate(spec)
    except ValidationError as exc:
        problems += pydantic_problems(exc, "spec")
    else:
        problems += runtime_cel_problems(kind, spec)
    return [m for _, m in problems]
