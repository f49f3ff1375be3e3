"""A whole pass of the per-job controller against an in-memory apiserver: the parts in order, and the
status written on one path, once per pass, only when it changed."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from llm_operator.control.controller import RUNTIME_RETRY_SECONDS, JobController
from llm_operator.settings import Settings

from .fake_kube import FakeKube, record_events
from .jobs import manifest
from .views import node, pod

LOG = logging.getLogger("test")


def controller(kube: FakeKube) -> JobController:
    k: Any = kube
    return JobController(k, Settings(), "ml", "llama")


def one_pass(c: JobController, body: dict[str, Any]) -> float:
    return asyncio.run(c.reconcile(body, {}, {}, LOG))  # type: ignore[arg-type]


def test_a_pass_creates_support_objects_once_workers_and_writes_the_status_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = record_events(monkeypatch)
    kube = FakeKube()
    c = controller(kube)
    body = manifest()
    assert 0 < one_pass(c, body) <= 30.0
    created = [obj["kind"] for (obj,) in kube.called("create")]
    assert created.count("Pod") == 4
    (write,) = kube.called("patch_job_status")
    status = write[2]
    assert status["targetReplicas"] == 4 and status["runtime"] is None
    assert status["replicas"] == 4, "the workers this pass created are counted in its one write"
    assert c.status.current(body) is status
    assert "CreatedWorkers" not in events.reasons(), "a first start is in the status, not in an Event"
    support = len(created) - 4
    one_pass(c, body)  # the watch has not caught up: expectations hold the created workers
    assert [obj["kind"] for (obj,) in kube.called("create")].count("Pod") == 4, "no second worker per index"
    assert len(kube.called("create")) == 4 + support, "support objects once per generation"
    assert len(kube.called("patch_job_status")) == 1, "nothing changed: no write"


def test_a_missing_runtime_is_one_status_write_and_one_event_and_no_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = record_events(monkeypatch)
    kube = FakeKube()
    c = controller(kube)
    body = manifest(runtimeRef={"name": "cpu"}, image=None)
    assert one_pass(c, body) == RUNTIME_RETRY_SECONDS
    assert one_pass(c, body) == RUNTIME_RETRY_SECONDS
    (write,) = kube.called("patch_job_status")  # the second pass changed nothing
    assert write[2]["reason"] == "RuntimeNotFound" and write[2]["phase"] == "Pending"
    assert events.reasons() == ["RuntimeNotFound"]
    assert kube.called("create") == []
    assert c.status.current(body)["conditions"][-1]["type"] == "RuntimeResolved"


def test_a_lost_worker_whose_name_is_free_is_replaced_by_the_next_pass_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The forced deletion answers that no object is left: the next pass creates the replacement without
    waiting for the watch (whose index still holds the old pod) and without the coalescing wait."""
    record_events(monkeypatch)
    kube = FakeKube()
    c = controller(kube)
    body = manifest(failurePolicy={"nodeFailureGraceSeconds": 0})
    body["status"] = {"phase": "Running", "targetReplicas": 4, "desiredReplicas": 4, "replicas": 4,
                      "readyReplicas": 4, "startTime": "2026-11-28T10:00:00Z"}  # fmt: skip
    now = time.time()
    pods = {("ml", "llama"): [pod(i, created=now - 100) for i in range(4)]}
    nodes = {f"node-{i}": [node(f"node-{i}")] for i in range(4)}
    nodes["node-1"] = [node("node-1", ready=False, not_ready_since=now - 1)]
    asyncio.run(c.reconcile(body, pods, nodes, LOG))  # type: ignore[arg-type]
    assert [call[1] for call in kube.called("delete_pod")] == ["llama-worker-1"]
    assert kube.called("create") != [] and "Pod" not in [o["kind"] for (o,) in kube.called("create")]
    assert c.replace_now, "the name is free: pass again at once"
    asyncio.run(c.reconcile(body, pods, nodes, LOG))  # type: ignore[arg-type]
    made = [o["metadata"]["name"] for (o,) in kube.called("create") if o["kind"] == "Pod"]
    assert made == ["llama-worker-1"] and not c.replace_now
    asyncio.run(c.reconcile(body, pods, nodes, LOG))  # type: ignore[arg-type]
    assert len(kube.called("delete_pod")) == 1, "the old pod, still in the index, is not lost twice"
    assert [o["kind"] for (o,) in kube.called("create")].count("Pod") == 1


def test_a_lost_node_runs_its_jobs_pass_without_waiting_for_the_burst(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node of the job's workers lost (``wake_up(urgent=True)``): the pass starts at once, not after
    the coalescing wait that gathers an ordinary burst of events (made an hour long here)."""
    from llm_operator.control import controller as module

    monkeypatch.setattr(module, "COALESCE_SECONDS", 3600.0)
    c = controller(FakeKube())
    passes: list[bool] = []

    class Stopped:
        def __bool__(self) -> bool:
            return len(passes) >= 2

    async def reconcile(*_: Any, **__: Any) -> float:
        passes.append(c.urgent)
        if len(passes) == 1:  # the pass at start; the node is lost while it runs
            c.wake_up(urgent=True)
        return 3600.0

    monkeypatch.setattr(c, "reconcile", reconcile)
    loop = c._loop(manifest(), {}, {}, Stopped(), LOG)  # type: ignore[arg-type]
    asyncio.run(asyncio.wait_for(loop, 10))
    assert passes == [False, False], "two passes, the flag spent when the second began"
