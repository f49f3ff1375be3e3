"""One reconcile pass, end to end on pure data: what gets created, deleted and written."""

from __future__ import annotations

from typing import Any

from llm_operator.control.expectations import Expectations
from llm_operator.observe import format_time
from llm_operator.reconcile import plan

from .jobs import job
from .views import NOW, node, pod


def running_status(**kw: Any) -> dict[str, Any]:
    base = {
        "phase": "Running",
        "targetReplicas": 4,
        "desiredReplicas": 4,
        "startTime": format_time(NOW - 500),
    }
    base.update(kw)
    return base


NODES = {f"node-{i}": node(f"node-{i}") for i in range(4)}


def test_first_pass_creates_all_workers_pending() -> None:
    p = plan(job(), [], NODES, [], NOW)
    assert p.create == [0, 1, 2, 3] and p.delete == []
    assert p.status["phase"] == "Pending" and p.status["targetReplicas"] == 4
    assert p.status["selector"] == "elasticllm.dev/job-name=llama,elasticllm.dev/role=worker"


def test_a_first_start_posts_no_event_and_a_start_after_a_loss_does() -> None:
    """The status records a first start (startTime); a start that lost a worker on the way is told."""
    first = plan(job(), [], NODES, [], NOW)
    assert first.starting and first.events == []
    pods = [pod(i) for i in range(4)]
    pending = {"phase": "Pending", "targetReplicas": 4, "desiredReplicas": 4, "replicas": 4}
    started = plan(job(status=pending), pods, NODES, pods, NOW)
    assert started.status["phase"] == "Running" and started.status["startTime"] == format_time(NOW)
    assert started.starting and started.events == []
    again = plan(job(status={**pending, "restarts": 1}), pods, NODES, pods, NOW)
    assert not again.starting and [e[1] for e in again.events] == ["PhaseRunning"]
    later = plan(job(status=running_status(phase="Restarting", restarts=0)), pods, NODES, pods, NOW)
    assert not later.starting and [e[1] for e in later.events] == ["PhaseRunning"]


