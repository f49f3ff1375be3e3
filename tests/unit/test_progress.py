"""Hang detection: the pure decision, the tracker, and what one pass does with it."""

from __future__ import annotations

from typing import Any

import pytest
from llm_elastic import contract
from llm_operator.control.scrape import ProgressTracker, Sample, parse_sample, probe_interval, probe_targets
from llm_operator.observe import format_time
from llm_operator.policy.progress import Progress, assess_progress
from llm_operator.reconcile import plan

from .jobs import job
from .views import NOW, node, pod

NODES = {f"node-{i}": node(f"node-{i}") for i in range(4)}
STARTED = NOW - 1000.0
HANG = {"progressTimeoutSeconds": 60, "progressStartupSeconds": 300}


@pytest.mark.parametrize(
    ("progress", "now", "stalled", "deadline"),
    [
        (None, STARTED + 299, False, STARTED + 300),  # never probed: the start-up allowance
        (Progress(None, None), STARTED + 300, True, STARTED + 300),
        (Progress(7, STARTED - 50), STARTED + 200, False, STARTED + 300),  # previous membership's step
        (Progress(7, STARTED + 100), STARTED + 159, False, STARTED + 160),
        (Progress(9, NOW - 59), NOW, False, NOW + 1),
        (Progress(9, NOW - 60), NOW, True, NOW),
    ],
)
def test_assess_progress(progress: Progress | None, now: float, stalled: bool, deadline: float) -> None:
    verdict = assess_progress(progress, STARTED, now, 60, 300)
    assert (verdict.stalled, verdict.deadline) == (stalled, deadline)


def test_startup_allowance_runs_out() -> None:
    verdict = assess_progress(Progress(None, None), STARTED, STARTED + 300, 60, 300)
    assert verdict.stalled and "progressStartupSeconds 300" in verdict.message
    verdict = assess_progress(Progress(12, NOW - 61), STARTED, NOW, 60, 300)
    assert verdict.stalled and "last step 12" in verdict.message and "61s" in verdict.message


def test_tracker_advances_on_change_only() -> None:
    t = ProgressTracker()

    def seen() -> tuple[int | None, float | None]:
        p = t.progress()
        return p.step, p.advanced_at

    t.record([], NOW)
    t.record([Sample(0, 0.0)], NOW)
    assert seen() == (None, None), "no answer, or no step yet, is no progress"
    assert t.progress().latest == Sample(0, 0.0), "but status.progress sees the trainer before its first step"
    t.record([Sample(5, 100.0), Sample(4, 99.0)], NOW + 1)
    assert seen() == (5, NOW + 1)
    assert (t.progress().latest, t.progress().latest_at) == (Sample(5, 100.0), NOW + 1), "the newest answer"
    t.record([Sample(5, 100.0)], NOW + 20)
    assert seen() == (5, NOW + 1), "the same step again is not progress"
    assert t.progress().latest_at == NOW + 20, "but it is a fresh sample for status.progress"
    t.record([Sample(3, 130.0)], NOW + 30)
    assert seen() == (3, NOW + 30), "a restart from an older checkpoint that steps again"


def test_parse_sample_from_exposition_text() -> None:
    text = (
        "# HELP llm_trainer_step Last completed optimizer step\n"
        "# TYPE llm_trainer_step gauge\n"
        'llm_trainer_step{job="llama",rank="0"} 42.0\n'
        'llm_trainer_last_step_timestamp_seconds{job="llama",rank="0"} 1.7e9\n'
        "llm_trainer_loss 2.5\n"
    )
    # No llm_trainer_contract_version gauge: a runtime from before the contract was versioned (0.1.0).
    assert parse_sample(text) == Sample(42, 1.7e9, loss=2.5, contract_version=contract.UNANNOUNCED_VERSION)
    full = "".join(
        f'llm_trainer_{name}{{job="llama",rank="0"}} {value}\n'
        for name, value in (
            ("step", 120),
            ("last_step_timestamp_seconds", 1.7e9),
            ("total_steps", 1000),
            ("loss", 3.25),
            ("tokens_per_second", 5120.5),
            ("step_time_seconds_sum", 61.5),
            ("step_time_seconds_count", 100),
            ("last_saved_step", 110),
            ("last_saved_timestamp_seconds", 1.7e9 - 5),
            ("world_size", 16),
        )
    )
    assert parse_sample(full) == Sample(
        step=120,
        timestamp=1.7e9,
        total_steps=1000,
        loss=3.25,
        tokens_per_second=5120.5,
        step_time_sum=61.5,
        step_time_count=100,
        last_saved_step=110,
        last_saved_timestamp=1.7e9 - 5,
        world_size=16,
        contract_version=contract.UNANNOUNCED_VERSION,
    ), "one scrape serves hang detection, status.progress and status.members"
    unannounced = contract.UNANNOUNCED_VERSION
    assert parse_sample("llm_trainer_loss NaN\nllm_trainer_step 3\n") == Sample(
        3, 0.0, contract_version=unannounced
    ), "NaN is not served"
    assert parse_sample("other_metric 1\n") is None
    assert parse_sample("not { prometheus") is None


