"""Elasticity scenarios on the local control plane (4 fake p5.48xlarge nodes), one per test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from llm_testbed.localcluster import chaos

from tests.support.sampling import sampled
from tests.support.wait import wait_for

from .conftest import OperatorProcess
from .kube_helpers import apply, job_manifest, live_workers, running_workers, status, wait_events, workers

pytestmark = pytest.mark.cluster
TIMEOUT = 60


def gpu_job(namespace: str, name: str = "llama", **spec: Any) -> dict[str, Any]:
    spec.setdefault("gpusPerNode", 8)
    spec.setdefault("scheduling", {"instanceTypes": ["p5.48xlarge"]})
    return job_manifest(name, namespace, **spec)


def wait_gpus_free(cluster: Any) -> None:
    """Earlier tests' workers must be gone before a test that counts GPU capacity."""

    def free() -> bool:
        pods = cluster.kube.items("pods", all_namespaces=True, labels="elasticllm.dev/role=worker")
        return not [p for p in pods if p["spec"].get("nodeName", "").startswith("gpu-")]

    wait_for(free, TIMEOUT, "GPU nodes free of earlier workers")


def start(cluster: Any, namespace: str, size: int, **spec: Any) -> list[dict[str, Any]]:
    wait_gpus_free(cluster)
    assert apply(cluster, gpu_job(namespace, **spec)).returncode == 0
    wait_for(
        lambda: (
            status(cluster, namespace, "llama").get("phase") == "Running"
            and status(cluster, namespace, "llama").get("readyReplicas") == size
        ),
        TIMEOUT,
        f"job Running at {size}",
    )
    return running_workers(cluster, namespace, "llama")


def status_when(cluster: Any, namespace: str, what: str, **expected: Any) -> dict[str, Any]:
    """Wait until the job's status has every expected field value; return that status."""

    def probe() -> dict[str, Any] | None:
        s = status(cluster, namespace, "llama")
        return s if all(s.get(k) == v for k, v in expected.items()) else None

    found: dict[str, Any] = wait_for(probe, TIMEOUT, what)
    return found


def not_ready(cluster: Any, node: str) -> None:
    """Mark the node NotReady and wait only until it reports so (not for the controller-manager)."""
    chaos.node_not_ready(node, kube=cluster.kube, wait=False)
    wait_for(
        lambda: chaos.condition(cluster.kube.get("node", node) or {}, "Ready") != "True",
        TIMEOUT,
        f"{node} NotReady",
    )


def running_at(cluster: Any, namespace: str, size: int) -> bool:
    s = status(cluster, namespace, "llama")
    return s.get("phase") == "Running" and s.get("readyReplicas") == size


