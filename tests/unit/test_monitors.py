"""llm_testbed.monitors: the chart's monitors as Prometheus scrape jobs, and pods as discovered targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from llm_testbed.monitors import MonitorError, pod_targets, scrape_configs

POD_MONITOR: dict[str, Any] = {
    "kind": "PodMonitor",
    "metadata": {"name": "trainers", "namespace": "ops"},
    "spec": {
        "selector": {"matchLabels": {"elasticllm.dev/role": "worker"}},
        "namespaceSelector": {"matchNames": ["ml"]},
        "podMetricsEndpoints": [
            {
                "port": "metrics",
                "path": "/metrics",
                "interval": "5s",
                "relabelings": [
                    {
                        "sourceLabels": ["__meta_kubernetes_pod_label_elasticllm_dev_job_name"],
                        "targetLabel": "llmjob",
                    }
                ],
            }
        ],
    },
}
SERVICE: dict[str, Any] = {
    "kind": "Service",
    "metadata": {"name": "op-metrics", "namespace": "ops", "labels": {"app": "op", "x": "y"}},
    "spec": {"ports": [{"name": "metrics", "port": 9090}]},
}
SERVICE_MONITOR: dict[str, Any] = {
    "kind": "ServiceMonitor",
    "metadata": {"name": "op", "namespace": "ops"},
    "spec": {
        "selector": {"matchLabels": {"app": "op"}},
        "endpoints": [{"port": "metrics", "path": "/metrics", "honorLabels": True, "interval": "1s"}],
    },
}


def _pod(name: str, ip: str | None, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "labels": {"elasticllm.dev/role": "worker"}},
        "spec": {
            "nodeName": "gpu-node-0",
            "containers": [{"name": "trainer", "ports": [{"name": "metrics", "containerPort": 9400}]}],
        },
        "status": {"podIP": ip, "phase": phase} if ip else {"phase": "Pending"},
    }


def test_pods_become_targets_labelled_as_pod_discovery_does() -> None:
    (group,) = pod_targets([_pod("w-0", "127.1.0.3"), _pod("w-1", None)])
    assert group["targets"] == ["127.1.0.3:9400"]
    labels = group["labels"]
    assert labels["__meta_kubernetes_pod_label_elasticllm_dev_role"] == "worker"
    assert labels["__meta_kubernetes_pod_container_port_name"] == "metrics"
    assert labels["__meta_kubernetes_namespace"] == "ml" and labels["__meta_kubernetes_pod_name"] == "w-0"


def test_the_monitors_become_scrape_jobs(tmp_path: Path) -> None:
    file = tmp_path / "pods.json"
    pods, operator = scrape_configs(
        [SERVICE, POD_MONITOR, SERVICE_MONITOR], pod_targets_file=file, operator_address="127.0.0.1:1"
    )
    assert pods["file_sd_configs"][0]["files"] == [str(file)] and pods["scrape_interval"] == "5s"
    relabel = pods["relabel_configs"]
    assert {"action": "keep", "source_labels": ["__meta_kubernetes_pod_label_elasticllm_dev_role"],
            "regex": "worker"} in relabel  # fmt: skip
    assert relabel[-1] == {
        "source_labels": ["__meta_kubernetes_pod_label_elasticllm_dev_job_name"],
        "target_label": "llmjob",
    }, "the monitor's own relabelings come last, as written"
    assert operator["honor_labels"] is True
    assert operator["static_configs"][0]["labels"]["job"] == "op-metrics"
    assert operator["static_configs"][0]["targets"] == ["127.0.0.1:1"]


def test_a_monitor_that_does_not_fit_names_the_field(tmp_path: Path) -> None:
    bad = {**SERVICE_MONITOR, "spec": {**SERVICE_MONITOR["spec"], "endpoints": [{"port": "http"}]}}
    with pytest.raises(
        MonitorError, match=r"endpoints\[0\]\.port 'http' is not a port of Service op-metrics"
    ):
        scrape_configs([SERVICE, bad], pod_targets_file=tmp_path / "f", operator_address="a:1")
    with pytest.raises(MonitorError, match="no ServiceMonitor or PodMonitor"):
        scrape_configs([SERVICE], pod_targets_file=tmp_path / "f", operator_address="a:1")
