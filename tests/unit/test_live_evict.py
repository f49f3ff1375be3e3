"""inProcess recovery: which deleted workers leave the live membership, and the etcd request for it."""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import pytest
from llm_operator.control import live_evict
from llm_operator.control.live_evict import LiveEvictor, deleterange_body, member_range
from llm_operator.policy.deletion import DeletionReason
from llm_operator.reconcile import plan
from llm_operator.steps.live import evict_live_members
from llm_operator.steps.state import Deletion

from .fake_kube import FakeKube, record_events
from .jobs import job
from .test_steps import NODES, state
from .views import NOW, node, pod

LIVE = {"failurePolicy": {"recovery": "inProcess", "nodeFailureGraceSeconds": 0}}


def test_failed_and_lost_workers_are_evicted_graceful_deletions_are_not() -> None:
    s = state(**LIVE)
    workers = [pod(i) for i in range(6)]
    s.out.delete = [
        Deletion(workers[0], True, DeletionReason.NODE_NOT_READY),
        Deletion(workers[1], False, DeletionReason.POD_FAILED),
        Deletion(workers[2], False, DeletionReason.STALLED),
        Deletion(workers[3], False, DeletionReason.NODE_TERMINATING),  # SIGTERM: it leaves at a step boundary
        Deletion(workers[4], False, DeletionReason.SCALED_DOWN),
        Deletion(workers[5], False, DeletionReason.SUSPENDED),
    ]
    evict_live_members(s)
    assert s.out.evict == ["llama-worker-0", "llama-worker-1", "llama-worker-2"]


def test_restart_jobs_never_evict() -> None:
    s = state()
    s.out.delete = [Deletion(pod(0), True, DeletionReason.NODE_NOT_READY)]
    evict_live_members(s)
    assert s.out.evict == []


def test_a_not_ready_node_evicts_its_worker_in_the_same_pass_that_deletes_it() -> None:
    nodes = {**NODES, "node-1": node("node-1", ready=False, not_ready_since=NOW - 1)}
    pods = [pod(i) for i in range(4)]
    job = state(**LIVE).job
    decided = plan(job, pods, nodes, pods, NOW)
    assert [d.pod.name for d in decided.delete] == ["llama-worker-1"]
    assert decided.evict == ["llama-worker-1"]


def test_member_range_covers_one_pod_only() -> None:
    key, end = member_range("/llmjob/u/live/", "train-worker-1")
    assert key == "/llmjob/u/live/members/train-worker-1."
    assert key <= "/llmjob/u/live/members/train-worker-1.4242" < end
    assert not key <= "/llmjob/u/live/members/train-worker-10.77" < end
    body = deleterange_body("/p/", "w-0")
    assert (
        base64.b64decode(body["key"]) == b"/p/members/w-0."
        and base64.b64decode(body["range_end"]) == b"/p/members/w-0/"
    )


@pytest.mark.parametrize(
    ("prefix", "pod_name"), [("p/", "w"), ("/p", "w"), ("/p/", ""), ("/p/", "a/b"), ("/p/", "a.b")]
)
def test_member_range_rejects_bad_input(prefix: str, pod_name: str) -> None:
    with pytest.raises(ValueError):
        member_range(prefix, pod_name)


def _evictor(kube: Any) -> LiveEvictor:
    return LiveEvictor(kube, "ml")


def test_the_job_etcd_is_its_endpoint_else_the_managed_pod_else_its_service() -> None:
    kube = FakeKube()
    external = job(rendezvous={"backend": "etcd-v3", "endpoint": "etcd.example:2379"})
    assert asyncio.run(_evictor(kube).address(external)) == "etcd.example:2379" and kube.calls == []
    managed = job(rendezvous={"backend": "etcd-v3"})
    assert asyncio.run(_evictor(kube).address(managed)) == "llama-rdzv.ml.svc:2379"  # no running pod yet
    kube.ips = ["10.1.2.3"]
    assert asyncio.run(_evictor(kube).address(managed)) == "10.1.2.3:2379"


def test_an_eviction_that_fails_is_a_warning_event(monkeypatch: pytest.MonkeyPatch) -> None:
    events = record_events(monkeypatch)

    async def refused(address: str, prefix: str, pods: Any, **_: Any) -> int:
        raise RuntimeError(f"etcd at {address}: refused")

    monkeypatch.setattr(live_evict, "evict_pods", refused)
    external = job(rendezvous={"backend": "etcd-v3", "endpoint": "etcd.example:2379"})
    body: Any = {}
    asyncio.run(_evictor(FakeKube()).evict(external, ["llama-worker-1"], body, logging.getLogger("t")))
    assert events.reasons() == ["LiveEvictionFailed"] and "their leases expire" in events[0][2]


def test_generation_reads_of_an_etcd_that_does_not_answer_look_it_up_less_and_less(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers: list[bool] = []

    async def read(address: str, prefix: str, **_: Any) -> list[str]:
        if not answers.pop(0):
            raise RuntimeError(f"etcd at {address}: refused")
        return ["llama-worker-0.7"]

    monkeypatch.setattr(live_evict, "read_generation_members", read)
    kube = FakeKube()
    kube.ips = ["10.1.2.3"]
    now = [0.0]
    evictor = LiveEvictor(kube, "ml", clock=lambda: now[0])
    managed = job(rendezvous={"backend": "etcd-v3"})

    def rounds(until: float, answer: bool) -> list[float]:
        """Read every 10 s until ``until``; when the rendezvous pod was listed."""
        lookups = []
        while now[0] <= until:
            before = len(kube.calls)
            answers.append(answer)
            pods = asyncio.run(evictor.generation_pods(managed))
            assert (pods is not None) == answer
            if len(kube.calls) > before:
                lookups.append(now[0])
            now[0] += 10
        return lookups

    # Failing: looked up after 10, 20, 40 s, then at most once a minute (was: at every round).
    assert rounds(200, answer=False) == [0, 10, 30, 70, 130, 190]
    # It answers again: the address is kept for a minute, and a new failure starts at 10 s again.
    assert rounds(310, answer=True) == [250, 310]
    assert rounds(330, answer=False) == [330]
    assert rounds(350, answer=False) == [340]
