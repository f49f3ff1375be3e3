"""One job's progress prober: how often it probes, what it folds in, and that it reads the spec cheaply."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from unittest import mock

import pytest
from llm_operator.control import prober as prober_module
from llm_operator.control.prober import ProgressProber
from llm_operator.control.scrape import Sample
from llm_operator.control.status_writer import StatusWriter
from llm_operator.runtime_resolution import RuntimeResolver

from .views import pod

KEY = ("ns", "j")


def body(generation: int, timeout: int) -> Any:
    return {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": generation},
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 2,
            "image": "x",
            "failurePolicy": {"progressTimeoutSeconds": timeout},
        },
    }


def make(progress_seconds: float = 0.0) -> ProgressProber:
    kube: Any = mock.Mock()
    return ProgressProber(
        KEY,
        progress_seconds,
        RuntimeResolver(kube, *KEY),
        StatusWriter(kube, *KEY),
        asyncio.Event(),
    )


def test_the_prober_validates_the_job_once_per_generation() -> None:
    prober = make()
    with mock.patch.object(RuntimeResolver, "job", autospec=True, side_effect=RuntimeResolver.job) as spy:
        assert prober.timeout(body(1, 600)) == 600
        assert prober.timeout(body(1, 600)) == 600
        assert spy.call_count == 1
        assert prober.timeout(body(2, 900)) == 900  # the spec changed
        assert spy.call_count == 2


def test_a_round_folds_the_answers_in_and_the_first_progress_wakes_the_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[list[str]] = []

    async def probe(urls: list[str], **_: Any) -> list[Sample]:
        asked.append(urls)
        return [Sample(step=5, timestamp=100.0)]

    monkeypatch.setattr(prober_module, "probe", probe)
    prober = make()
    workers = [pod(i, ip=f"10.0.0.{i}", phase="Running", ready=True) for i in range(3)]
    asyncio.run(prober.sample(workers))
    assert len(asked[0]) == 2  # two workers per job
    assert prober.tracker.step == 5 and prober.wake.is_set()
    prober.wake.clear()
    asyncio.run(prober.sample(workers))
    assert not prober.wake.is_set()  # only the first progress wakes


@pytest.mark.parametrize(
    ("timeout", "progress_seconds", "interval", "probes"),
    [
        (0, 0.0, prober_module.PROBE_IDLE_SECONDS, 0),
        (600, 0.0, 30.0, 1),
        (40, 30.0, 10.0, 1),
        (0, 30.0, 15.0, 1),
    ],
)
def test_the_interval_follows_the_timeout_and_the_progress_interval(
    timeout: int, progress_seconds: float, interval: float, probes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    prober = make(progress_seconds)
    rounds: list[int] = []
    slept: list[float] = []

    async def sample(workers: Any) -> None:
        rounds.append(1)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(prober, "sample", sample)
    monkeypatch.setattr(prober_module.asyncio, "sleep", sleep)
    deleted = iter([False, True])
    stopped: Any = False
    asyncio.run(prober.run(body(1, timeout), {}, stopped, lambda: next(deleted), logging.getLogger("t")))
    assert (slept, len(rounds)) == ([interval], probes)


def test_the_same_scheduling_verdict_with_a_newer_event_time_wakes_nobody() -> None:
    from llm_operator.policy.unschedulable import SchedulingEvent

    answers = [
        [SchedulingEvent("llama-worker-1", "karpenter", "no nodepool fits", 10.0)],
        [SchedulingEvent("llama-worker-1", "karpenter", "no nodepool fits", 20.0)],  # repeated later
        [SchedulingEvent("llama-worker-1", "default-scheduler", "0/4 nodes are available", 30.0)],
    ]

    async def read(_: str) -> list[SchedulingEvent]:
        return answers.pop(0)

    prober = make()
    prober.scheduling = read
    waiting = [pod(1, phase="Pending", ready=False, node="")]
    woken = []
    for _ in range(3):
        prober.wake.clear()
        asyncio.run(prober.read_scheduling(waiting))
        woken.append(prober.wake.is_set())
    assert woken == [True, False, True]
    assert prober.tracker.scheduling[0].source == "default-scheduler"
