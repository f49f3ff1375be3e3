"""Why a worker pod is deleted: every reason the reconcile steps give, and what each one implies.

The value is the word the ``DeletedWorkers`` Event shows beside the pod; the properties are the rules
other parts read from the reason (never by matching its spelling).
"""

from __future__ import annotations

from enum import StrEnum

from llm_operator.policy.health import (
    NODE_CONDITION,
    NODE_CORDONED,
    NODE_DELETED,
    NODE_NOT_READY,
    NODE_TERMINATING,
    NODE_UNHEALTHY,
    POD_EVICTED,
    POD_FAILED,
    RULE_FIRED,
    STRAGGLER,
)


class DeletionReason(StrEnum):
    """Why a worker pod is deleted. A lost worker's reason is its signal (``policy.health``)."""

    NODE_DELETED = NODE_DELETED
    NODE_NOT_READY = NODE_NOT_READY
    NODE_TERMINATING = NODE_TERMINATING
    NODE_CORDONED = NODE_CORDONED
    NODE_CONDITION = NODE_CONDITION
    POD_FAILED = POD_FAILED
    POD_EVICTED = POD_EVICTED
    NODE_UNHEALTHY = NODE_UNHEALTHY
    STRAGGLER = STRAGGLER
    RULE_FIRED = RULE_FIRED
    """A monitoring rule ended a worker, or its restartJob stops every worker."""
    STALLED = "Stalled"
    """No training step for failurePolicy.progressTimeoutSeconds: every worker restarts."""
    STUCK_TERMINATING = "ForceDeleteStuckTerminating"
    """A pod left Terminating on a node that is gone or unreachable: force-deleted whatever else happens."""
    SCALED_DOWN = "ScaledDown"
    SUSPENDED = "Suspended"
    NOT_ADMITTED = "NotAdmitted"
    """Kueue has not admitted the job (or evicted it); the Event shows Kueue's own reason."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TTL_EXPIRED = "TTLExpired"
    AVOIDED_NODE_USABLE = "AvoidedNodeUsable"
    """A Pending worker kept off a node that is usable again: re-created without that term."""

    @property
    def evicts(self) -> bool:
        """The worker's processes cannot leave the live membership by themselves (dead, gone or hung):
        an inProcess job evicts its members at once. A graceful deletion (scale down, suspend, a
        terminating or cordoned node, the end) is left out: SIGTERM makes those members leave at a step
        boundary, and when all stop together they first save a checkpoint."""
        return self in _EVICTS

    @property
    def stall(self) -> bool:
        """A hang restart (``llmjob_stalls_total``)."""
        return self is DeletionReason.STALLED

    @property
    def unconditional(self) -> bool:
        """Goes ahead even when the pass ends the job (a stuck pod is freed whatever the job's fate)."""
        return self is DeletionReason.STUCK_TERMINATING


_EVICTS = frozenset(
    {
        DeletionReason.NODE_CONDITION,
        DeletionReason.NODE_DELETED,
        DeletionReason.NODE_NOT_READY,
        DeletionReason.POD_FAILED,
        DeletionReason.POD_EVICTED,
        DeletionReason.NODE_UNHEALTHY,
        DeletionReason.STRAGGLER,
        DeletionReason.STALLED,
        DeletionReason.STUCK_TERMINATING,
    }
)
