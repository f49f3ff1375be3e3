"""Warnings the operator puts on jobs the API accepts but that cannot behave as users expect."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.wait import wait_for

from .kube_helpers import apply, events, job_manifest, status

pytestmark = pytest.mark.cluster
TIMEOUT = 60


def test_checkpoint_dir_not_shared_condition_and_event(cluster: Any, namespace: str, operator: Any) -> None:
    doc = job_manifest("ckpt", namespace, replicas=2, checkpointDir="/tmp/checkpoints")
    assert apply(cluster, doc).returncode == 0

    def condition() -> dict[str, Any] | None:
        conds = status(cluster, namespace, "ckpt").get("conditions") or []
        return next((c for c in conds if c["type"] == "CheckpointNotShared"), None)

    cond = wait_for(condition, TIMEOUT, "CheckpointNotShared condition")
    assert cond["status"] == "True" and "spec.checkpointDir (/tmp/checkpoints)" in cond["message"]

    def warning_events() -> list[str]:
        return [e["type"] for e in events(cluster, namespace, "CheckpointNotShared")]

    assert wait_for(warning_events, TIMEOUT, "CheckpointNotShared Warning event") == ["Warning"]
    wait_for(lambda: status(cluster, namespace, "ckpt").get("phase") == "Running", TIMEOUT, "Running")
    assert warning_events() == ["Warning"], "one Event, not one per pass"
