"""Steps: wake-ups from running grace periods, the nodes new workers must avoid, and pending workers
whose avoidance went stale."""

from __future__ import annotations

from llm_operator.policy.deletion import DeletionReason
from llm_operator.policy.health import NODE_DELETED
from llm_operator.policy.placement import needs_term, nodes_to_avoid, stale_avoidance
from llm_operator.steps.state import Deletion, PassState

AVOIDED_NODE_USABLE = DeletionReason.AVOIDED_NODE_USABLE.value


def observe_nodes(s: PassState) -> None:
    """Recheck when a node's grace period runs out; exclude every bad node from new pods."""
    for _, h in s.verdicts:
        s.out.wake_at(h.recheck_at)
    deleted = [p.node for p, h in s.verdicts if h.signal == NODE_DELETED]
    s.out.avoid_nodes = nodes_to_avoid(s.nodes.values(), deleted)
    s.out.avoid_hard = tuple(n for n in s.out.avoid_nodes if needs_term(s.nodes.get(n)))
    s.out.avoid_failing = tuple(n for n in s.out.avoid_nodes if (node := s.nodes.get(n)) and node.failing)


def renew_stale_avoidance(s: PassState) -> None:
    """A Pending worker made to avoid a node that is usable again is deleted; the scale step of a later
    pass re-creates it (same index, no restart counted) with the avoid terms of that pass. It does not
    count as stuck Pending meanwhile (``PassState.renewing``), so the pending timeout never shrinks the
    job for a term that no longer holds."""
    if not s.live:
        return
    for pod, h in s.verdicts:
        if h.state != "pending":
            continue
        usable = stale_avoidance(pod, s.out.avoid_nodes, s.nodes)
        if not usable:
            continue
        s.renewing.add(pod.name)
        s.out.delete.append(Deletion(pod, False, DeletionReason.AVOIDED_NODE_USABLE))
        s.out.events.append(
            (
                "Normal",
                AVOIDED_NODE_USABLE,
                f"re-creating pending {pod.name} without its term against node(s) {', '.join(usable)},"
                " usable again",
            )
        )
