"""What ``llmjob cluster status`` reports (pure: built from objects already fetched)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_testbed.localcluster import marks


@dataclass(frozen=True)
class NodeSummary:
    name: str
    role: str
    ready: bool
    gpus: int
    efa: int


def summarize_node(node: dict[str, Any]) -> NodeSummary:
    meta = node["metadata"]
    status = node.get("status", {})
    allocatable = status.get("allocatable", {})
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    return NodeSummary(
        name=meta["name"],
        role=meta.get("labels", {}).get(marks.NODE_ROLE_LABEL, "?"),
        ready=ready,
        gpus=int(allocatable.get(marks.GPU_RESOURCE, "0")),
        efa=int(allocatable.get(marks.EFA_RESOURCE, "0")),
    )


@dataclass(frozen=True)
class ClusterStatus:
    name: str
    exists: bool
    running: bool
    kubeconfig: Path
    components: dict[str, str] = field(default_factory=dict)  # name -> "running" | "stopped"
    nodes: list[NodeSummary] = field(default_factory=list)

    def lines(self) -> list[str]:
        if not self.exists:
            return [f"cluster {self.name}: does not exist"]
        state = "running" if self.running else "not running"
        out = [f"cluster {self.name}: {state}", f"  kubeconfig: {self.kubeconfig}"]
        out += [f"  {name}: {state}" for name, state in self.components.items()]
        if self.running:
            ready = sum(n.ready for n in self.nodes)
            gpus = sum(n.gpus for n in self.nodes if n.ready)
            out.append(f"  nodes: {ready}/{len(self.nodes)} Ready, {gpus} {marks.GPU_RESOURCE} allocatable")
            for n in self.nodes:
                node_state = "Ready" if n.ready else "NotReady"
                out.append(f"    {n.name:<16} {n.role:<4} {node_state:<9} gpu={n.gpus} efa={n.efa}")
        return out
