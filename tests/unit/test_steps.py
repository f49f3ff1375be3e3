"""The reconcile steps one by one, on a PassState built from pure data."""

from __future__ import annotations

from typing import Any

from llm_operator.observe import format_time
from llm_operator.policy.progress import Progress, Sample
from llm_operator.reconcile import STEPS
from llm_operator.steps.below_min import below_min
from llm_operator.steps.failures import replace_lost, terminal_outcome
from llm_operator.steps.finish import finish
from llm_operator.steps.restarts import count_process_restarts, count_restart
from llm_operator.steps.sizing import choose_surplus, scale
from llm_operator.steps.state import PassState
from llm_operator.steps.suspend import suspend

from .jobs import job
from .views import NOW, node, pod

NODES = {f"node-{i}": node(f"node-{i}") for i in range(4)}


def state(pods: list[Any] | None = None, status: dict[str, Any] | None = None, **spec: Any) -> PassState:
    pods = [pod(i) for i in range(4)] if pods is None else pods
    base = {
        "phase": "Running",
        "targetReplicas": 4,
        "desiredReplicas": 4,
        "startTime": format_time(NOW - 500),
    }
    return PassState.start(job(status={**base, **(status or {})}, **spec), pods, NODES, pods, NOW)


def test_state_seeds_decisions_from_status() -> None:
    s = state(status={"restarts": 2, "belowMinSince": format_time(NOW - 5)})
    assert (s.restarts, s.target, s.terminal_phase) == (2, 4, None)
    assert s.below_min_since == NOW - 5 and s.live and s.desired == 4


def test_terminal_outcome_is_sticky() -> None:
    s = state([pod(0, phase="Failed", exit_code=42, ready=False)], status={"phase": "Succeeded"})
    terminal_outcome(s)
    assert s.terminal_phase == "Succeeded", "a finished job stays finished"


def test_replace_lost_at_the_limit_fails_without_deleting() -> None:
    s = state(
        [pod(0, phase="Failed", exit_code=1, ready=False)],
        status={"restarts": 1},
        failurePolicy={"maxRestarts": 1},
    )
    replace_lost(s)
    assert s.terminal_phase == "Failed" and s.reason == "MaxRestartsExceeded"
    assert s.out.delete == [] and not s.replacing


def _seen(s: PassState, count: int | None) -> PassState:
    s.progress = Progress(10, NOW, Sample(10, NOW, job_process_restarts=count), NOW)
    return s


def test_programs_restarted_in_their_pods_count_as_restarts_once_each() -> None:
    s = _seen(state(status={"restarts": 1, "processRestarts": 1}, failurePolicy={"maxRestarts": 5}), 3)
    count_process_restarts(s)
    assert (s.restarts, s.process_restarts, s.terminal_phase) == (3, 3, None)
    assert [e[1] for e in s.out.events] == ["ProcessRestarted"] and "2 training program" in s.out.events[0][2]
    for count in (3, 2, None):  # the same count again, a lower one (an older checkpoint), no metric: nothing
        again = _seen(state(status={"restarts": 3, "processRestarts": 3}), count)
        count_process_restarts(again)
        assert (again.restarts, again.process_restarts, again.out.events) == (3, 3, [])


def test_programs_restarted_past_max_restarts_fail_the_job() -> None:
    s = _seen(state(status={"restarts": 2}, failurePolicy={"maxRestarts": 2}), 1)
    count_process_restarts(s)
    assert s.terminal_phase == "Failed" and s.reason == "MaxRestartsExceeded"


def test_one_restart_per_pass_whether_replacing_or_resizing() -> None:
    s = state()
    count_restart(s)
    assert s.restarts == 0
    s.out.resize = (4, 3, "ShrinkToCapacity")
    count_restart(s)
    assert s.restarts == 1, "a resize is a restart"
    lost = state([pod(0, phase="Failed", exit_code=1, ready=False), pod(1)])
    replace_lost(lost)
    lost.out.resize = (2, 1, "ShrinkToCapacity")
    count_restart(lost)
    assert (lost.restarts, lost.replacing) == (1, True), "the replacement spent the pass's one restart"


def test_a_resize_past_max_restarts_fails_the_job_and_counts_it() -> None:
    s = state(status={"restarts": 2}, failurePolicy={"maxRestarts": 2})
    s.out.resize = (4, 3, "ShrinkToCapacity")
    count_restart(s)
    assert (s.terminal_phase, s.reason, s.restarts) == ("Failed", "MaxRestartsExceeded", 3)
    assert s.message == "restart 3 exceeds maxRestarts 2"


def test_scale_sets_attempt_and_fills_free_indices() -> None:
    s = state([pod(0), pod(2)])
    s.restarts = 3
    scale(s)
    assert s.out.create == [1, 3] and s.out.attempt == 3


def test_choose_surplus_prefers_pending_then_highest_index() -> None:
    s = state([pod(0), pod(1), pod(2, node="", phase="Pending", ready=False), pod(3)])
    assert [p.index for p in choose_surplus(s.active, 2)] == [2, 3]


def test_below_min_not_before_start_and_clears_when_recovered() -> None:
    s = state([pod(0)], status={"startTime": None, "belowMinSince": format_time(NOW - 9)}, minReplicas=2)
    below_min(s)
    assert s.below_min_since is None and s.terminal_phase is None
    s = state([pod(0)], minReplicas=2)
    below_min(s)
    assert s.below_min_since == NOW and s.out.requeue_at == NOW + 1800


def test_suspend_skips_finished_jobs() -> None:
    s = state(status={"phase": "Failed"}, suspend=True)
    suspend(s)
    assert s.out.delete == [] and s.reason != "Suspended"


def test_finish_waits_for_ttl() -> None:
    s = state(
        [pod(0, phase="Succeeded", ready=False)], status={"phase": "Succeeded"}, ttlSecondsAfterFinished=60
    )
    s.completion = format_time(NOW - 10)
    finish(s)
    assert s.out.delete == [] and s.out.requeue_at == NOW + 50


def test_pipeline_order_status_last() -> None:
    names = [step.__name__ for step in STEPS]
    assert names[-2:] == ["status", "report_progress"], "progress reads the phase the status step decided"
    assert names.index("replace_lost") < names.index("count_restart") < names.index("scale")
