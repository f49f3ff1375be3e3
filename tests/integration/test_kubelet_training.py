"""The smoke job under real kubelets (issue 54): two GPU kubelet nodes and one CPU node (the rendezvous
etcd's), the operator as `llmjob operator`, the trainer image `make images` built pulled by each node's
kubelet from the tier's registry. Three tests on the module's cluster prove what the pod runner alone proved
before (the smoke job at world size 2 is the module's, so the nodes' first pulls are paid once):

1. The in-process smoke job at min 1 / max 2 trains at world size 2; `kubectl logs` and `kubectl exec` work
   on a worker, and inside it the other worker's headless name resolves, the rendezvous endpoint answers by
   name, ``/dev/shm`` has the size the builder sets and the downward API env is the pod's own.
2. A worker's node is deleted mid-training (kubelet, containerd and containers killed at once): the
   survivor goes on at 1 in the same container and process, 0 steps replayed; a node is added under the
   same name, the replacement lands there and the job is back at 2 (loss -> next step, loss -> full size).
3. A second job (min 1 / max 1): its node is drained; the kubelet stops the worker (SIGTERM), which saves
   a checkpoint within its grace period; the replacement on another node resumes from that step, and its
   `failJob` rule (on the resume line) ends it: the kubelet's termination message carries `rule-fired`, and
   the job fails with the rule's name.

Disk: each node unpacks its own copy of the trainer image (5.6 GiB); the fixture fails at once naming the
free space needed when the disk cannot hold two (docs/development.md, "Real nodes: the kubelet tier"). Two
GPU nodes, not three: a third copy took the need to 22.6 GiB, more than a CI machine had free (decision KL9);
a group of survivors (2 of 3, 3 of 4) is the trainer tier's to prove (tests/trainer/test_live_recovery.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llm_elastic.checkpoint import complete_checkpoints
from llm_elastic.metrics import read_records
from llm_testbed import training
from llm_testbed.kubeletnodes import workload
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from support.images import make_images
from support.kube import get_pod
from support.wait import wait_for

from .conftest import _training
from .e2e_support import JOB, Training
from .kube_helpers import wait_events

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.images,
    pytest.mark.tools("distribution", "containerd", "kubenode", "coredns"),
    pytest.mark.timeout(1800),
]

NAMESPACE = "kubelet-training"
GPU_NODES, CPU_NODES = 2, 1
PULL_TIMEOUT = 600.0  # nodes pulling the 5.6 GiB image at once, on two loaded cores
DRAINED = "drained"
DRAINED_DIR = "checkpoints/drained"
GRACE = 60
RULE = "stop-after-resume"
PROBE = """
import json, os, socket, sys, urllib.request
etcd = os.environ["LLMJOB_LIVE_ETCD"]
with urllib.request.urlopen(f"http://{etcd}/health", timeout=10) as answer:
    health = json.load(answer)
shm = os.statvfs("/dev/shm")
print(json.dumps({
    "peer": socket.gethostbyname(sys.argv[1]), "etcd": etcd, "health": health.get("health"),
    "shm": shm.f_blocks * shm.f_frsize, "fqdn": socket.getfqdn(), "pod": os.environ["LLMJOB_POD_NAME"],
    "node": os.environ["LLMJOB_NODE_NAME"], "ip": os.environ["LLMJOB_POD_IP"],
}))
"""


@pytest.fixture(scope="module")
def kubelet_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    logs = tmp_path_factory.mktemp("kubelet-training-logs")
    with workload.run_cluster(f"pytest-kubelet-{os.getpid()}", GPU_NODES, CPU_NODES, logs) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def trainer(kubelet_cluster: LocalCluster) -> str:
    """The trainer image of `make images`, in the tier's registry (the disk checked for both GPU nodes)."""
    refs, _ = make_images()
    try:
        return workload.publish_trainer(kubelet_cluster.kubelet_tier, refs["trainer"], GPU_NODES)
    except workload.NoRoomError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def gid(trainer: str) -> int:
    """The trainer image's group (its USER's): the shared volume is given to it, the jobs run as it."""
    return workload.image_group(trainer)


@pytest.fixture(scope="module")
def kubelet_train(
    kubelet_cluster: LocalCluster, gid: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Training]:
    """The module's namespace, its operator and its shared volume (given to the image's group: a kubelet
    gives a hostPath volume no fsGroup)."""
    kubelet_cluster.kubectl("create", "namespace", NAMESPACE)
    kubelet_cluster.wait_default_service_account(NAMESPACE)
    for t in _training(kubelet_cluster, NAMESPACE, tmp_path_factory.mktemp("kubelet-train"),
                       {"KUBECONFIG": str(kubelet_cluster.kubeconfig)}):  # fmt: skip
        training.share_with_group(t.volume, gid)
        yield t


