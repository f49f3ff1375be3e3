"""The size the job aims at: follow the user, shrink to what can be scheduled, grow back when room appears."""

from __future__ import annotations

from dataclasses import dataclass

# Reasons (also event reasons and the `direction` label of llmjob_resizes_total).
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


@dataclass(frozen=True)
class SizeDecision:
    """The new target and why it changed ('' when it did not)."""

    target: int
    reason: str = ""
    recheck_at: float | None = None


def decide_size(s: SizeInput) -> SizeDecision:
    """Ordered rules, first match wins."""
    if s.current is None or s.current == 0:
        return SizeDecision(s.desired, INITIAL)
    if s.last_desired is not None and s.desired != s.last_desired:
        return SizeDecision(s.desired, USER_SCALED)
    if s.current > s.desired:
        return SizeDecision(s.desired, USER_SCALED)
    if s.stuck_pending > 0 and s.current > s.minimum:
        return SizeDecision(max(s.minimum, s.current - s.stuck_pending), SHRUNK)
    if s.current < s.desired and s.stuck_pending == 0 and s.free_slots > 0:
        ready_at = (s.last_resize or 0.0) + s.cooldown
        if s.now >= ready_at:
            return SizeDecision(min(s.desired, s.current + s.free_slots), GROWN)
        return SizeDecision(s.current, recheck_at=ready_at)
    return SizeDecision(s.current)
