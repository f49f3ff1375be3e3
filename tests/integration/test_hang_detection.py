"""Hang detection wired through the real operator: kwok workers run no trainer, so no step ever
completes and no metrics endpoint answers; the job is restarted once, then fails (maxRestarts 1).

The end-to-end case (real trainers, one SIGSTOPped, training resumes) needs the local pod runner."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.wait import wait_for

from .kube_helpers import apply, job_manifest, status, wait_events

pytestmark = pytest.mark.cluster
TIMEOUT = 90


def test_no_progress_restarts_then_fails(cluster: Any, namespace: str, operator: Any) -> None:
    policy = {
        "nodeFailureGraceSeconds": 0,
        "resizeCooldownSeconds": 0,
        "maxRestarts": 1,
        "progressTimeoutSeconds": 2,
        "progressStartupSeconds": 2,
    }
    assert apply(cluster, job_manifest("hang", namespace, replicas=2, failurePolicy=policy)).returncode == 0
    wait_for(lambda: status(cluster, namespace, "hang").get("restarts") == 1, TIMEOUT, "one stall restart")
    st = wait_for(
        lambda: (s := status(cluster, namespace, "hang")).get("phase") == "Failed" and s, TIMEOUT, "Failed"
    )
    assert st["reason"] == "MaxRestartsExceeded" and "progressStartupSeconds 2" in st["message"]
    assert st["restarts"] == 1
    stalled = next(c for c in st["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True" and "no training step completed" in stalled["message"]
    types = [e["type"] for e in wait_events(cluster, namespace, "Stalled")]
    assert types == ["Warning"], types
