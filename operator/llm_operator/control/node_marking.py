"""Nodes a worker found unhealthy (exit 78): counted, and with ``LLMJOB_MARK_UNHEALTHY_NODES`` labelled and
tainted so that no workload lands there (docs/decisions.md, H3 and H4). Best effort: a node that cannot be
marked gets a Warning Event on the job, and the job's own avoidance still keeps its workers off it.

With marking on, a node that a platform condition reports unhealthy (``Settings.node_conditions``) is
marked the same way, with the condition's type as the value, and unmarked by the operator once no
watched condition fails any more (docs/decisions.md, K5): Karpenter then sees a taint it can reason about
and launches a node for the displaced worker. A mark from a health check (exit 78) stays until a person
removes it.

Every mark goes through the operator's one ``HealthBrake`` (``llm_operator.policy.brake``): beyond its share
of the cluster's nodes no node is marked; a Warning Event ``NodeHealthBraked`` and
``llmjob_node_health_braked_total`` say so."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from typing import Literal

import kopf

from llm_operator import labels, metrics
from llm_operator.kube import Kube, KubeError
from llm_operator.observe import NodeView
from llm_operator.policy.brake import HealthBrake, Held

Marking = tuple[Literal["mark", "unmark"], str]


def condition_mark(node: NodeView, conditions: Collection[str]) -> Marking | None:
    """What the operator's mark on ``node`` should become for its platform conditions: ("mark", the first
    failing condition) on an unmarked node that fails one, ("unmark", the mark's value) on a node the
    operator marked for a condition (``conditions``: the watched types) that fails none any more."""
    marked = node.taint(labels.UNHEALTHY_NODE) is not None
    if node.failing and not marked:
        return "mark", node.failing[0][0]
    value = node.label(labels.UNHEALTHY_NODE)
    if marked and not node.failing and value is not None and value in conditions:
        return "unmark", value
    return None


class NodeMarker:
    """Counts the unhealthy nodes a pass found and, when enabled, marks them."""

    def __init__(self, kube: Kube, enabled: bool, brake: HealthBrake | None = None) -> None:
        self.kube = kube
        self.enabled = enabled
        self.brake = brake or HealthBrake()
        self.nodes: Mapping[str, NodeView] = {}
        """The cluster's nodes as the last pass saw them (:meth:`see`): the brake's share counts them."""

    def see(self, nodes: Mapping[str, NodeView]) -> None:
        """The cluster's nodes as a pass sees them (the index)."""
        self.nodes = nodes

    def marked(self) -> set[str]:
        """Nodes that carry the operator's unhealthy taint, as the index shows them."""
        return {name for name, view in self.nodes.items() if view.taint(labels.UNHEALTHY_NODE) is not None}

    async def record(
        self, unhealthy: Iterable[tuple[str, str]], body: kopf.Body, logger: kopf.Logger
    ) -> None:
        """Every (node, check) of the pass: counted by check, and marked when enabled."""
        for node, check in unhealthy:
            metrics.UNHEALTHY_NODES.labels(check).inc()
            if not self.enabled:
                continue
            held = self.brake.may_mark(node, self.marked(), len(self.nodes), time.time())
            if held is None:
                await self.mark(node, check, body, logger)
            else:
                braked(held, body, logger)

    async def mark(self, node: str, check: str, body: kopf.Body, logger: kopf.Logger) -> None:
        """Label and taint the node (``elasticllm.dev/unhealthy=<check>``, NoSchedule)."""
        try:
            marked = await self.kube.mark_node(node, labels.UNHEALTHY_NODE, check)
        except KubeError as exc:
            message = f"could not mark node {node} unhealthy: {exc}"
            logger.warning(f"NodeMarkFailed: {message}")
            kopf.event(body, type="Warning", reason="NodeMarkFailed", message=message)
            return
        if marked:
            metrics.NODES_MARKED.inc()
            logger.info(f"NodeMarked: {node} labelled and tainted {labels.UNHEALTHY_NODE}={check}")

    async def follow_conditions(
        self, node: NodeView, conditions: Collection[str], logger: kopf.Logger
    ) -> None:
        """Mark or unmark ``node`` for its platform conditions (``condition_mark``), when enabled. A
        failure is logged: the jobs' own avoidance still keeps their workers off the node."""
        change = condition_mark(node, conditions) if self.enabled else None
        if change is None or (change[0] == "mark" and self.nodes and not self.brake.obeys(node.name)):
            return  # a condition the brake holds back (``HealthBrake.filter_nodes``) marks nothing
        action, value = change
        try:
            if action == "mark":
                done = await self.kube.mark_node(node.name, labels.UNHEALTHY_NODE, value)
            else:
                done = await self.kube.unmark_node(node.name, labels.UNHEALTHY_NODE, value)
        except KubeError as exc:
            logger.warning(f"NodeMarkFailed: could not {action} node {node.name} ({value}): {exc}")
            return
        if done and action == "mark":
            metrics.NODES_MARKED.inc()
        if done:
            logger.info(f"Node{action.capitalize()}ed: {node.name} {labels.UNHEALTHY_NODE}={value}")


def braked(held: Held, body: kopf.Body, logger: kopf.Logger) -> None:
    """A report the brake held back: counted, and the first time a Warning Event on the job."""
    metrics.NODE_HEALTH_BRAKED.labels(held.limit).inc()
    if held.first:
        logger.warning(f"NodeHealthBraked: {held.message}")
        kopf.event(body, type="Warning", reason="NodeHealthBraked", message=held.message)
