"""Step: spec.suspend deletes every worker and sizes the job to 0."""

from __future__ import annotations

from llm_operator.policy.deletion import DeletionReason
from llm_operator.steps.state import Deletion, PassState


def suspend(s: PassState) -> None:
    """Suspended (and not finished): delete active and lost workers, target 0."""
    if not s.job.spec.suspend or s.terminal_phase is not None:
        return
    s.out.delete += [Deletion(p, False, DeletionReason.SUSPENDED) for p, _ in s.active + s.lost]
    s.target, s.reason, s.message = 0, "Suspended", "spec.suspend is true"
