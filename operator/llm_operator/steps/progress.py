"""Step: hang detection (failurePolicy.progressTimeoutSeconds): restart workers that stopped stepping."""

from __future__ import annotations

from typing import Any

from llm_operator.policy.progress import assess_progress
from llm_operator.steps.state import Deletion, PassState

CONDITION = "Stalled"


def _condition(s: PassState, status: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": s.job.metadata.generation,
    }


def detect_stall(s: PassState) -> None:
    """When every worker runs and nothing else changes this pass, a job with no completed step for
    progressTimeoutSeconds (progressStartupSeconds after a start) restarts all its workers."""
    policy = s.job.spec.failurePolicy
    before = s.had_condition(CONDITION)
    if policy.progressTimeoutSeconds <= 0:
        return  # off: the condition (if any) is dropped
    active = s.active
    steady = (
        s.live
        and active
        and all(h.state == "healthy" and p.phase == "Running" for p, h in active)
        and not (s.replacing or s.out.delete or s.out.create or s.out.resize)
    )
    if not steady:
        if before is not None:  # keep what was said until the workers run again
            old = next(c for c in s.job.status.conditions if c.type == CONDITION)
            s.extra_conditions.append(_condition(s, old.status, old.reason, old.message))
        return
    started = max((p.started or p.created) for p, _ in active)
    verdict = assess_progress(
        s.progress, started, s.now, policy.progressTimeoutSeconds, policy.progressStartupSeconds
    )
    if not verdict.stalled:
        s.out.wake_at(verdict.deadline)
        if before is not None:
            s.extra_conditions.append(_condition(s, "False", "Progressing", "training steps complete"))
        return
    s.extra_conditions.append(_condition(s, "True", "Stalled", verdict.message))
    if s.restarts + 1 > policy.maxRestarts:
        s.finish(
            "Failed",
            "MaxRestartsExceeded",
            f"{verdict.message}; {s.restarts} restarts done (maxRestarts {policy.maxRestarts})",
        )
        return
    s.restarts += 1
    s.replacing = True
    s.out.delete += [Deletion(p, False, "Stalled") for p, _ in active]
    s.reason, s.message = "Stalled", f"restarting all workers: {verdict.message}"
    s.out.events.append(("Warning", "Stalled", s.message))