class Smoke:
    """The module's smoke job (in process, min 1 / max 2), applied once; the first test to ask waits for it
    at world size 2, so the nodes' pulls are in that test's time, not in a set-up."""

    def __init__(self, t: Training, applied: float) -> None:
        self.t, self.applied = t, applied
        self._to_world_2: float | None = None

    def to_world_2(self) -> float:
        """Seconds from the apply to the first step at world size 2 (waited for once: 3 steps there)."""
        if self._to_world_2 is None:
            at_2 = self.t.wait_steps("3 steps at world size 2 (each node pulls the image first)", world=2,
                                     count=3, timeout=PULL_TIMEOUT)  # fmt: skip
            self._to_world_2 = float(at_2[0]["time"]) - self.applied
        return self._to_world_2


@pytest.fixture(scope="module")
def smoke(kubelet_train: Training, trainer: str, gid: int) -> Smoke:
    job = training.training_job(JOB, NAMESPACE, minimum=1, maximum=2, steps=100000, recovery="inProcess")
    applied = time.time()
    kubelet_train.apply(training.in_image(job, trainer, gid))
    return Smoke(kubelet_train, applied)


def _pulled(cluster: LocalCluster, pod: str) -> str:
    """The kubelet's ``Pulled`` message for ``pod`` ("" before it pulled)."""
    events = cluster.kube.items("events", fields=f"involvedObject.name={pod}", namespace=NAMESPACE)
    return next((e["message"] for e in events if e.get("reason") == "Pulled"), "")


def _container_id(pod: dict[str, Any]) -> str:
    return str(pod["status"]["containerStatuses"][0]["containerID"])


def test_the_smoke_job_trains_at_2_from_the_registry_and_a_worker_answers_inside(
    smoke: Smoke, trainer: str
) -> None:
    """1. World size 2 from the registry's image; logs, exec; DNS, the rendezvous, /dev/shm, downward API."""
    to_world_2 = smoke.to_world_2()
    t = smoke.t
    c = t.cluster
    workers = {w["metadata"]["name"]: w for w in t.workers()}
    assert sorted(w["spec"]["nodeName"] for w in workers.values()) == ["gpu-node-0", "gpu-node-1"]
    for name, pod in workers.items():
        assert trainer in _pulled(c, name), f"{name}: no Pulled event of {trainer} from its kubelet"
        assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    first = f"{JOB}-worker-0"
    logged = wait_for(
        lambda: re.search(r"step \d+ loss \S+ world 2", c.kubectl("logs", first, "-n", NAMESPACE).stdout),
        60, f"kubectl logs {first}: a step line at world size 2",
    )  # fmt: skip
    assert logged
    w0, w1 = workers[first], workers[f"{JOB}-worker-1"]
    peer = f"{w0['spec']['hostname']}.{w0['spec']['subdomain']}.{NAMESPACE}.svc.cluster.local"
    probe = c.kubectl("exec", w1["metadata"]["name"], "-n", NAMESPACE, "--", "python", "-c", PROBE, peer)
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["peer"] == w0["status"]["podIP"], seen
    assert seen["etcd"].split(".")[1] == NAMESPACE and seen["health"] == "true", seen
    assert seen["shm"] == 2**30, f"/dev/shm is {seen['shm']} bytes, the job's sharedMemory is 1Gi"
    assert (seen["pod"], seen["node"], seen["ip"]) == (
        w1["metadata"]["name"], w1["spec"]["nodeName"], w1["status"]["podIP"],
    )  # fmt: skip
    assert seen["fqdn"].startswith(f"{w1['spec']['hostname']}.{w1['spec']['subdomain']}.{NAMESPACE}.svc")
    print(f"kubelet training: apply -> world size 2 {to_world_2:.1f}s (both nodes' pulls included)")


def test_a_lost_node_leaves_the_survivor_training_and_an_added_node_brings_it_back(smoke: Smoke) -> None:
    """2. A node lost mid-training, a node added: 1 in the same process, then 2 again."""
    smoke.to_world_2()
    t = smoke.t
    kube = t.cluster.kube
    before = t.records()[-1]
    victim = t.worker_on(1)
    node, gone = victim["spec"]["nodeName"], victim["metadata"]["name"]
    survivors = {
        w["metadata"]["name"]: _container_id(w) for w in t.workers() if w["metadata"]["name"] != gone
    }
    lost_members = [m for m in before["members"] if m.startswith(f"{gone}.")]
    lost_at = time.time()
    chaos.delete_node(node, kube=kube)
    at_1 = t.wait_steps("the survivor to go on at world size 1", world=1, count=3, after=lost_at,
                        without=lost_members)  # fmt: skip
    assert set(at_1[-1]["pids"]) <= set(before["pids"]), "the survivor is the same process"
    for pod in t.workers():
        name = pod["metadata"]["name"]
        if name in survivors:
            assert _container_id(pod) == survivors[name], f"{name}: a new container"
            assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    added_at = time.time()
    assert chaos.add_node(node, kind="gpu", kube=kube) == node
    at_2 = t.wait_steps("the replacement on the added node: world size 2", world=2, count=3, after=added_at,
                        timeout=PULL_TIMEOUT)  # fmt: skip
    replacement = t.worker_on(1)
    assert (
        replacement["spec"]["nodeName"] == node
        and replacement["metadata"]["uid"] != victim["metadata"]["uid"]
    )
    result = t.audit()
    sizes = [(i.world_before, i.world_after) for i in result.interruptions]
    assert (2, 1) in sizes and (1, 2) in sizes, sizes
    assert all(i.replayed == 0 for i in result.interruptions), result.interruptions
    assert {r.get("restart") for r in t.records()} == {0}, "no fallback to a checkpoint"
    print(f"kubelet: {result.summary()}")
    print(f"kubelet training: loss -> next step {float(at_1[0]['time']) - lost_at:.1f}s, loss -> full size "
          f"{float(at_2[0]['time']) - lost_at:.1f}s (the added node's pull included); "
          f"{workload.free_bytes() / workload.GIB:.1f} GiB free at {GPU_NODES} GPU nodes")  # fmt: skip


