"""Capacity asked for (issue 39): a shrunk job keeps its missing workers Pending for an autoscaler, grows by
each one that gets a node, and says when no NodePool can ever place one."""

from __future__ import annotations

from typing import Any

from llm_operator.observe import format_time
from llm_operator.policy.progress import Progress
from llm_operator.policy.unschedulable import SchedulingEvent, never_fits, newest_per_pod
from llm_operator.reconcile import Plan, plan

from .jobs import job
from .views import NOW, node, pod

TIMEOUT = 300
LIMITS = 'Failed to schedule pod, all available instance types exceed limits for nodepool "gpu"'
INCOMPATIBLE = (
    'Failed to schedule pod, incompatible with nodepool "gpu", incompatible requirements, key '
    "node.kubernetes.io/instance-type, node.kubernetes.io/instance-type In [p4d.24xlarge] not in "
    "node.kubernetes.io/instance-type In [p5.48xlarge]"
)


def run(pods: list[Any], status: dict[str, Any], progress: Progress | None = None) -> Plan:
    base = {"phase": "Running", "desiredReplicas": 4, "startTime": format_time(NOW - 1000), **status}
    spec = {"failurePolicy": {"pendingTimeoutSeconds": TIMEOUT}}
    nodes = {p.node: node(p.node) for p in pods if p.node}  # every node full: no room but what Karpenter adds
    return plan(job(status=base, **spec), pods, nodes, pods, NOW, progress)


def waiting(index: int) -> Any:
    return pod(index, phase="Pending", ready=False, node="", unschedulable=True, created=NOW - TIMEOUT - 1)


def test_a_shrink_keeps_the_missing_workers_pending_and_says_the_job_waits_for_capacity() -> None:
    pods = [pod(0), pod(1), waiting(2), waiting(3)]
    first = run(pods, {"targetReplicas": 4})
    assert first.status["targetReplicas"] == 2 and first.delete == [] and first.create == []
    assert first.status["waitingForCapacity"] == 2 and first.status["phase"] == "Running"
    cond = next(c for c in first.status["conditions"] if c["type"] == "WaitingForCapacity")
    assert cond["status"] == "True" and "2 worker(s) Pending" in cond["message"]
    assert "WaitingForCapacity" in [e[1] for e in first.events]

    again = run(pods, {"targetReplicas": 2, "conditions": first.status["conditions"]})
    assert again.status["targetReplicas"] == 2 and again.delete == [], "the waiting workers are not stuck"
    assert "WaitingForCapacity" not in [e[1] for e in again.events], "one Event per stretch"


def test_a_waiting_worker_that_gets_a_node_joins_at_once_cooldown_or_not() -> None:
    pods = [pod(0), pod(1), pod(2), waiting(3)]
    grown = run(pods, {"targetReplicas": 2, "lastResizeTime": format_time(NOW - 1)})
    assert grown.status["targetReplicas"] == 3 and grown.resize == (2, 3, "Grown")
    assert grown.status["waitingForCapacity"] == 1 and grown.delete == []


def test_a_user_scale_down_still_deletes_the_workers_no_longer_wanted() -> None:
    pods = [pod(0), pod(1), waiting(2), waiting(3)]
    decided = plan(
        job(status={"phase": "Running", "targetReplicas": 2, "desiredReplicas": 4}, replicas=2),
        pods,
        {p.node: node(p.node) for p in pods if p.node},
        pods,
        NOW,
    )
    assert sorted(d.pod.name for d in decided.delete) == ["llama-worker-2", "llama-worker-3"]
    assert decided.status["waitingForCapacity"] == 0


def test_karpenter_limits_mean_waiting_anything_else_from_karpenter_means_never() -> None:
    assert not never_fits(SchedulingEvent("p", "karpenter", LIMITS, 1.0))
    assert never_fits(SchedulingEvent("p", "karpenter", INCOMPATIBLE, 1.0))
    assert not never_fits(SchedulingEvent("p", "default-scheduler", "0/4 nodes are available", 1.0))
    newest = newest_per_pod(
        [SchedulingEvent("a", "karpenter", "old", 1.0), SchedulingEvent("a", "karpenter", "new", 2.0),
         SchedulingEvent("other", "karpenter", "x", 3.0)],
        ["a"],
    )  # fmt: skip
    assert list(newest) == ["a"] and newest["a"].message == "new"


def test_no_nodepool_fits_is_a_condition_and_one_event_quoting_karpenter() -> None:
    pods = [pod(0), pod(1), waiting(2), waiting(3)]
    events = (SchedulingEvent("llama-worker-2", "karpenter", INCOMPATIBLE, NOW),)
    decided = run(pods, {"targetReplicas": 2}, Progress(None, None, scheduling=events))
    cond = next(c for c in decided.status["conditions"] if c["type"] == "Unschedulable")
    assert (
        cond["status"] == "True" and cond["reason"] == "NoNodePoolFits" and "p4d.24xlarge" in cond["message"]
    )
    assert [e[1] for e in decided.events].count("NoNodePoolFits") == 1

    limited = (SchedulingEvent("llama-worker-2", "karpenter", LIMITS, NOW),)
    decided = run(pods, {"targetReplicas": 2, "conditions": decided.status["conditions"]},
                  Progress(None, None, scheduling=limited))  # fmt: skip
    cond = next(c for c in decided.status["conditions"] if c["type"] == "Unschedulable")
    assert cond["status"] == "False", "a NodePool at its limit is capacity to wait for"
