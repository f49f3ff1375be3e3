"""Carrying out a plan: the order of the pod changes, expectations, and the Events and gauges after."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from llm_operator.control import live_evict
from llm_operator.control.apply import Applied, PassClock, PlanApplier, at_size, plan_events
from llm_operator.control.expectations import Expectations
from llm_operator.control.kueue_sync import KueueSync
from llm_operator.control.live_evict import LiveEvictor
from llm_operator.control.node_marking import NodeMarker
from llm_operator.metrics import REACTION_STAGE_NAMES
from llm_operator.policy.deletion import DeletionReason
from llm_operator.reconcile import Deletion, Plan
from prometheus_client import REGISTRY

from .fake_kube import FakeKube, record_events
from .jobs import job
from .views import pod

LOG = logging.getLogger("test")
BODY: Any = {}


@pytest.mark.parametrize(
    ("status", "spares", "expected"),
    [
        ({"phase": "Running", "targetReplicas": 4, "desiredReplicas": 4}, 0, True),
        ({"phase": "Running", "targetReplicas": 3, "desiredReplicas": 4}, 0, False),  # shrunk: may grow
        ({"phase": "Scaling", "targetReplicas": 4, "desiredReplicas": 4}, 0, False),
        ({"phase": "Running", "targetReplicas": 4, "desiredReplicas": 4, "spareReplicas": 1}, 2, False),
        ({"phase": "Running", "targetReplicas": 4, "desiredReplicas": 4, "spareReplicas": 2}, 2, True),
    ],
)
def test_at_size(status: dict[str, Any], spares: int, expected: bool) -> None:
    assert at_size(status, spares) is expected


def test_the_events_of_a_plan_name_created_and_deleted_workers() -> None:
    decided = Plan(attempt=2, events=[("Normal", "PhaseRunning", "Pending -> Running")])
    decided.delete = [Deletion(pod(1), force=True, why=DeletionReason.NODE_NOT_READY)]
    assert plan_events(decided, ["llama-worker-1"]) == [
        ("Normal", "PhaseRunning", "Pending -> Running"),
        ("Normal", "CreatedWorkers", "created llama-worker-1 (attempt 2)"),
        ("Normal", "DeletedWorkers", "deleted llama-worker-1 (NodeNotReady, force)"),
    ]
    assert plan_events(Plan(), []) == []
    assert plan_events(Plan(starting=True), ["llama-worker-0"]) == [], "a first start: the status counts them"


def applier(kube: FakeKube, mark: bool = False) -> PlanApplier:
    k: Any = kube
    return PlanApplier(
        k, "ml", "llama", Expectations(), KueueSync(k, False), NodeMarker(k, mark), LiveEvictor(k, "ml")
    )


def test_members_leave_before_the_pods_go_and_the_index_lag_is_covered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = FakeKube()
    order: list[str] = []

    async def evict(address: str, prefix: str, pods: Any, **_: Any) -> int:
        order.append("evict")
        return 1

    monkeypatch.setattr(live_evict, "evict_pods", evict)
    original = kube.delete_pod

    async def delete_pod(*args: Any) -> bool:
        order.append("delete")
        return await original(*args)

    monkeypatch.setattr(kube, "delete_pod", delete_pod)
    the_job = job(rendezvous={"backend": "etcd-v3", "endpoint": "etcd:2379"})
    lost = pod(1, uid="old-1")
    decided = Plan(
        create=[1], attempt=1, delete=[Deletion(lost, force=True, why=DeletionReason.NODE_NOT_READY)]
    )
    decided.evict = [lost.name]
    decided.unhealthy = [("node-1", "gpu")]
    parts = applier(kube, mark=True)
    applied = asyncio.run(parts.pods(the_job, decided, BODY, LOG))
    assert order == ["evict", "delete"]
    assert [name for name, _ in kube.calls] == ["mark_node", "delete_pod", "create"]
    assert applied.created == ["llama-worker-1"]
    assert "old-1" in parts.expect.deleted and "uid-llama-worker-1" in parts.expect.created


def stage_totals() -> dict[str, tuple[float, float]]:
    """(count, sum) of ``llmjob_reaction_stage_seconds`` by stage, as /metrics serves them."""
    name = "llmjob_reaction_stage_seconds"
    return {
        stage: (
            REGISTRY.get_sample_value(f"{name}_count", {"stage": stage}) or 0.0,
            REGISTRY.get_sample_value(f"{name}_sum", {"stage": stage}) or 0.0,
        )
        for stage in REACTION_STAGE_NAMES
    }


def stage_counts(before: dict[str, tuple[float, float]]) -> dict[str, float]:
    now = stage_totals()
    return {s: now[s][0] - before[s][0] for s in REACTION_STAGE_NAMES if now[s][0] > before[s][0]}


def test_the_reaction_to_a_lost_worker_records_where_its_time_went_over_its_two_passes() -> None:
    parts, lost = applier(FakeKube()), pod(1, uid="old-1")
    deleting = Plan(attempt=1, delete=[Deletion(lost, force=True, why=DeletionReason.NODE_NOT_READY)])
    deleting.lost = [("NodeNotReady", None)]
    before = stage_totals()
    started = time.monotonic()
    asyncio.run(parts.pods(job(), deleting, BODY, LOG, PassClock(started, woken=started - 0.5)))
    assert stage_counts(before) == {"queued": 1, "planned": 1, "deleted": 1}
    assert stage_totals()["queued"][1] - before["queued"][1] == pytest.approx(0.5)

    replacing = Plan(create=[1], attempt=1)  # the next pass, once the deletion is seen
    asyncio.run(parts.pods(job(), replacing, BODY, LOG, PassClock(time.monotonic())))
    assert stage_counts(before) == {"queued": 1, "planned": 1, "deleted": 1, "replaced": 1, "created": 1}
    after = stage_totals()
    assert all(0 <= after[s][1] - before[s][1] < 5 for s in ("planned", "deleted", "replaced", "created"))

    growing = Plan(create=[2], attempt=1)  # no lost worker before it: not a reaction
    asyncio.run(parts.pods(job(), growing, BODY, LOG, PassClock(time.monotonic())))
    assert stage_totals() == after


def test_a_lost_worker_replaced_in_the_same_pass_records_every_stage_once() -> None:
    decided = Plan(
        create=[1],
        attempt=1,
        delete=[Deletion(pod(1, uid="old-1"), force=True, why=DeletionReason.POD_FAILED)],
    )
    decided.lost = [("PodFailed", None)]
    before = stage_totals()
    asyncio.run(applier(FakeKube()).pods(job(), decided, BODY, LOG, PassClock(time.monotonic())))
    assert stage_counts(before) == {"planned": 1, "deleted": 1, "replaced": 1, "created": 1}, (
        "no event: no queue"
    )


def test_announce_emits_the_events_after_the_write(monkeypatch: pytest.MonkeyPatch) -> None:
    events = record_events(monkeypatch)
    decided = Plan(attempt=1, events=[("Warning", "PhaseFailed", "Running -> Failed")])
    status = {"phase": "Failed", "desiredReplicas": 2, "targetReplicas": 2, "readyReplicas": 0}
    applier(FakeKube()).announce(decided, Applied(0.0, ["llama-worker-0"]), status, BODY, LOG)
    assert events.reasons() == ["PhaseFailed", "CreatedWorkers"]
