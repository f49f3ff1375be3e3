"""Validate an LLMTrainingJob manifest exactly as the apiserver would, without one.

Two layers, in the apiserver's order: the schema (types, bounds, enums, unknown fields; here through
the pydantic models the schema is generated from), then every ``x-kubernetes-validations`` CEL rule
of the generated CRD, evaluated with cel-python on the defaulted object. Each problem is one line
naming the field.
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
from llm_operator.api.models import API_VERSION, KIND, LLMTrainingJob
from llm_operator.api.rules import DETAILS, QUANTITY_PATTERN


@dataclass(frozen=True)
class Result:
    """A validated job (None when invalid) and the problems found."""

    job: LLMTrainingJob | None
    problems: list[str]


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


def _pydantic_problems(error: ValidationError) -> list[str]:
    seen: dict[str, str] = {}
    for item in error.errors(include_url=False):
        where = _loc(tuple(item["loc"]))
        kind = item["type"]
        if kind == "extra_forbidden":
            message = "unknown field"
        elif kind == "missing":
            message = "required field is missing"
        else:
            message = item["msg"]
            if "input" in item and not isinstance(item["input"], dict | list):
                message += f" (got {item['input']!r})"
        if where in seen and where.endswith(("cpu", "memory", "sharedMemory", "ephemeralStorage")):
            continue  # one line per quantity, not one per union branch
        seen.setdefault(where, f"{where}: {message}")
    return list(seen.values())


_QUANTITY = re.compile(QUANTITY_PATTERN)


def _quantity_problems(job: LLMTrainingJob) -> list[str]:
    res = job.spec.resources
    fields = {
        "spec.resources.cpu": res.cpu,
        "spec.resources.memory": res.memory,
        "spec.resources.ephemeralStorage": res.ephemeralStorage,
        "spec.sharedMemory": job.spec.sharedMemory,
    }
    return [
        f"{name}: {value!r} is not a Kubernetes quantity (e.g. 64Gi, 500m, 180)"
        for name, value in fields.items()
        if isinstance(value, str) and not _QUANTITY.match(value)
    ]


@functools.lru_cache(maxsize=256)
def _program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _evaluate(expression: str, value: Any) -> Any:
    return _program(expression).evaluate({"self": json_to_cel(value)})


def _rules_at(schema: dict[str, Any], value: Any, path: str) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations", []):
        try:
            ok = bool(_evaluate(rule["rule"], value))
        except Exception as exc:  # a rule that cannot be evaluated is itself a finding
            yield f"{path or '<root>'}: rule {rule['rule']!r} could not be evaluated: {exc}"
            continue
        if not ok:
            expression = DETAILS.get(rule["rule"]) or rule.get("messageExpression")
            if expression:
                yield str(_evaluate(expression, value))
            else:
                yield f"{path}{rule.get('fieldPath', '')}: {rule.get('message', 'failed ' + rule['rule'])}"


def _walk(schema: dict[str, Any], value: Any, path: str) -> Iterator[str]:
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


def cel_problems(job: LLMTrainingJob) -> list[str]:
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


def validate(manifest: Any) -> Result:
    """Validate one manifest (a parsed YAML document)."""
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
    try:
        job = LLMTrainingJob.model_validate(body)
    except ValidationError as exc:
        return Result(None, _pydantic_problems(exc))
    problems = _quantity_problems(job) + cel_problems(job)
    return Result(None if problems else job, problems)
