"""Pods the index holds after they were deleted in a watch gap: found by audit, never counted again."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from llm_operator import labels
from llm_operator.control import ghosts as ghosts_module
from llm_operator.control.ghosts import (
    LISTING_BURST_GAP_S,
    Ghosts,
    IndexAudit,
    ListingAudit,
    LiveWorkers,
)
from llm_operator.kube import KubeError

from .fake_kube import FakeKube
from .views import pod


def test_a_pod_the_list_lacks_becomes_a_ghost_and_is_no_longer_seen() -> None:
    ghosts = Ghosts()
    indexed = [pod(0), pod(1), pod(2)]
    found = ghosts.record(indexed, existing={"u0", "u2", "u-newer"})
    assert [p.name for p in found] == ["llama-worker-1"]
    assert [p.name for p in ghosts.visible(indexed)] == ["llama-worker-0", "llama-worker-2"]
    assert ghosts.record(indexed, existing={"u0", "u2"}) == []  # reported once


def test_without_ghosts_the_index_values_are_read_as_they_are() -> None:
    views = [pod(0)]
    assert Ghosts().visible(views) is views


def test_live_workers_filters_every_read_of_the_index() -> None:
    ghosts = Ghosts()
    index = {("ns", "llama"): [pod(0), pod(1)], ("ns", "other"): [pod(5, uid="x5")]}
    ghosts.record(index[("ns", "llama")], existing={"u0"})
    live = LiveWorkers(index, ghosts)
    assert [p.name for p in live.get(("ns", "llama"), ())] == ["llama-worker-0"]
    assert live.get(("ns", "missing"), ()) == ()
    assert {k: [p.uid for p in v] for k, v in live.items()} == {
        ("ns", "llama"): ["u0"],
        ("ns", "other"): ["x5"],
    }
    assert ("ns", "other") in live and len(live) == 2


def test_the_first_listed_pod_of_a_burst_wakes_the_jobs_once() -> None:
    ghosts = Ghosts()
    assert ghosts.note_listed(100.0)
    assert not ghosts.note_listed(100.0 + LISTING_BURST_GAP_S / 2)
    assert ghosts.note_listed(100.0 + 3 * LISTING_BURST_GAP_S)


def test_the_audit_after_a_listing_lists_each_namespace_once_and_wakes_only_the_jobs_with_ghosts() -> None:
    kube, ghosts = FakeKube(), Ghosts()
    woken: list[tuple[str, str]] = []
    audit = ListingAudit(kube, ghosts, woken.append)  # type: ignore[arg-type]
    index = {
        ("ns", "llama"): [pod(0), pod(1)],
        ("ns", "other"): [pod(5, uid="x5")],
        ("team", "mistral"): [pod(7, uid="y7")],
    }
    kube.uids = {"u0", "x5"}  # llama-worker-1 and mistral's worker were deleted in the gap
    found = asyncio.run(audit.audit(index))
    assert kube.called("pod_uids") == [("ns", labels.WORKERS), ("team", labels.WORKERS)]
    assert {key: [p.uid for p in views] for key, views in found.items()} == {
        ("ns", "llama"): ["u1"],
        ("team", "mistral"): ["y7"],
    }
    assert woken == [("ns", "llama"), ("team", "mistral")], "no pass for a job without a ghost"
    assert ghosts.uids == {"u1", "y7"}
    assert ghosts.unreported == {("ns", "llama"): ["llama-worker-1"], ("team", "mistral"): ["llama-worker-7"]}
    assert asyncio.run(audit.audit(index)) == {}, "a ghost is found once"


class GatedKube(FakeKube):
    """Its pod lists wait for :attr:`gate`; the first ``failures`` of them then fail."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.failures = 0

    async def pod_uids(self, namespace: str, selector: dict[str, str]) -> set[str]:
        self._call("pod_uids", namespace, selector)
        await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise KubeError(500, "the list failed")
        return self.uids


@pytest.mark.parametrize(
    ("failures", "second_listing"),
    [(0, True), (1, False)],
    ids=["a listing during the audit: once more", "a failed list: tried again"],
)
def test_the_audit_after_a_listing_runs_again_when_its_lists_may_have_missed_a_ghost(
    monkeypatch: pytest.MonkeyPatch, failures: int, second_listing: bool
) -> None:
    monkeypatch.setattr(ghosts_module, "AUDIT_RETRY_S", 0.0)
    kube, ghosts = GatedKube(), Ghosts()
    kube.uids, kube.failures = {"u0", "u1"}, failures
    audit = ListingAudit(kube, ghosts, lambda key: None)  # type: ignore[arg-type]
    index = {("ns", "llama"): [pod(0), pod(1)]}

    async def scenario() -> None:
        audit.listed(index)
        task = audit.task
        assert task is not None
        while not kube.called("pod_uids"):  # the audit's list is in flight
            await asyncio.sleep(0)
        if second_listing:
            audit.listed(index)
            assert audit.task is task, "one audit at a time"
        kube.gate.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert len(kube.called("pod_uids")) == 2
    assert ghosts.uids == set()


def test_a_job_reports_what_the_audit_after_a_listing_found_for_it_at_its_next_pass(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube, ghosts = FakeKube(), Ghosts()
    audit = IndexAudit(kube, "ns", "llama", ghosts, every=0.0)  # type: ignore[arg-type]
    ghosts.unreported[("ns", "llama")] = ["llama-worker-1"]
    log = logging.getLogger("test")
    with caplog.at_level(logging.WARNING, "test"):
        assert asyncio.run(audit.run({}, log)) is None, "no periodic audit: never due"
        asyncio.run(audit.run({}, log))
    assert [r.getMessage() for r in caplog.records] == [
        "IndexGhosts: llama-worker-1 deleted during a watch gap; no longer counted"
    ], "reported once"
    assert kube.calls == []


def test_the_periodic_audit_lists_the_jobs_workers_once_due_and_records_the_ghosts() -> None:
    kube, ghosts = FakeKube(), Ghosts()
    audit = IndexAudit(kube, "ns", "llama", ghosts, every=300.0)  # type: ignore[arg-type]
    index = {("ns", "llama"): [pod(0), pod(1)]}
    log = logging.getLogger("test")
    due = asyncio.run(audit.run(index, log))  # just started: not due
    assert due is not None and due > time.monotonic() and kube.calls == []
    audit.audited_at -= 300.0
    kube.uids = {"u0"}
    due = asyncio.run(audit.run(index, log))
    assert kube.called("pod_uids") == [("ns", labels.selector("llama"))]
    assert due == audit.audited_at + 300.0
    assert ghosts.uids == {"u1"}
    assert [p.name for p in LiveWorkers(index, ghosts)[("ns", "llama")]] == ["llama-worker-0"]
