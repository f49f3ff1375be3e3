"""status.py and kwokctl.readable: what people read about a cluster."""

from __future__ import annotations

import json
from pathlib import Path

from llm_testbed.localcluster import nodes
from llm_testbed.localcluster.kwokctl import readable
from llm_testbed.localcluster.status import ClusterStatus, summarize_node


def _ready(node: dict, ready: bool) -> dict:  # type: ignore[type-arg]
    node["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "Unknown"}]
    return node


def test_status_lines_count_ready_nodes_and_gpus() -> None:
    made = nodes.cluster_nodes(2, 1)
    summaries = [summarize_node(_ready(made[0], True)), summarize_node(_ready(made[1], False)),
                 summarize_node(_ready(made[2], True))]  # fmt: skip
    status = ClusterStatus("c", True, True, Path("/k"), {"etcd": "running"}, summaries)
    lines = status.lines()
    assert lines[:3] == ["cluster c: running", "  kubeconfig: /k", "  etcd: running"]
    assert "  nodes: 2/3 Ready, 8 nvidia.com/gpu allocatable" in lines
    assert any("gpu-node-1" in line and "NotReady" in line for line in lines)


def test_status_of_missing_cluster() -> None:
    assert ClusterStatus("gone", False, False, Path("/k")).lines() == ["cluster gone: does not exist"]


def test_kwokctl_log_lines_are_made_readable() -> None:
    line = json.dumps({"level": "INFO", "msg": "Cluster is started", "elapsed": {"human": "5.3s"}})
    assert readable(line) == "Cluster is started (5.3s)"
    warn = json.dumps({"level": "WARN", "msg": "Cluster is not served yet", "err": "deadline"})
    assert readable(warn) == "WARN: Cluster is not served yet: deadline"
    assert readable("plain text\n") == "plain text"
