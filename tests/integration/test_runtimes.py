"""Runtimes on the real apiserver: CEL on what a job and a runtime hold, and the operator resolving one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.wait import wait_for

from .kube_helpers import apply, job, status, wait_events, workers

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60
API = "elasticllm.dev/v1alpha1"


def runtime(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LLMTrainingRuntime",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def short_job(name: str, namespace: str, ref: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LLMTrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"runtimeRef": {"name": ref}, **spec},
    }


def test_apiserver_checks_jobs_and_runtimes_as_written(cluster: Any, namespace: str) -> None:
    # A short job: the apiserver cannot know what its runtime supplies, and stores it without defaults.
    result = apply(
        cluster, short_job("short", namespace, "p5", maxReplicas=4), "--dry-run=server", "-o", "json"
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["spec"] == {"runtimeRef": {"name": "p5"}, "maxReplicas": 4}
    # Without runtimeRef the job must name its own image (and min, max, FSx claim).
    bare = short_job("bare", namespace, "x", minReplicas=1, maxReplicas=2, fsx={"mountPath": "/fsx"})
    del bare["spec"]["runtimeRef"]
    result = apply(cluster, bare, "--dry-run=server")
    assert result.returncode != 0
    assert "spec.image is required (or spec.runtimeRef naming a runtime that sets it)" in result.stderr
    assert "spec.fsx.claimName is required" in result.stderr
    # Rules across fields the job holds itself still hold.
    result = apply(
        cluster, short_job("minmax", namespace, "p5", minReplicas=5, maxReplicas=2), "--dry-run=server"
    )
    assert result.returncode != 0 and "spec.minReplicas must be <= spec.maxReplicas" in result.stderr
    # A runtime: the same rules on what it sets, no runtimeRef of its own.
    bad = runtime("bad", namespace, gpusPerNode=4, nprocPerNode=8, env=[{"name": "RANK", "value": "0"}])
    result = apply(cluster, bad, "--dry-run=server")
    assert result.returncode != 0
    assert "spec.nprocPerNode must be <= spec.gpusPerNode" in result.stderr
    assert "spec.env RANK is reserved" in result.stderr
    nested = runtime("nested", namespace, runtimeRef={"name": "x"})
    result = apply(cluster, nested, "--dry-run=server")
    assert result.returncode != 0 and "runtimeRef" in result.stderr
    # The shipped runtime example is accepted as it is.
    (p5,) = [d for d in yaml.safe_load_all((ROOT / "deploy/examples/runtime-p5.yaml").read_text()) if d]
    result = apply(cluster, p5, "--dry-run=server")
    assert result.returncode == 0, result.stderr


def test_operator_waits_for_a_missing_runtime_then_makes_pods_from_it(
    cluster: Any, namespace: str, operator: Any
) -> None:
    body = short_job(
        "rt", namespace, "cpu", minReplicas=1, maxReplicas=2, env=[{"name": "B", "value": "job"}]
    )
    assert apply(cluster, body).returncode == 0

    def not_found() -> dict[str, Any] | None:
        conds = {c["type"]: c for c in status(cluster, namespace, "rt").get("conditions") or []}
        cond = conds.get("RuntimeResolved")
        return cond if cond and cond["reason"] == "RuntimeNotFound" else None

    cond = wait_for(not_found, TIMEOUT, "condition RuntimeResolved=False (RuntimeNotFound)")
    assert (
        cond["status"] == "False"
        and f"LLMTrainingRuntime cpu not found in namespace {namespace}" in cond["message"]
    )
    wait_events(cluster, namespace, "RuntimeNotFound")
    assert workers(cluster, namespace, "rt") == [], "no pods without the runtime"

    made = runtime(
        "cpu",
        namespace,
        image="trainer:rt",
        gpusPerNode=0,
        env=[{"name": "A", "value": "runtime"}, {"name": "B", "value": "runtime"}],
        failurePolicy={"nodeFailureGraceSeconds": 0},
    )
    assert apply(cluster, made).returncode == 0
    pods = wait_for(
        lambda: len(workers(cluster, namespace, "rt")) == 2 and workers(cluster, namespace, "rt"),
        TIMEOUT,
        "2 workers from the runtime",
    )
    (container,) = pods[0]["spec"]["containers"]
    assert container["image"] == "trainer:rt"
    assert [(e["name"], e.get("value")) for e in container["env"] if e["name"] in ("A", "B")] == [
        ("A", "runtime"),
        ("B", "job"),
    ]
    snapshot = wait_for(lambda: status(cluster, namespace, "rt").get("runtime"), TIMEOUT, "status.runtime")
    assert snapshot["kind"] == "LLMTrainingRuntime" and snapshot["spec"]["image"] == "trainer:rt"

    # Editing the runtime does not change the running job: it keeps its copy.
    edited = {**made, "spec": {**made["spec"], "image": "trainer:edited"}}
    assert apply(cluster, edited).returncode == 0
    current = cluster.kube.get("llmtrainingruntimes", "cpu", namespace) or {}
    assert current["metadata"]["resourceVersion"] != snapshot["resourceVersion"]
    cluster.kubectl("scale", "llmjob/rt", "-n", namespace, "--replicas=1")
    wait_for(lambda: len(workers(cluster, namespace, "rt")) == 1, TIMEOUT, "scaled to 1")
    cluster.kubectl("scale", "llmjob/rt", "-n", namespace, "--replicas=2")
    pods = wait_for(
        lambda: len(workers(cluster, namespace, "rt")) == 2 and workers(cluster, namespace, "rt"),
        TIMEOUT,
        "back to 2",
    )
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {"trainer:rt"}
    assert status(cluster, namespace, "rt")["runtime"]["resourceVersion"] == snapshot["resourceVersion"]
    assert "runtimeRef" in job(cluster, namespace, "rt")["spec"]
