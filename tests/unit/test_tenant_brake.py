"""The brake on node health (policy.brake, control.node_marking): a health check or a platform condition that
fails on 60 % of the nodes gets 20 % of them marked and no more; a burst of conditions is obeyed at the rate
allowed. The Event, the metric and the message say why."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from llm_operator import labels, metrics
from llm_operator.control.node_marking import NodeMarker
from llm_operator.policy.brake import RATE, SHARE, BrakeLimits, HealthBrake, mark_limit

from .fake_kube import FakeKube, record_events
from .views import node

LOG = logging.getLogger("test")
BODY: Any = {}
NODES = {f"n{i}": node(f"n{i}") for i in range(10)}
FAILING = [f"n{i}" for i in range(6)]  # 60 %


def braked(limit: str) -> float:
    return metrics.NODE_HEALTH_BRAKED.labels(limit)._value.get()


@pytest.mark.parametrize(
    ("total", "share", "limit"),
    [(10, 0.2, 2), (100, 0.2, 20), (4, 0.2, 1), (0, 0.2, 0), (10, 0.0, 0), (7, 1, 7)],
)
def test_the_share_rounds_down_to_at_least_one_node(total: int, share: float, limit: int) -> None:
    assert mark_limit(total, share) == limit


def test_a_health_check_failing_on_60_percent_marks_at_most_20(monkeypatch: pytest.MonkeyPatch) -> None:
    events = record_events(monkeypatch)
    kube = FakeKube()
    marker = NodeMarker(kube, enabled=True, brake=HealthBrake(BrakeLimits(0.2, 10)))  # type: ignore[arg-type]
    marker.see(NODES)
    before = braked(SHARE)
    asyncio.run(marker.record([(n, "gpu") for n in FAILING], BODY, LOG))
    assert kube.called("mark_node") == [
        ("n0", labels.UNHEALTHY_NODE, "gpu"),
        ("n1", labels.UNHEALTHY_NODE, "gpu"),
    ]
    assert braked(SHARE) == before + 4
    held = [m for _, reason, m in events if reason == "NodeHealthBraked"]
    assert len(held) == 4 and "n2" in held[0] and "2 of 10 nodes are marked" in held[0], held
    # The next pass finds the same nodes failing: nothing more is marked, no second Event per node.
    marked = {n: node(n, taints=((labels.UNHEALTHY_NODE, "NoSchedule", None),)) for n in ("n0", "n1")}
    marker.see({**NODES, **marked})
    asyncio.run(marker.record([(n, "gpu") for n in FAILING[2:]], BODY, LOG))
    assert len(kube.called("mark_node")) == 2 and len(events) == 4
    assert braked(SHARE) == before + 8, "every report held back counts"


def test_conditions_on_60_percent_are_obeyed_on_20_and_hidden_on_the_rest() -> None:
    brake = HealthBrake(BrakeLimits(0.2, 10))
    failing = {n: node(n, failing=(("AcceleratedHardwareReady", float(i)),)) for i, n in enumerate(FAILING)}
    seen, held = brake.filter_nodes({**NODES, **failing}, (), 100.0)
    assert sorted(n for n, v in seen.items() if v.failing) == ["n0", "n1"], "the oldest reports first"
    assert [(h.node, h.limit) for h in held] == [(n, SHARE) for n in FAILING[2:]]
    again, held_again = brake.filter_nodes({**NODES, **failing}, (), 101.0)
    assert held_again == [] and sorted(n for n, v in again.items() if v.failing) == ["n0", "n1"]
    recovered = {**NODES, **{n: v for n, v in failing.items() if n != "n0"}}
    seen, _ = brake.filter_nodes(recovered, (), 102.0)
    assert sorted(n for n, v in seen.items() if v.failing) == ["n1", "n2"], "a recovered node frees its place"
    assert brake.obeys("n2") and not brake.obeys("n0")


def test_a_burst_of_conditions_is_obeyed_at_the_allowed_rate() -> None:
    brake = HealthBrake(BrakeLimits(1.0, 3))
    failing = {n: node(n, failing=(("NetworkingReady", 0.0),)) for n in FAILING}
    seen, held = brake.filter_nodes({**NODES, **failing}, (), 0.0)
    assert sum(1 for v in seen.values() if v.failing) == 3
    assert {h.limit for h in held} == {RATE} and "in the last minute" in held[0].message
    seen, _ = brake.filter_nodes({**NODES, **failing}, (), 61.0)
    assert sum(1 for v in seen.values() if v.failing) == 6, "the next minute has room for the rest"
