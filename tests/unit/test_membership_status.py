"""Who trains (issue 38): status.members beside READY, and a ready worker left outside the generation."""

from __future__ import annotations

from typing import Any

from llm_operator.observe import format_time
from llm_operator.policy.membership import (
    OUTSIDE_BOUND_SECONDS,
    LiveGeneration,
    left_out,
    member_pods,
    members_from_world_size,
    track_outside,
)
from llm_operator.policy.progress import Progress, Sample
from llm_operator.reconcile import plan
from llm_operator.steps.membership import report_members
from llm_operator.steps.state import PassState

from .jobs import job
from .views import NOW, node, pod

NODES = {f"node-{i}": node(f"node-{i}") for i in range(4)}
IN_PROCESS = {"failurePolicy": {"recovery": "inProcess"}, "maxReplicas": 3}


def state(
    live: LiveGeneration | None, sample: Sample | None = None, members_false: bool = False, **spec: Any
) -> PassState:
    pods = [pod(i) for i in range(3)]
    status: dict[str, Any] = {
        "phase": "Running",
        "targetReplicas": 3,
        "desiredReplicas": 3,
        "startTime": format_time(NOW - 500),
    }
    if members_false:
        status["conditions"] = [
            {"type": "Members", "status": "False", "reason": "NotAMember", "message": "before"}
        ]
    s = PassState.start(job(status=status, **{**IN_PROCESS, **spec}), pods, NODES, pods, NOW)
    s.progress = Progress(10, NOW, sample, NOW, 30.0, live)
    return s


def test_member_ids_become_pods_and_world_sizes_become_workers() -> None:
    assert member_pods(["llama-worker-0.17", "llama-worker-0.18", "llama-worker-1.5"]) == {
        "llama-worker-0",
        "llama-worker-1",
    }
    assert members_from_world_size(16, 8) == 2 and members_from_world_size(3, 0) == 3


def test_outside_since_is_kept_while_out_and_dropped_once_in() -> None:
    first = track_outside({}, ["w0", "w1", "w2"], frozenset({"w0", "w1"}), 100.0)
    assert first == {"w2": 100.0}
    assert track_outside(first, ["w0", "w1", "w2"], frozenset({"w0", "w1"}), 150.0) == {"w2": 100.0}
    assert track_outside(first, ["w0", "w1", "w2"], frozenset({"w0", "w1", "w2"}), 160.0) == {}


def test_left_out_only_past_the_bound_and_only_beside_a_short_generation() -> None:
    live = LiveGeneration(frozenset({"w0", "w1"}), {"w2": 0.0})
    assert left_out(live, 3, OUTSIDE_BOUND_SECONDS - 1) == []
    assert left_out(live, 3, OUTSIDE_BOUND_SECONDS + 1) == [("w2", OUTSIDE_BOUND_SECONDS + 1)]
    assert left_out(live, 2, OUTSIDE_BOUND_SECONDS + 1) == [], "beside a full generation it is a spare"


def test_a_worker_left_out_past_the_bound_gets_one_event_and_a_false_condition() -> None:
    workers = [pod(i).name for i in range(3)]
    live = LiveGeneration(frozenset(workers[:2]), {workers[2]: NOW - OUTSIDE_BOUND_SECONDS - 5})
    s = state(live)
    report_members(s)
    assert s.members == 2
    (cond,) = s.extra_conditions
    assert cond["type"] == "Members" and cond["status"] == "False" and cond["reason"] == "NotAMember"
    assert workers[2] in cond["message"] and "2 of 3" in cond["message"]
    assert [e[:2] for e in s.out.events] == [("Warning", "NotAMember")] and len(s.out.events[0]) == 3

    again = state(live, members_false=True)  # the next pass of the same stretch
    report_members(again)
    assert again.out.events == [] and again.extra_conditions[0]["status"] == "False"


def test_a_short_stretch_outside_asks_for_a_pass_when_it_would_be_due() -> None:
    workers = [pod(i).name for i in range(3)]
    live = LiveGeneration(frozenset(workers[:2]), {workers[2]: NOW - 10})
    s = state(live)
    report_members(s)
    assert s.out.events == [] and s.extra_conditions[0]["status"] == "True"
    assert s.out.requeue_at == NOW - 10 + OUTSIDE_BOUND_SECONDS


def test_the_whole_pass_writes_members_beside_ready() -> None:
    workers = [pod(i).name for i in range(3)]
    pods = [pod(i) for i in range(3)]
    status = {
        "phase": "Running",
        "targetReplicas": 3,
        "desiredReplicas": 3,
        "startTime": format_time(NOW - 500),
    }
    j = job(status=status, **IN_PROCESS)
    progress = Progress(10, NOW, None, NOW, 30.0, LiveGeneration(frozenset(workers[:2]), {}))
    decided = plan(j, pods, NODES, pods, NOW, progress)
    assert decided.status["readyReplicas"] == 3 and decided.status["members"] == 2


def test_restart_mode_reads_the_world_size_from_the_metrics() -> None:
    s = state(None, Sample(5, NOW, world_size=16), failurePolicy={"recovery": "restart"}, gpusPerNode=8)
    report_members(s)
    assert s.members == 2 and s.extra_conditions == []
