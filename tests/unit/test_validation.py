"""Invalid manifests are rejected with one line naming the field; the examples are valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.api.runtime import is_runtime, ref_of, runtime_key
from llm_operator.api.validate import validate, validate_runtime

from .jobs import manifest

ROOT = Path(__file__).resolve().parents[2]


def _with_meta(name: str) -> dict[str, Any]:
    m = manifest()
    m["metadata"]["name"] = name
    return m


INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "min above max",
        manifest(minReplicas=5, maxReplicas=2),
        "spec.minReplicas (5) must be <= spec.maxReplicas (2)",
    ),
    ("replicas above max", manifest(replicas=9), "spec.replicas (9) must be within"),
    ("replicas below min", manifest(replicas=1), "spec.replicas (1) must be within"),
    ("min zero", manifest(minReplicas=0), "spec.minReplicas"),
    ("max missing", manifest(maxReplicas=None), "spec.maxReplicas: required"),
    ("image missing", manifest(image=None), "spec.image: required"),
    ("image empty", manifest(image=""), "spec.image"),
    (
        "reserved PET env",
        manifest(env=[{"name": "PET_NNODES", "value": "1"}]),
        "spec.env PET_NNODES is reserved",
    ),
    ("reserved RANK env", manifest(env=[{"name": "RANK", "value": "0"}]), "spec.env RANK is reserved"),
    (
        "reserved LLMJOB env",
        manifest(env=[{"name": "LLMJOB_JOB_NAME", "value": "x"}]),
        "spec.env LLMJOB_JOB_NAME is reserved",
    ),
    (
        "reserved MASTER_ADDR",
        manifest(env=[{"name": "MASTER_ADDR", "value": "x"}]),
        "spec.env MASTER_ADDR is reserved",
    ),
    (
        "env value and valueFrom",
        manifest(env=[{"name": "A", "value": "1", "valueFrom": {"fieldRef": {}}}]),
        "spec.env A sets both",
    ),
    (
        "fsx relative mount",
        manifest(fsx={"claimName": "c", "mountPath": "fsx"}),
        "spec.fsx.mountPath (fsx) must be an absolute path",
    ),
    ("fsx root mount", manifest(fsx={"claimName": "c", "mountPath": "/"}), "spec.fsx.mountPath (/)"),
    ("fsx without claim", manifest(fsx={"mountPath": "/fsx"}), "spec.fsx.claimName: required"),
    (
        "checkpoint outside fsx",
        manifest(fsx={"claimName": "c", "mountPath": "/fsx"}, checkpointDir="/data/ck"),
        "spec.checkpointDir (/data/ck) must be under spec.fsx.mountPath (/fsx)",
    ),
    (
        "checkpoint prefix trick",
        manifest(fsx={"claimName": "c"}, checkpointDir="/fsx2/ck"),
        "spec.checkpointDir (/fsx2/ck)",
    ),
    ("checkpoint relative", manifest(checkpointDir="ck"), "spec.checkpointDir"),
    ("unknown backend", manifest(rendezvous={"backend": "etcd"}), "spec.rendezvous.backend"),
    (
        "inProcess on c10d",
        manifest(rendezvous={"backend": "c10d"}, failurePolicy={"recovery": "inProcess"}),
        "spec.failurePolicy.recovery inProcess needs spec.rendezvous.backend etcd-v3",
    ),
    ("unknown recovery", manifest(failurePolicy={"recovery": "live"}), "spec.failurePolicy.recovery"),
    (
        "endpoint without port",
        manifest(rendezvous={"endpoint": "etcd.svc"}),
        "spec.rendezvous.endpoint (etcd.svc) must be host:port",
    ),
    (
        "negative grace",
        manifest(failurePolicy={"nodeFailureGraceSeconds": -1}),
        "spec.failurePolicy.nodeFailureGraceSeconds",
    ),
    (
        "exit code out of range",
        manifest(failurePolicy={"nonRetryableExitCodes": [0]}),
        "spec.failurePolicy.nonRetryableExitCodes",
    ),
    (
        "nproc above gpus",
        manifest(gpusPerNode=8, nprocPerNode=16),
        "spec.nprocPerNode (16) must be <= spec.gpusPerNode (8)",
    ),
    (
        "bad quantity",
        manifest(resources={"memory": "lots"}),
        "spec.resources.memory: 'lots' is not a Kubernetes quantity",
    ),
    (
        "spares without inProcess",
        manifest(spareReplicas=1),
        "spec.spareReplicas needs spec.failurePolicy.recovery inProcess",
    ),
    (
        "spares with restart",
        manifest(spareReplicas=2, failurePolicy={"recovery": "restart"}),
        "spec.spareReplicas needs spec.failurePolicy.recovery inProcess",
    ),
    ("negative spares", manifest(spareReplicas=-1), "spec.spareReplicas"),
    (
        "health check bad quantity",
        manifest(healthCheck={"minSharedMemory": "lots"}),
        "spec.healthCheck.minSharedMemory: 'lots' is not a Kubernetes quantity",
    ),
    (
        "straggler factor below 1",
        manifest(healthCheck={"stragglerFactor": 0.5}),
        "spec.healthCheck.stragglerFactor",
    ),
    (
        "topology on hosts",
        manifest(scheduling={"topology": {"key": "kubernetes.io/hostname"}}),
        "spec.scheduling.topology.key kubernetes.io/hostname would put every worker on one node",
    ),
    (
        "topology without key",
        manifest(scheduling={"topology": {"mode": "required"}}),
        "spec.scheduling.topology.key",
    ),
    (
        "topology unknown mode",
        manifest(scheduling={"topology": {"key": "a/b", "mode": "always"}}),
        "spec.scheduling.topology.mode",
    ),
    ("unknown field", manifest(replicaz=3), "spec.replicaz: unknown field"),
    ("wrong type", manifest(minReplicas="two"), "spec.minReplicas"),
    ("command as string", manifest(command="python train.py"), "spec.command"),
    ("bad pull policy", manifest(imagePullPolicy="Sometimes"), "spec.imagePullPolicy"),
    ("name too long", _with_meta("a" * 48), "metadata.name (" + "a" * 48 + ") must be at most 47"),
    ("name not DNS", _with_meta("Llama_8B"), "metadata.name (Llama_8B) must be a DNS-1035 label"),
]


@pytest.mark.parametrize(("case", "doc", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_manifest_names_the_field(case: str, doc: dict[str, Any], expected: str) -> None:
    result = validate(doc)
    assert result.job is None, case
    assert any(expected in p for p in result.problems), result.problems


def test_wrong_kind_and_not_a_mapping() -> None:
    bad = manifest()
    bad["kind"] = "PyTorchJob"
    assert validate(bad).problems == ["kind ('PyTorchJob') must be LLMTrainingJob"]
    assert "must be a mapping" in validate(["a"]).problems[0]


def test_all_problems_reported_at_once() -> None:
    doc = manifest(minReplicas=5, maxReplicas=2, env=[{"name": "RANK", "value": "0"}])
    assert len(validate(doc).problems) >= 2


EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    runtimes = {
        runtime_key(d): d for p in EXAMPLES for d in yaml.safe_load_all(p.read_text()) if is_runtime(d)
    }
    for doc in yaml.safe_load_all(path.read_text()):
        if is_runtime(doc):
            assert validate_runtime(doc) == []
        if doc and doc.get("kind") == "LLMTrainingJob":
            ref = ref_of(doc["spec"])
            runtime = None
            if ref is not None:
                ns = "" if ref[0] == "ClusterLLMTrainingRuntime" else doc["metadata"]["namespace"]
                runtime = runtimes[(ref[0], ns, ref[1])]
            result = validate(doc, runtime)
            assert result.problems == [] and result.job is not None


def test_defaults_applied() -> None:
    result = validate(manifest())
    assert result.job is not None
    job = result.job
    assert job.desired_replicas == 4 and job.nproc_per_node == 8
    assert job.spec.rendezvous.backend == "etcd-v3" and job.spec.failurePolicy.nodeFailureGraceSeconds == 30
