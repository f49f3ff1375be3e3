"""Why Pending workers get no node: one read of a namespace's FailedScheduling events for all its jobs.

kube-apiserver keeps no watch cache for Events (its default ``--watch-cache-sizes`` sets ``events`` to 0), so
every LIST of a namespace's Events reads all of them from etcd and decodes them, whatever its field
selector. Each job's prober reads them while one of its workers is Pending (``control.prober``): at 1,000
jobs starting in one namespace that was 701 LISTs in the creation window, each of every Event the namespace
held (docs/decisions.md, SW7). Here the jobs of a namespace share one read: a caller gets the answer of a
LIST sent at most :data:`FRESH_SECONDS` ago, or waits for the one on its way, or sends one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from llm_operator.policy.unschedulable import SchedulingEvent

FRESH_SECONDS = 5.0
"""How old an answer may be and still serve a caller (a Karpenter verdict comes seconds after the pod)."""

Reader = Callable[[str], Awaitable[list[SchedulingEvent]]]
"""Lists a namespace's FailedScheduling events of pods (``Kube.failed_scheduling``)."""


class SchedulingEvents:
    """The operator's shared reader; :meth:`read` has the signature of the :data:`Reader` it wraps."""

    def __init__(self, reader: Reader, clock: Callable[[], float] = time.monotonic) -> None:
        self.reader = reader
        self.clock = clock
        self.latest: dict[str, tuple[float, list[SchedulingEvent]]] = {}
        """By namespace: when the last answered LIST was sent, and its answer."""
        self.pending: dict[str, asyncio.Future[list[SchedulingEvent]]] = {}
        """By namespace: the LIST on its way, which callers meanwhile wait for."""

    async def read(self, namespace: str) -> list[SchedulingEvent]:
        """The namespace's events as a LIST sent at most :data:`FRESH_SECONDS` ago saw them. A failed LIST
        raises its error in every caller that waited for it and leaves nothing behind."""
        latest = self.latest.get(namespace)
        if latest is not None and self.clock() - latest[0] < FRESH_SECONDS:
            return latest[1]
        future = self.pending.get(namespace)
        if future is None:
            future = asyncio.ensure_future(self._list(namespace))
            future.add_done_callback(_retrieved)
            self.pending[namespace] = future
        return await asyncio.shield(future)  # a caller that is cancelled leaves the LIST to the others

    async def _list(self, namespace: str) -> list[SchedulingEvent]:
        sent = self.clock()
        try:
            events = await self.reader(namespace)
        finally:
            del self.pending[namespace]
        self.latest[namespace] = (sent, events)
        return events


def _retrieved(future: asyncio.Future[list[SchedulingEvent]]) -> None:
    """Marks a LIST's error as seen when every caller left before it came (no "never retrieved" log)."""
    if not future.cancelled():
        future.exception()