def pod_named(pods: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    return next(p for p in pods if p["metadata"]["name"].endswith(suffix))


def replaced(cluster: Any, namespace: str, old: dict[str, Any]) -> Callable[[], Any]:
    """A new Running worker exists and the old pod (by uid) is gone."""

    def check() -> Any:
        # One listing: two (running, then all) could see the old pod still running in the first and
        # already gone in the second, and return it as if it were a replacement.
        everything = workers(cluster, namespace, "llama")
        uids = {p["metadata"]["uid"] for p in everything}
        pods = [
            p
            for p in everything
            if not p["metadata"].get("deletionTimestamp") and p.get("status", {}).get("phase") == "Running"
        ]
        return old["metadata"]["uid"] not in uids and len(pods) >= 3 and pods

    return check


def test_node_not_ready_worker_replaced(cluster: Any, namespace: str, operator: Any) -> None:
    pods = start(cluster, namespace, 3, replicas=3)
    victim = pod_named(pods, "-worker-0")
    chaos.node_not_ready(victim["spec"]["nodeName"], kube=cluster.kube, wait=False)
    now = wait_for(replaced(cluster, namespace, victim), TIMEOUT, "lost worker replaced on a healthy node")
    assert victim["spec"]["nodeName"] not in {p["spec"]["nodeName"] for p in now}
    st = status_when(cluster, namespace, "Running", phase="Running")
    assert st["restarts"] == 1 and st["readyReplicas"] == 3
    wait_events(cluster, namespace, "NodeNotReady")


def test_grace_period_delays_replacement(cluster: Any, namespace: str, operator: Any) -> None:
    pods = start(cluster, namespace, 3, replicas=3, failurePolicy={"nodeFailureGraceSeconds": 8})
    victim = pod_named(pods, "-worker-1")
    not_ready(cluster, victim["spec"]["nodeName"])
    assert victim["metadata"]["uid"] in {
        p["metadata"]["uid"] for p in workers(cluster, namespace, "llama")
    }, "replaced before the grace period ran out"
    wait_for(replaced(cluster, namespace, victim), TIMEOUT, "replaced once the grace period ran out")
    # The operator writes its status after it creates the pods (one write per pass): waited for, not read.
    status_when(cluster, namespace, "the replacement counted as one restart", restarts=1)


def test_node_deleted_worker_replaced(cluster: Any, namespace: str, operator: Any) -> None:
    pods = start(cluster, namespace, 3, replicas=3)
    victim = pod_named(pods, "-worker-2")
    chaos.delete_node(victim["spec"]["nodeName"], kube=cluster.kube)
    wait_for(replaced(cluster, namespace, victim), TIMEOUT, "worker of a deleted node replaced")


@pytest.mark.parametrize("kind", ["karpenter", "spot", "cordon"])
def test_termination_signal_replaces_proactively(
    cluster: Any, namespace: str, operator: Any, kind: str
) -> None:
    pods = start(cluster, namespace, 3, replicas=3, failurePolicy={"nodeFailureGraceSeconds": 300})
    victim = pod_named(pods, "-worker-0")
    node = victim["spec"]["nodeName"]
    chaos.taint_for_termination(node, kind, kube=cluster.kube)  # type: ignore[arg-type]
    now = wait_for(replaced(cluster, namespace, victim), TIMEOUT, f"worker moved off the {kind} node")
    assert node not in {p["spec"]["nodeName"] for p in now}
    node_obj = cluster.kube.get("node", node)
    assert chaos.condition(node_obj, "Ready") == "True", "replaced before the node died"


def avoided_nodes(pod: dict[str, Any]) -> list[set[str]]:
    """Per required nodeSelectorTerm, the node names excluded by a `metadata.name NotIn` field."""
    required = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return [
        {v for f in term.get("matchFields", []) if f["operator"] == "NotIn" for v in f["values"]}
        for term in required.get("nodeSelectorTerms", [])
    ]


@pytest.mark.parametrize("kind", ["karpenter", "cordon", "not-ready"])
def test_replacement_never_lands_on_the_bad_node(
    cluster: Any, namespace: str, operator: Any, kind: str
) -> None:
    """The operator reacts before the scheduler has seen the taint/cordon/NotReady: new pods exclude the
    node by name, ANDed with the instance-type term, so they cannot land back on it."""
    grace = 0 if kind == "not-ready" else 300
    pods = start(cluster, namespace, 3, replicas=3, failurePolicy={"nodeFailureGraceSeconds": grace})
    victim = pod_named(pods, "-worker-0")
    node = victim["spec"]["nodeName"]
    if kind == "not-ready":
        chaos.node_not_ready(node, kube=cluster.kube, wait=False)
    else:
        chaos.taint_for_termination(node, kind, kube=cluster.kube)  # type: ignore[arg-type]
    now = wait_for(replaced(cluster, namespace, victim), TIMEOUT, f"worker moved off the {kind} node")
    assert node not in {p["spec"]["nodeName"] for p in now}
    originals = {p["metadata"]["uid"] for p in pods}
    replacement = next(p for p in now if p["metadata"]["uid"] not in originals)  # any free index
    terms = avoided_nodes(replacement)
    assert terms and all(node in names for names in terms), replacement["spec"].get("affinity")
    required = replacement["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert all(
        any(e["key"] == "node.kubernetes.io/instance-type" for e in t.get("matchExpressions", []))
        for t in required["nodeSelectorTerms"]
    ), "the instance-type term is kept"
    for pod in workers(cluster, namespace, "llama"):
        assert pod["metadata"]["uid"] == victim["metadata"]["uid"] or pod["spec"].get("nodeName") != node


def test_node_blip_on_the_only_fitting_node_does_not_strand_the_job(
    cluster: Any, namespace: str, operator: Any
) -> None:
    """min 2 / max 2 on the only two nodes that fit; one blips NotReady: its worker is replaced with a
    term against it and waits, since nothing else fits. Once the node is back, the waiting worker is
    re-created without the term and the job runs at full size again (it used to wait for ever)."""
    fits = ["gpu-node-0", "gpu-node-1"]
    # One value per metadata.name requirement (the API's rule): one term per node, ORed.
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]} for n in fits]
    required = {"nodeSelectorTerms": terms}
    only_there = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    pods = start(cluster, namespace, 2, minReplicas=2, maxReplicas=2, replicas=2,
                 scheduling={"instanceTypes": ["p5.48xlarge"], "affinity": only_there})  # fmt: skip
    victim = pod_named(pods, "-worker-1")
    node = victim["spec"]["nodeName"]
    chaos.node_not_ready(node, kube=cluster.kube)

    def waiting_replacement() -> dict[str, Any] | None:
        for pod in workers(cluster, namespace, "llama"):
            fresh = pod["metadata"]["uid"] != victim["metadata"]["uid"]
            if (
                fresh
                and pod["metadata"]["name"] == victim["metadata"]["name"]
                and not pod["spec"].get("nodeName")
            ):
                return pod
        return None

    waiting = wait_for(waiting_replacement, TIMEOUT, "the replacement waiting, kept off the lost node")
    assert waiting["metadata"]["annotations"]["elasticllm.dev/avoided-nodes"] == node
    assert status(cluster, namespace, "llama")["phase"] == "Restarting"
    chaos.node_ready(node, kube=cluster.kube)
    wait_for(lambda: running_at(cluster, namespace, 2), TIMEOUT, "the job at full size on the node come back")
    back = {p["metadata"]["name"]: p for p in running_workers(cluster, namespace, "llama")}
    again = back[victim["metadata"]["name"]]
    assert again["spec"]["nodeName"] == node and again["metadata"]["uid"] != waiting["metadata"]["uid"]
    assert not avoided_nodes(again) or all(node not in names for names in avoided_nodes(again))
    assert status(cluster, namespace, "llama")["restarts"] == 1, "re-creating the waiting pod is no restart"
    wait_events(cluster, namespace, "AvoidedNodeUsable")


