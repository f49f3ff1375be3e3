"""The operator's running jobs: one object per run (kopf's memo), and which jobs an event wakes."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest import mock

import pytest
from llm_operator import labels
from llm_operator.control import jobs as jobs_module
from llm_operator.control.jobs import (
    MEMO_KEY,
    RunningJobs,
    job_facts,
    node_health,
    node_improved,
    node_lost,
    running_jobs,
)
from llm_operator.settings import Settings

from .fake_kube import FakeKube
from .views import node, pod

A, B, C = ("ns", "a"), ("ns", "b"), ("ns", "c")


def running(*keys: tuple[str, str]) -> RunningJobs:
    jobs = RunningJobs(mock.Mock(), Settings())
    for key in keys:
        jobs.start(key)
    return jobs


def woken(jobs: RunningJobs) -> set[tuple[str, str]]:
    out = {key for key, c in jobs.controllers.items() if c.wake.is_set()}
    for c in jobs.controllers.values():
        c.wake.clear()
    return out


def test_a_node_improves_when_it_can_take_workers_it_could_not_before() -> None:
    ok = (True, False, ())
    tainted = (True, False, (("karpenter.sh/disrupted", "NoSchedule"),))
    assert node_improved(None, ok)  # a new node
    assert node_improved((False, False, ()), ok)  # Ready again
    assert node_improved((True, True, ()), ok)  # uncordoned
    assert node_improved(tainted, ok)  # a taint gone
    assert not node_improved(ok, None)  # deleted
    assert not node_improved(ok, (False, False, ()))  # lost
    assert not node_improved(ok, tainted)
    assert not node_improved(ok, (True, True, ()))  # cordoned


def test_a_node_is_lost_when_deleted_or_no_longer_ready() -> None:
    ok, not_ready, cordoned = (True, False, ()), (False, False, ()), (True, True, ())
    assert node_lost(ok, None) and node_lost(ok, not_ready)
    assert not node_lost(None, ok) and not node_lost(None, None)  # new, or unknown before
    assert not node_lost(not_ready, None), "already lost: its jobs passed then"
    assert not node_lost(ok, cordoned) and not node_lost(not_ready, ok)


def test_only_the_jobs_on_a_lost_node_pass_without_coalescing() -> None:
    jobs = running(A, B)
    index = {A: [pod(0, node="n1")], B: [pod(1, node="n2")]}
    ok = (True, False, ())
    jobs.node_changed("n1", ok, index)
    assert not any(c.urgent for c in jobs.controllers.values()), "room gained: a burst may follow"
    woken(jobs)
    jobs.node_changed("n1", (False, False, ()), index)
    assert woken(jobs) == {A} and jobs.controllers[A].urgent and not jobs.controllers[B].urgent


def test_node_health_is_readiness_schedulability_and_taints_without_values() -> None:
    view = node("n1", taints=(("spot", "NoSchedule", "event-1"),))
    assert node_health(view, deleted=False) == (True, False, (("spot", "NoSchedule"),))
    assert node_health(view, deleted=True) is None


def test_each_run_has_its_own_state_found_through_the_memo() -> None:
    first, second = running(A), running()
    assert first.controllers.keys() == {A} and second.controllers == {}
    assert first.ghosts is not second.ghosts
    assert first.controllers[A].ghosts is first.ghosts  # shared by the run's controllers
    assert running_jobs({MEMO_KEY: first}) is first
    with pytest.raises(RuntimeError, match="start-up handler"):
        running_jobs({})


def test_stop_forgets_a_controller_unless_a_newer_one_replaced_it() -> None:
    jobs = running(A)
    old = jobs.controllers[A]
    new = jobs.start(A)
    jobs.stop(A, old)
    assert jobs.controllers[A] is new
    jobs.stop(A, new)
    assert jobs.controllers == {}


def test_a_pod_event_wakes_its_job_and_a_listing_wakes_only_for_changed_pods_and_ghosts() -> None:
    async def scenario() -> None:
        kube = FakeKube()
        jobs = RunningJobs(kube, Settings())  # type: ignore[arg-type]
        for key in (A, B, C):
            jobs.start(key)
        index = {A: [pod(0, uid="a0")], B: [pod(1, uid="b0")], C: [pod(2, uid="c0")]}
        jobs.pod_changed(A, "a-0", "1", "ADDED", index)
        assert woken(jobs) == {A}
        jobs.pod_changed(("ns", "unknown"), "u-0", "2", "MODIFIED", index)
        assert woken(jobs) == set()
        jobs.pod_changed(B, "b-0", "3", "ADDED", index)
        jobs.pod_changed(C, "c-0", "4", "ADDED", index)
        woken(jobs)
        kube.uids = {"a0", "c0"}  # B's worker was deleted while the watch was away
        jobs.pod_changed(A, "a-0", "1", None, index)  # the first pod of a listing, unchanged: one audit
        assert jobs.listing_audit.task is not None
        await asyncio.wait_for(jobs.listing_audit.task, 5)
        assert kube.called("pod_uids") == [("ns", labels.WORKERS)], "one list for every job"
        assert woken(jobs) == {B}, "only the job that had a ghost"
        jobs.pod_changed(C, "c-0", "5", None, index)  # changed while the watch was away
        assert woken(jobs) == {C}
        assert len(kube.called("pod_uids")) == 1, "the same listing: no second audit"
        jobs.pod_changed(C, "c-0", "6", "DELETED", index)
        assert woken(jobs) == {C}
        assert ("ns", "c-0") not in jobs.pod_versions, "forgotten when deleted"
        await jobs.listing_audit.close()

    asyncio.run(scenario())


def test_a_node_event_wakes_the_jobs_on_it_and_when_it_gained_room_those_not_at_size() -> None:
    jobs = running(A, B, C)
    jobs.controllers[C].at_size = True
    index = {A: [pod(0, node="n1")], B: [pod(1, node="n2")], C: [pod(2, node="n3")]}
    ok, lost = (True, False, ()), (False, False, ())
    jobs.node_changed("n1", ok, index)  # new node: room for A and B, not C (at its size)
    assert woken(jobs) == {A, B}
    jobs.node_changed("n1", ok, index)  # a heartbeat: nothing changed
    assert woken(jobs) == set()
    jobs.node_changed("n1", lost, index)  # only its own workers' job
    assert woken(jobs) == {A}
    jobs.node_changed("n1", None, index)  # deleted
    assert woken(jobs) == {A}
    assert "n1" not in jobs.node_health


def test_a_ghost_on_a_node_does_not_wake_its_job() -> None:
    jobs = running(A)
    gone = pod(0, node="n1")
    jobs.ghosts.record([gone], existing=set())
    jobs.node_health["n1"] = (True, False, ())
    jobs.node_changed("n1", (False, False, ()), {A: [gone]})
    assert woken(jobs) == set()


def test_a_deleted_job_ends_its_loop_and_forgets_its_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    forgotten: list[tuple[str, str]] = []
    monkeypatch.setattr(jobs_module.metrics, "forget_job", lambda *key: forgotten.append(key))
    jobs = running(A, B)
    jobs.job_changed(A, deleted=False)
    assert woken(jobs) == {A} and not jobs.controllers[A].deleted
    jobs.job_changed(B, deleted=True)
    assert woken(jobs) == {B} and jobs.controllers[B].deleted
    jobs.job_changed(C, deleted=True)  # not running here: its metrics still go
    assert forgotten == [B, C]


def test_the_jobs_own_status_write_does_not_wake_it_and_a_spec_or_label_change_does() -> None:
    jobs = running(A)
    job = {"metadata": {"generation": 1, "labels": {"q": "a"}}, "status": {"phase": "Pending"}}
    jobs.job_changed(A, False, job_facts(job))
    assert woken(jobs) == {A}
    jobs.job_changed(A, False, job_facts({**job, "status": {"phase": "Running"}}))
    assert woken(jobs) == set()
    jobs.job_changed(A, False, job_facts({"metadata": {"generation": 2, "labels": {"q": "a"}}}))
    assert woken(jobs) == {A}
    jobs.job_changed(A, False, job_facts({"metadata": {"generation": 2, "labels": {"q": "b"}}}))
    assert woken(jobs) == {A}


def test_handlers_reach_the_start_up_object_through_their_memo_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf gives each object's handlers a shallow copy of the operator's memo (kopf's inventory)."""
    import copy
    import logging

    import kopf
    from llm_operator import handlers

    api = mock.Mock(close=mock.AsyncMock())

    async def connect() -> Any:
        return api

    monkeypatch.setattr(handlers, "connect", connect)
    memo = kopf.Memo()
    asyncio.run(handlers.startup(settings=kopf.OperatorSettings(), memo=memo))
    jobs = running_jobs(memo)
    jobs.start(A)
    body = kopf.Body(
        {"metadata": {"name": "w", "namespace": "ns", "labels": {"elasticllm.dev/job-name": "a"}}}
    )
    asyncio.run(
        handlers.pod_changed(body=body, namespace="ns", type="MODIFIED", memo=copy.copy(memo), worker_pods={})
    )
    assert woken(jobs) == {A}
    ready = {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    asyncio.run(
        handlers.node_changed(
            body=kopf.Body(ready),
            type="ADDED",
            memo=copy.copy(memo),
            logger=logging.getLogger("test"),
            worker_pods={A: [pod(0, node="n1")]},
        )
    )
    assert woken(jobs) == {A} and jobs.node_health["n1"] == (True, False, ())
    gone = kopf.Body({"metadata": {"name": "a", "namespace": "ns"}})
    asyncio.run(
        handlers.job_changed(body=gone, namespace="ns", name="a", type="DELETED", memo=copy.copy(memo))
    )
    assert jobs.controllers[A].deleted
    asyncio.run(handlers.cleanup(memo=memo))
    api.close.assert_awaited_once()
    assert MEMO_KEY not in memo
