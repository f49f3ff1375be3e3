"""Step: an inProcess job's workers that are given up on leave the live membership at once."""

from __future__ import annotations

from llm_operator.policy.health import (
    HEALTH_SIGNALS,
    NODE_CONDITION,
    NODE_DELETED,
    NODE_NOT_READY,
    POD_EVICTED,
    POD_FAILED,
)
from llm_operator.steps.state import PassState

EVICT_REASONS = frozenset(
    {
        NODE_CONDITION,
        NODE_DELETED,
        NODE_NOT_READY,
        POD_FAILED,
        POD_EVICTED,
        *HEALTH_SIGNALS,
        "Stalled",
        "ForceDeleteStuckTerminating",
    }
)
"""Deletions of workers whose processes cannot leave by themselves (dead, gone, or hung). Graceful
deletions (scale down, suspend, a terminating or cordoned node, the end) are left out: SIGTERM makes
those members leave at a step boundary, and when all stop together they first save a checkpoint."""


def evict_live_members(s: PassState) -> None:
    """failurePolicy.recovery inProcess: evict the members of every worker deleted for a failure."""
    if s.job.spec.failurePolicy.recovery != "inProcess":
        return
    s.out.evict = sorted({d.pod.name for d in s.out.delete if d.force or d.reason in EVICT_REASONS})