def test_retryable_exit_replaced_nonretryable_fails(cluster: Any, namespace: str, operator: Any) -> None:
    pods = start(cluster, namespace, 4, failurePolicy={"nonRetryableExitCodes": [42]})
    first = pod_named(pods, "-worker-1")
    chaos.fail_pod(namespace, first["metadata"]["name"], 1, kube=cluster.kube, wait=False)

    def failed_one_replaced() -> bool:
        uids = {p["metadata"]["uid"] for p in workers(cluster, namespace, "llama")}
        return first["metadata"]["uid"] not in uids and len(running_workers(cluster, namespace, "llama")) == 4

    wait_for(failed_one_replaced, TIMEOUT, "retryable failure replaced")
    status_when(cluster, namespace, "the replacement counted as one restart", restarts=1)
    second = pod_named(running_workers(cluster, namespace, "llama"), "-worker-2")
    chaos.fail_pod(namespace, second["metadata"]["name"], 42, kube=cluster.kube, wait=False)
    st = status_when(cluster, namespace, "Failed", phase="Failed")
    assert st["reason"] == "NonRetryableExitCode" and "42" in st["message"]
    wait_for(lambda: not running_workers(cluster, namespace, "llama"), TIMEOUT, "remaining workers deleted")


def test_shrink_to_capacity_then_grow_back(cluster: Any, namespace: str, operator: Any) -> None:
    pods = start(
        cluster, namespace, 4, failurePolicy={"pendingTimeoutSeconds": 3, "resizeCooldownSeconds": 0}
    )
    lost = [
        pod_named(pods, "-worker-0")["spec"]["nodeName"],
        pod_named(pods, "-worker-1")["spec"]["nodeName"],
    ]
    for node in lost:
        chaos.node_not_ready(node, kube=cluster.kube, wait=False)
    st = status_when(cluster, namespace, "shrunk to 2 and Running", targetReplicas=2, phase="Running")
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InsufficientCapacity"
    # The two it gave up on stay Pending: an autoscaler launches nodes only for Pending pods (issue 39).
    workers = live_workers(cluster, namespace, "llama")
    assert len(workers) == 4 and sum(not w["spec"].get("nodeName") for w in workers) == 2
    assert st["waitingForCapacity"] == 2
    waiting = next(c for c in st["conditions"] if c["type"] == "WaitingForCapacity")
    assert waiting["status"] == "True"
    for node in lost:
        chaos.node_ready(node, kube=cluster.kube)
    st = status_when(cluster, namespace, "grown back to 4", readyReplicas=4, phase="Running")
    assert next(c for c in st["conditions"] if c["type"] == "Degraded")["status"] == "False"


