"""Markdown API reference generated from the CRD schema (docs/api.md; a test keeps it current)."""

from __future__ import annotations

import json
from typing import Any

from llm_operator.api.crd import PRINTER_COLUMNS, RUNTIME_NAMES, crd, documented_spec_schema
from llm_operator.api.rules import (
    RULES_ENV_VAR,
    RULES_FSX,
    RULES_INIT_CONTAINER,
    RULES_JOB,
    RULES_JOB_SPEC,
    RULES_POD_METADATA,
    RULES_POD_VOLUME,
    RULES_SPEC,
    RULES_TRAINER_ENTRY,
)


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


POD_TEMPLATE_SECTION = [
    "## Pod template (`spec.podTemplate`)",
    "",
    "Your own pod settings, merged by the operator into every worker pod (`llmjob render` shows the result)."
    " A runtime may carry one too: the job's wins, as with every field (labels and annotations by key;"
    " `volumes`, `initContainers`, `imagePullSecrets` and `containers` by `name`).",
    "",
    "| field | into every worker pod |",
    "|---|---|",
    "| `metadata.labels`, `metadata.annotations` | added beside the operator's |",
    "| `spec.serviceAccountName`, `automountServiceAccountToken`, `imagePullSecrets` | set as given |",
    "| `spec.securityContext`, `dnsPolicy`, `dnsConfig`, `hostAliases`, `runtimeClassName` | set as given |",
    "| `spec.volumes` | after the operator's `dshm` (/dev/shm) and `fsx` |",
    "| `spec.initContainers` | init containers, and native sidecars with `restartPolicy: Always`: started"
    " before the trainer, stopped after it, so a sidecar never keeps a finished or lost worker alive |",
    "| `spec.containers` (one entry, `name: trainer`) | its `volumeMounts` after the trainer's own;"
    " its `envFrom` on the trainer (the operator's env and `spec.env` win over it, as in any pod) |",
    "",
    "Placement stays in `spec.scheduling` (nodeSelector, tolerations, affinity, priorityClassName,"
    " schedulerName) and the training container's image, command, args, env and resources in `spec`. Refused"
    " at admission (CEL, the same rules in `llmjob render`), with the field named, never overwritten:",
    "",
    "- label keys under `elasticllm.dev/` and `kueue.x-k8s.io/`, `app.kubernetes.io/managed-by`,"
    " `scheduling.x-k8s.io/pod-group` (the operator selects its workers on them; put Kueue labels on the"
    " job); annotation keys under `elasticllm.dev/`;",
    "- volumes named `dshm` or `fsx`; trainer mounts at `/dev/shm`, `/dev/termination-log` or"
    " `spec.fsx.mountPath` (mounting the `fsx` volume elsewhere, with a `subPath`, is fine);",
    "- a `containers` entry other than `trainer` (a sidecar goes in `initContainers` with"
    " `restartPolicy: Always`), and any field of the `trainer` entry but `volumeMounts` and `envFrom`"
    " (image, command, env, resources: GPU and EFA limits, ports, securityContext with `IPC_LOCK`);",
    "- an init container named `trainer`; any pod field not listed above (`nodeName`, `hostNetwork`,"
    " `restartPolicy`, ...).",
    "",
    "`llmjob render` also reports a mount that names no volume and two init containers with one name.",
    "",
    "### Example: S3 through EKS Pod Identity, a dataset volume and a log shipper",
    "",
    "EKS Pod Identity needs only the ServiceAccount (`aws eks create-pod-identity-association --cluster-name"
    " C --namespace ml-training --service-account llama-s3"
    " --role-arn arn:aws:iam::123456789012:role/llama-s3`);"
    " with IRSA, annotate the ServiceAccount with `eks.amazonaws.com/role-arn` instead. Either way the job"
    " names only the ServiceAccount:",
    "",
    "```yaml",
    "spec:",
    "  podTemplate:",
    "    metadata:",
    "      labels: {cost-center: research}",
    '      annotations: {sidecar.istio.io/inject: "false"}',
    "    spec:",
    "      serviceAccountName: llama-s3          # Pod Identity / IRSA credentials for S3, CloudWatch, ECR",
    "      imagePullSecrets: [{name: registry}]",
    "      volumes:",
    "        - name: dataset                     # Mountpoint for S3 CSI driver",
    "          persistentVolumeClaim: {claimName: s3-dataset}",
    "      initContainers:",
    "        - name: log-shipper                 # a native sidecar",
    "          image: public.ecr.aws/aws-observability/aws-for-fluent-bit:stable",
    "          restartPolicy: Always",
    "      containers:",
    "        - name: trainer                     # the training container: mounts and envFrom only",
    "          volumeMounts: [{name: dataset, mountPath: /data, readOnly: true}]",
    "          envFrom: [{secretRef: {name: hf-token}}]",
    "```",
    "",
]


def reference() -> str:
    """The whole page."""
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec, status = documented_spec_schema(), schema["properties"]["status"]
    head = "| field | type | required | default | description |\n|---|---|---|---|---|"
    pod_template = RULES_POD_METADATA + RULES_POD_VOLUME + RULES_TRAINER_ENTRY + RULES_INIT_CONTAINER
    rules = [
        r["rule"] for r in RULES_JOB + RULES_SPEC + RULES_JOB_SPEC + RULES_ENV_VAR + RULES_FSX + pod_template
    ]
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
        *POD_TEMPLATE_SECTION,
    ]
    return "\n".join(lines)
