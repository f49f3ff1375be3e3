"""The brake on node marking, on a real cluster (issue 55, Done-when 3): a health check that fails on 60 % of
the cluster's nodes gets at most 20 % of them marked; the operator's Events and its metric (which the alert
``LLMJobNodeHealthBraked`` reads: tests/chart/promtool/node_health_braked.yaml) say why.

The pure rules are table-tested in tests/unit/test_tenant_brake.py; this test holds what only the cluster
shows: real workers failing the pre-flight check on real (fake-kubelet) nodes, the operator with
``markNodes`` on (``LLMJOB_MARK_UNHEALTHY_NODES``) tainting nodes through the API server, and what it posts.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_operator import labels
from llm_testbed import training
from llm_testbed.local_etcd import free_port
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from support.wait import wait_for

from .conftest import _training
from .e2e_support import JOB, Training

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.timeout(420)]

TOTAL_NODES = 10
BAD_NODES = 6  # 60 % of the cluster fails the check
MARK_LIMIT = 2  # nodeHealth.maxMarkedShare's default (0.2) of 10 nodes


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def marking(
    process_cluster: LocalCluster, process_namespace: str, tmp_path: Path, metrics_port: int
) -> Iterator[Training]:
    """The e2e world; its operator marks nodes (the chart's nodeHealth.markNodes) and serves /metrics."""
    yield from _training(
        process_cluster,
        process_namespace,
        tmp_path,
        extra_env={"LLMJOB_MARK_UNHEALTHY_NODES": "true"},
        extra_args=["--metrics-port", str(metrics_port)],
    )


def _braked_total(port: int) -> float:
    """``llmjob_node_health_braked_total{limit="share"}`` as the operator serves it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as rsp:
        text = rsp.read().decode()
    for line in text.splitlines():
        if line.startswith('llmjob_node_health_braked_total{limit="share"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_tenant_a_check_failing_on_60_percent_of_nodes_marks_at_most_20(
    marking: Training, metrics_port: int
) -> None:
    kube = marking.cluster.kube
    # 1. Ten nodes; six new GPU nodes fail the pre-flight check (read-only volumes), and the healthy GPU
    # nodes are cordoned so that the job's six workers land on the six bad ones. The fixture's namespace
    # restores the cluster's nodes afterwards (added ones deleted, cordons and faults cleared).
    while len(kube.items("nodes")) < TOTAL_NODES:
        chaos.add_node(kind="gpu", kube=kube)
    gpu = sorted(
        n["metadata"]["name"] for n in kube.items("nodes") if n["metadata"]["name"].startswith("gpu")
    )
    bad, good = gpu[-BAD_NODES:], gpu[:-BAD_NODES]
    for node in bad:
        chaos.node_fault(node, "readonly-volumes", kube=kube)
    for node in good:
        chaos.taint_for_termination(node, "cordon", kube=kube)
    marking.apply(
        training.training_job(
            JOB, marking.ns, minimum=1, maximum=BAD_NODES, steps=100000, recovery="inProcess"
        )
    )

    # 2. Every bad node is reported: the job records all six (it keeps its own workers off them) ...
    def recorded() -> set[str] | None:
        found = {str(n.get("node")) for n in marking.status().get("unhealthyNodes") or []}
        return found if set(bad) <= found else None

    wait_for(recorded, 300, f"the job to record the {BAD_NODES} nodes that fail the check", interval=1.0)

    # 3. ... but the operator marks two of ten and holds the other four back, each with one Warning Event
    # that says why, counted in the metric the alert reads.
    def held_back() -> list[str] | None:
        events = kube.items("events", fields="reason=NodeHealthBraked", namespace=marking.ns)
        messages = sorted(str(e.get("message")) for e in events)
        return messages if len(messages) >= BAD_NODES - MARK_LIMIT else None

    messages = wait_for(held_back, 120, f"{BAD_NODES - MARK_LIMIT} NodeHealthBraked Events", interval=1.0)
    marked = sorted(
        n["metadata"]["name"]
        for n in kube.items("nodes")
        if any(t.get("key") == labels.UNHEALTHY_NODE for t in n.get("spec", {}).get("taints") or [])
    )
    assert len(marked) == MARK_LIMIT and set(marked) <= set(bad), marked
    assert len(messages) == BAD_NODES - MARK_LIMIT, messages
    assert all(f"{MARK_LIMIT} of {TOTAL_NODES} nodes are marked" in m for m in messages), messages
    held = {node for node in bad if any(f"node {node} " in m for m in messages)}
    assert held == set(bad) - set(marked), (held, marked)
    assert _braked_total(metrics_port) >= BAD_NODES - MARK_LIMIT
