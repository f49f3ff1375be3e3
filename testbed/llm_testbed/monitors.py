"""Prometheus scrape configs derived from the chart's ServiceMonitor and PodMonitor, for the local cluster.

kube-prometheus-stack's Prometheus Operator turns a ``PodMonitor`` into a ``kubernetes_sd_configs`` job
(role ``pod``) that keeps the pods its selector matches and the container port it names, and a
``ServiceMonitor`` into one over the selected Service's endpoints. The test bed has no Prometheus
Operator, so :func:`scrape_configs` does the same translation for the objects ``helm template`` rendered:

- the PodMonitor becomes a job over a file of pod targets (``file_sd_configs``): Debian's Prometheus is
  built without Kubernetes service discovery, so :func:`pod_targets` writes what ``role: pod`` discovery
  would find (one target per container port at ``status.podIP``, with its ``__meta_kubernetes_pod_*``
  labels) for the pods the test bed lists, and the job keeps the selected pods and port with the same
  relabelings the Prometheus Operator generates, then applies the PodMonitor's own ``relabelings``
  (``llmjob``, ``replica_index``) as written. The local pod runner gives every pod a real loopback
  address (127.1.x.y) where its processes listen, so the workers are scraped where they run;
- the ServiceMonitor's operator runs here as a local process, not a pod behind the chart's Service (an
  Endpoints object cannot hold a loopback address), so it becomes a static target at the operator's
  address, with the labels the Prometheus Operator would give it: ``job`` is the selected Service's name,
  ``namespace`` its namespace, ``endpoint`` the port name; path, ``honorLabels``, interval and timeout come
  from the ServiceMonitor's endpoint.

Pure functions: no I/O. Objects that do not fit (no selected Service, a port the Service lacks) raise
MonitorError naming the object and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Obj = Mapping[str, Any]


class MonitorError(ValueError):
    """A rendered monitor that cannot be turned into a scrape config; the message names the field."""


def label_name(key: str) -> str:
    """A Kubernetes label key as Prometheus's service discovery spells it (``a.b/c-d`` -> ``a_b_c_d``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _name(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"


def _match_labels(obj: Obj) -> dict[str, str]:
    selector = obj["spec"].get("selector") or {}
    if selector.get("matchExpressions"):
        raise MonitorError(f"{_name(obj)}: spec.selector.matchExpressions is not translated here")
    labels: dict[str, str] = selector.get("matchLabels") or {}
    if not labels:
        raise MonitorError(f"{_name(obj)}: spec.selector.matchLabels is empty (it would select everything)")
    return labels


def _namespaces(obj: Obj) -> list[str]:
    """The namespaces of spec.namespaceSelector; [] for ``any: true``."""
    selector = obj["spec"].get("namespaceSelector") or {}
    if selector.get("any"):
        return []
    names: list[str] = selector.get("matchNames") or [obj["metadata"]["namespace"]]
    return names


def _relabelings(items: Sequence[Obj]) -> list[dict[str, Any]]:
    """A monitor's ``relabelings`` (camelCase, the CRD's spelling) as Prometheus relabel_configs."""
    keys = {
        "sourceLabels": "source_labels",
        "targetLabel": "target_label",
        "separator": "separator",
        "regex": "regex",
        "replacement": "replacement",
        "action": "action",
        "modulus": "modulus",
    }
    out = []
    for item in items:
        unknown = set(item) - set(keys)
        if unknown:
            raise MonitorError(f"relabelings: unknown field(s) {sorted(unknown)}")
        out.append({keys[k]: v for k, v in item.items()})
    return out


def _timing(endpoint: Obj) -> dict[str, str]:
    found = {"scrape_interval": endpoint.get("interval"), "scrape_timeout": endpoint.get("scrapeTimeout")}
    return {k: str(v) for k, v in found.items() if v}


def pod_monitor_namespaces(monitor: Obj) -> list[str]:
    """The namespaces whose pods ``monitor`` selects from; [] means every namespace."""
    return _namespaces(monitor)


def pod_targets(pods: Sequence[Obj]) -> list[dict[str, Any]]:
    """File service-discovery groups for ``pods``, as Prometheus's ``role: pod`` discovery would label
    them: one target per container port of each pod that has an address."""
    groups = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        ip = status.get("podIP")
        if not ip:
            continue
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        base = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_ready": str(ready).lower(),
            "__meta_kubernetes_pod_node_name": pod["spec"].get("nodeName", ""),
            **{
                f"__meta_kubernetes_pod_label_{label_name(k)}": v
                for k, v in (meta.get("labels") or {}).items()
            },
        }
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                labels = {
                    **base,
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                }
                groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": labels})
    return groups


