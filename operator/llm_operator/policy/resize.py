"""The size the job aims at: follow the user, shrink to what can be scheduled, grow back when room appears.

Two numbers: ``target`` training workers (never below ``minimum`` by a shrink) and ``spares`` warm
standby workers beside them (spec.spareReplicas, failurePolicy.recovery inProcess). Spares never count
toward the minimum, are the first to go when workers stay unschedulable, and the last to come back.

A shrink lowers the size the job trains at; it does not take back the request for capacity: the workers
it gave up on stay Pending (``demand``), visible to an autoscaler such as Karpenter, which launches
nodes only for Pending pods. One that gets a node runs at once and the job grows by it
(``running_extra``), cooldown or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Reasons (also event reasons).
INITIAL = "Initial"
USER_SCALED = "UserScaled"
SHRUNK = "Shrunk"
GROWN = "Grown"


@dataclass(frozen=True)
class SizeInput:
    """What the decision looks at."""

    desired: int
    minimum: int
    current: int | None
    """status.targetReplicas; None before the first pass."""
    last_desired: int | None
    """status.desiredReplicas: the desired size seen last pass."""
    stuck_pending: int
    """Workers unschedulable for longer than pendingTimeoutSeconds."""
    free_slots: int
    """Nodes that could take one more worker now."""
    now: float
    last_resize: float | None
    cooldown: int
    spares_desired: int = 0
    """spec.spareReplicas (0 unless inProcess; fewer when Kueue admitted less)."""
    spares_current: int | None = None
    """status.spareReplicas; None before the first pass."""
    running_extra: int = 0
    """Workers bound and running beyond ``current`` plus the spares: Pending workers that asked for
    capacity and got a node."""
    count_free_slots: Callable[[], int] | None = None
    """Counts ``free_slots`` when given (instead of the field): only the grow rule needs it, and counting
    looks at every worker of every job, so a job at its size never pays for it (bench/scale.py)."""


@dataclass(frozen=True)
class SizeDecision:
    """The new target and why it changed ('' when it did not)."""

    target: int
    reason: str = ""
    recheck_at: float | None = None
    spares: int = 0
    """Spare workers to run beside ``target``."""


def decide_size(s: SizeInput) -> SizeDecision:
    """Ordered rules, first match wins."""
    spares = s.spares_desired if s.spares_current is None else s.spares_current
    if s.current is None or s.current == 0:
        return SizeDecision(s.desired, INITIAL, spares=s.spares_desired)
    if s.last_desired is not None and s.desired != s.last_desired:
        return SizeDecision(s.desired, USER_SCALED, spares=s.spares_desired)
    if s.current > s.desired:
        return SizeDecision(s.desired, USER_SCALED, spares=s.spares_desired)
    if spares > s.spares_desired:  # spareReplicas lowered (or Kueue admitted fewer): at once
        return SizeDecision(s.current, USER_SCALED, spares=s.spares_desired)
    short = (s.desired - s.current) + (s.spares_desired - spares)
    if s.running_extra > 0 and short > 0:  # capacity came for a waiting worker: use it at once
        target = min(s.desired, s.current + s.running_extra)
        room = s.running_extra - (target - s.current)
        return SizeDecision(target, GROWN, spares=min(s.spares_desired, spares + room))
    if s.stuck_pending > 0 and (spares > 0 or s.current > s.minimum):
        # Spares go first; only what is still stuck after them shrinks the training size.
        left = max(0, s.stuck_pending - spares)
        return SizeDecision(max(s.minimum, s.current - left), SHRUNK, spares=max(0, spares - s.stuck_pending))
    if short <= 0 or s.stuck_pending > 0:
        return SizeDecision(s.current, spares=spares)
    free = s.count_free_slots() if s.count_free_slots is not None else s.free_slots
    if free > 0:
        ready_at = (s.last_resize or 0.0) + s.cooldown
        if s.now >= ready_at:
            target = min(s.desired, s.current + free)  # training workers first
            room = free - (target - s.current)
            return SizeDecision(target, GROWN, spares=min(s.spares_desired, spares + room))
        return SizeDecision(s.current, recheck_at=ready_at, spares=spares)
    return SizeDecision(s.current, spares=spares)
