"""The real apiserver enforces the generated CRD: same rules, same messages as `llmjob render`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.api.validate import validate

from tests.unit.test_pod_template import REFUSED_MANIFESTS
from tests.unit.test_validation import INVALID

from .kube_helpers import apply

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]

# Messages the apiserver phrases itself (schema errors): check it rejects and names the field.
SCHEMA_FIELD = {
    # rules whose CRD message is static (no numbers: see llm_operator.api.rules.DETAILS)
    "min above max": "spec.minReplicas must be <= spec.maxReplicas",
    "replicas above max": "spec.replicas must be within [spec.minReplicas, spec.maxReplicas]",
    "replicas below min": "spec.replicas must be within [spec.minReplicas, spec.maxReplicas]",
    "nproc above gpus": "spec.nprocPerNode must be <= spec.gpusPerNode",
    "min zero": "spec.minReplicas",
    "max missing": "spec.maxReplicas",
    "image missing": "spec.image",
    "image empty": "spec.image",
    "fsx without claim": "spec.fsx.claimName",
    "checkpoint relative": "spec.checkpointDir",
    "unknown backend": "spec.rendezvous.backend",
    "negative grace": "spec.failurePolicy.nodeFailureGraceSeconds",
    "bad quantity": "spec.resources.memory",
    "negative spares": "spec.spareReplicas",
    "health check bad quantity": "spec.healthCheck.minSharedMemory",
    "straggler factor below 1": "spec.healthCheck.stragglerFactor",
    "unknown field": "replicaz",
    "wrong type": "spec.minReplicas",
    "command as string": "spec.command",
    "bad pull policy": "spec.imagePullPolicy",
}


@pytest.mark.parametrize(("case", "doc", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_apiserver_rejects_invalid(
    cluster: Any, namespace: str, case: str, doc: dict[str, Any], expected: str
) -> None:
    doc = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    doc["metadata"].pop("uid", None)
    doc["metadata"].pop("generation", None)
    result = apply(cluster, doc, "--dry-run=server")
    assert result.returncode != 0, f"{case}: the apiserver accepted it"
    wanted = SCHEMA_FIELD.get(case, expected)
    assert wanted in result.stderr, result.stderr
    assert validate(doc).problems, "render and the apiserver must agree"


@pytest.mark.parametrize("path", sorted((ROOT / "deploy" / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_apiserver_accepts_examples(cluster: Any, namespace: str, path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") != "LLMTrainingJob":
            continue
        doc["metadata"]["namespace"] = namespace
        result = apply(cluster, doc, "--dry-run=server")
        assert result.returncode == 0, result.stderr


def test_apiserver_stores_the_spec_as_written_and_render_defaults_it(cluster: Any, namespace: str) -> None:
    """No spec defaults in the CRD (a field a job leaves out may come from its runtime, decision R2):
    the operator and `llmjob render` apply the API defaults to the (merged) spec instead."""
    doc = {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": "defaults", "namespace": namespace},
        "spec": {"minReplicas": 1, "maxReplicas": 2, "image": "i"},
    }
    result = apply(cluster, doc, "--dry-run=server", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["spec"] == doc["spec"]
    job = validate(doc).job
    assert job is not None
    assert job.spec.failurePolicy.nodeFailureGraceSeconds == 30
    assert job.spec.rendezvous.backend == "etcd-v3"
    assert job.spec.command == ["python", "-m", "llm_trainer"]


def test_apiserver_accepts_the_worker_log_format_in_a_jobs_and_a_runtimes_env(
    cluster: Any, namespace: str
) -> None:
    """LLMJOB_LOG_FORMAT is the one LLMJOB_ name users set (decision W4); the CRDs' CEL rule agrees."""
    env = [{"name": "LLMJOB_LOG_FORMAT", "value": "json"}]
    job = {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": "json-logs", "namespace": namespace},
        "spec": {"minReplicas": 1, "maxReplicas": 2, "image": "trainer:1", "env": env},
    }
    runtime = {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "ClusterLLMTrainingRuntime",
        "metadata": {"name": f"json-logs-{namespace}"},
        "spec": {"env": env},
    }
    for doc in (job, runtime):
        result = apply(cluster, doc, "--dry-run=server")
        assert result.returncode == 0, result.stderr


def test_apiserver_accepts_spares_with_in_process_or_from_a_runtime(cluster: Any, namespace: str) -> None:
    """Spares need recovery inProcess in the job itself, unless a runtime may give it (checked merged)."""
    base = {"apiVersion": "elasticllm.dev/v1alpha1", "kind": "LLMTrainingJob"}
    in_process = {
        **base,
        "metadata": {"name": "spares", "namespace": namespace},
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 2,
            "image": "trainer:1",
            "spareReplicas": 1,
            "failurePolicy": {"recovery": "inProcess"},
            "healthCheck": {"minSharedMemory": "1Gi", "stragglerFactor": 2.5, "command": ["true"]},
        },
    }
    from_runtime = {
        **base,
        "metadata": {"name": "spares-rt", "namespace": namespace},
        "spec": {"runtimeRef": {"name": "in-process"}, "spareReplicas": 1},
    }
    for doc in (in_process, from_runtime):
        result = apply(cluster, doc, "--dry-run=server")
        assert result.returncode == 0, result.stderr


# The apiserver phrases schema errors itself: for those, the field it names.
POD_TEMPLATE_SCHEMA = {
    "trainer image": 'unknown field "spec.podTemplate.spec.containers[0].image"',
    "trainer resources": 'unknown field "spec.podTemplate.spec.containers[0].resources"',
    "trainer env": 'unknown field "spec.podTemplate.spec.containers[0].env"',
    "sidecar restartPolicy other than Always": "spec.podTemplate.spec.initContainers[0].restartPolicy",
    "sidecar without image": "spec.podTemplate.spec.initContainers[0].image",
    "service account not a DNS name": "spec.podTemplate.spec.serviceAccountName",
    "unknown pod field": 'unknown field "spec.podTemplate.spec.nodeName"',
}


@pytest.mark.parametrize(("case", "doc", "line"), REFUSED_MANIFESTS, ids=[c[0] for c in REFUSED_MANIFESTS])
def test_apiserver_refuses_operator_owned_pod_template_fields(
    cluster: Any, namespace: str, case: str, doc: dict[str, Any], line: str
) -> None:
    """A job whose spec.podTemplate names what the operator owns is refused at admission, the field named."""
    doc = {**doc, "metadata": {"name": "pod-template", "namespace": namespace}}
    result = apply(cluster, doc, "--dry-run=server")
    assert result.returncode != 0, f"{case}: the apiserver accepted it"
    assert POD_TEMPLATE_SCHEMA.get(case, line) in result.stderr, result.stderr


def test_apiserver_accepts_a_pod_template(cluster: Any, namespace: str) -> None:
    template = {
        "metadata": {"labels": {"team": "nlp"}, "annotations": {"sidecar.istio.io/inject": "false"}},
        "spec": {
            "serviceAccountName": "s3-reader",
            "volumes": [
                {"name": "data", "csi": {"driver": "s3.csi.aws.com", "volumeAttributes": {"bucketName": "b"}}}
            ],
            "initContainers": [{"name": "log-shipper", "image": "fluent-bit:3", "restartPolicy": "Always"}],
            "containers": [{"name": "trainer", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        },
    }
    doc = {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": "pod-template", "namespace": namespace},
        "spec": {"minReplicas": 1, "maxReplicas": 2, "image": "i", "podTemplate": template},
    }
    result = apply(cluster, doc, "--dry-run=server", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["spec"]["podTemplate"] == template
