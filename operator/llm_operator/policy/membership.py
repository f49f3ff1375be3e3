"""Who trains: the workers in the generation that trains now, against the workers that run.

A job must never look whole while it is not. The workers report the generation they train in (recovery
inProcess: the live membership's generation record in the job's etcd; restart: the world size in their
metrics), and ``status.members`` shows it beside READY. In process, a worker that runs and is ready while
the generation is short of the target size should be taken in at the next step boundary; one left out
for ``OUTSIDE_BOUND_SECONDS`` is a defect the operator reports (condition ``Members``, Event
``NotAMember``). Beside a full generation a worker outside is a spare, not a defect.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

OUTSIDE_BOUND_SECONDS = 120.0
"""How long a ready worker may stay outside a generation that is short of the target size (joining takes a
step boundary, a generation's forming and a state transfer: seconds)."""


@dataclass(frozen=True)
class LiveGeneration:
    """The live membership's generation as the operator last read it (recovery inProcess)."""

    pods: frozenset[str]
    """Workers (pod names) with a member in the generation."""
    outside_since: Mapping[str, float] = field(default_factory=dict)
    """Running, ready workers not in it: when each was first seen outside (operator clock)."""


def member_pods(member_ids: Iterable[str]) -> frozenset[str]:
    """Pod names of live member ids ``<pod>.<n>``."""
    return frozenset(member.rsplit(".", 1)[0] for member in member_ids)


def track_outside(
    previous: Mapping[str, float], ready: Iterable[str], members: frozenset[str], now: float
) -> dict[str, float]:
    """Since when each ready worker outside ``members`` has been seen outside (a worker that was in, or
    not ready, starts again at ``now``)."""
    return {pod: previous.get(pod, now) for pod in ready if pod not in members}


def members_from_world_size(world_size: int, nproc_per_node: int) -> int:
    """Workers in a generation of ``world_size`` processes (restart mode's metrics)."""
    return world_size // max(1, nproc_per_node)


def left_out(
    generation: LiveGeneration, target: int, now: float, bound: float = OUTSIDE_BOUND_SECONDS
) -> list[tuple[str, float]]:
    """(pod, seconds outside) of the workers left out longer than ``bound`` while the generation is short
    of ``target`` workers, by pod name; none beside a full generation (those are spares)."""
    if len(generation.pods) >= target:
        return []
    waited = ((pod, now - since) for pod, since in generation.outside_since.items())
    return sorted((pod, seconds) for pod, seconds in waited if seconds >= bound)
