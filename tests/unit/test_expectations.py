"""Expectations settled by the watch, by UID (issue 56): a replacement takes its predecessor's name, so a
name settles nothing; a lagging watch never leads to a second create (on a fresh cluster at 1,000 jobs the
API server refused 4,291 creates of names already taken once a 30 s expectation ran out)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from llm_operator.control.expectations import TTL_SECONDS, Expectations
from llm_operator.reconcile import Plan, plan

from .fake_kube import FakeKube
from .jobs import job
from .test_apply import applier
from .test_reconcile import NODES, running_status
from .views import NOW, pod

LOG = logging.getLogger("test")


def replacement(index: int = 3, uid: str = "new-3") -> Any:
    return pod(index, uid=uid, phase="Pending", ready=False, node="", created=NOW)


def creates(observed: list[Any]) -> list[int]:
    return plan(job(status=running_status()), observed, NODES, observed, NOW).create


def test_the_predecessor_of_the_same_name_does_not_settle_its_replacement() -> None:
    ex = Expectations()
    ex.expect_created(replacement(), now=0.0)
    lagging = [pod(0), pod(1), pod(2), pod(3, uid="old-3", deleting=True)]  # the watch: the old one
    seen = ex.apply(lagging, now=1.0)
    assert "new-3" in ex.created, "the old pod of that name is not the new one"
    assert [v.uid for v in seen if v.index == 3] == ["old-3", "new-3"]
    assert creates(seen) == []
    ex.apply([pod(0), pod(1), pod(2), replacement()], now=2.0)
    assert ex.created == {}, "settled when the watch shows its uid"


def test_a_watch_lagging_past_the_old_ttl_never_leads_to_a_second_create() -> None:
    ex = Expectations()
    ex.expect_created(replacement(), now=0.0)
    for late in (31.0, 120.0, TTL_SECONDS):
        seen = ex.apply([pod(0), pod(1), pod(2)], now=late)
        assert creates(seen) == [], f"a second create after {late:g} s"
        assert ex.overdue(now=late) == []


def test_an_overdue_creation_is_asked_for_not_assumed_gone() -> None:
    ex = Expectations()
    ex.expect_created(replacement(), now=0.0)
    late = TTL_SECONDS + 1
    assert ex.overdue(now=late) == [("new-3", "llama-worker-3")]
    ex.confirm("new-3", exists=True, now=late)  # the API server has it: the watch lags
    assert ex.overdue(now=late) == [] and creates(ex.apply([pod(0), pod(1), pod(2)], now=late)) == []
    ex.confirm("new-3", exists=False, now=late)  # gone before the watch ever showed it
    assert creates(ex.apply([pod(0), pod(1), pod(2)], now=late)) == [3], "the slot is free again"


def test_a_deletion_the_watch_reports_settles_a_creation_no_pass_saw() -> None:
    ex = Expectations()
    ex.expect_created(replacement(), now=0.0)
    ex.watched_deleted("old-3")
    assert "new-3" in ex.created, "another uid of that name settles nothing"
    ex.watched_deleted("new-3")
    assert ex.created == {}


def test_a_name_already_taken_is_expected_under_its_holders_uid() -> None:
    """409 on a create: the watch lags behind an earlier creation. The holder's uid is read back and
    expected, so the next pass creates nothing; a name whose holder is gone (or going) is not expected."""
    kube = FakeKube()
    kube.taken = {"llama-worker-1": "earlier-1", "llama-worker-2": None}
    parts = applier(kube)
    body: Any = {}
    applied = asyncio.run(parts.pods(job(), Plan(create=[1, 2], attempt=0), body, LOG))
    assert applied.created == [] and applied.refused == []
    assert list(parts.expect.created) == ["earlier-1"]
    assert [args[1] for args in kube.called("pod_uid")] == ["llama-worker-1", "llama-worker-2"]
    seen = parts.expect.apply([pod(0), pod(3)])
    assert plan(job(status=running_status()), seen, NODES, seen, NOW).create == [2]
