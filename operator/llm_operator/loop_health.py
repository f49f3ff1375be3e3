"""How late the operator's event loop runs, and how long garbage collection stops the process.

Every watch, handler and job pass of the operator shares one asyncio loop: while it is busy, a node event
waits unread in its socket and no job learns of it. :class:`LoopWatch` sleeps ``LAG_INTERVAL_S`` again
and again and records how much later than asked each sleep came back (``llmjob_operator_loop_lag_seconds``),
and hooks ``gc.callbacks`` to record each collection's pause by generation
(``llmjob_operator_gc_pause_seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from typing import Any

from llm_operator import metrics

LAG_INTERVAL_S = 0.1
"""How often the loop's lateness is sampled."""


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
