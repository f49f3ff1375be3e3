"""Healthy nodes only, and spares that take over at once (issue 19), end to end with real training.

* A warm spare (``spareReplicas: 1``) registers and waits; when a training member's node is lost, the spare
  is promoted at the next step boundary: the job is at full size again without waiting for a new pod, the
  survivor keeps its process, no step is replayed.
* A node whose volumes are read-only fails the pre-flight check: its worker never becomes a member
  (exit 78, the reason in its termination message), the operator records the node and the job's pods avoid
  it from then on.
"""

from __future__ import annotations

import time

import pytest
from llm_testbed import training
from llm_testbed.localcluster import chaos
from support.live_events import events
from support.wait import wait_for

from .e2e_support import JOB, Training
from .kube_helpers import wait_events

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.timeout(600)]


def _pod_of(member: str) -> str:
    return member.rsplit(".", 1)[0]


def test_a_spare_takes_over_a_lost_node_at_once(train: Training) -> None:
    chaos.add_node(kind="gpu", kube=train.cluster.kube)  # three fake p5: two train, one waits
    train.apply(training.spare_job(JOB, train.ns, replicas=2, spares=1))
    first = train.wait_steps("5 steps at world size 2", world=2, count=5)
    training_pods = sorted({_pod_of(m) for m in first[-1]["members"]})
    spare = next(p["metadata"]["name"] for p in train.workers() if p["metadata"]["name"] not in training_pods)
    wait_for(
        lambda: any(
            e.get("event") == "standby"
            for e in events(train.cluster.pod_log(train.ns, spare).read_text(errors="replace"))
        ),
        240,
        f"{spare} waiting as a spare",
    )
    survivor, victim = training_pods
    node = next(p["spec"]["nodeName"] for p in train.workers() if p["metadata"]["name"] == victim)
    lost_at = time.time()
    chaos.node_not_ready(node, kube=train.cluster.kube, wait=False)
    gone = [m for m in first[-1]["members"] if _pod_of(m) == victim]
    full = train.wait_steps("full size again with the spare", world=2, count=3, after=lost_at, without=gone)
    promoted = sorted({_pod_of(m) for m in full[-1]["members"]})
    assert promoted == sorted([survivor, spare]), promoted
    survivor_pids = set(first[-1]["pids"]) & set(full[-1]["pids"])
    assert len(survivor_pids) == 1, "the survivor kept its process"
    result = train.audit()
    assert all(i.replayed == 0 for i in result.interruptions), result.interruptions
    status = train.status()
    assert status.get("spareReplicas") == 1, status
    print(f"spare: node lost -> full size {full[0]['time'] - lost_at:.2f}s; {result.summary()}")


def test_a_node_that_fails_preflight_is_recorded_and_never_used(train: Training) -> None:
    kube = train.cluster.kube
    gpu_nodes = sorted(
        n["metadata"]["name"] for n in kube.items("nodes") if n["metadata"]["name"].startswith("gpu")
    )
    # The job's two workers must land on the bad node and one healthy one: any other GPU node is cordoned
    # until the bad one is recorded, then a fresh node makes room for the replacement.
    bad = gpu_nodes[0]
    for other in gpu_nodes[2:]:
        train.cluster.kubectl("cordon", other)
    chaos.node_fault(bad, "readonly-volumes", kube=kube)
    train.apply(
        training.training_job(JOB, train.ns, minimum=1, maximum=2, steps=100000, recovery="inProcess")
    )

    def recorded() -> list[dict[str, object]] | None:
        nodes = train.status().get("unhealthyNodes") or []
        return [n for n in nodes if n.get("node") == bad] or None

    (entry,) = wait_for(recorded, 240, f"{bad} recorded unhealthy", interval=0.5)
    assert entry["check"] == "checkpoint-write" and "not writable" in str(entry["reason"]), entry
    chaos.add_node(kind="gpu", kube=kube)
    train.wait_steps("2 workers training on healthy nodes", world=2, count=3)
    placed = {p["spec"].get("nodeName") for p in train.workers() if p["status"].get("phase") == "Running"}
    assert bad not in placed, placed
    members = {m for r in train.records() for m in (r.get("members") or [])}
    on_bad = {p["metadata"]["name"] for p in train.workers() if p["spec"].get("nodeName") == bad}
    assert not {_pod_of(m) for m in members} & on_bad, "a worker on the bad node never became a member"
    wait_events(train.cluster, train.ns, "NodeUnhealthy")


def test_a_throttled_node_is_found_a_straggler_and_replaced(train: Training) -> None:
    kube = train.cluster.kube
    chaos.add_node(kind="gpu", kube=kube)  # room for the replacement
    job = training.training_job(JOB, train.ns, minimum=1, maximum=2, steps=100000, recovery="inProcess")
    job["spec"]["healthCheck"] = {"stragglerWindowSteps": 10, "stragglerFactor": 1.5}
    train.apply(job)
    first = train.wait_steps("5 steps at world size 2", world=2, count=5)
    slow_member = [m for m in first[-1]["members"] if _pod_of(m) == f"{JOB}-worker-1"]
    slow = next(p["spec"]["nodeName"] for p in train.workers() if p["metadata"]["name"] == f"{JOB}-worker-1")
    chaos.node_fault(slow, "cpu", "0.05", kube=kube)  # a real CPU quota on the node's running containers

    def recorded() -> list[dict[str, object]] | None:
        nodes = train.status().get("unhealthyNodes") or []
        return [n for n in nodes if n.get("node") == slow] or None

    (entry,) = wait_for(recorded, 300, f"{slow} found a straggler", interval=0.5)
    assert entry["check"] == "straggler", entry
    conditions = {c["type"]: c for c in train.status().get("conditions") or []}
    assert "Straggler" in conditions, conditions
    back_at = time.time()
    train.wait_steps(
        "full size again without the slow node", world=2, count=3, after=back_at, without=slow_member
    )
    placed = {p["spec"].get("nodeName") for p in train.workers() if p["status"].get("phase") == "Running"}
    assert slow not in placed, placed
