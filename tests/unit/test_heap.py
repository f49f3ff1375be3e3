"""The generation boundary's collection: it frees what the closed generation left in cycles, and scans
only what was made since the last freeze (llm_elastic.heap, decision LM2)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from llm_elastic import heap


class Group:
    """Stands for a process group that a failed step's frames keep in a reference cycle."""


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()  # this pytest process's other tests expect a plain heap


def test_settle_frees_a_cycle_made_since_the_freeze_and_freezes_what_survives() -> None:
    heap.freeze()
    frozen = gc.get_freeze_count()
    group = Group()
    cycle: dict[str, object] = {"group": group}
    cycle["self"] = cycle  # only a collection frees it
    gone = weakref.ref(group)
    kept = [[i] for i in range(100)]  # containers: tracked by the collector
    del group, cycle
    assert gone() is not None, "a cycle outlives its last name"
    assert heap.settle() >= 2
    assert gone() is None, "the closed generation's group is freed at the boundary"
    assert gc.get_freeze_count() >= frozen + len(kept), "what survived is left out of the next collection"


def test_a_frozen_object_is_still_freed_when_its_last_reference_goes() -> None:
    group = Group()
    gone = weakref.ref(group)
    heap.freeze()
    del group
    assert gone() is None
