"""Why a Pending worker gets no node: waiting for capacity, or a shape no node pool can ever make.

Karpenter tells why it launches nothing for a pod in a Warning Event on the pod, reason
``FailedScheduling``, source ``karpenter``, message ``Failed to schedule pod, <one error per NodePool>``.
A NodePool whose limits are reached ("node limits have been exhausted", "all available instance types exceed
limits") will launch again when the limit is raised or nodes go away: the job waits for capacity. Any other
error (requirements, taints or resources no instance type of any NodePool meets) holds until a person
changes a NodePool or the job: the job gets the condition ``Unschedulable`` and a Warning Event
``NoNodePoolFits`` that quote Karpenter, never a silent demand for ever. kube-scheduler's own
FailedScheduling events only say that no existing node fits, which an autoscaler may cure: they are not read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

KARPENTER = "karpenter"
"""The event source (``source.component`` / ``reportingController``) of Karpenter's events."""
LIMIT_PHRASES = ("limits have been exhausted", "exceed limits")
"""Karpenter's words for a NodePool at its limits: capacity may come later."""


@dataclass(frozen=True)
class SchedulingEvent:
    """The newest FailedScheduling event of one worker pod."""

    pod: str
    source: str
    message: str
    time: float


def never_fits(event: SchedulingEvent) -> bool:
    """Whether Karpenter found no NodePool that could ever launch a node for the pod (no NodePool is
    merely at its limits)."""
    if event.source != KARPENTER:
        return False
    text = event.message.lower()
    return not any(phrase in text for phrase in LIMIT_PHRASES)


def newest_per_pod(events: Iterable[SchedulingEvent], pods: Iterable[str]) -> dict[str, SchedulingEvent]:
    """The newest event of each of ``pods`` (other pods' events are dropped)."""
    wanted = set(pods)
    out: dict[str, SchedulingEvent] = {}
    for event in events:
        if event.pod in wanted and (event.pod not in out or event.time >= out[event.pod].time):
            out[event.pod] = event
    return out
