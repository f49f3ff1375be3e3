"""Kueue admission of LLMTrainingJobs against the real Kueue manager (pinned, built like the other tools).

The ClusterQueue holds 4 p5 nodes' GPUs (32). Pods do not run on kwok nodes: a worker's exit is driven
through the fake kubelet (``chaos.fail_pod``), as in test_elasticity.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_testbed import kueue as local_kueue
from llm_testbed.localcluster import chaos, nodes

from tests.support.wait import wait_for

from .kube_helpers import apply, job_manifest, live_workers, status, wait_events

pytestmark = [pytest.mark.cluster, pytest.mark.tools("kueue")]
TIMEOUT = 90
QUEUE = {"kueue.x-k8s.io/queue-name": local_kueue.LOCAL_QUEUE}


@pytest.fixture(scope="session")
def kueue(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[local_kueue.Kueue]:
    """The Kueue manager for the session's cluster (started only by the tests that use it)."""
    workdir: Path = tmp_path_factory.mktemp("kueue")
    with local_kueue.running(cluster.kube, workdir) as manager:
        yield manager


@pytest.fixture
def queues(cluster: Any, kueue: local_kueue.Kueue, namespace: str) -> Iterator[local_kueue.Kueue]:
    """ResourceFlavor, ClusterQueue (32 GPUs) and a LocalQueue in the test's namespace, all Active.

    Afterwards the test's Workloads are deleted and the quota is seen free again, so the next test
    starts with the whole ClusterQueue (namespace deletion alone is asynchronous).
    """
    kueue.set_up_queues(namespace)
    yield kueue
    cluster.kubectl("delete", "llmtrainingjobs", "--all", "-n", namespace, "--wait=false", check=False)
    cluster.kubectl("delete", "workloads.kueue.x-k8s.io", "--all", "-n", namespace, check=False)

    def quota_free() -> bool:
        cq = cluster.kube.get("clusterqueue", local_kueue.CLUSTER_QUEUE) or {}
        return (cq.get("status") or {}).get("reservingWorkloads", 0) == 0

    wait_for(quota_free, TIMEOUT, "ClusterQueue without reserving Workloads")


@pytest.fixture
def tas_queues(cluster: Any, kueue: local_kueue.Kueue, namespace: str) -> Iterator[local_kueue.Kueue]:
    """Topology (the fake p5 nodes' EKS network levels), a flavor naming it, a ClusterQueue with 32 GPUs on
    that flavor and LocalQueue ``gpu-tas-queue``; afterwards as ``queues``."""
    kueue.set_up_queues(namespace, topology=True)
    yield kueue
    cluster.kubectl("delete", "llmtrainingjobs", "--all", "-n", namespace, "--wait=false", check=False)
    cluster.kubectl("delete", "workloads.kueue.x-k8s.io", "--all", "-n", namespace, check=False)

    def quota_free() -> bool:
        cq = cluster.kube.get("clusterqueue", local_kueue.TAS_CLUSTER_QUEUE) or {}
        return (cq.get("status") or {}).get("reservingWorkloads", 0) == 0

    wait_for(quota_free, TIMEOUT, "TAS ClusterQueue without reserving Workloads")


