"""Which nodes new workers must avoid."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator.policy.placement import node_signal, nodes_to_avoid

from .views import NOW, node


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, None),
        ({"taints": (("karpenter.sh/disruption", "NoSchedule", NOW),)}, "NodeTerminating"),
        ({"taints": (("aws-node-termination-handler/spot-itn", "NoSchedule", None),)}, "NodeTerminating"),
        ({"unschedulable": True}, "NodeCordoned"),
        ({"ready": False, "not_ready_since": NOW - 1}, "NodeNotReady"),
        ({"ready": False, "not_ready_since": None}, "NodeNotReady"),
        ({"taints": (("node.kubernetes.io/unreachable", "NoExecute", NOW),)}, "NodeNotReady"),
        ({"taints": (("nvidia.com/gpu", "NoSchedule", None),)}, None),
    ],
)
def test_node_signal(kw: dict[str, Any], expected: str | None) -> None:
    assert node_signal(node("n", **kw)) == expected


def test_nodes_to_avoid_sorted_with_deleted_names() -> None:
    nodes = [
        node("b", unschedulable=True),
        node("a"),
        node("c", ready=False, not_ready_since=NOW),
    ]
    assert nodes_to_avoid(nodes, ["z", ""]) == ("b", "c", "z")
    assert nodes_to_avoid([node("a")]) == ()