def test_below_min_for_too_long_fails(cluster: Any, namespace: str, operator: Any) -> None:
    pods = start(
        cluster,
        namespace,
        4,
        minReplicas=3,
        failurePolicy={"pendingTimeoutSeconds": 60, "belowMinTimeoutSeconds": 3},
    )
    for suffix in ("-worker-0", "-worker-1"):
        chaos.node_not_ready(pod_named(pods, suffix)["spec"]["nodeName"], kube=cluster.kube, wait=False)
    st = status_when(cluster, namespace, "Failed", phase="Failed")
    assert st["reason"] == "BelowMinReplicas"


def test_max_restarts_exhausted_fails(cluster: Any, namespace: str, operator: Any) -> None:
    pods = start(cluster, namespace, 4, failurePolicy={"maxRestarts": 1})
    chaos.fail_pod(
        namespace, pod_named(pods, "-worker-0")["metadata"]["name"], 1, kube=cluster.kube, wait=False
    )
    wait_for(lambda: status(cluster, namespace, "llama").get("restarts") == 1, TIMEOUT, "first restart")
    again = wait_for(
        lambda: len(r := running_workers(cluster, namespace, "llama")) == 4 and r, TIMEOUT, "4 running"
    )
    chaos.fail_pod(
        namespace, pod_named(again, "-worker-3")["metadata"]["name"], 1, kube=cluster.kube, wait=False
    )
    st = status_when(cluster, namespace, "Failed", phase="Failed")
    assert st["reason"] == "MaxRestartsExceeded"


def test_stuck_terminating_on_unreachable_node_force_deleted(
    cluster: Any, namespace: str, operator: Any
) -> None:
    pods = start(cluster, namespace, 3, replicas=3, failurePolicy={"nodeFailureGraceSeconds": 300})
    victim = pod_named(pods, "-worker-0")
    not_ready(cluster, victim["spec"]["nodeName"])
    cluster.kubectl("delete", "pod", victim["metadata"]["name"], "-n", namespace, "--wait=false")
    wait_for(replaced(cluster, namespace, victim), TIMEOUT, "Terminating pod force-deleted and replaced")


def test_workers_exit_zero_job_succeeds(cluster: Any, namespace: str, operator: Any) -> None:
    pods = start(cluster, namespace, 2, replicas=2, ttlSecondsAfterFinished=1)
    for pod in pods:
        chaos.fail_pod(namespace, pod["metadata"]["name"], 0, kube=cluster.kube, wait=False)
    st = status_when(cluster, namespace, "Succeeded", phase="Succeeded")
    assert st["completionTime"]
    wait_for(lambda: not workers(cluster, namespace, "llama"), TIMEOUT, "finished pods deleted after the TTL")


