"""Unhealthy nodes: always counted, marked only when enabled, a failed mark is a Warning Event."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from llm_operator import labels, metrics
from llm_operator.control.node_marking import Marking, NodeMarker, condition_mark
from llm_operator.observe import NodeView

from .fake_kube import FakeKube, record_events

LOG = logging.getLogger("test")
BODY: Any = {}


def count(check: str) -> float:
    return metrics.UNHEALTHY_NODES.labels(check)._value.get()


def test_disabled_counts_and_marks_nothing() -> None:
    kube = FakeKube()
    before = count("gpu-count")
    asyncio.run(NodeMarker(kube, enabled=False).record([("n1", "gpu-count")], BODY, LOG))  # type: ignore[arg-type]
    assert count("gpu-count") == before + 1 and kube.calls == []


def test_enabled_labels_and_taints_each_node() -> None:
    kube = FakeKube()
    marker = NodeMarker(kube, enabled=True)  # type: ignore[arg-type]
    asyncio.run(marker.record([("n1", "efa"), ("n2", "nccl")], BODY, LOG))
    assert kube.called("mark_node") == [
        ("n1", labels.UNHEALTHY_NODE, "efa"),
        ("n2", labels.UNHEALTHY_NODE, "nccl"),
    ]


def test_a_mark_that_fails_is_a_warning_event_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    events = record_events(monkeypatch)
    kube = FakeKube()
    kube.fail.add("mark_node")
    asyncio.run(NodeMarker(kube, enabled=True).record([("n1", "efa")], BODY, LOG))  # type: ignore[arg-type]
    assert events.reasons() == ["NodeMarkFailed"] and "n1" in events[0][2]


def _node(failing: tuple[str, ...] = (), mark: str | None = None) -> NodeView:
    taints = ((labels.UNHEALTHY_NODE, "NoSchedule", None),) if mark else ()
    return NodeView(
        name="n1",
        ready=True,
        not_ready_since=None,
        unschedulable=False,
        taints=taints,
        labels=((labels.UNHEALTHY_NODE, mark),) if mark else (),
        allocatable_gpus=8,
        failing=tuple((kind, None) for kind in failing),
    )


WATCHED = ("AcceleratedHardwareReady", "NetworkingReady")


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (_node(), None),
        (_node(("NetworkingReady",)), ("mark", "NetworkingReady")),
        (_node(("NetworkingReady",), mark="efa"), None),  # marked already (by a health check): left alone
        (_node(mark="AcceleratedHardwareReady"), ("unmark", "AcceleratedHardwareReady")),
        (_node(("NetworkingReady",), mark="AcceleratedHardwareReady"), None),  # another still fails
        (_node(mark="efa"), None),  # a health check's mark stays until a person removes it
    ],
)
def test_condition_mark_follows_the_platform_conditions(node: NodeView, expected: Marking | None) -> None:
    assert condition_mark(node, WATCHED) == expected


def test_follow_conditions_marks_and_unmarks_only_when_enabled() -> None:
    kube = FakeKube()
    asyncio.run(NodeMarker(kube, enabled=False).follow_conditions(_node(("NetworkingReady",)), WATCHED, LOG))  # type: ignore[arg-type]
    assert kube.calls == []
    marker = NodeMarker(kube, enabled=True)  # type: ignore[arg-type]
    asyncio.run(marker.follow_conditions(_node(("NetworkingReady",)), WATCHED, LOG))
    asyncio.run(marker.follow_conditions(_node(mark="NetworkingReady"), WATCHED, LOG))
    assert [name for name, _ in kube.calls] == ["mark_node", "unmark_node"]
    assert kube.called("unmark_node") == [("n1", labels.UNHEALTHY_NODE, "NetworkingReady")]
