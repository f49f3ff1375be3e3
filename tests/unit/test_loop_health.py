"""The operator's loop lag and garbage-collection pauses reach its metrics."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest
from llm_operator.loop_health import HeapFreeze, LoopWatch
from llm_operator.settings import Settings
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


class Node:
    """An object in a reference cycle with itself: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_survivors_of_a_full_collection_are_frozen_until_the_thaw() -> None:
    now = [0.0]
    freeze = HeapFreeze(thaw_seconds=60, clock=lambda: now[0])
    freeze.start()
    try:
        cycle = Node()
        alive = weakref.ref(cycle)
        gc.collect()  # `cycle` survives (referenced) and is frozen with everything else
        assert gc.get_freeze_count() > 0
        del cycle
        gc.collect()  # dead, but in a frozen cycle: a full collection does not walk it
        assert alive() is not None
        now[0] = 59.0
        gc.collect()
        assert alive() is not None, "thawed before thaw_seconds"
        now[0] = 60.0
        gc.collect()  # the thaw: this collection walks everything again
        assert alive() is None
        assert gc.get_freeze_count() > 0, "the survivors are frozen again"
    finally:
        freeze.close()
    assert gc.get_freeze_count() == 0
    dead = Node()
    gone = weakref.ref(dead)
    del dead
    gc.collect()
    assert gone() is None


def test_a_thaw_of_zero_leaves_the_collector_as_it_is() -> None:
    freeze = HeapFreeze(thaw_seconds=0)
    freeze.start()
    try:
        gc.collect()
        assert gc.get_freeze_count() == 0
    finally:
        freeze.close()


def test_the_thaw_is_read_from_the_environment() -> None:
    assert Settings.from_env({}).gc_thaw_seconds == 3600.0
    assert Settings.from_env({"LLMJOB_GC_THAW_SECONDS": "0"}).gc_thaw_seconds == 0.0
    with pytest.raises(ValueError, match="LLMJOB_GC_THAW_SECONDS must be >= 0"):
        Settings.from_env({"LLMJOB_GC_THAW_SECONDS": "-1"})
