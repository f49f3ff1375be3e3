"""A job's status is written on one path, once per pass, only when a field changed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llm_operator.control import status_writer
from llm_operator.control.status_writer import (
    HOLD_SECONDS,
    STARTING_HOLD_SECONDS,
    StatusWriter,
    changed,
)
from llm_operator.kube import KubeError

from .fake_kube import FakeKube

BODY: dict[str, Any] = {"metadata": {"name": "j"}, "status": {"phase": "Pending", "restarts": 0}}


def writer() -> tuple[StatusWriter, FakeKube]:
    kube = FakeKube()
    return StatusWriter(kube, "ns", "j"), kube  # type: ignore[arg-type]


def test_changed_compares_only_the_new_fields() -> None:
    assert not changed({"a": 1, "b": 2}, {"a": 1})
    assert changed({"a": 1}, {"a": 2})
    assert changed({}, {"a": None}) is False  # absent and None are the same to a merge patch
    assert changed({"a": 1}, {"b": None}) is False


def test_a_pass_starts_from_the_watched_status_until_one_was_decided() -> None:
    status, _ = writer()
    assert status.current(BODY) == {"phase": "Pending", "restarts": 0}
    asyncio.run(status.write(BODY, {"phase": "Running"}))
    assert status.current(BODY) == {"phase": "Running"}  # the watch lags behind


def test_the_status_is_patched_only_when_a_field_changed() -> None:
    status, kube = writer()
    asyncio.run(status.write(BODY, {"phase": "Pending", "restarts": 0}))  # as watched: nothing to write
    assert kube.called("patch_job_status") == []
    asyncio.run(status.write(BODY, {"phase": "Running", "restarts": 0}))
    asyncio.run(status.write(BODY, {"phase": "Running", "restarts": 0}))
    assert kube.called("patch_job_status") == [("ns", "j", {"phase": "Running", "restarts": 0})]


def test_a_partial_record_patches_its_fields_and_keeps_the_rest_decided() -> None:
    status, kube = writer()
    asyncio.run(status.write(BODY, {"phase": "Pending", "restarts": 0, "reason": "X"}, {"reason": "X"}))
    assert kube.called("patch_job_status") == [("ns", "j", {"reason": "X"})]
    assert status.written == {"phase": "Pending", "restarts": 0, "reason": "X"}
    assert status.current(BODY)["reason"] == "X"


def test_the_decision_stands_when_the_write_fails_and_the_next_pass_writes_it_again() -> None:
    status, kube = writer()
    kube.fail.add("patch_job_status")
    with pytest.raises(KubeError):
        asyncio.run(status.write(BODY, {"phase": "Running"}))
    assert status.current(BODY) == {"phase": "Running"} and status.written is None
    kube.fail.clear()
    asyncio.run(status.write(BODY, {"phase": "Running"}))
    assert len(kube.called("patch_job_status")) == 2


def test_counters_alone_wait_for_the_hold_and_any_other_change_writes_them_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Workers coming up one by one: one write per hold, not one per pass (bench/scale.py, issue 44)."""
    clock = [100.0]
    monkeypatch.setattr(status_writer.time, "monotonic", lambda: clock[0])
    status, kube = writer()
    started = {"startTime": "2026-11-28T10:00:00Z"}
    asyncio.run(status.write(BODY, {"phase": "Restarting", "replicas": 0, **started}))
    asyncio.run(status.write(BODY, {"phase": "Restarting", "replicas": 8, "readyReplicas": 3, **started}))
    assert len(kube.called("patch_job_status")) == 1 and status.due == 100.0 + HOLD_SECONDS
    assert status.current(BODY)["readyReplicas"] == 3  # decided, so the next pass starts from it
    clock[0] += HOLD_SECONDS
    asyncio.run(status.write(BODY, {"phase": "Restarting", "replicas": 8, "readyReplicas": 5, **started}))
    assert kube.called("patch_job_status")[-1][2]["readyReplicas"] == 5 and status.due is None
    asyncio.run(status.write(BODY, {"phase": "Running", "replicas": 8, "readyReplicas": 8, **started}))
    assert len(kube.called("patch_job_status")) == 3, "a phase change is written at once"


def test_while_a_job_first_starts_its_counters_wait_longer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first start writes Pending, a count that waited STARTING_HOLD_SECONDS for more, and Running at
    once (which takes any count still waiting with it)."""
    clock = [100.0]
    monkeypatch.setattr(status_writer.time, "monotonic", lambda: clock[0])
    status, kube = writer()
    asyncio.run(status.write(BODY, {"phase": "Pending", "replicas": 8, "readyReplicas": 0}))
    for ready in range(1, 8):
        clock[0] += STARTING_HOLD_SECONDS / 6
        asyncio.run(status.write(BODY, {"phase": "Pending", "replicas": 8, "readyReplicas": ready}))
    assert len(kube.called("patch_job_status")) == 2, "the first write and one count a hold after the 1st"
    assert kube.called("patch_job_status")[-1][2]["readyReplicas"] == 7 and status.due is None
    clock[0] += 2 * STARTING_HOLD_SECONDS
    asyncio.run(status.write(BODY, {"phase": "Pending", "replicas": 8, "readyReplicas": 6}))
    assert status.due == clock[0] + STARTING_HOLD_SECONDS, "after a quiet spell a count still waits"
    running = {"phase": "Running", "replicas": 8, "readyReplicas": 8, "startTime": "2026-11-28T10:00:00Z"}
    asyncio.run(status.write(BODY, running))
    assert len(kube.called("patch_job_status")) == 3 and status.due is None, "Running: at once, with it"


def test_a_partial_record_leaves_a_held_counter_held(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status_writer.time, "monotonic", lambda: 100.0)
    status, kube = writer()
    asyncio.run(status.write(BODY, {"phase": "Pending", "replicas": 0}))
    asyncio.run(status.write(BODY, {"phase": "Pending", "replicas": 8}))
    asyncio.run(status.write(BODY, {"phase": "Pending", "replicas": 8, "reason": "X"}, {"reason": "X"}))
    assert kube.called("patch_job_status")[-1][2] == {"reason": "X"}
    assert status.due == 100.0 + STARTING_HOLD_SECONDS, "the count is still to be written"
