"""What keeps a pass cheap at 1,000 jobs: capacity is counted only when a job could grow, and every job's
workers are a lazy view instead of a copy per pass (bench/scale.py, docs/benchmarks.md)."""

from __future__ import annotations

import dataclasses

from llm_operator.control.controller import AllWorkers
from llm_operator.observe import PodView
from llm_operator.policy.resize import GROWN, SizeInput, decide_size


def pod(name: str, index: int = 0) -> PodView:
    return PodView(
        name=name,
        uid=name,
        index=index,
        attempt=0,
        node="n",
        phase="Running",
        ready=True,
        deleting=False,
        created=0.0,
        exit_code=None,
        reason="",
        unschedulable=False,
    )


BASE = SizeInput(
    desired=4, minimum=2, current=4, last_desired=4, stuck_pending=0, free_slots=0, now=2000.0,
    last_resize=None, cooldown=0,
)  # fmt: skip


def counting(result: int) -> tuple[list[int], SizeInput]:
    calls: list[int] = []

    def count() -> int:
        calls.append(1)
        return result

    return calls, dataclasses.replace(BASE, count_free_slots=count)


def test_a_job_at_its_size_never_counts_free_slots() -> None:
    calls, size = counting(5)
    assert decide_size(size).target == 4
    assert decide_size(dataclasses.replace(size, stuck_pending=1)).reason  # shrinks without counting
    assert calls == []


def test_a_job_below_its_size_counts_once_and_grows_into_the_room() -> None:
    calls, size = counting(1)
    decision = decide_size(dataclasses.replace(size, current=2))
    assert (decision.target, decision.reason, len(calls)) == (3, GROWN, 1)
    calls, size = counting(0)
    assert decide_size(dataclasses.replace(size, current=2)).target == 2
    assert len(calls) == 1


def test_all_workers_is_the_others_from_the_index_and_mine_and_can_be_walked_twice() -> None:
    index = {
        ("ns", "a"): [pod("a-0")],
        ("ns", "me"): [pod("stale")],
        ("ns", "b"): [pod("b-0"), pod("b-1", 1)],
    }
    view = AllWorkers(index, ("ns", "me"), [pod("me-0"), pod("me-1", 1)])
    names = sorted(p.name for p in view)
    assert names == ["a-0", "b-0", "b-1", "me-0", "me-1"]
    assert sorted(p.name for p in view) == names
