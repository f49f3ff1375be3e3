"""Step: an inProcess job's workers that are given up on leave the live membership at once."""

from __future__ import annotations

from llm_operator.steps.state import PassState


def evict_live_members(s: PassState) -> None:
    """failurePolicy.recovery inProcess: evict the members of every worker deleted for a failure
    (forced, or for a reason that evicts: ``DeletionReason.evicts``)."""
    if s.job.spec.failurePolicy.recovery != "inProcess":
        return
    s.out.evict = sorted({d.pod.name for d in s.out.delete if d.force or d.why.evicts})
