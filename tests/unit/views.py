"""PodView/NodeView factories for policy tests."""

from __future__ import annotations

from typing import Any

from llm_operator.observe import NodeView, PodView

NOW = 1_000_000.0


def pod(index: int, **kw: Any) -> PodView:
    base: dict[str, Any] = dict(
        name=f"llama-worker-{index}",
        uid=f"u{index}",
        index=index,
        attempt=0,
        phase="Running",
        ready=True,
        node=f"node-{index}",
        created=NOW - 100,
        deleting=False,
        exit_code=None,
        reason="",
        unschedulable=False,
        gpus=8,
    )
    base.update(kw)
    return PodView(**base)


def node(name: str, **kw: Any) -> NodeView:
    base: dict[str, Any] = dict(
        name=name,
        ready=True,
        not_ready_since=None,
        unschedulable=False,
        taints=(("nvidia.com/gpu", "NoSchedule", None),),
        labels=(("node.kubernetes.io/instance-type", "p5.48xlarge"),),
        allocatable_gpus=8,
    )
    base.update(kw)
    return NodeView(**base)
