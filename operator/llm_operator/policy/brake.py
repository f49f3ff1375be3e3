"""The brake on node health: no misreport (a health check or a platform condition that fails everywhere)
can mark the whole cluster or move every job at once (docs/security.md and docs/operations.md, "Alerts").

No I/O: one ``HealthBrake`` per operator run holds what it let through, and every job's pass and every node
event ask it. Two limits (the chart's nodeHealth.maxMarkedShare and maxReplacementsPerMinute):

- **share**: the nodes the operator acts on as unhealthy (those it marked, and those whose platform
  condition it obeys) never exceed ``max_marked_share`` of the cluster's nodes (rounded down, at least one);
- **rate**: nodes whose platform condition it starts obeying (their workers are replaced at once) never
  exceed ``max_replacements_per_minute`` in any minute.

Beyond either limit a node's report is held back: it is not marked, its failing condition is hidden from
the jobs' passes (their workers stay where they are) and it counts in ``llmjob_node_health_braked_total``,
with one Warning Event ``NodeHealthBraked`` per node held back. A node that recovers frees its place.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from llm_operator.observe import NodeView

WINDOW_S = 60.0
SHARE = "share"
RATE = "rate"


@dataclass(frozen=True)
class BrakeLimits:
    """The two limits (the chart's nodeHealth values)."""

    max_marked_share: float = 0.2
    """Most nodes acted on as unhealthy, as a share of the cluster's nodes (EKS auto repair stops at 20 %)."""
    max_replacements_per_minute: int = 10
    """Most nodes a minute whose platform condition starts being obeyed; 0: no limit."""


def mark_limit(total: int, share: float) -> int:
    """How many of ``total`` nodes may be acted on: the share rounded down, at least one (0 with no nodes or
    a share of 0)."""
    if total <= 0 or share <= 0:
        return 0
    return max(1, math.floor(total * share + 1e-9))


@dataclass(frozen=True)
class Held:
    """A node whose report the brake held back, and which limit did."""

    node: str
    limit: str
    """``share`` or ``rate``."""
    acted: int
    """Nodes acted on when it was held."""
    total: int
    """The cluster's nodes."""
    first: bool = True
    """The first time this node is held back by this limit (one Event then)."""

    @property
    def message(self) -> str:
        why = (
            f"{self.acted} of {self.total} nodes are marked or treated unhealthy already (the most allowed)"
            if self.limit == SHARE
            else "too many nodes were treated unhealthy in the last minute"
        )
        return f"node {self.node} reported unhealthy, not acted on: {why}; check the health checks"


class HealthBrake:
    """What the operator acts on of the unhealthy reports, over every job (see the module docstring)."""

    def __init__(self, limits: BrakeLimits | None = None) -> None:
        self.limits = limits or BrakeLimits()
        self.obeyed: set[str] = set()
        """Nodes whose failing platform condition the jobs see."""
        self.marked: dict[str, float] = {}
        """Nodes this operator marked for a health check (exit 78) in the last minute -> when: the index
        may not show their taint yet."""
        self.held: dict[str, str] = {}
        """Nodes held back now -> the limit (a node's Event is posted once while it is held)."""
        self.times: deque[float] = deque()
        """When each obeyed node was let through (the rate window)."""

    def _acted(self, marked: Collection[str]) -> int:
        return len(self.obeyed | set(self.marked) | set(marked))

    def _rate_room(self, now: float) -> bool:
        while self.times and self.times[0] <= now - WINDOW_S:
            self.times.popleft()
        rate = self.limits.max_replacements_per_minute
        return rate == 0 or len(self.times) < rate

    def _hold(self, node: str, limit: str, acted: int, total: int) -> Held:
        first = self.held.get(node) != limit
        self.held[node] = limit
        return Held(node, limit, acted, total, first)

    def filter_nodes(
        self, nodes: Mapping[str, NodeView], marked: Collection[str], now: float
    ) -> tuple[dict[str, NodeView], list[Held]]:
        """``nodes`` with the failing conditions the brake holds back cleared, and the nodes newly held.
        ``marked``: nodes that carry the operator's unhealthy taint (the index's view)."""
        failing = sorted(
            (n for n, v in nodes.items() if v.failing), key=lambda n: (nodes[n].failing[0][1] or 0.0, n)
        )
        self.obeyed &= set(failing)
        for name in list(self.held):
            if name not in nodes or (not nodes[name].failing and self.held[name] == RATE):
                del self.held[name]
        limit = mark_limit(len(nodes), self.limits.max_marked_share)
        out = dict(nodes)
        new: list[Held] = []
        for name in failing:
            if name in self.obeyed:
                continue
            acted = self._acted([m for m in marked if m != name])
            if acted >= limit:
                held = self._hold(name, SHARE, acted, len(nodes))
            elif not self._rate_room(now):
                held = self._hold(name, RATE, acted, len(nodes))
            else:
                self.obeyed.add(name)
                self.times.append(now)
                self.held.pop(name, None)
                continue
            out[name] = dataclasses.replace(nodes[name], failing=())
            if held.first:
                new.append(held)
        return out, new

    def may_mark(self, node: str, marked: Collection[str], total: int, now: float) -> Held | None:
        """Whether a node a health check found unhealthy may be marked (None), or why not; a node let
        through counts from now on, before the index shows its taint."""
        self.marked = {n: t for n, t in self.marked.items() if t > now - WINDOW_S}
        if node in self.marked or node in marked or node in self.obeyed:
            return None
        acted = self._acted(marked)
        if total > 0 and acted >= mark_limit(total, self.limits.max_marked_share):  # 0: no view of the nodes
            return self._hold(node, SHARE, acted, total)
        self.marked[node] = now
        self.held.pop(node, None)
        return None

    def obeys(self, node: str) -> bool:
        """Whether the jobs see ``node``'s failing condition (so it may be marked for it)."""
        return node in self.obeyed
