"""status.py and kwokctl.readable: what people read about a cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_testbed.localcluster import nodes
from llm_testbed.localcluster.cluster import LocalCluster
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


def test_a_cluster_stays_where_it_was_named_when_the_cache_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control-plane supervisor's thread reads a cluster's pid files while other tests run: a test that
    points LLMJOB_CACHE_DIR elsewhere must not make it look in (and start components from) another folder."""
    monkeypatch.setenv("LLMJOB_CACHE_DIR", str(tmp_path / "first"))
    cluster = LocalCluster("pinned", tool_paths={"kubectl": Path("/bin/true")})
    monkeypatch.setenv("LLMJOB_CACHE_DIR", str(tmp_path / "second"))
    first = tmp_path / "first" / "kwok"
    assert cluster.workdir == first / "clusters" / "pinned"
    assert cluster.logs_dir.parent == cluster.kubeconfig.parent == cluster.workdir
    assert cluster.config_path.parent == first / "configs"
    assert cluster._kwokctl.env()["KWOK_WORKDIR"] == str(first)