def pod_monitor_jobs(monitor: Obj, targets_file: Path) -> list[dict[str, Any]]:
    """One scrape job per podMetricsEndpoint of ``monitor``, over the pod targets in ``targets_file``
    (written by :func:`pod_targets`)."""
    labels = _match_labels(monitor)
    sd: dict[str, Any] = {"files": [str(targets_file)], "refresh_interval": "5s"}
    meta = monitor["metadata"]
    jobs = []
    for i, endpoint in enumerate(monitor["spec"]["podMetricsEndpoints"]):
        if "port" not in endpoint:
            raise MonitorError(f"{_name(monitor)}: podMetricsEndpoints[{i}].port is required here")
        keep: list[dict[str, Any]] = [
            {
                "action": "keep",
                "source_labels": [f"__meta_kubernetes_pod_label_{label_name(k)}"],
                "regex": re.escape(v),
            }
            for k, v in sorted(labels.items())
        ]
        relabel = [
            *keep,
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": re.escape(endpoint["port"]),
            },
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            *_relabelings(endpoint.get("relabelings") or []),
        ]
        jobs.append(
            {
                "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{i}",
                "honor_labels": bool(endpoint.get("honorLabels", False)),
                "metrics_path": endpoint.get("path", "/metrics"),
                **_timing(endpoint),
                "file_sd_configs": [sd],
                "relabel_configs": relabel,
            }
        )
    return jobs


def _selected_service(monitor: Obj, services: Sequence[Obj]) -> Obj:
    labels = _match_labels(monitor)
    namespaces = _namespaces(monitor)
    found = [
        s
        for s in services
        if labels.items() <= (s["metadata"].get("labels") or {}).items()
        and (not namespaces or s["metadata"]["namespace"] in namespaces)
    ]
    if len(found) != 1:
        names = [s["metadata"]["name"] for s in found]
        raise MonitorError(f"{_name(monitor)}: spec.selector selects {len(found)} rendered Services {names}")
    return found[0]


def service_monitor_jobs(monitor: Obj, services: Sequence[Obj], address: str) -> list[dict[str, Any]]:
    """One static scrape job per endpoint of ``monitor``, at ``address`` (host:port of the local process
    that the selected Service would front)."""
    service = _selected_service(monitor, services)
    ports = {p.get("name") for p in service["spec"]["ports"]}
    meta = monitor["metadata"]
    jobs = []
    for i, endpoint in enumerate(monitor["spec"]["endpoints"]):
        if endpoint.get("port") not in ports:
            raise MonitorError(
                f"{_name(monitor)}: endpoints[{i}].port {endpoint.get('port')!r} is not a port of Service "
                f"{service['metadata']['name']} ({sorted(p for p in ports if p)})"
            )
        target_labels = {
            "job": service["metadata"]["name"],
            "namespace": service["metadata"]["namespace"],
            "service": service["metadata"]["name"],
            "endpoint": endpoint["port"],
        }
        jobs.append(
            {
                "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}",
                "honor_labels": bool(endpoint.get("honorLabels", False)),
                "metrics_path": endpoint.get("path", "/metrics"),
                **_timing(endpoint),
                "static_configs": [{"targets": [address], "labels": target_labels}],
                "relabel_configs": _relabelings(endpoint.get("relabelings") or []),
            }
        )
    return jobs


def scrape_configs(
    objects: Sequence[Obj], *, pod_targets_file: Path, operator_address: str
) -> list[dict[str, Any]]:
    """Scrape jobs for every ServiceMonitor and PodMonitor among the rendered ``objects``."""
    services = [o for o in objects if o["kind"] == "Service"]
    jobs: list[dict[str, Any]] = []
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            jobs += service_monitor_jobs(obj, services, operator_address)
        elif obj["kind"] == "PodMonitor":
            jobs += pod_monitor_jobs(obj, pod_targets_file)
    if not jobs:
        raise MonitorError("the rendered chart has no ServiceMonitor or PodMonitor")
    return jobs


def rule_groups(objects: Sequence[Obj]) -> list[dict[str, Any]]:
    """The groups of every rendered PrometheusRule: the contents of a Prometheus rule file."""
    groups: list[dict[str, Any]] = [
        g for o in objects if o["kind"] == "PrometheusRule" for g in o["spec"]["groups"]
    ]
    if not groups:
        raise MonitorError("the rendered chart has no PrometheusRule (prometheusRule.enabled)")
    return groups
