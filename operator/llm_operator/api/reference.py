"""Markdown API reference generated from the CRD schema (docs/api.md; a test keeps it current)."""

from __future__ import annotations

import json
from typing import Any

from llm_operator.api.crd import PRINTER_COLUMNS, RUNTIME_NAMES, crd, documented_spec_schema
from llm_operator.api.rules import RULES_ENV_VAR, RULES_FSX, RULES_JOB, RULES_JOB_SPEC, RULES_SPEC


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity"
    kind = str(node.get("type", "object"))
    if kind == "array":
        return f"[]{_type(node.get('items', {}))}"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type(node['additionalProperties'])}"
    return kind


def _rows(node: dict[str, Any], path: str, required: set[str]) -> list[str]:
    rows: list[str] = []
    for name, prop in node.get("properties", {}).items():
        here = f"{path}.{name}"
        default = prop.get("default")
        shown = "" if default is None else f"`{json.dumps(default)}`".replace("|", "\\|")
        need = "yes" if name in required else ""
        desc = " ".join(str(prop.get("description", "")).split()).replace("|", "\\|")
        bounds = []
        if "minimum" in prop:
            bounds.append(f"≥ {prop['minimum']}")
        if "maximum" in prop:
            bounds.append(f"≤ {prop['maximum']}")
        if bounds:
            desc += f" ({', '.join(bounds)})"
        rows.append(f"| `{here}` | {_type(prop)} | {need} | {shown} | {desc} |")
        inner = prop.get("items", prop) if prop.get("type") == "array" else prop
        if inner.get("properties"):
            rows += _rows(
                inner, here + ("[]" if prop.get("type") == "array" else ""), set(inner.get("required", []))
            )
    return rows


def reference() -> str:
    """The whole page."""
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec, status = documented_spec_schema(), schema["properties"]["status"]
    head = "| field | type | required | default | description |\n|---|---|---|---|---|"
    rules = [r["rule"] for r in RULES_JOB + RULES_SPEC + RULES_JOB_SPEC + RULES_ENV_VAR + RULES_FSX]
    runtime_kinds = "\n".join(
        f"| `{kind}` | {names['scope']} | `{names['plural']}` | `{'`, `'.join(names['shortNames'])}` |"
        for kind, names in RUNTIME_NAMES.items()
    )
    lines = [
        "# LLMTrainingJob API reference (elasticllm.dev/v1alpha1)",
        "",
        "Generated from `llm_operator.api.models` by `make crds`; do not edit by hand.",
        "Short names: `llmjob`, `llmjobs`. Subresources: `status`, `scale`"
        " (`kubectl scale llmjob/NAME --replicas=N`).",
        "",
        "## spec",
        "",
        "Required fields may come from the runtime named in `spec.runtimeRef` instead (see below). Defaults"
        " are applied by the operator and `llmjob render` to the merged spec: the apiserver stores a job's"
        " spec as written, so that a field the job leaves out can come from its runtime.",
        "",
        head,
        *_rows(spec, "spec", set(spec.get("required", []))),
        "",
        "## status",
        "",
        head,
        *_rows(status, "status", set()),
        "",
        "## Printer columns (`kubectl get llmjob`; `-o wide` adds the wide ones)",
        "",
        "| column | value | wide only | meaning |",
        "|---|---|---|---|",
        *[
            f"| {c['name'].upper()} | `{c['jsonPath']}` | {'yes' if c.get('priority') else ''}"
            f" | {c.get('description', '')} |"
            for c in PRINTER_COLUMNS
        ],
        "",
        "## Validation rules (CEL, enforced by the apiserver and by `llmjob render`)",
        "",
        "On a job with `spec.runtimeRef` the apiserver checks what the job's spec holds; the operator and"
        " `llmjob render` check the merged spec with the same rules (a rule across a job's field and its"
        " runtime's is only checked there).",
        "",
        *[f"- `{r}`" for r in rules],
        "",
        "## LLMTrainingRuntime and ClusterLLMTrainingRuntime",
        "",
        "Platform defaults that jobs name in `spec.runtimeRef` (guide: [platform.md](platform.md)).",
        "",
        "| kind | scope | plural | short names |",
        "|---|---|---|---|",
        runtime_kinds,
        "",
        "`spec` takes every field of a job's `spec` above except `runtimeRef`, all optional, with the same"
        " types, bounds and CEL rules (on the fields it sets). Merge with a job's spec: the job's fields win;"
        " objects merge field by field; `env` merges by `name` and `scheduling.tolerations` by"
        " `(key, effect)`, the runtime's items first and the job's last; other lists and"
        " `scheduling.affinity` are replaced whole. The operator copies the runtime into"
        " `status.runtime` when it first resolves a job's reference and keeps using that copy: editing"
        " or deleting a runtime does not change the jobs that already use it.",
        "",
    ]
    return "\n".join(lines)
