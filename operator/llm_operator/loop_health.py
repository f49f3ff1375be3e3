"""How late the operator's event loop runs, how long garbage collection stops the process, and keeping the
long-lived heap out of full collections.

Every watch, handler and job pass of the operator shares one asyncio loop: while it is busy, a node event
waits unread in its socket and no job learns of it. :class:`LoopWatch` sleeps ``LAG_INTERVAL_S`` again
and again and records how much later than asked each sleep came back (``llmjob_operator_loop_lag_seconds``),
and hooks ``gc.callbacks`` to record each collection's pause by generation
(``llmjob_operator_gc_pause_seconds``).

A full collection walks every tracked object with the loop stopped: at 1,000 jobs that is about 400,000
(kopf keeps several per watched object) and takes 0.6-2 s on a 2-core machine. :class:`HeapFreeze` moves
the survivors of each full collection into the permanent generation (``gc.freeze``), so the next one walks
only what was made since. Frozen objects are still freed when their last reference goes; only a cycle among
them waits for the thaw, every ``Settings.gc_thaw_seconds``, when one full collection walks everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable
from typing import Any

from llm_operator import metrics

LAG_INTERVAL_S = 0.1
"""How often the loop's lateness is sampled."""
FULL = 2
"""The generation a full collection collects (the oldest of CPython's three)."""


class LoopWatch:
    """The lag sampler (a task on the operator's loop) and the collector hook, from start to close."""

    def __init__(self, interval: float = LAG_INTERVAL_S) -> None:
        self.interval = interval
        self.task: asyncio.Task[None] | None = None
        self._collecting: float | None = None
        """When (perf_counter) the collection under way started."""

    def start(self) -> None:
        """Start sampling on the running loop and timing collections."""
        self.task = asyncio.get_running_loop().create_task(self._sample())
        gc.callbacks.append(self._collection)

    async def close(self) -> None:
        """Stop both."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._collection)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            metrics.LOOP_LAG.observe(max(0.0, loop.time() - asked))

    def _collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._collecting = time.perf_counter()
        elif self._collecting is not None:
            metrics.GC_PAUSE.labels(str(info.get("generation", ""))).observe(
                time.perf_counter() - self._collecting
            )
            self._collecting = None


class HeapFreeze:
    """Freeze the survivors of every full collection; thaw them every ``thaw_seconds`` (0: never freeze).

    Both happen in the collector's own callback, so no collection can run between the decision and the act:
    the thaw at the start of a full collection (which then walks everything), the freeze at its end.
    """

    def __init__(self, thaw_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.thaw_seconds = thaw_seconds
        self.clock = clock
        self.frozen_since: float | None = None
        """When the oldest frozen object was frozen (None: nothing frozen)."""

    def start(self) -> None:
        """Hook the collector (nothing, with ``thaw_seconds`` 0)."""
        if self.thaw_seconds > 0:
            gc.callbacks.append(self._collection)

    def close(self) -> None:
        """Unhook and thaw: what was frozen is collected as usual again."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._collection)
        if self.frozen_since is not None:
            gc.unfreeze()
            self.frozen_since = None

    def _collection(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != FULL:
            return
        if phase == "start":
            if self.frozen_since is not None and self.clock() - self.frozen_since >= self.thaw_seconds:
                gc.unfreeze()
                self.frozen_since = None
        else:
            gc.freeze()
            if self.frozen_since is None:
                self.frozen_since = self.clock()
