"""Generate the LLMTrainingJob CustomResourceDefinition from the typed models.

Pydantic emits JSON Schema (with ``$ref``, ``anyOf: [X, null]``, titles); the apiserver wants a
structural OpenAPI v3 schema. ``structural()`` converts one into the other: references inlined,
optionals unwrapped, quantities made int-or-string, free-form objects marked to keep unknown fields.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from llm_operator.api import models
from llm_operator.api.rules import QUANTITY_PATTERN, RULES_JOB, RULES_JOB_SPEC

_DROP = {"title", "discriminator"}

CRD_ANNOTATIONS: dict[str, str] = {"argocd.argoproj.io/sync-options": "Prune=false"}
"""On every CRD the project installs: Argo CD never prunes it (an application with ``prune: true`` that
stops rendering a CRD would otherwise delete it, and with it every object of its kind)."""


def structural(node: Any, defs: dict[str, Any]) -> Any:
    """Convert a pydantic JSON-schema node into a structural OpenAPI v3 node."""
    if isinstance(node, list):
        return [structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return structural({**target, **extra}, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if node.get("x-llmjob-quantity"):
            return _quantity(rest)
        if len(options) == 1:
            merged = {**structural(options[0], defs), **structural(rest, defs)}
            if merged.get("default", 0) is None:
                merged.pop("default")
            return merged
        raise ValueError(f"cannot express a union as a structural schema: {node}")
    if node.get("x-llmjob-quantity"):
        return _quantity(node)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "const":  # a one-value Literal: the apiserver knows enum, not const
            out["enum"] = [value]
            continue
        if key == "properties":
            out[key] = {name: structural(prop, defs) for name, prop in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = structural(value, defs)
        else:
            out[key] = value
    if out.get("x-kubernetes-preserve-unknown-fields"):
        out["type"] = "object"
        out.pop("additionalProperties", None)
    if out.get("additionalProperties") is True or out.get("additionalProperties") == {}:
        out.pop("additionalProperties")
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "object" and out.get("additionalProperties") is False:
        out.pop("additionalProperties")
    if "default" in out and out["default"] is None:
        out.pop("default")
    return out


def _quantity(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
    }
    if "description" in node:
        out["description"] = node["description"]
    if node.get("default") is not None:
        out["default"] = node["default"]
    return out


def _factory_defaults(model: type[BaseModel], node: dict[str, Any], defs: dict[str, Any]) -> None:
    """Put ``default_factory`` values into the schema so the apiserver defaults the same way.

    A nested object gets ``default: {}`` so that structural defaulting reaches its own fields.
    """
    for name, info in model.model_fields.items():
        prop = node.get("properties", {}).get(info.alias or name)
        if prop is None:
            continue
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            ref = prop.get("$ref", "").split("/")[-1]
            if ref in defs:
                _factory_defaults(annotation, defs[ref], defs)
        if info.default_factory is not None and name != "status":
            value = info.default_factory()  # type: ignore[call-arg]
            prop["default"] = {} if isinstance(value, BaseModel) else value


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    _factory_defaults(model, raw, defs)
    schema: dict[str, Any] = structural(raw, defs)
    return schema


def documented_spec_schema() -> dict[str, Any]:
    """The job spec's schema with the API defaults, as docs/api.md shows them.

    The CRDs carry no spec defaults (see ``input_spec``); the operator and `llmjob render` apply these
    to the merged spec through the models.
    """
    return _model_schema(models.LLMTrainingJobSpec)


def _strip_defaults(node: dict[str, Any]) -> None:
    node.pop("default", None)
    for prop in node.get("properties", {}).values():
        _strip_defaults(prop)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            _strip_defaults(node[key])


def input_spec(kind: str = models.KIND) -> dict[str, Any]:
    """The spec schema a job or runtime is stored with: no defaults, no required top-level fields.

    A job's spec may leave any field to its runtime, so the apiserver must not fill in defaults (they
    would always win over the runtime) and cannot require what a runtime may supply: a job without
    spec.runtimeRef still must set minReplicas, maxReplicas, image, fsx.claimName and scheduling.topology.key
    (RULES_JOB_SPEC).
    A runtime's spec has every field of a job's but runtimeRef, all optional.
    """
    spec = copy.deepcopy(documented_spec_schema())
    _strip_defaults(spec)
    spec.pop("required", None)
    if kind == models.KIND:
        spec["properties"]["fsx"].pop("required", None)
        spec["properties"]["scheduling"]["properties"]["topology"].pop("required", None)
        spec["x-kubernetes-validations"] = [*spec.get("x-kubernetes-validations", []), *RULES_JOB_SPEC]
    else:
        del spec["properties"]["runtimeRef"]
        spec["description"] = "Job fields this runtime supplies (all optional); a job's own fields win."
    return spec


def openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the CRD: spec and status generated, metadata left to the apiserver."""
    spec = input_spec(models.KIND)
    status = _model_schema(models.LLMTrainingJobStatus)
    return {
        "type": "object",
        "description": models.LLMTrainingJob.__doc__,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "elasticllm.dev/v1alpha1"},
            "kind": {"type": "string", "description": "LLMTrainingJob"},
            # Bounding the name keeps the CEL cost estimate of the name rules within budget.
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 253}}},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": RULES_JOB,
    }


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Min", "type": "integer", "jsonPath": ".spec.minReplicas"},
    {"name": "Max", "type": "integer", "jsonPath": ".spec.maxReplicas"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
    {"name": "Target", "type": "integer", "jsonPath": ".status.targetReplicas", "priority": 1},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Members", "type": "integer", "jsonPath": ".status.members"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Spares", "type": "integer", "jsonPath": ".status.runningSpares", "priority": 1},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {
        "name": "Step",
        "type": "integer",
        "jsonPath": ".status.progress.step",
        "description": "Last completed training step",
    },
    {
        "name": "Goodput",
        "type": "number",
        "jsonPath": ".status.progress.goodput",
        "description": "Share of the job's wall time spent on kept training steps (0..1)",
    },
    {
        "name": "ETA",
        "type": "string",
        "jsonPath": ".status.progress.eta",
        "priority": 1,
        "description": "Time left at the current step time if nothing fails",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def runtime_schema(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of a runtime CRD."""
    return {
        "type": "object",
        "description": (models.LLMTrainingRuntime.__doc__ or "").split("\n")[0],
        "properties": {
            "apiVersion": {"type": "string", "description": "elasticllm.dev/v1alpha1"},
            "kind": {"type": "string", "description": kind},
            "metadata": {"type": "object"},
            "spec": input_spec(kind),
        },
    }


RUNTIME_COLUMNS: list[dict[str, Any]] = [
    {"name": "Image", "type": "string", "jsonPath": ".spec.image"},
    {"name": "GPUs", "type": "integer", "jsonPath": ".spec.gpusPerNode"},
    {"name": "EFA", "type": "integer", "jsonPath": ".spec.efaPerNode"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
RUNTIME_NAMES: dict[str, dict[str, Any]] = {
    models.RUNTIME_KIND: {
        "plural": models.RUNTIME_PLURAL,
        "shortNames": ["llmruntime"],
        "scope": "Namespaced",
    },
    models.CLUSTER_RUNTIME_KIND: {
        "plural": models.CLUSTER_RUNTIME_PLURAL,
        "shortNames": ["cllmruntime"],
        "scope": "Cluster",
    },
}


def runtime_crd(kind: str) -> dict[str, Any]:
    """The CustomResourceDefinition of LLMTrainingRuntime or ClusterLLMTrainingRuntime."""
    names = RUNTIME_NAMES[kind]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{names['plural']}.{models.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "elastic-llm-operator"},
            "annotations": dict(CRD_ANNOTATIONS),
        },
        "spec": {
            "group": models.GROUP,
            "scope": names["scope"],
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": names["plural"],
                "singular": kind.lower(),
                "shortNames": names["shortNames"],
                "categories": ["elasticllm"],
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": runtime_schema(kind)},
                    "additionalPrinterColumns": RUNTIME_COLUMNS,
                }
            ],
        },
    }


CRD_KINDS = (models.KIND, *models.RUNTIME_KINDS)


def crd_file(kind: str = models.KIND) -> str:
    """File name of a kind's CRD in crds/ and the chart."""
    plural = models.PLURAL if kind == models.KIND else RUNTIME_NAMES[kind]["plural"]
    return f"{models.GROUP}_{plural}.yaml"


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{models.PLURAL}.{models.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "elastic-llm-operator"},
            "annotations": dict(CRD_ANNOTATIONS),
        },
        "spec": {
            "group": models.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": models.KIND,
                "listKind": f"{models.KIND}List",
                "plural": models.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": models.SHORT_NAMES,
                "categories": models.CATEGORIES,
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml(kind: str = models.KIND) -> str:
    """The CRD as the YAML committed in crds/ (a test fails when they differ)."""
    if kind == models.KIND:
        header = "# Generated by `llmjob crd` (make crds) from llm_operator.api.models. Do not edit.\n"
        return header + yaml.safe_dump(crd(), sort_keys=False, width=120)
    header = (
        f"# Generated by `llmjob crd --kind {kind}` (make crds) from llm_operator.api.models. Do not edit.\n"
    )
    return header + yaml.safe_dump(runtime_crd(kind), sort_keys=False, width=120)
