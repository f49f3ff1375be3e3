"""The operator's loop lag and garbage-collection pauses reach its metrics."""

from __future__ import annotations

import asyncio
import gc
import time

from llm_operator.loop_health import LoopWatch
from prometheus_client import REGISTRY


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_a_busy_loop_shows_as_lag_and_a_collection_as_a_pause() -> None:
    lag_sum = sample("llmjob_operator_loop_lag_seconds_sum")
    pauses = sample("llmjob_operator_gc_pause_seconds_count", {"generation": "2"})

    async def scenario() -> None:
        watch = LoopWatch(interval=0.01)
        watch.start()
        await asyncio.sleep(0)  # the sampler is asleep now
        time.sleep(0.3)  # the loop is held: the sampler's sleep comes back late
        deadline = time.monotonic() + 10
        while sample("llmjob_operator_loop_lag_seconds_sum") - lag_sum < 0.25:
            assert time.monotonic() < deadline, "no lag recorded"
            await asyncio.sleep(0.01)
        gc.collect()
        await watch.close()
        assert watch.task is not None and watch.task.done()

    asyncio.run(scenario())
    assert sample("llmjob_operator_gc_pause_seconds_count", {"generation": "2"}) == pauses + 1
    gc.collect()  # closed: no longer timed
    assert sample("llmjob_operator_gc_pause_seconds_count", {"generation": "2"}) == pauses + 1