def test_all_ready_is_running_and_nothing_to_do() -> None:
    pods = [pod(i) for i in range(4)]
    p = plan(job(status=running_status()), pods, NODES, pods, NOW)
    assert p.create == [] and p.delete == [] and p.status["phase"] == "Running"
    assert p.status["readyReplicas"] == 4 and p.status["restarts"] == 0
    ready = next(c for c in p.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"


def test_node_not_ready_replaces_with_restart_bump() -> None:
    pods = [pod(i) for i in range(4)]
    nodes = dict(NODES, **{"node-1": node("node-1", ready=False, not_ready_since=NOW - 1)})
    p = plan(
        job(failurePolicy={"nodeFailureGraceSeconds": 0}, status=running_status()), pods, nodes, pods, NOW
    )
    assert [(d.pod.name, d.force, d.reason) for d in p.delete] == [("llama-worker-1", True, "NodeNotReady")]
    assert p.create == [], "index 1 is still held by the pod being deleted: never more than maxReplicas"
    assert p.status["restarts"] == 1 and p.status["phase"] == "Restarting"
    assert p.lost == [("NodeNotReady", NOW - 1)]


def test_replacement_created_when_index_frees_up() -> None:
    pods = [pod(i) for i in (0, 2, 3)]
    p = plan(job(status=running_status(phase="Restarting", restarts=1)), pods, NODES, pods, NOW)
    assert p.create == [1] and p.attempt == 1
    assert p.status["phase"] == "Restarting" and p.status["restarts"] == 1


def test_grace_period_waits_and_requeues() -> None:
    pods = [pod(i) for i in range(4)]
    nodes = dict(NODES, **{"node-1": node("node-1", ready=False, not_ready_since=NOW - 10)})
    p = plan(job(status=running_status()), pods, nodes, pods, NOW)
    assert p.delete == [] and p.requeue_at == NOW + 20


def test_stuck_pending_shrinks_to_min_stays_running_and_keeps_asking_for_capacity() -> None:
    pods = [
        pod(0),
        pod(1),
        pod(2, node="", phase="Pending", ready=False, created=NOW - 301),
        pod(3, node="", phase="Pending", ready=False, created=NOW - 301),
    ]
    p = plan(
        job(status=running_status(restarts=1)),
        pods,
        {"node-0": node("node-0"), "node-1": node("node-1")},
        pods,
        NOW,
    )
    assert p.status["targetReplicas"] == 2
    assert p.delete == [], "the stuck workers stay Pending for an autoscaler"
    assert p.status["waitingForCapacity"] == 2
    assert p.resize == (4, 2, "Shrunk") and p.status["restarts"] == 2
    assert p.status["phase"] == "Running"
    degraded = next(c for c in p.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InsufficientCapacity"


def test_grow_back_when_nodes_return() -> None:
    pods = [pod(0), pod(1)]
    status = running_status(targetReplicas=2, lastResizeTime=format_time(NOW - 100))
    p = plan(job(status=status), pods, NODES, pods, NOW)
    assert p.status["targetReplicas"] == 4 and p.create == [2, 3] and p.resize == (2, 4, "Grown")


def test_non_retryable_exit_fails_job_and_deletes_rest() -> None:
    pods = [pod(0, phase="Failed", exit_code=42, ready=False), pod(1), pod(2), pod(3)]
    p = plan(
        job(failurePolicy={"nonRetryableExitCodes": [42]}, status=running_status()), pods, NODES, pods, NOW
    )
    assert p.status["phase"] == "Failed" and p.status["reason"] == "NonRetryableExitCode"
    assert sorted(d.pod.index for d in p.delete) == [1, 2, 3] and p.create == []
    assert p.status["completionTime"] is not None


def test_max_restarts_exhausted_fails() -> None:
    pods = [pod(0, phase="Failed", exit_code=1, ready=False), pod(1), pod(2), pod(3)]
    p = plan(job(failurePolicy={"maxRestarts": 3}, status=running_status(restarts=3)), pods, NODES, pods, NOW)
    assert p.status["phase"] == "Failed" and p.status["reason"] == "MaxRestartsExceeded"


def test_below_min_times_out() -> None:
    pods = [pod(0)]
    status = running_status(targetReplicas=2, belowMinSince=format_time(NOW - 1801))
    p = plan(job(status=status), pods, {"node-0": node("node-0")}, pods, NOW)
    assert p.status["phase"] == "Failed" and p.status["reason"] == "BelowMinReplicas"


def test_below_min_records_since_and_requeues() -> None:
    pods = [pod(0)]
    p = plan(job(status=running_status(targetReplicas=2)), pods, {"node-0": node("node-0")}, pods, NOW)
    assert p.status["belowMinSince"] == format_time(NOW)
    assert p.requeue_at is not None and p.requeue_at <= NOW + 1800


def test_success_when_workers_exit_zero() -> None:
    pods = [pod(i, phase="Succeeded", exit_code=0, ready=False) for i in range(4)]
    p = plan(job(status=running_status(), ttlSecondsAfterFinished=60), pods, NODES, pods, NOW)
    assert p.status["phase"] == "Succeeded" and p.delete == [] and p.requeue_at == NOW + 60


def test_ttl_after_finished_deletes_pods() -> None:
    pods = [pod(i, phase="Succeeded", exit_code=0, ready=False) for i in range(2)]
    status = running_status(phase="Succeeded", completionTime=format_time(NOW - 61))
    p = plan(job(status=status, ttlSecondsAfterFinished=60), pods, NODES, pods, NOW)
    assert sorted(d.reason for d in p.delete) == ["TTLExpired", "TTLExpired"]


def test_suspend_deletes_all_and_resume_recreates() -> None:
    pods = [pod(i) for i in range(4)]
    p = plan(job(suspend=True, status=running_status()), pods, NODES, pods, NOW)
    assert len(p.delete) == 4 and p.status["phase"] == "Suspended" and p.status["targetReplicas"] == 0
    resumed = plan(job(status=p.status), [], NODES, [], NOW + 1)
    assert resumed.create == [0, 1, 2, 3]


def test_user_scale_down_removes_highest_index() -> None:
    pods = [pod(i) for i in range(4)]
    p = plan(job(replicas=3, status=running_status()), pods, NODES, pods, NOW)
    assert [d.pod.index for d in p.delete] == [3] and p.status["targetReplicas"] == 3


def test_stuck_terminating_on_dead_node_is_force_deleted() -> None:
    pods = [pod(0, deleting=True), pod(1), pod(2), pod(3)]
    nodes = dict(NODES, **{"node-0": node("node-0", ready=False, not_ready_since=NOW - 600)})
    p = plan(job(status=running_status()), pods, nodes, pods, NOW)
    assert [(d.pod.name, d.force) for d in p.delete] == [("llama-worker-0", True)]


def test_never_above_max_and_no_duplicate_index() -> None:
    # A pass after a restart with stale observations plus our own expectations.
    ex = Expectations()
    ex.expect_created(pod(3, phase="Pending", ready=False, node=""), now=0.0)
    observed = ex.apply([pod(0), pod(1), pod(2)], now=1.0)
    p = plan(job(status=running_status()), observed, NODES, observed, NOW)
    assert p.create == [], "the expected pod at index 3 fills the slot"
    indices = [v.index for v in observed] + p.create
    assert len(indices) == len(set(indices)) <= 4


def test_expectations_mark_deleted_and_expire() -> None:
    ex = Expectations()
    ex.expect_deleted("u1", now=0.0)
    seen = ex.apply([pod(1)], now=1.0)
    assert seen[0].deleting
    assert ex.apply([pod(1)], now=100.0)[0].deleting, "a lagging watch: still deleting after 100 s"
    assert not ex.apply([pod(1)], now=400.0)[0].deleting


def test_a_pod_deleted_and_gone_is_left_out_and_its_index_replaced() -> None:
    """A forced deletion that left no object frees the index before the watch shows it."""
    ex = Expectations()
    ex.expect_deleted("u1", now=0.0, gone=True)
    pods = [pod(0), pod(1), pod(2), pod(3)]
    seen = ex.apply(pods, now=1.0)
    assert [v.index for v in seen] == [0, 2, 3]
    p = plan(job(status=running_status(phase="Restarting", restarts=1)), seen, NODES, seen, NOW)
    assert p.create == [1] and p.status["restarts"] == 1, "replaced, and no second restart counted"
    assert [v.index for v in ex.apply([pod(0), pod(2), pod(3)], now=2.0)] == [0, 2, 3]
    assert ex.gone == set(), "forgotten once the watch shows it"


def test_fresh_pending_replacement_is_not_stuck() -> None:
    pods = [pod(0), pod(1), pod(2), pod(3, node="", phase="Pending", ready=False, created=NOW)]
    p = plan(job(status=running_status()), pods, NODES, pods, NOW + 1)
    assert p.status["targetReplicas"] == 4 and p.resize is None and p.delete == []


def test_no_replacement_once_a_worker_succeeded() -> None:
    pods = [pod(0, phase="Succeeded", exit_code=0, ready=False), pod(1)]
    p = plan(
        job(replicas=2, status=running_status(targetReplicas=2, desiredReplicas=2)), pods, NODES, pods, NOW
    )
    assert p.create == [] and p.status["phase"] != "Succeeded"
    done = [
        pod(0, phase="Succeeded", exit_code=0, ready=False),
        pod(1, phase="Succeeded", exit_code=0, ready=False),
    ]
    assert plan(job(replicas=2, status=p.status), done, NODES, done, NOW).status["phase"] == "Succeeded"


def test_new_workers_avoid_every_bad_node() -> None:
    """Replacements must not land on a node being drained, whether or not this job has a pod there."""
    pods = [pod(i) for i in (0, 2, 3)]
    nodes = dict(
        NODES,
        **{
            "node-1": node("node-1", taints=(("karpenter.sh/disruption", "NoSchedule", NOW),)),
            "node-5": node("node-5", unschedulable=True),
            "node-6": node("node-6", ready=False, not_ready_since=NOW - 1),
        },
    )
    p = plan(job(status=running_status(phase="Restarting", restarts=1)), pods, nodes, pods, NOW)
    assert p.create == [1]
    assert p.avoid_nodes == ("node-1", "node-5", "node-6")


def test_deleted_node_of_a_lost_worker_is_avoided() -> None:
    pods = [pod(i) for i in range(4)]
    nodes = {k: v for k, v in NODES.items() if k != "node-2"}
    p = plan(job(status=running_status()), pods, nodes, pods, NOW)
    assert [d.reason for d in p.delete] == ["NodeDeleted"]
    assert p.avoid_nodes == ("node-2",)


def test_healthy_cluster_avoids_nothing() -> None:
    p = plan(job(), [], NODES, [], NOW)
    assert p.avoid_nodes == ()
