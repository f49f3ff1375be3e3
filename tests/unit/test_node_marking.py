"""Unhealthy nodes: always counted, marked only when enabled, a failed mark is a Warning Event."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from llm_operator import labels, metrics
from llm_operator.node_marking import NodeMarker

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
