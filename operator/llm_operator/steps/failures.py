"""Steps: stuck Terminating pods, the terminal outcome (non-retryable exit, success), lost workers."""

from __future__ import annotations

from llm_operator.policy.deletion import DeletionReason
from llm_operator.policy.health import HEALTH_SIGNALS
from llm_operator.policy.nodehealth import parse_failure
from llm_operator.steps.restarts import spend_restarts
from llm_operator.steps.state import Deletion, PassState, Verdict


def _preflight(verdict: Verdict) -> bool:
    """A worker that failed its health check before it became a member (exit 78, ``preflight``)."""
    pod, h = verdict
    return h.signal in HEALTH_SIGNALS and parse_failure(pod.message).preflight


def force_stuck_terminating(s: PassState) -> None:
    """A pod stuck Terminating on a dead node is force-deleted, whatever else happens."""
    for pod, h in s.verdicts:
        if h.state == "terminating" and h.force:
            s.out.delete.append(Deletion(pod, True, DeletionReason.STUCK_TERMINATING))


def terminal_outcome(s: PassState) -> None:
    """A non-retryable exit fails the job; workers exiting 0 with none left running succeed it."""
    if s.terminal_phase is not None:
        return
    if s.fatal:
        pod = s.fatal[0]
        s.finish(
            "Failed",
            "NonRetryableExitCode",
            f"worker {pod.name} exited with code {pod.exit_code}, listed in nonRetryableExitCodes",
        )
    elif s.succeeded and not s.active and not s.lost:
        s.finish("Succeeded", "WorkersSucceeded", f"{len(s.succeeded)} worker(s) exited 0")


def replace_lost(s: PassState) -> None:
    """Lost or failed workers are deleted (their indices free up for replacements): one restart spent,
    unless it would exceed maxRestarts. Workers that only failed a pre-flight health check never were
    members: replacing them is no restart, they count in healthFailures (more than maxRestarts of them
    fail the job, so a check that fails on every node cannot loop for ever)."""
    lost = s.lost
    if not s.live or not lost:
        return
    limit = s.job.spec.failurePolicy.maxRestarts
    preflight = [v for v in lost if _preflight(v)]
    if len(preflight) == len(lost):
        s.health_failures += len(preflight)
        if s.health_failures > limit:
            s.finish(
                "Failed",
                "HealthChecksFailing",
                f"{s.health_failures} workers failed their pre-flight health check (maxRestarts {limit});"
                f" last: {parse_failure(preflight[-1][0].message).reason}",
            )
            return
        for pod, h in preflight:
            s.out.delete.append(Deletion(pod, h.force, DeletionReason(h.signal), h.since))
            s.out.lost.append((h.signal, h.since))
        return
    if not spend_restarts(
        s, refused=f"{len(lost)} worker(s) lost after {s.restarts} restarts (maxRestarts {limit})"
    ):
        return
    s.replacing = True
    for pod, h in lost:
        s.out.delete.append(Deletion(pod, h.force, DeletionReason(h.signal), h.since))
        s.out.lost.append((h.signal, h.since))
    signals = sorted({h.signal for _, h in lost})
    s.reason = signals[0] if len(signals) == 1 else "WorkersLost"
    s.message = "replacing " + ", ".join(
        f"{p.name} ({h.signal}: {h.detail})" if h.detail else f"{p.name} ({h.signal})" for p, h in lost
    )
    s.out.events.append(("Warning", s.reason, s.message))
