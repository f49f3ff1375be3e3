"""Step: the below-minReplicas rule (fail after belowMinTimeoutSeconds with fewer than min running)."""

from __future__ import annotations

from llm_operator.steps.state import PassState


def below_min(s: PassState) -> None:
    """Once started, fewer than minReplicas Running for belowMinTimeoutSeconds fails the job."""
    if not s.live:
        return
    spec = s.job.spec
    running = sum(1 for p, h in s.active if h.state == "healthy" and p.phase == "Running")
    if running >= spec.minReplicas or s.job.status.startTime is None:
        s.below_min_since = None
        return
    timeout = spec.failurePolicy.belowMinTimeoutSeconds
    s.below_min_since = s.below_min_since or s.now
    deadline = s.below_min_since + timeout
    if s.now >= deadline:
        s.finish(
            "Failed",
            "BelowMinReplicas",
            f"{running} worker(s) running, below minReplicas {spec.minReplicas} for {timeout}s",
        )
    else:
        s.out.wake_at(deadline)
