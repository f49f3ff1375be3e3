"""The jobs of a namespace share one read of its FailedScheduling events (``control.scheduling_events``)."""

from __future__ import annotations

import asyncio

import pytest
from llm_operator.control.scheduling_events import FRESH_SECONDS, SchedulingEvents
from llm_operator.kube import KubeError
from llm_operator.policy.unschedulable import SchedulingEvent


class Reader:
    """Counts the LISTs; each waits for ``go`` and answers one event naming the namespace and the call."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.go = asyncio.Event()
        self.fail = False

    async def __call__(self, namespace: str) -> list[SchedulingEvent]:
        self.calls.append(namespace)
        await self.go.wait()
        if self.fail:
            raise KubeError(500, "etcd timeout")
        return [SchedulingEvent(f"{namespace}-{len(self.calls)}", "karpenter", "no", 0.0)]


def test_callers_of_a_namespace_share_one_list_until_it_is_stale() -> None:
    now = [100.0]

    async def run() -> None:
        reader = Reader()
        shared = SchedulingEvents(reader, clock=lambda: now[0])
        waiting = [asyncio.ensure_future(shared.read("ml")) for _ in range(50)]
        other = asyncio.ensure_future(shared.read("team-b"))
        await asyncio.sleep(0)
        reader.go.set()
        answers = await asyncio.gather(*waiting)
        assert reader.calls == ["ml", "team-b"], "one LIST per namespace for 50 callers"
        assert {a[0].pod for a in answers} == {"ml-1"}
        assert (await other)[0].pod == "team-b-2"
        now[0] += FRESH_SECONDS - 0.1
        assert (await shared.read("ml"))[0].pod == "ml-1" and len(reader.calls) == 2, "still fresh"
        now[0] += 0.2
        assert (await shared.read("ml"))[0].pod == "ml-3", "stale: a new LIST"

    asyncio.run(run())


def test_a_failed_list_reaches_every_waiting_caller_and_is_not_kept() -> None:
    async def run() -> None:
        reader = Reader()
        reader.fail = True
        shared = SchedulingEvents(reader, clock=lambda: 0.0)
        waiting = [asyncio.ensure_future(shared.read("ml")) for _ in range(3)]
        await asyncio.sleep(0)
        reader.go.set()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(r, KubeError) for r in results) and len(reader.calls) == 1
        reader.fail = False
        assert (await shared.read("ml"))[0].pod == "ml-2", "the next caller lists again"

    asyncio.run(run())


def test_a_cancelled_caller_leaves_the_list_to_the_others() -> None:
    async def run() -> None:
        reader = Reader()
        shared = SchedulingEvents(reader, clock=lambda: 0.0)
        first = asyncio.ensure_future(shared.read("ml"))
        second = asyncio.ensure_future(shared.read("ml"))
        await asyncio.sleep(0)
        first.cancel()
        reader.go.set()
        assert (await second)[0].pod == "ml-1" and len(reader.calls) == 1
        with pytest.raises(asyncio.CancelledError):
            await first

    asyncio.run(run())
