"""Pods the index holds after they were deleted in a watch gap: found by audit, never counted again."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from llm_operator import labels
from llm_operator.control.ghosts import (
    AUDIT_MIN_INTERVAL_S,
    LISTING_BURST_GAP_S,
    Ghosts,
    IndexAudit,
    LiveWorkers,
    audit_due,
)

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


@pytest.mark.parametrize(
    ("listed_at", "audited_at", "now", "every", "due"),
    [
        (0.0, 1000.0, 1000.0, 300.0, 1300.0),  # nothing listed since: the periodic audit
        (0.0, 1000.0, 1000.0, 0.0, None),  # no periodic audit: only after a re-list
        (1100.0, 1000.0, 1100.0, 300.0, 1100.0),  # re-listed since the last audit: now
        (1100.0, 1000.0, 1100.0, 0.0, 1100.0),
        (1001.0, 1000.0, 1001.0, 300.0, 1000.0 + AUDIT_MIN_INTERVAL_S),  # not sooner than the minimum
    ],
)
def test_audit_due(listed_at: float, audited_at: float, now: float, every: float, due: float | None) -> None:
    assert audit_due(listed_at, audited_at, now, every) == due


def test_an_audit_lists_the_jobs_workers_once_due_and_records_the_ghosts() -> None:
    kube, ghosts = FakeKube(), Ghosts()
    audit = IndexAudit(kube, "ns", "llama", ghosts, every=300.0)  # type: ignore[arg-type]
    index = {("ns", "llama"): [pod(0), pod(1)]}
    log = logging.getLogger("test")
    due = asyncio.run(audit.run(index, log))  # just started: not due
    assert due is not None and due > time.monotonic() and kube.calls == []
    ghosts.note_listed()  # kopf re-listed the pods
    audit.audited_at -= AUDIT_MIN_INTERVAL_S
    kube.uids = {"u0"}
    asyncio.run(audit.run(index, log))
    assert kube.called("pod_uids") == [("ns", labels.selector("llama"))]
    assert ghosts.uids == {"u1"}
    assert [p.name for p in LiveWorkers(index, ghosts)[("ns", "llama")]] == ["llama-worker-0"]