def test_operator_killed_mid_resize_converges(
    cluster: Any, namespace: str, operator_process: Callable[[], OperatorProcess]
) -> None:
    """SIGKILL the operator right after a resize starts; a new one finishes it without duplicates."""
    op = operator_process()
    op.start()
    wait_gpus_free(cluster)
    apply(cluster, job_manifest("llama", namespace, minReplicas=2, maxReplicas=6, replicas=2))
    wait_for(lambda: len(running_workers(cluster, namespace, "llama")) == 2, TIMEOUT, "2 running")

    def worker_names() -> list[str]:
        return [p["metadata"]["name"] for p in workers(cluster, namespace, "llama")]

    with sampled(worker_names, 0.0) as seen:  # back to back: each read is a kubectl call
        cluster.kubectl("scale", "llmjob/llama", "-n", namespace, "--replicas=6")
        wait_for(lambda: len(workers(cluster, namespace, "llama")) > 2, TIMEOUT, "resize started")
        op.kill()
        op.start()
        wait_for(lambda: running_at(cluster, namespace, 6), TIMEOUT, "converged at 6 after the restart")
    names = sorted(p["metadata"]["name"] for p in workers(cluster, namespace, "llama"))
    assert names == [f"llama-worker-{i}" for i in range(6)], op.logs()
    duplicates = [n for n in seen if len(n) != len(set(n))]
    assert max(map(len, seen)) <= 6 and not duplicates, (max(map(len, seen)), duplicates)


@pytest.fixture
def mark_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator started after this fixture marks unhealthy nodes (LLMJOB_MARK_UNHEALTHY_NODES)."""
    monkeypatch.setenv("LLMJOB_MARK_UNHEALTHY_NODES", "true")


def test_spare_runs_and_an_unhealthy_node_is_recorded_avoided_and_marked(
    cluster: Any, namespace: str, mark_nodes: None, operator: Any
) -> None:
    """replicas 2 + 1 spare = 3 pods; a worker exiting 78 (a failed health check) puts its node in
    status.unhealthyNodes, its replacement excludes that node by name, and (opt-in) the node is labelled
    and tainted for every workload."""
    policy = {"nodeFailureGraceSeconds": 0, "resizeCooldownSeconds": 0, "recovery": "inProcess"}
    pods = start(cluster, namespace, 3, replicas=2, spareReplicas=1, failurePolicy=policy)
    assert status_when(cluster, namespace, "a running spare", spareReplicas=1, runningSpares=1)
    victim = pod_named(pods, "-worker-0")
    node = victim["spec"]["nodeName"]
    try:
        _unhealthy_node_story(cluster, namespace, pods, victim, node)
    finally:
        cluster.kubectl("taint", "node", node, "elasticllm.dev/unhealthy-", check=False)
        cluster.kubectl("label", "node", node, "elasticllm.dev/unhealthy-", check=False)


def _unhealthy_node_story(
    cluster: Any, namespace: str, pods: list[dict[str, Any]], victim: dict[str, Any], node: str
) -> None:
    chaos.fail_pod(namespace, victim["metadata"]["name"], 78, kube=cluster.kube, wait=False)
    now = wait_for(replaced(cluster, namespace, victim), TIMEOUT, "the unhealthy node's worker replaced")
    assert node not in {p["spec"]["nodeName"] for p in now}
    originals = {p["metadata"]["uid"] for p in pods}
    replacement = next(p for p in now if p["metadata"]["uid"] not in originals)
    assert all(node in names for names in avoided_nodes(replacement)), replacement["spec"].get("affinity")

    # The operator writes the record and marks the node after it has made the replacement: wait for each.
    def recorded() -> dict[str, Any] | None:
        st = status(cluster, namespace, "llama")
        return st if st.get("unhealthyNodes") else None

    def labelled() -> dict[str, Any] | None:
        obj = cluster.kube.get("node", node) or {}
        return obj if obj.get("metadata", {}).get("labels", {}).get("elasticllm.dev/unhealthy") else None

    st: dict[str, Any] = wait_for(recorded, TIMEOUT, "status.unhealthyNodes")
    assert [n["node"] for n in st["unhealthyNodes"]] == [node], st
    assert st["unhealthyNodes"][0]["check"] == "other"  # kwok writes no termination message
    wait_events(cluster, namespace, "NodeUnhealthy", lambda e: node in e.get("message", ""))
    marked: dict[str, Any] = wait_for(labelled, TIMEOUT, f"node {node} labelled unhealthy")
    assert marked["metadata"]["labels"].get("elasticllm.dev/unhealthy") == "other"
    taints = marked["spec"].get("taints", [])
    assert {"key": "elasticllm.dev/unhealthy", "value": "other", "effect": "NoSchedule"} in taints
    assert any(t["key"] == "nvidia.com/gpu" for t in taints), "the node's other taints are kept"
