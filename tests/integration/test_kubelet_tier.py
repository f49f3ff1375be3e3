"""Pods under real kubelets: the kubelet node tier (``llmjob cluster up --kubelet``).

One cluster of two kubelet nodes (kubelet v1.36.3 + containerd 2.4.2 + runc, CNI bridges, CoreDNS,
kube-proxy) and one test walking through what a node does for the operator's pods: an image pulled from
the local registry, the downward API and the ``/dev/shm`` size, ``kubectl logs``/``exec``, a headless
Service name resolved in another pod, a termination message, SIGTERM on a graceful delete, and the chaos
verbs with their real meaning (the kubelet stops while the containers go on; the instance goes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_testbed.kubeletnodes.node import node_pids
from llm_testbed.kubeletnodes.workload import run_cluster
from llm_testbed.localcluster import chaos, marks
from llm_testbed.localcluster.cluster import LocalCluster
from support.kube import create, get_pod
from support.wait import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.tools("distribution", "containerd", "kubenode", "coredns")]

NAMESPACE = "kubelet-tier"
SHM = "64Mi"
WORKER_SCRIPT = (
    'echo "NODE=$NODE POD=$POD"; df -k /dev/shm | tail -1; '
    "trap 'echo TERM > /beats/$POD.term; exit 0' TERM; "
    "while :; do date +%s > /beats/$POD.beat; sleep 1 & wait $!; done"
)


@pytest.fixture(scope="module")
def kubelet_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    logs = tmp_path_factory.mktemp("kubelet-cluster-logs")
    with run_cluster(f"pytest-kubelet-{os.getpid()}", 2, 0, logs) as local:
        yield local


def _worker(name: str, image: str, node: str, beats: Path) -> dict[str, Any]:
    env = [
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "workers"}},
        "spec": {
            "hostname": name,
            "subdomain": "workers",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": marks.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 10,
            "containers": [
                {
                    "name": "worker",
                    "image": image,
                    "command": ["/bin/sh", "-c", WORKER_SCRIPT],
                    "env": env,
                    "resources": {"limits": {marks.GPU_RESOURCE: "8", marks.EFA_RESOURCE: "32"}},
                    "volumeMounts": [
                        {"name": "shm", "mountPath": "/dev/shm"},
                        {"name": "beats", "mountPath": "/beats"},
                    ],
                }
            ],
            "volumes": [
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM}},
                {"name": "beats", "hostPath": {"path": str(beats), "type": "Directory"}},
            ],
        },
    }


def _running(cluster: LocalCluster, name: str) -> dict[str, Any] | None:
    pod = get_pod(cluster, NAMESPACE, name)
    ready = pod is not None and chaos.condition(pod, "Ready") == "True"
    return pod if ready else None


def _alive(pid: int) -> bool:
    """Alive and not a zombie (a killed process whose parent has not reaped it yet is dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _beating(beats: Path, pod: str, since: float) -> bool:
    """The pod's container wrote its heartbeat after ``since`` (its process runs)."""
    beat = beats / f"{pod}.beat"
    return beat.is_file() and beat.stat().st_mtime > since


def test_kubelet_nodes_run_pods_from_the_local_registry(
    kubelet_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster, tier = kubelet_cluster, kubelet_cluster.kubelet_tier
    kube = cluster.kube
    beats = tmp_path / "beats"
    beats.mkdir()

    # 1. Two real nodes, shaped like the fake GPU nodes.
    nodes = {n["metadata"]["name"]: n for n in kube.items("nodes")}
    assert sorted(nodes) == ["gpu-node-0", "gpu-node-1"]
    for node in nodes.values():
        info, capacity = node["status"]["nodeInfo"], node["status"]["capacity"]
        assert info["kubeletVersion"] == "v1.36.3" and info["containerRuntimeVersion"] == "containerd://2.4.2"
        assert capacity[marks.GPU_RESOURCE] == "8" and capacity[marks.EFA_RESOURCE] == "32"
        assert {t["key"] for t in node["spec"]["taints"]} == {marks.GPU_TAINT_KEY}
        assert chaos.is_ready(node)

    # 2. Two workers behind a headless Service, their image pulled from the local registry.
    image = tier.publish_test_images("v3.6.16")["busybox"]
    assert image.startswith("127.0.0.1:")
    cluster.kubectl("create", "namespace", NAMESPACE)
    wait_for(lambda: kube.get("serviceaccount", "default", NAMESPACE), 30, "the namespace's ServiceAccount")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "workers"},
        "spec": {"clusterIP": "None", "selector": {"app": "workers"}, "publishNotReadyAddresses": True},
    }
    create(cluster, NAMESPACE, service)
    for index in (0, 1):
        create(cluster, NAMESPACE, _worker(f"w{index}", image, f"gpu-node-{index}", beats))
    w0 = wait_for(lambda: _running(cluster, "w0"), 60, "worker w0 Running and Ready")
    wait_for(lambda: _running(cluster, "w1"), 60, "worker w1 Running and Ready")
    assert w0["status"]["podIP"].startswith("10.64.0.")  # gpu-node-0's pod CIDR, from its CNI bridge

    # 3. kubectl logs: the downward API env and the /dev/shm size; kubectl exec: another worker by name.
    logs = cluster.kubectl("logs", "w0", "-n", NAMESPACE).stdout
    assert "NODE=gpu-node-0 POD=w0" in logs
    assert logs.splitlines()[1].split()[1] == str(64 * 1024)  # df -k: size of /dev/shm
    fqdn = f"w0.workers.{NAMESPACE}.svc.cluster.local"
    looked_up = cluster.kubectl("exec", "w1", "-n", NAMESPACE, "--", "nslookup", fqdn).stdout
    assert w0["status"]["podIP"] in looked_up

    # 4. A termination message, as a monitoring rule writes it, with its exit code.
    failing = _worker("rule", image, "gpu-node-1", beats)
    failing["spec"]["restartPolicy"] = "Never"
    del failing["spec"]["containers"][0]["resources"]  # w1 holds gpu-node-1's GPUs
    failing["spec"]["containers"][0]["command"] = [
        "/bin/sh", "-c", "echo 'rule-fired: loss-spike' > /dev/termination-log; exit 79",
    ]  # fmt: skip
    create(cluster, NAMESPACE, failing)

    def terminated() -> dict[str, Any] | None:
        pod = get_pod(cluster, NAMESPACE, "rule")
        states = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
        found: dict[str, Any] | None = states[0].get("state", {}).get("terminated")
        return found

    state = wait_for(terminated, 60, "pod rule's container to terminate")
    assert state["exitCode"] == 79 and state["message"].strip() == "rule-fired: loss-spike"

    # 5. A graceful delete: the kubelet sends SIGTERM, the worker acts on it within its grace period.
    cluster.kubectl("delete", "pod", "w1", "-n", NAMESPACE, "--wait=true", timeout=60)
    assert (beats / "w1.term").read_text().strip() == "TERM"

    # 6. node-not-ready: the kubelet stops, the node is marked unreachable, the container goes on.
    chaos.node_not_ready("gpu-node-0", kube=kube)
    assert not chaos.is_ready(kube.get("node", "gpu-node-0") or {})
    stopped = time.time()
    wait_for(lambda: _beating(beats, "w0", stopped), 10, "w0's heartbeat while its kubelet is stopped")
    chaos.node_ready("gpu-node-0", kube=kube)
    w0_again = wait_for(lambda: _running(cluster, "w0"), 60, "worker w0 Ready again")
    assert w0_again["status"]["containerStatuses"][0]["restartCount"] == 0

    # 7. delete-node: kubelet, containerd and the container die at once and the Node goes; add-node joins.
    assert tier.node_names() == ["gpu-node-0", "gpu-node-1"]
    processes = node_pids(tier.layout("gpu-node-0"))  # kubelet, containerd, shim, pause, the worker's shell
    assert len(processes) >= 5
    chaos.delete_node("gpu-node-0", kube=kube)
    assert kube.get("node", "gpu-node-0") is None and tier.node_names() == ["gpu-node-1"]
    assert not [pid for pid in processes if _alive(pid)], "a process of the deleted node still runs"
    assert chaos.add_node("gpu-node-2", kind="gpu", kube=kube) == "gpu-node-2"
    added = kube.get("node", "gpu-node-2")
    assert added is not None and chaos.is_ready(added)
    assert "gpu-node-2" in tier.node_names()