def test_probe_targets_two_lowest_running_ready_with_ip() -> None:
    pods = [
        pod(3, ip="10.0.0.3"),
        pod(0, ip=""),
        pod(1, ip="10.0.0.1"),
        pod(2, ip="10.0.0.2", ready=False),
        pod(4, ip="10.0.0.4"),
    ]
    assert [p.index for p in probe_targets(pods)] == [1, 3]


def test_probe_interval_bounds() -> None:
    assert probe_interval(8) == 5.0 and probe_interval(60) == 15.0 and probe_interval(3600) == 30.0


def _running(**kw: Any) -> dict[str, Any]:
    base = {
        "phase": "Running",
        "targetReplicas": 4,
        "desiredReplicas": 4,
        "startTime": format_time(NOW - 5000),
    }
    return {**base, **kw}


def _pods() -> list[Any]:
    return [pod(i, started=STARTED) for i in range(4)]


def test_stall_restarts_all_workers_with_condition_and_event() -> None:
    pods = _pods()
    p = plan(
        job(status=_running(restarts=2), failurePolicy=HANG), pods, NODES, pods, NOW, Progress(17, NOW - 61)
    )
    assert sorted((d.pod.index, d.reason) for d in p.delete) == [(i, "Stalled") for i in range(4)]
    assert p.status["restarts"] == 3 and p.status["phase"] == "Restarting"
    stalled = next(c for c in p.status["conditions"] if c["type"] == "Stalled")
    assert (
        stalled["status"] == "True" and "last step 17" in stalled["message"] and "61s" in stalled["message"]
    )
    assert ("Warning", "Stalled") in {(e[0], e[1]) for e in p.events}
    assert p.create == []


def test_replacements_after_a_stall_get_the_new_attempt() -> None:
    pods = _pods()
    first = plan(job(status=_running(), failurePolicy=HANG), pods, NODES, pods, NOW, Progress(17, NOW - 61))
    again = plan(job(status=first.status, failurePolicy=HANG), [], NODES, [], NOW + 1, Progress(17, NOW - 61))
    assert again.create == [0, 1, 2, 3] and again.attempt == 1
    assert next(c for c in again.status["conditions"] if c["type"] == "Stalled")["status"] == "True"


def test_stall_with_restarts_spent_fails() -> None:
    pods = _pods()
    spec = {**HANG, "maxRestarts": 2}
    p = plan(
        job(status=_running(restarts=2), failurePolicy=spec), pods, NODES, pods, NOW, Progress(None, None)
    )
    assert p.status["phase"] == "Failed" and p.status["reason"] == "MaxRestartsExceeded"
    assert "progressStartupSeconds" in p.status["message"]
    assert sorted(d.reason for d in p.delete) == ["Failed"] * 4


def test_progressing_job_waits_until_the_deadline() -> None:
    pods = _pods()
    p = plan(job(status=_running(), failurePolicy=HANG), pods, NODES, pods, NOW, Progress(30, NOW - 10))
    assert p.delete == [] and p.requeue_at == NOW + 50
    assert "Stalled" not in {c["type"] for c in p.status["conditions"]}


def test_stalled_condition_clears_when_steps_resume() -> None:
    pods = _pods()
    stalled = [{"type": "Stalled", "status": "True", "reason": "Stalled", "message": "x"}]
    p = plan(
        job(status=_running(conditions=stalled), failurePolicy=HANG),
        pods,
        NODES,
        pods,
        NOW,
        Progress(31, NOW - 1),
    )
    cond = next(c for c in p.status["conditions"] if c["type"] == "Stalled")
    assert cond["status"] == "False" and cond["reason"] == "Progressing"


def test_off_by_default_and_not_while_workers_change() -> None:
    pods = _pods()
    assert plan(job(status=_running()), pods, NODES, pods, NOW, Progress(None, None)).delete == []
    waiting = [*pods[:3], pod(3, node="", phase="Pending", ready=False, created=NOW - 1)]
    p = plan(job(status=_running(), failurePolicy=HANG), waiting, NODES, waiting, NOW, Progress(None, None))
    assert not [d for d in p.delete if d.reason == "Stalled"], "a worker is still starting"


def test_startup_allowance_counts_from_the_last_worker_start() -> None:
    pods = [*_pods()[:3], pod(3, started=NOW - 100)]
    p = plan(job(status=_running(), failurePolicy=HANG), pods, NODES, pods, NOW, Progress(None, None))
    assert p.delete == [] and p.requeue_at == NOW + 200
