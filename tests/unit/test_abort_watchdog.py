"""The NCCL watchdog's logic on CPU (issue 18): it aborts every communicator once a member is gone, never
for a joiner or while the store is unreadable, and reports an abort that does not return. The NCCL abort
itself (``abort_group``) needs a GPU: see docs/benchmarks.md, "Elastic on GPUs"."""

from __future__ import annotations

import threading

import pytest
from llm_elastic import abort
from llm_elastic.abort import Watchdog
from llm_elastic.live.changes import Changes
from support.wait import wait_for


class Verdicts:
    """What the membership says at each watch event: False (a joiner), an error (store out), True (gone)."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bool(answer)


def test_it_aborts_every_group_once_a_member_is_gone_but_not_for_a_joiner_or_an_outage() -> None:
    changes = Changes()
    aborted: list[str] = []
    verdicts = Verdicts(False, RuntimeError("etcd is out"), True)
    dog = Watchdog(verdicts, changes, lambda: ["world", "snapshot-group"], aborted.append).start()
    try:
        wait_for(lambda: verdicts.asked == 1, 5, "the verdict read at start (a joiner registered)")
        changes.bump()  # etcd unreadable
        wait_for(lambda: verdicts.asked == 2, 5, "the second verdict")
        assert aborted == [] and dog.aborted_at is None
        changes.bump()  # a member left
        wait_for(lambda: len(aborted) == 2, 5, "both groups aborted")
    finally:
        dog.stop()
    assert sorted(aborted) == ["snapshot-group", "world"] and dog.aborted_at is not None and not dog.stuck


def test_an_abort_that_never_returns_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(abort, "ABORT_TIMEOUT", 0.2)
    release = threading.Event()
    dog = Watchdog(lambda: True, Changes(), lambda: ["world"], lambda _g: release.wait(5)).start()
    try:
        wait_for(lambda: dog.stuck, 5, "the stuck abort to be reported")
    finally:
        release.set()
        dog.stop()
