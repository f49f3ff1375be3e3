"""The managed rendezvous server's NetworkPolicy, as the apiserver stores it (the apiserver validates it)."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator import labels

from tests.support.wait import wait_for

from .kube_helpers import apply, job_manifest

pytestmark = pytest.mark.cluster
TIMEOUT = 60


def test_rendezvous_network_policy_exists_with_the_right_shape(
    cluster: Any, namespace: str, operator: Any
) -> None:
    assert apply(cluster, job_manifest("fenced", namespace, replicas=2)).returncode == 0
    policy = wait_for(
        lambda: cluster.kube.get("networkpolicy", "fenced-rdzv", namespace),
        TIMEOUT,
        "NetworkPolicy fenced-rdzv",
    )
    uid = cluster.kube.get("llmtrainingjob", "fenced", namespace)["metadata"]["uid"]  # type: ignore[index]
    owner = policy["metadata"]["ownerReferences"][0]
    assert owner["uid"] == uid and owner["controller"] is True
    spec = policy["spec"]
    server = cluster.kube.get("deployment", "fenced-rdzv", namespace)
    assert server is not None
    assert spec["podSelector"]["matchLabels"] == server["spec"]["selector"]["matchLabels"]
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 2379}]
    workers, operator_peer = rule["from"]
    assert workers["podSelector"]["matchLabels"] == {labels.JOB_NAME: "fenced", labels.ROLE: "worker"}
    assert operator_peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "elastic-llm-operator"
    }
    # Deleting the job garbage-collects the policy with the rest (ownerReferences).
    cluster.kubectl("delete", "llmjob/fenced", "-n", namespace, "--wait=true")
    wait_for(
        lambda: cluster.kube.get("networkpolicy", "fenced-rdzv", namespace) is None,
        TIMEOUT,
        "NetworkPolicy garbage-collected",
    )
