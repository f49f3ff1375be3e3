"""The sample-accounting audit over synthetic metrics logs (pure)."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest
from llm_elastic.accounting import audit
from llm_elastic.order import GlobalOrder

BATCH = 4
ORDER = GlobalOrder(1000, 7)


def rec(
    step: int, restart: int = 0, world: int = 2, t: float | None = None, resumed: int | None = None
) -> dict[str, Any]:
    start, stop = (step - 1) * BATCH, step * BATCH
    ids = np.asarray(ORDER.sample_ids(start, stop), dtype="<i8")
    return {
        "step": step,
        "global_batch": BATCH,
        "sample_start": start,
        "sample_end": stop,
        "samples_crc32": zlib.crc32(ids.tobytes()),
        "restart": restart,
        "world_size": world,
        "time": float(step) if t is None else t,
        "resumed_from": resumed,
    }


def test_uninterrupted_run_is_clean() -> None:
    result = audit([rec(s) for s in range(1, 11)], ORDER)
    assert result.ok, result.problems
    assert result.steps == 10 and result.interruptions == []
    assert result.summary() == "10 steps, no interruption, no sample lost or repeated"


def test_restart_with_replay_is_measured() -> None:
    log = [rec(s) for s in range(1, 8)]  # steps 1..7, checkpoint at 5
    log += [rec(6, restart=1, world=1, t=27.0, resumed=5), *[rec(s, 1, 1, 20.0 + s) for s in range(7, 11)]]
    result = audit(log, ORDER)
    assert result.ok, result.problems
    (only,) = result.interruptions
    assert (only.last_step, only.resumed_from, only.replayed) == (7, 5, 2)
    assert (only.world_before, only.world_after, only.paused_s) == (2, 1, 20.0)
    assert "training paused 20.0s, 2 step(s) replayed, no sample lost or repeated" in result.summary()


def test_restart_before_any_checkpoint_replays_from_step_one() -> None:
    log = [rec(1), rec(2), rec(3), rec(1, restart=1, world=1, t=9.0), rec(2, 1, 1, 10.0)]
    result = audit(log, ORDER)
    assert result.ok, result.problems
    assert [(i.resumed_from, i.replayed) for i in result.interruptions] == [(0, 3)]


def test_live_world_size_change_counts_without_replay() -> None:
    log = [rec(s) for s in range(1, 5)] + [rec(s, world=3, t=s + 1.5) for s in range(5, 8)]
    result = audit(log, ORDER)
    assert result.ok and [(i.replayed, i.world_after, i.paused_s) for i in result.interruptions] == [
        (0, 3, 2.5)
    ]


@pytest.mark.parametrize(
    ("log", "problem"),
    [
        ([], "no step was recorded"),
        ([rec(1), rec(2), rec(4)], "not consecutive"),
        ([rec(1), rec(2), rec(4, restart=1, resumed=3)], "past step 2"),
        ([rec(1), rec(2), rec(2, restart=1)], "trained step 2 first"),
        ([rec(1), rec(2), rec(4, restart=1, resumed=2)], "trained step 4 first"),
        ([rec(1), {**rec(2), "sample_start": 5}], "trained positions"),
        ([rec(1), {**rec(2), "samples_crc32": 1}], "other samples"),
    ],
    ids=[
        "empty",
        "gap-in-run",
        "resumed-past-end",
        "restarted-from-scratch",
        "skipped-step",
        "positions",
        "ids",
    ],
)
def test_broken_logs_are_reported(log: list[dict[str, Any]], problem: str) -> None:
    result = audit(log, ORDER)
    assert not result.ok
    assert any(problem in p for p in result.problems), result.problems


def test_a_loss_that_keeps_the_world_size_counts_as_a_loss_and_a_join_does_not() -> None:
    """bench/e2e_recovery.py (restart mode): the survivors and a replacement re-rendezvous together (2 -> 2)
    and replay from the checkpoint; a later join (1 -> 2) after a SIGTERM checkpoint replays nothing. The
    per-loss figures and the summary's total read the same interruptions."""
    log = [rec(s) for s in range(1, 8)]  # checkpoint at 5, node lost after 7
    log += [rec(6, restart=1, world=2, t=27.0, resumed=5), rec(7, 1, 2, 28.0), rec(8, 1, 2, 29.0)]
    log += [rec(9, restart=2, world=1, t=40.0, resumed=8), rec(10, 2, 1, 41.0)]
    log += [rec(11, restart=3, world=2, t=50.0, resumed=10), rec(12, 3, 2, 51.0)]
    result = audit(log, ORDER)
    assert result.ok, result.problems
    assert [i.grew for i in result.interruptions] == [False, False, True]
    assert result.replayed_per_loss == [2, 0] and result.replayed == 2
    assert "2 step(s) replayed" in result.summary()
