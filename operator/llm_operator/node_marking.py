"""Nodes a worker found unhealthy (exit 78): counted, and with ``LLMJOB_MARK_UNHEALTHY_NODES`` labelled and
tainted so that no workload lands there (docs/decisions.md, H3 and H4). Best effort: a node that cannot be
marked gets a Warning Event on the job, and the job's own avoidance still keeps its workers off it."""

from __future__ import annotations

from collections.abc import Iterable

import kopf

from llm_operator import labels, metrics
from llm_operator.kube import Kube, KubeError


class NodeMarker:
    """Counts the unhealthy nodes a pass found and, when enabled, marks them."""

    def __init__(self, kube: Kube, enabled: bool) -> None:
        self.kube = kube
        self.enabled = enabled

    async def record(
        self, unhealthy: Iterable[tuple[str, str]], body: kopf.Body, logger: kopf.Logger
    ) -> None:
        """Every (node, check) of the pass: counted by check, and marked when enabled."""
        for node, check in unhealthy:
            metrics.UNHEALTHY_NODES.labels(check).inc()
            if self.enabled:
                await self.mark(node, check, body, logger)

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