def kueue_job(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("gpusPerNode", 8)
    spec.setdefault("scheduling", {"instanceTypes": ["p5.48xlarge"]})
    doc = job_manifest(name, namespace, **spec)
    doc["metadata"]["labels"] = dict(QUEUE)
    return doc


def admitted(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    """The job's Admitted condition ({} while there is none)."""
    conds = status(cluster, namespace, name).get("conditions") or []
    return next((c for c in conds if c["type"] == "Admitted"), {})


def running_at(cluster: Any, namespace: str, name: str, size: int) -> bool:
    s = status(cluster, namespace, name)
    return s.get("phase") == "Running" and s.get("readyReplicas") == size


def wait_running(cluster: Any, namespace: str, name: str, size: int, what: str) -> None:
    """Wait until the job runs ``size`` ready workers; on a timeout say where it and its Workload stand."""
    try:
        wait_for(lambda: running_at(cluster, namespace, name, size), TIMEOUT, what)
    except BaseException:
        print("job status:", status(cluster, namespace, name))
        print("workload status:", workload(cluster, namespace, name).get("status"))
        print(
            "cluster queue status:",
            (cluster.kube.get("clusterqueue", local_kueue.CLUSTER_QUEUE) or {}).get("status"),
        )
        print(cluster.kubectl("get", "workloads.kueue.x-k8s.io", "-A", check=False).stdout)
        raise


def workload(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    items = cluster.kube.items("workloads.kueue.x-k8s.io", namespace)
    mine = [w for w in items if w["metadata"]["labels"].get("elasticllm.dev/job-name") == name]
    return mine[0] if mine else {}


def wait_gpus_free(cluster: Any) -> None:
    def free() -> bool:
        pods = cluster.kube.items("pods", all_namespaces=True, labels="elasticllm.dev/role=worker")
        return not [
            p
            for p in pods
            if p["spec"].get("nodeName", "").startswith("gpu-")
            and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        ]

    wait_for(free, TIMEOUT, "GPU nodes free of earlier workers")


def test_quota_partial_admission_and_release(
    cluster: Any, namespace: str, queues: Any, operator: Any
) -> None:
    wait_gpus_free(cluster)
    # first: 3 nodes of the 4 the quota holds, admitted at its desired size.
    assert apply(cluster, kueue_job(namespace, "first", minReplicas=2, maxReplicas=3)).returncode == 0
    wait_running(cluster, namespace, "first", 3, "first Running at 3")
    cond = admitted(cluster, namespace, "first")
    assert cond["status"] == "True" and "admitted 3 of 3" in cond["message"], cond
    wl = workload(cluster, namespace, "first")
    assert wl["spec"]["podSets"][0]["count"] == 3 and wl["spec"]["podSets"][0]["minCount"] == 2
    assert wl["metadata"]["ownerReferences"][0]["name"] == "first"
    # second needs at least 2 nodes' GPUs; 1 node's are left: Kueue keeps it queued, no pods.
    assert apply(cluster, kueue_job(namespace, "second", minReplicas=2, maxReplicas=4)).returncode == 0
    wait_for(
        lambda: (
            status(cluster, namespace, "second").get("phase") == "Queued"
            and admitted(cluster, namespace, "second").get("reason") == "Queued"
        ),
        TIMEOUT,
        "second Queued",
    )
    # third fits partially: 1 of 2 (minReplicas 1) in the node left (partial admission).
    assert apply(cluster, kueue_job(namespace, "third", minReplicas=1, maxReplicas=2)).returncode == 0
    wait_running(cluster, namespace, "third", 1, "third Running at 1")
    cond = admitted(cluster, namespace, "third")
    assert "admitted 1 of 2 workers (partial admission)" in cond["message"], cond
    assert live_workers(cluster, namespace, "second") == []
    assert status(cluster, namespace, "second")["phase"] == "Queued"
    # scaled while queued: the Workload asks for the new size (podSets are mutable until admitted).
    cluster.kubectl("scale", "llmtrainingjob", "second", "-n", namespace, "--replicas=3")
    wait_for(
        lambda: workload(cluster, namespace, "second")["spec"]["podSets"][0]["count"] == 3,
        TIMEOUT,
        "second's Workload resized to 3 while queued",
    )
    # first finishes: its Workload is marked Finished, the quota goes to second (3 nodes free).
    for pod in live_workers(cluster, namespace, "first"):
        chaos.fail_pod(namespace, pod["metadata"]["name"], 0, kube=cluster.kube)
    wait_for(
        lambda: status(cluster, namespace, "first").get("phase") == "Succeeded", TIMEOUT, "first Succeeded"
    )
    finished = wait_for(
        lambda: next(
            (
                c
                for c in workload(cluster, namespace, "first")["status"]["conditions"]
                if c["type"] == "Finished"
            ),
            None,
        ),
        TIMEOUT,
        "first's Workload Finished",
    )
    assert finished["status"] == "True" and finished["reason"] == "Succeeded"
    wait_for(
        lambda: running_at(cluster, namespace, "second", 3), TIMEOUT, "second Running at 3 after release"
    )
    assert admitted(cluster, namespace, "second")["message"] == "admitted 3 of 3 workers"
    pods = live_workers(cluster, namespace, "second")
    # the flavor's placement is on every admitted worker; the queue label is not (no per-pod admission)
    for pod in pods:
        assert pod["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] == "p5.48xlarge"
        assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]


def test_preemption_stops_victim_and_requeues(
    cluster: Any, namespace: str, queues: Any, operator: Any
) -> None:
    wait_gpus_free(cluster)
    for name, value in (("llmjob-test-low", 10), ("llmjob-test-high", 1000)):
        pclass = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        assert apply(cluster, pclass).returncode == 0
    low = kueue_job(namespace, "low", minReplicas=2, maxReplicas=4)
    low["spec"]["scheduling"]["priorityClassName"] = "llmjob-test-low"
    assert apply(cluster, low).returncode == 0
    wait_running(cluster, namespace, "low", 4, "low Running at 4 (whole quota)")
    victims = {p["metadata"]["uid"] for p in live_workers(cluster, namespace, "low")}
    high = kueue_job(namespace, "high", minReplicas=2, maxReplicas=2)
    high["spec"]["scheduling"]["priorityClassName"] = "llmjob-test-high"
    assert apply(cluster, high).returncode == 0
    wl = wait_for(lambda: workload(cluster, namespace, "high"), TIMEOUT, "high's Workload")
    assert wl["spec"]["priority"] == 1000
    wait_running(cluster, namespace, "high", 2, "high Running at 2")

    # the victim's workers were stopped (gracefully: deleted, not forced) and it went back to the queue...
    def about_low(e: dict[str, Any]) -> bool:
        return bool(e["involvedObject"]["name"] == "low")

    wait_events(cluster, namespace, "Preempted", about_low)
    stops = wait_events(
        cluster, namespace, "DeletedWorkers", lambda e: about_low(e) and "Preempted" in e["message"]
    )
    assert not any("force" in e["message"] for e in stops), stops
    # ...and Kueue admits it again in what is left (2 nodes), partially: 2 of 4.
    wait_running(cluster, namespace, "low", 2, "low requeued and Running at 2")
    now = {p["metadata"]["uid"] for p in live_workers(cluster, namespace, "low")}
    assert not now & victims, "the preempted workers were replaced by new ones"
    assert "admitted 2 of 4" in admitted(cluster, namespace, "low")["message"]


def test_suspend_and_resume_through_kueue(cluster: Any, namespace: str, queues: Any, operator: Any) -> None:
    wait_gpus_free(cluster)
    assert apply(cluster, kueue_job(namespace, "job", minReplicas=2, maxReplicas=2)).returncode == 0
    wait_running(cluster, namespace, "job", 2, "job Running at 2")
    cluster.kubectl(
        "patch", "llmtrainingjob", "job", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    wait_for(lambda: status(cluster, namespace, "job").get("phase") == "Suspended", TIMEOUT, "job Suspended")
    wait_for(lambda: live_workers(cluster, namespace, "job") == [], TIMEOUT, "workers stopped")

    def released() -> bool:
        wl = workload(cluster, namespace, "job")
        return wl["spec"].get("active") is False and not (wl.get("status") or {}).get("admission")

    wait_for(released, TIMEOUT, "Workload deactivated and its quota released")
    cluster.kubectl(
        "patch", "llmtrainingjob", "job", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    wait_running(cluster, namespace, "job", 2, "job admitted again and Running at 2")
    assert workload(cluster, namespace, "job")["spec"]["active"] is True


def test_job_without_queue_label_has_no_workload(
    cluster: Any, namespace: str, queues: Any, operator: Any
) -> None:
    wait_gpus_free(cluster)
    doc = job_manifest("plain", namespace, minReplicas=1, maxReplicas=1, gpusPerNode=8)
    assert apply(cluster, doc).returncode == 0
    wait_running(cluster, namespace, "plain", 1, "plain job Running")
    assert workload(cluster, namespace, "plain") == {}
    assert not any(c["type"] == "Admitted" for c in status(cluster, namespace, "plain")["conditions"])


def test_topology_aware_admission_and_replacement_in_the_block(
    cluster: Any, namespace: str, tas_queues: Any, operator: Any
) -> None:
    """Kueue TAS admits the job into the one layer-3 block that holds it (nn-l3-0: gpu-node-0..2; nn-l3-1
    has one node); the workers run there, and a lost worker's replacement stays there although
    gpu-node-3 (other block) is free."""
    wait_gpus_free(cluster)
    topology = {"key": nodes.BLOCK_LABEL, "mode": "required"}
    doc = kueue_job(
        namespace,
        "tas",
        minReplicas=1,
        maxReplicas=2,
        scheduling={"instanceTypes": ["p5.48xlarge"], "topology": topology},
    )
    doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": local_kueue.TAS_LOCAL_QUEUE}
    assert apply(cluster, doc).returncode == 0
    wait_running(cluster, namespace, "tas", 2, "tas Running at 2")
    wl = workload(cluster, namespace, "tas")
    assert wl["spec"]["podSets"][0]["topologyRequest"] == {"required": nodes.BLOCK_LABEL}
    assignment = wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert nodes.BLOCK_LABEL in assignment["levels"], assignment
    pods = live_workers(cluster, namespace, "tas")
    assert sorted(nodes.block_of(p["spec"]["nodeName"]) for p in pods) == ["nn-l3-0", "nn-l3-0"]
    for pod in pods:
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] == nodes.BLOCK_LABEL
        required = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        reserved = {"key": nodes.BLOCK_LABEL, "operator": "In", "values": ["nn-l3-0"]}
        assert reserved in required["nodeSelectorTerms"][0]["matchExpressions"], "Kueue's assignment applied"
    assert status(cluster, namespace, "tas")["topology"]["domain"] == "nn-l3-0"
    lost = pods[0]["spec"]["nodeName"]
    chaos.node_not_ready(lost, kube=cluster.kube, wait=False)

    def replaced() -> list[dict[str, Any]] | None:
        now = [
            p
            for p in live_workers(cluster, namespace, "tas")
            if p.get("status", {}).get("phase") == "Running"
        ]
        placed = {p["spec"]["nodeName"] for p in now}
        return (
            now if len(now) == 2 and lost not in placed and running_at(cluster, namespace, "tas", 2) else None
        )

    after = wait_for(replaced, TIMEOUT, "the lost worker replaced")
    assert sorted(nodes.block_of(p["spec"]["nodeName"]) for p in after) == ["nn-l3-0", "nn-l3-0"]
