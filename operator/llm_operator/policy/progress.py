"""Hang detection: has the job completed a training step recently enough?

Synchronous data-parallel training advances every rank together (each step ends in collectives), so the
step counter of any one running worker is the job's; a rank that hangs stalls every rank at the next
collective. The operator therefore samples one or two workers per job (``llm_operator.control.scrape``) and
keeps, per job, when it last saw the step advance on its own clock (no clock skew between nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator.policy.membership import LiveGeneration
from llm_operator.policy.unschedulable import SchedulingEvent


@dataclass(frozen=True)
class Sample:
    """One worker's answer: the trainer's ``llm_trainer_*`` gauges (None: the gauge is not served).

    ``step``/``timestamp`` (0/0 before the first step) serve hang detection; the rest serve
    ``status.progress`` (``llm_operator.policy.goodput``)."""

    step: int
    timestamp: float
    total_steps: int | None = None
    """Steps the run trains in total (0: unknown)."""
    loss: float | None = None
    tokens_per_second: float | None = None
    step_time_sum: float | None = None
    """Wall seconds of the steps this process completed (resets when the process starts)."""
    step_time_count: int | None = None
    """Steps this process completed (resets when the process starts)."""
    last_saved_step: int | None = None
    last_saved_timestamp: float | None = None
    job_process_restarts: int | None = None
    """Programs of the job restarted inside their pods so far (recovery layer 2; the members agree on it)."""
    world_size: int | None = None
    """Processes in the generation the worker trains in."""
    contract_version: int | None = None
    """The runtime/operator contract the worker's runtime speaks (``llm_elastic.contract``; a runtime that
    serves metrics without it speaks the first); None: not known (a sample not read from metrics)."""
    rules_fired: tuple[tuple[str, str, int], ...] = ()
    """(rule, action, count) of ``llm_trainer_rule_fired_total``: the runtime's loss rules that fired in
    this process (every member of a generation fires together)."""


@dataclass(frozen=True)
class Progress:
    """What the probes saw for one job (an input of ``reconcile.plan``)."""

    step: int | None
    """The last step a worker reported (None: no worker answered with a step yet)."""
    advanced_at: float | None
    """Operator time when the step was last seen to advance (None: never since the operator started)."""
    latest: Sample | None = None
    """The newest answer with a completed step (None: none yet), for ``status.progress``."""
    latest_at: float | None = None
    """Operator time of that answer."""
    report_every: float = 0.0
    """Seconds between two updates of ``status.progress`` (0: progress is not reported)."""
    live: LiveGeneration | None = None
    """The live membership's generation as last read (recovery inProcess; None: not read)."""
    scheduling: tuple[SchedulingEvent, ...] = ()
    """The newest FailedScheduling event of each worker still Pending (``policy.unschedulable``)."""
    contracts: frozenset[int] = frozenset()
    """The runtime contracts the workers that answered the last probe round speak (``policy.skew``)."""


@dataclass(frozen=True)
class StallVerdict:
    """Stalled now, or when to look again."""

    stalled: bool
    deadline: float
    message: str


def assess_progress(
    progress: Progress | None, workers_started: float, now: float, timeout: int, startup: int
) -> StallVerdict:
    """``workers_started``: when the last worker of the current membership started running.

    Before a step has completed since then, the job gets ``startup`` seconds (rendezvous, checkpoint
    load); afterwards ``timeout`` seconds from the last step seen advancing.
    """
    advanced = progress.advanced_at if progress is not None else None
    step = progress.step if progress is not None else None
    if advanced is not None and advanced >= workers_started:
        deadline = advanced + timeout
        message = (
            f"no training step completed for {now - advanced:.0f}s (last step {step},"
            f" progressTimeoutSeconds {timeout})"
        )
    else:
        deadline = workers_started + startup
        last = f"last step seen {step}" if step is not None else "no step seen"
        message = (
            f"no training step completed {now - workers_started:.0f}s after the workers started"
            f" ({last}, progressStartupSeconds {startup})"
        )
    return StallVerdict(now >= deadline, deadline, message)
