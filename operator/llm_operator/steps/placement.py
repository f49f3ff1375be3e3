"""Step: wake-ups from running grace periods, and the nodes new workers must avoid."""

from __future__ import annotations

from llm_operator.policy.health import NODE_DELETED
from llm_operator.policy.placement import nodes_to_avoid
from llm_operator.steps.state import PassState


def observe_nodes(s: PassState) -> None:
    """Recheck when a node's grace period runs out; exclude every bad node from new pods."""
    for _, h in s.verdicts:
        s.out.wake_at(h.recheck_at)
    deleted = [p.node for p, h in s.verdicts if h.signal == NODE_DELETED]
    s.out.avoid_nodes = nodes_to_avoid(s.nodes.values(), deleted)
