"""Where a process stands (``llm_elastic.position``): one frozen value of world, progress and restore facts;
each kind of move returns a new position and leaves the old one as it was."""

from __future__ import annotations

import dataclasses
import math

import pytest
from llm_elastic import RestoreFacts
from llm_elastic.position import Position, Progress, World


def test_a_process_starts_as_a_new_member_of_a_one_process_world() -> None:
    start = Position()
    assert start.world == World(rank=0, world_size=1, generation=0) and start.restored == RestoreFacts()
    progress = start.progress
    assert (progress.step, progress.fresh, progress.restarts) == (0, True, 0)
    assert math.isnan(progress.last_loss)


def test_a_position_and_its_parts_never_change_in_place() -> None:
    start = Position()
    with pytest.raises(dataclasses.FrozenInstanceError):
        start.progress.fresh = False  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        start.world = World(1, 2, 3)  # type: ignore[misc]
    moved = start.joined(World(2, 4, 7))
    assert moved.world == World(2, 4, 7)
    assert moved.progress is start.progress and moved.restored is start.restored
    assert start.world == World(), "the old position is untouched"


def test_a_completed_step_counts_with_its_loss_or_with_the_loss_before_when_it_was_dropped() -> None:
    held = Position(World(1, 2, 5), Progress(4, 2.0, False, restarts=1))
    assert held.trained(5, 1.5).progress == Progress(5, 1.5, False, 1)
    dropped = held.trained(5, None)
    assert dropped.progress == Progress(5, 2.0, False, 1), "a dropped step keeps the loss before"
    assert held.trained(5, 1.5).world == World(1, 2, 5)
    assert not Position().trained(1, 3.0).progress.fresh, "a member that completed a step holds trained state"


def test_a_member_holds_state_from_scratch_or_after_a_transfer() -> None:
    scratch = Position().from_scratch()
    assert not scratch.progress.fresh and scratch.progress.step == 0 and scratch.restored == RestoreFacts()
    held = Position(progress=Progress(9, 1.0, True))
    agreed = held.agreed(Progress(12, 0.8, True, restarts=2))
    assert agreed.progress == Progress(12, 0.8, False, 2)
    assert agreed.restored == RestoreFacts(), "a transfer is no restore from storage"
    resumed = agreed.resumed()
    assert resumed.restored == RestoreFacts(resumed_from=12), "in process: resumed at the agreed step"


def test_a_restore_records_its_source_and_training_resumes_at_its_step() -> None:
    joined = Position().joined(World(1, 2, 3))
    loaded = joined.loaded(Progress(40, 0.7, True, restarts=1), "memory", 2)
    assert loaded.progress == Progress(40, 0.7, False, 1) and loaded.world == World(1, 2, 3)
    assert loaded.restored == RestoreFacts(None, "memory", 0.0, 2), "resumed only once the caller says so"
    resumed = loaded.resumed(seconds=1.25)
    assert resumed.restored == RestoreFacts(40, "memory", 1.25, 2)
    again = resumed.loaded(Progress(30, 0.9, False, 2), "checkpoint", None).resumed()
    assert again.restored == RestoreFacts(30, "checkpoint", 1.25, 2), "untimed: the seconds and peers stay"
    assert again.progress.step == 30
