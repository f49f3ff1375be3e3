"""Markdown API reference generated from the CRD schema (docs/api.md; a test keeps it current)."""

from __future__ import annotations

import json
from typing import Any

from llm_operator.api.crd import PRINTER_COLUMNS, crd
from llm_operator.api.rules import RULES_ENV_VAR, RULES_FSX, RULES_JOB, RULES_SPEC


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
    spec, status = schema["properties"]["spec"], schema["properties"]["status"]
    head = "| field | type | required | default | description |\n|---|---|---|---|---|"
    rules = [r["rule"] for r in RULES_JOB + RULES_SPEC + RULES_ENV_VAR + RULES_FSX]
    lines = [
        "# LLMTrainingJob API reference (elasticllm.dev/v1alpha1)",
        "",
        "Generated from `llm_operator.api.models` by `make crds`; do not edit by hand.",
        "Short names: `llmjob`, `llmjobs`. Subresources: `status`, `scale`"
        " (`kubectl scale llmjob/NAME --replicas=N`).",
        "",
        "## spec",
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
        *[f"- `{r}`" for r in rules],
        "",
    ]
    return "\n".join(lines)
