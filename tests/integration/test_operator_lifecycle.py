"""A job's life against the real control plane: children, Running, scale, suspend, delete."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator import labels

from tests.support.wait import wait_for

from .kube_helpers import (
    apply,
    events,
    job_manifest,
    live_workers,
    running_workers,
    status,
    workers,
)

pytestmark = pytest.mark.cluster
TIMEOUT = 60


def test_job_gets_workers_service_rendezvous_and_runs(cluster: Any, namespace: str, operator: Any) -> None:
    assert apply(cluster, job_manifest("llama", namespace)).returncode == 0
    pods = wait_for(
        lambda: (
            len(running_workers(cluster, namespace, "llama")) == 4
            and running_workers(cluster, namespace, "llama")
        ),
        TIMEOUT,
        "4 running workers",
    )
    names = sorted(p["metadata"]["name"] for p in pods)
    assert names == [f"llama-worker-{i}" for i in range(4)]
    uid = cluster.kube.get("llmtrainingjob", "llama", namespace)["metadata"]["uid"]  # type: ignore[index]
    pod = pods[0]
    assert pod["metadata"]["ownerReferences"][0]["uid"] == uid
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ID"] == uid and env["PET_NNODES"] == "2:4"
    assert env["PET_RDZV_ENDPOINT"] == f"llama-rdzv.{namespace}.svc:2379"
    assert cluster.kube.get("service", "llama-workers", namespace) is not None
    assert cluster.kube.get("service", "llama-rdzv", namespace) is not None
    assert cluster.kube.get("deployment", "llama-rdzv", namespace) is not None
    st = wait_for(
        lambda: (s := status(cluster, namespace, "llama")).get("phase") == "Running" and s,
        TIMEOUT,
        "phase Running",
    )
    assert st["readyReplicas"] == 4 and st["targetReplicas"] == 4 and st["replicas"] == 4
    assert st["selector"] == f"{labels.JOB_NAME}=llama,{labels.ROLE}=worker"
    assert st["observedGeneration"] >= 1
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert st["restarts"] == 0 and st["startTime"]
    reasons = [e["reason"] for e in events(cluster, namespace, fields="involvedObject.name=llama")]
    assert not {"CreatedWorkers", "PhaseRunning"} & set(reasons), f"a first start posts no Event: {reasons}"


def test_kubectl_scale_changes_worker_count(cluster: Any, namespace: str, operator: Any) -> None:
    apply(cluster, job_manifest("scaled", namespace))
    wait_for(lambda: status(cluster, namespace, "scaled").get("phase") == "Running", TIMEOUT, "Running at 4")
    assert cluster.kubectl("scale", "llmjob/scaled", "-n", namespace, "--replicas=2").returncode == 0
    wait_for(
        lambda: len(live_workers(cluster, namespace, "scaled")) == 2, TIMEOUT, "2 workers after scale down"
    )
    wait_for(lambda: status(cluster, namespace, "scaled").get("targetReplicas") == 2, TIMEOUT, "target 2")
    cluster.kubectl("scale", "llmjob/scaled", "-n", namespace, "--replicas=3")
    wait_for(
        lambda: len(running_workers(cluster, namespace, "scaled")) == 3, TIMEOUT, "3 workers after scale up"
    )
    rejected = cluster.kubectl("scale", "llmjob/scaled", "-n", namespace, "--replicas=9", check=False)
    assert rejected.returncode != 0 and "spec.replicas must be within" in rejected.stderr


def test_suspend_and_resume(cluster: Any, namespace: str, operator: Any) -> None:
    apply(cluster, job_manifest("pause", namespace, replicas=2))
    wait_for(lambda: status(cluster, namespace, "pause").get("phase") == "Running", TIMEOUT, "Running")
    cluster.kubectl(
        "patch", "llmjob/pause", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    wait_for(lambda: status(cluster, namespace, "pause").get("phase") == "Suspended", TIMEOUT, "Suspended")
    wait_for(lambda: not workers(cluster, namespace, "pause"), TIMEOUT, "no workers while suspended")
    cluster.kubectl(
        "patch", "llmjob/pause", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    wait_for(
        lambda: len(running_workers(cluster, namespace, "pause")) == 2, TIMEOUT, "workers back after resume"
    )
    wait_for(lambda: status(cluster, namespace, "pause").get("phase") == "Running", TIMEOUT, "Running again")


def test_delete_removes_everything_it_owns(cluster: Any, namespace: str, operator: Any) -> None:
    apply(cluster, job_manifest("gone", namespace, replicas=2))
    wait_for(lambda: len(running_workers(cluster, namespace, "gone")) == 2, TIMEOUT, "2 workers")
    job = cluster.kube.get("llmjob", "gone", namespace)
    assert job is not None and not job["metadata"].get("finalizers"), (
        "no finalizer: deletion never waits on us"
    )
    cluster.kubectl("delete", "llmjob/gone", "-n", namespace, "--wait=true")
    selector = f"{labels.JOB_NAME}=gone"
    wait_for(
        lambda: not cluster.kube.items("pods,services,deployments", namespace, labels=selector),
        TIMEOUT,
        "children garbage-collected",
    )
