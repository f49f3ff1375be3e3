"""Who serves, from a kopf peering object's status (pure), and the start-up helpers."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
import subprocess
import sys

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from llm_operator.peering import Deadline, PeeringTarget, StartupError, backoff, peering_targets
from llm_operator.readiness import ServingMonitor, Verdict, combine, verdict

NOW = datetime.datetime(2026, 11, 23, 7, 0, 0, tzinfo=datetime.UTC)


def seen(seconds_ago: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds_ago)).isoformat()


def entry(priority: int, ago: float = 1.0, lifetime: int = 60) -> dict[str, object]:
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen(ago)}


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (None, "missing"),
        ({}, "absent"),
        ({"other": entry(5)}, "absent"),
        ({"me": entry(5, ago=61)}, "absent"),  # our own keep-alive expired
        ({"me": entry(5)}, "active"),
        ({"me": entry(5), "other": entry(3)}, "active"),
        ({"me": entry(5), "other": entry(9)}, "standby"),
        ({"me": entry(5), "other": entry(9, ago=120)}, "active"),  # a dead peer does not count
        ({"me": entry(5), "other": entry(5)}, "conflict"),
        ({"me": entry(5), "a": entry(9), "b": entry(9)}, "conflict"),  # the top two pause each other
        ({"me": entry(9), "a": entry(5), "b": entry(5)}, "active"),
        ({"me": entry(5), "bad": "not a mapping", "worse": {"priority": "x"}}, "active"),
    ],
)
def test_verdict_applies_kopfs_pause_rule(status: dict[str, object] | None, state: str) -> None:
    found = verdict(status, "me", NOW)
    assert found.state == state, found
    assert found.ready is (state in ("active", "standby"))


def test_verdict_names_the_peer_it_waits_for() -> None:
    found = verdict({"me": entry(5), "pod-b": entry(9)}, "me", NOW)
    assert "pod-b" in found.detail and "9 > 5" in found.detail


def test_combine_is_not_ready_when_any_namespace_is_not() -> None:
    active, standby, missing = Verdict("active", "a"), Verdict("standby", "s"), Verdict("missing", "m")
    assert combine([active, active]) == active
    assert combine([active, standby]) == standby
    assert combine([standby, missing, active]) == missing


def test_backoff_is_bounded() -> None:
    assert list(itertools.islice(backoff(), 6)) == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_peering_targets_and_hints() -> None:
    (cluster_wide,) = peering_targets("op", [])
    assert cluster_wide == PeeringTarget("op", None) and cluster_wide.kind == "ClusterKopfPeering"
    assert cluster_wide.manifest() == {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": "op"},
    }
    assert "kubectl apply -f -" in cluster_wide.create_hint()
    a, b = peering_targets("op", ["a", "b", "a"])
    assert (a.namespace, b.namespace) == ("a", "b") and a.plural == "kopfpeerings"
    assert "kubectl apply -n a -f -" in a.create_hint() and "kind: KopfPeering" in a.create_hint()


def test_monitor_says_starting_until_the_first_keep_alive_then_absent_is_a_failure() -> None:
    monitor = ServingMonitor([PeeringTarget("op", None)], "me", standalone=False)
    absent = verdict({}, "me", NOW)
    assert monitor.settle(absent).state == "starting"
    monitor.set(monitor.settle(verdict({"me": entry(5)}, "me", NOW)))
    assert monitor.current.ready and monitor.alive()
    monitor.set(monitor.settle(absent))
    assert monitor.current.state == "absent" and not monitor.current.ready
    assert monitor.alive(), "liveness holds during the grace period"


def test_retry_waits_out_a_429_then_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    answers = [ApiException(status=429, reason="storage is (re)initializing"), "ok"]

    async def attempt() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with caplog.at_level(logging.WARNING, logger="llm_operator.startup"):
        assert asyncio.run(Deadline(30).retry("the jobs", attempt, not_yet=frozenset())) == "ok"
    assert (
        "waiting for the jobs: HTTP 429 storage is (re)initializing (attempt 1; next in 0.5 s" in caplog.text
    )


def test_retry_gives_up_at_the_deadline_and_passes_other_errors_through() -> None:
    async def unavailable() -> None:
        raise ApiException(status=503, reason="Service Unavailable")

    with pytest.raises(StartupError, match="gave up after 0 s waiting for the jobs: HTTP 503"):
        asyncio.run(Deadline(0.1).retry("the jobs", unavailable, not_yet=frozenset()))

    async def forbidden() -> None:
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ApiException):
        asyncio.run(Deadline(30).retry("the jobs", forbidden, not_yet=frozenset()))


def test_operator_priority_must_be_positive() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llm_operator.cli", "operator", "--priority", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "--priority: must be >= 1, got 0" in result.stderr


def test_the_state_gauge_is_one_on_the_current_state_only() -> None:
    from prometheus_client import REGISTRY

    def gauge(state: str) -> float | None:
        return REGISTRY.get_sample_value("llmjob_operator_state", {"state": state})

    monitor = ServingMonitor([PeeringTarget("op", None)], "me", standalone=False)
    assert gauge("starting") == 1 and gauge("active") == 0
    monitor.set(verdict({"me": entry(5), "peer": entry(5)}, "me", NOW))
    assert gauge("conflict") == 1 and gauge("starting") == 0
    monitor.set(verdict({"me": entry(5)}, "me", NOW))
    assert gauge("active") == 1
    assert sum(gauge(s) or 0 for s in ("starting", "active", "standby", "conflict", "missing", "absent")) == 1
