"""The local control plane itself: fake p5 nodes, pod lifecycle, every fault injection, idempotent CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from llm_testbed.localcluster import chaos, marks, restart
from llm_testbed.localcluster.apireader import ApiReadError
from llm_testbed.localcluster.chaos import condition
from llm_testbed.localcluster.cluster import LocalCluster
from support.kube import create, get_pod, pod_manifest, pod_running_ready
from support.wait import wait_for

pytestmark = pytest.mark.cluster

TEST_GPU_NODES = int(os.environ.get("LLMJOB_TEST_GPU_NODES", "4"))
TEST_CPU_NODES = int(os.environ.get("LLMJOB_TEST_CPU_NODES", "2"))


def _nodes(cluster: LocalCluster, role: str) -> list[dict[str, Any]]:
    return cluster.kube.items("nodes", labels=f"{marks.NODE_ROLE_LABEL}={role}")


def _taints(node: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {t["key"]: t for t in node.get("spec", {}).get("taints", []) or []}


def _running_pod(cluster: LocalCluster, namespace: str, name: str, **kwargs: Any) -> dict[str, Any]:
    create(cluster, namespace, pod_manifest(name, **kwargs))
    return wait_for(lambda: pod_running_ready(cluster, namespace, name), 30, f"pod {name} Running and Ready")


# ------------------------------------------------------------------------------------------------ nodes
def test_gpu_nodes_are_ready_p5_shaped_and_tainted(cluster: LocalCluster) -> None:
    gpu = _nodes(cluster, "gpu")
    assert len(gpu) == TEST_GPU_NODES
    for node in gpu:
        labels = node["metadata"]["labels"]
        allocatable = node["status"]["allocatable"]
        assert condition(node, "Ready") == "True", node["metadata"]["name"]
        assert allocatable[marks.GPU_RESOURCE] == "8"
        assert allocatable[marks.EFA_RESOURCE] == "32"
        assert allocatable["cpu"] == "192"
        assert allocatable["memory"] == "2Ti"
        assert allocatable["pods"] == "110"
        assert node["status"]["capacity"][marks.GPU_RESOURCE] == "8"
        assert labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
        assert labels["topology.kubernetes.io/zone"]
        assert labels["type"] == "kwok"
        taint = _taints(node)[marks.GPU_TAINT_KEY]
        assert (taint.get("value"), taint["effect"]) == ("true", "NoSchedule")


def test_cpu_nodes_are_ready_and_untainted(cluster: LocalCluster) -> None:
    cpu = _nodes(cluster, "cpu")
    assert len(cpu) == TEST_CPU_NODES
    for node in cpu:
        assert condition(node, "Ready") == "True"
        assert marks.GPU_RESOURCE not in node["status"]["allocatable"]
        assert marks.GPU_TAINT_KEY not in _taints(node)


def test_kubectl_get_nodes_shows_them_ready(cluster: LocalCluster) -> None:
    out = cluster.kubectl("get", "nodes", "--no-headers").stdout.splitlines()
    statuses = {line.split()[0]: line.split()[1] for line in out}
    assert len(statuses) == TEST_GPU_NODES + TEST_CPU_NODES
    assert set(statuses.values()) == {"Ready"}


@pytest.mark.parametrize(
    ("kind", "namespace"),
    [("no", None), ("sa", "kube-system"), ("crd", None), ("leases.coordination.k8s.io", "kube-node-lease")],
)
def test_the_test_beds_reads_name_kinds_and_list_objects_as_kubectl_does(
    cluster: LocalCluster, kind: str, namespace: str | None
) -> None:
    # The polls read the API directly (apireader), not through a kubectl process per read: same kinds, same
    # objects, each with its kind and apiVersion as kubectl prints them.
    ns = ["--namespace", namespace] if namespace else []
    printed = json.loads(cluster.kubectl("get", kind, *ns, "-o", "json").stdout)["items"]
    read = cluster.kube.items(kind, namespace)
    assert read, kind
    assert [(o["kind"], o["apiVersion"], o["metadata"]["uid"]) for o in read] == [
        (o["kind"], o["apiVersion"], o["metadata"]["uid"]) for o in printed
    ]
    one = read[0]["metadata"]
    assert cluster.kube.get(kind, one["name"], one.get("namespace")) is not None
    assert cluster.kube.get(kind, "no-such-object", one.get("namespace")) is None


def test_a_kind_the_server_does_not_have_is_named_in_the_error(cluster: LocalCluster) -> None:
    with pytest.raises(ApiReadError, match='resource type "gizmos"'):
        cluster.kube.items("gizmos")


# -------------------------------------------------------------------------------------- control plane
def test_a_component_that_exits_is_started_again_but_not_one_a_test_stopped(
    cluster: LocalCluster, namespace: str, control_plane_supervisor: restart.Supervisor
) -> None:
    """kube-scheduler exits by itself (as it does on a cache it finds corrupted): the supervisor starts it
    again and pods are scheduled. etcd stopped on purpose (``restart.stop``) stays down until the test
    starts it."""
    old = cluster.component_pids()["kube-scheduler"]
    os.kill(old, signal.SIGKILL)
    restarted = wait_for(control_plane_supervisor.take, 30, "kube-scheduler started again")
    assert [r.component for r in restarted] == ["kube-scheduler"]
    assert cluster.component_pids()["kube-scheduler"] != old
    pid_file = cluster.workdir / "pids" / "kube-scheduler.pid"
    assert pid_file.read_text().isdigit(), "kwokctl's delete could not parse it, and would leak the process"
    _running_pod(cluster, namespace, "after-restart", gpus=1)

    held = restart.stop(cluster, "etcd")
    try:
        assert restart.dead(cluster) == ["etcd"]
        assert control_plane_supervisor.check() == [], "the supervisor would undo a fault made on purpose"
    finally:
        held.start()
    assert restart.dead(cluster) == []


# ------------------------------------------------------------------------------------------------- pods
def test_eight_gpu_pod_with_toleration_runs_on_a_gpu_node(cluster: LocalCluster, namespace: str) -> None:
    pod = _running_pod(cluster, namespace, "trainer", gpus=8, efa=32)
    node = cluster.kube.get("node", pod["spec"]["nodeName"])
    assert node is not None
    assert node["metadata"]["labels"][marks.NODE_ROLE_LABEL] == "gpu"
    assert pod["status"]["podIP"]
    assert pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]


def test_gpu_pod_without_toleration_is_unschedulable(cluster: LocalCluster, namespace: str) -> None:
    create(cluster, namespace, pod_manifest("no-toleration", gpus=8, tolerations=[]))

    def unschedulable() -> bool:
        pod = get_pod(cluster, namespace, "no-toleration") or {}
        conds = pod.get("status", {}).get("conditions", [])
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds)

    wait_for(unschedulable, 30, "pod no-toleration to be reported Unschedulable")
    assert "nodeName" not in (get_pod(cluster, namespace, "no-toleration") or {}).get("spec", {})


def test_pod_on_ready_node_is_deleted(cluster: LocalCluster, namespace: str) -> None:
    _running_pod(cluster, namespace, "short-lived", gpus=1)
    cluster.kubectl("delete", "pod", "short-lived", "--namespace", namespace, "--wait=false")
    wait_for(lambda: get_pod(cluster, namespace, "short-lived") is None, 30, "pod short-lived to be gone")


@pytest.mark.parametrize(("code", "phase", "reason"), [(3, "Failed", "Error"), (0, "Succeeded", "Completed")])
def test_fail_pod_sets_phase_and_exit_code(
    cluster: LocalCluster, namespace: str, code: int, phase: str, reason: str
) -> None:
    _running_pod(cluster, namespace, "worker", gpus=8)
    chaos.fail_pod(namespace, "worker", code, kube=cluster.kube)
    pod = get_pod(cluster, namespace, "worker")
    assert pod is not None
    assert pod["status"]["phase"] == phase
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (code, reason)
    assert condition(pod, "Ready") == "False"


# ------------------------------------------------------------------------------------------ node health
def test_node_not_ready_and_back(cluster: LocalCluster, namespace: str) -> None:
    node = chaos.add_node(kube=cluster.kube)
    _running_pod(cluster, namespace, "victim", gpus=8, node=node)

    chaos.node_not_ready(node, kube=cluster.kube)
    obj = cluster.kube.get("node", node)
    assert obj is not None and condition(obj, "Ready") == "Unknown"
    assert chaos.UNREACHABLE_TAINT in _taints(obj)
    assert cluster.kubectl("get", "node", node, "--no-headers").stdout.split()[1] == "NotReady"
    pod = get_pod(cluster, namespace, "victim")
    assert pod is not None and condition(pod, "Ready") == "False"
    assert pod["status"]["phase"] == "Running"
    marked = cluster.kube.items("events", namespace, fields="reason=NodeNotReady")
    assert marked, "chaos posts a NodeNotReady Event for each pod it marks, before it returns"

    chaos.node_ready(node, kube=cluster.kube)
    obj = cluster.kube.get("node", node)
    assert obj is not None and condition(obj, "Ready") == "True"
    assert not set(_taints(obj)) & set(chaos.LOST_NODE_TAINTS)
    assert pod_running_ready(cluster, namespace, "victim") is not None


def test_a_lost_pods_marks_never_land_on_its_replacement(cluster: LocalCluster, namespace: str) -> None:
    """A lost node's pods are marked (not ready, "on a dead node") as they were listed: when an operator has
    replaced one under the same name meanwhile, the marks miss the replacement (CI 2026-12-07: a replacement
    left not ready for good kept a job Restarting)."""
    listed = _running_pod(cluster, namespace, "worker-1", gpus=1)
    cluster.kubectl("delete", "pod", "worker-1", "--namespace", namespace, "--force", "--grace-period=0")
    wait_for(lambda: get_pod(cluster, namespace, "worker-1") is None, 30, "the lost pod gone")
    fresh = _running_pod(cluster, namespace, "worker-1", gpus=1)

    assert not chaos._mark_on_dead_node(cluster.kube, listed, on=True)
    chaos._mark_pod_not_ready(cluster.kube, listed, listed["spec"]["nodeName"], "2026-12-07T00:00:00Z")
    pod = get_pod(cluster, namespace, "worker-1")
    assert pod is not None and pod["metadata"]["uid"] == fresh["metadata"]["uid"]
    assert condition(pod, "Ready") == "True"
    assert marks.POD_ON_DEAD_NODE_LABEL not in (pod["metadata"].get("labels") or {})

    # The pod the marks were meant for gets them, and the label comes off again.
    assert chaos._mark_on_dead_node(cluster.kube, fresh, on=True)
    chaos._mark_pod_not_ready(cluster.kube, fresh, fresh["spec"]["nodeName"], "2026-12-07T00:00:00Z")
    pod = get_pod(cluster, namespace, "worker-1")
    assert pod is not None and condition(pod, "Ready") == "False"
    assert (pod["metadata"].get("labels") or {})[marks.POD_ON_DEAD_NODE_LABEL] == "true"
    assert chaos._mark_on_dead_node(cluster.kube, pod, on=False)
    pod = get_pod(cluster, namespace, "worker-1")
    assert pod is not None and marks.POD_ON_DEAD_NODE_LABEL not in (pod["metadata"].get("labels") or {})


def test_no_new_pod_lands_on_a_not_ready_node(cluster: LocalCluster, namespace: str) -> None:
    node = chaos.add_node(kube=cluster.kube)
    chaos.node_not_ready(node, kube=cluster.kube)
    create(cluster, namespace, pod_manifest("pinned", gpus=8, node=node))

    def unschedulable() -> bool:
        pod = get_pod(cluster, namespace, "pinned") or {}
        return any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in pod.get("status", {}).get("conditions", [])
        )

    wait_for(unschedulable, 30, "a pod pinned to the NotReady node to be Unschedulable")
    chaos.node_ready(node, kube=cluster.kube)
    wait_for(
        lambda: pod_running_ready(cluster, namespace, "pinned"), 30, "the pod to run once the node is back"
    )


def test_pod_on_not_ready_node_stays_terminating_until_force_deleted(
    cluster: LocalCluster, namespace: str
) -> None:
    node = chaos.add_node(kube=cluster.kube)
    _running_pod(cluster, namespace, "stuck", gpus=8, node=node)
    _running_pod(cluster, namespace, "witness", tolerations=[])  # lands on a healthy CPU node
    chaos.node_not_ready(node, kube=cluster.kube)

    cluster.kubectl("delete", "pod", "stuck", "--namespace", namespace, "--wait=false")
    cluster.kubectl("delete", "pod", "witness", "--namespace", namespace, "--wait=false")
    # kwok handles pod events in order: once the later deletion is done, the earlier one was judged.
    wait_for(lambda: get_pod(cluster, namespace, "witness") is None, 30, "pod witness to be deleted")
    stuck = get_pod(cluster, namespace, "stuck")
    assert stuck is not None, "a pod on a NotReady node must stay Terminating"
    assert stuck["metadata"].get("deletionTimestamp")

    cluster.kubectl("delete", "pod", "stuck", "--namespace", namespace, "--force", "--grace-period=0")
    wait_for(
        lambda: get_pod(cluster, namespace, "stuck") is None, 30, "pod stuck to be gone after force delete"
    )


def test_terminating_pod_finishes_when_its_node_recovers(cluster: LocalCluster, namespace: str) -> None:
    node = chaos.add_node(kube=cluster.kube)
    _running_pod(cluster, namespace, "late", gpus=8, node=node)
    chaos.node_not_ready(node, kube=cluster.kube)
    cluster.kubectl("delete", "pod", "late", "--namespace", namespace, "--wait=false")
    chaos.node_ready(node, kube=cluster.kube)
    wait_for(lambda: get_pod(cluster, namespace, "late") is None, 30, "pod late to finish deleting")


# -------------------------------------------------------------------------------------------- capacity
def test_delete_node_removes_it(cluster: LocalCluster) -> None:
    node = chaos.add_node(kube=cluster.kube)
    chaos.delete_node(node, kube=cluster.kube)
    assert cluster.kube.get("node", node) is None


def test_add_node_brings_gpu_capacity_back(cluster: LocalCluster) -> None:
    def gpus() -> int:
        return sum(
            int(n["status"]["allocatable"].get(marks.GPU_RESOURCE, "0"))
            for n in cluster.kube.items("nodes")
            if condition(n, "Ready") == "True"
        )

    before = gpus()
    node = chaos.add_node(kube=cluster.kube)
    assert node.startswith("gpu-node-")
    assert gpus() == before + 8
    cpu = chaos.add_node(kind="cpu", kube=cluster.kube)
    obj = cluster.kube.get("node", cpu)
    assert obj is not None and obj["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "m5.2xlarge"


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        ("karpenter", "karpenter.sh/disrupted", None),
        ("spot", "aws-node-termination-handler/spot-itn", chaos.SPOT_EVENT_ID),
        ("cordon", "node.kubernetes.io/unschedulable", None),
    ],
)
def test_taint_for_termination(
    cluster: LocalCluster, namespace: str, kind: chaos.TerminationKind, key: str, value: str | None
) -> None:
    node = chaos.add_node(kube=cluster.kube)
    chaos.taint_for_termination(node, kind, kube=cluster.kube)
    obj = cluster.kube.get("node", node)
    assert obj is not None
    taint = _taints(obj)[key]
    assert (taint.get("value"), taint["effect"]) == (value, "NoSchedule")
    assert marks.GPU_TAINT_KEY in _taints(obj), "the GPU taint must survive"
    assert bool(obj["spec"].get("unschedulable")) == (kind == "cordon")

    create(cluster, namespace, pod_manifest("wants-that-node", gpus=8, node=node))

    def unschedulable() -> bool:
        pod = get_pod(cluster, namespace, "wants-that-node") or {}
        return any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in pod.get("status", {}).get("conditions", [])
        )

    wait_for(unschedulable, 30, f"a new pod to be kept off the {kind}-tainted node")

    chaos.clear_termination(node, kind, kube=cluster.kube)
    wait_for(
        lambda: key not in _taints(cluster.kube.get("node", node) or {}), 30, f"taint {key} to be removed"
    )
    wait_for(
        lambda: pod_running_ready(cluster, namespace, "wants-that-node"), 60, "the pod to run once untainted"
    )


# ------------------------------------------------------------------------------------------------- CRDs
def test_every_yaml_of_a_crd_folder_is_installed_and_served(cluster: LocalCluster, namespace: str) -> None:
    folder = Path(__file__).resolve().parents[1] / "support" / "crds"
    installed = cluster.install_crds(folder)
    cleanup = ["delete", "--wait=false", "-f", str(folder)]
    assert sorted(installed) == [
        "customresourcedefinition.apiextensions.k8s.io/gadgets.test.elasticllm.dev",
        "customresourcedefinition.apiextensions.k8s.io/widgets.test.elasticllm.dev",
    ]
    widget = {"apiVersion": "test.elasticllm.dev/v1", "kind": "Widget", "metadata": {"name": "w"},
              "spec": {"size": 0}}  # fmt: skip
    rejected = cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(widget), check=False)
    assert rejected.returncode != 0 and "spec.size" in rejected.stderr, "the CRD schema is enforced"
    widget["spec"] = {"size": 2}
    create(cluster, namespace, widget)
    assert cluster.kube.get("widget", "w", namespace) is not None
    assert cluster.install_crds(folder) == installed, "installing again changes nothing"
    cluster.kubectl(*cleanup)


# ---------------------------------------------------------------------------------------- idempotency
def test_up_on_running_cluster_reports_and_keeps_it(cluster: LocalCluster) -> None:
    before = {n["metadata"]["uid"] for n in cluster.kube.items("nodes")}
    assert LocalCluster(cluster.name).up(TEST_GPU_NODES, TEST_CPU_NODES) is False
    assert cluster.is_running()
    assert {n["metadata"]["uid"] for n in cluster.kube.items("nodes")} == before


def _llmjob(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "llm_testbed.localcluster", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def test_cli_up_status_down_are_idempotent(cluster: LocalCluster) -> None:
    name = f"pytest-cli-{os.getpid()}"
    kubeconfig = LocalCluster(name, tool_paths=cluster.tools).kubeconfig
    try:
        first = _llmjob("cluster", "up", "--name", name, "--nodes", "1", "--cpu-nodes", "1")
        assert first.returncode == 0, first.stderr
        assert f"export KUBECONFIG={kubeconfig}" in first.stdout
        assert kubeconfig.is_file()

        again = _llmjob("cluster", "up", "--name", name)
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stderr

        status = _llmjob("cluster", "status", "--name", name)
        assert status.returncode == 0, status.stderr
        assert "nodes: 2/2 Ready, 8 nvidia.com/gpu allocatable" in status.stdout
    finally:
        down = _llmjob("cluster", "down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert "deleted" in down.stdout
    assert not kubeconfig.exists()

    twice = _llmjob("cluster", "down", "--name", name)
    assert twice.returncode == 0, twice.stderr
    assert "does not exist" in twice.stdout
    gone = _llmjob("cluster", "status", "--name", name)
    assert gone.returncode == 1
    assert "does not exist" in gone.stdout