def _drained_job(trainer: str, gid: int) -> dict[str, Any]:
    """Min 1 / max 1; no periodic checkpoint (the one of its drain is the only one); a failJob rule on the
    line a worker logs when it resumes from a checkpoint."""
    job = training.training_job(DRAINED, NAMESPACE, minimum=1, maximum=1, steps=100000,
                                checkpoint_every=100000, recovery="inProcess")  # fmt: skip
    spec = job["spec"]
    spec["checkpointDir"] = f"/shared/{DRAINED_DIR}"
    spec["terminationGracePeriodSeconds"] = GRACE
    rule = {"name": RULE, "logPattern": r"resumed from checkpoint step-(\d+)", "metricThreshold": 0,
            "operator": "gt", "action": "failJob"}  # fmt: skip
    spec["monitoring"] = {"rules": [rule]}
    return training.in_image(job, trainer, gid)


def test_a_drained_workers_checkpoint_is_resumed_elsewhere_and_its_rule_fails_the_job(
    kubelet_train: Training, trainer: str, gid: int, tmp_path: Path
) -> None:
    """3. A drained node's worker saves on SIGTERM; its replacement resumes there and a rule fails it."""
    t, log_dir = kubelet_train, tmp_path
    c = t.cluster
    c.kubectl("delete", "llmtrainingjob", JOB, "-n", NAMESPACE, "--ignore-not-found", "--wait=true",
              "--timeout=120s", timeout=150)  # fmt: skip
    wait_for(lambda: not t.workers(), 120, "the smoke job's workers gone (their nodes free)")
    t.apply(_drained_job(trainer, gid))
    metrics = t.volume / DRAINED_DIR / "metrics.jsonl"
    wait_for(lambda: metrics.is_file() and len(read_records(metrics)) >= 3, 300, f"3 steps of {DRAINED}")
    pod_name = f"{DRAINED}-worker-0"
    node = (get_pod(c, NAMESPACE, pod_name) or {})["spec"]["nodeName"]
    followed = log_dir / f"{pod_name}.log"
    with followed.open("wb") as out:  # the pod's log goes with the pod: follow it through the drain
        follow = subprocess.Popen(c.kube.argv("logs", "-f", pod_name, "-n", NAMESPACE), stdout=out,
                                  stderr=subprocess.STDOUT)  # fmt: skip
        drained_at = time.time()
        c.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                  "--timeout=180s", timeout=200)  # fmt: skip
        follow.wait(timeout=30)  # ends with the container
    text = followed.read_text(errors="replace")
    saved = complete_checkpoints(t.volume / DRAINED_DIR)
    last = read_records(metrics)[-1]["step"]
    listing = sorted(str(p.relative_to(t.volume)) for p in (t.volume / DRAINED_DIR).rglob("*"))
    why = f"checkpoints {listing}\n--- {pod_name} ---\n{text[-4000:]}"
    assert [s.step for s in saved] == [last], f"one checkpoint, of the last step {last}: {why}"
    assert f"every member stopped at step {last} (saved)" in text, why
    step, saved_after = saved[0].step, float(saved[0].meta["saved_at"]) - drained_at
    wait_events(c, NAMESPACE, "Killing", lambda e: e["involvedObject"]["name"] == pod_name)  # by the kubelet

    def failed() -> dict[str, Any]:  # empty (falsy) until the job failed
        job = c.kube.get("llmtrainingjob", DRAINED, NAMESPACE) or {}
        status: dict[str, Any] = job.get("status") or {}
        return status if status.get("phase") == "Failed" else {}

    status = wait_for(failed, 300, f"{DRAINED} failed by its rule {RULE}", interval=0.5)
    fired = status["lastRuleFired"]
    assert status["reason"] == "RuleFired" and (fired["rule"], fired["action"]) == (RULE, "failJob"), status
    assert f"({step})" in fired["detail"], f"the rule fired on a resume from step {step}: {fired}"
    replacement = get_pod(c, NAMESPACE, pod_name)
    if replacement is not None:  # the operator may have removed it already: the status came from its message
        assert replacement["spec"]["nodeName"] != node
        ended = replacement["status"]["containerStatuses"][0]["state"]["terminated"]
        assert ended["exitCode"] == 79 and ended["message"].startswith(f"rule-fired: {RULE} failJob"), ended
    c.kubectl("uncordon", node)
    print(f"kubelet training: drain -> checkpoint {saved_after:.1f}s")
