"""A real Prometheus over a training job on the local cluster (issue 42).

Everything Prometheus is given comes from the chart, rendered with ``helm template``: its scrape jobs are
the chart's ServiceMonitor (the operator) and PodMonitor (the workers) translated by
:mod:`llm_testbed.monitors` (the workers listed from the apiserver into a file of pod targets at their pod
runner addresses, labelled as Prometheus's pod discovery would, and kept by the PodMonitor's selector and
relabelings; the operator, a local process here, at its metrics port), its rule file is the chart's
PrometheusRule with a short ``for`` set through values, and the queries checked are those of the Grafana
dashboard ConfigMap the chart ships. Every wait asks Prometheus's HTTP API (``/api/v1/alerts``,
``/api/v1/query``).

The story: a job of 2 workers trains, and the dashboard's throughput panel shows the job's own rate (what
each worker's trainer exports), not twice it; worker-1's node goes NotReady and the 2-GPU-node cluster has
no other node for the replacement, so the job is held at 1 of 2: LLMJobBelowDesiredSize goes pending, then
firing; the node returns, the job is whole again and the alert resolves. Then every dashboard query has
data over the story's time range (the reaction latency panel included: the loss was reacted to).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart.chart_helpers import Helm, one
from llm_testbed import monitors, training
from llm_testbed.local_etcd import free_port
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.localcluster.tools import ensure
from llm_testbed.prometheus_server import PodTargets, PrometheusServer
from support.wait import wait_for

from .conftest import _training
from .e2e_support import JOB, STEP_TIMEOUT, Training

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.timeout(420)]

ALERT = "LLMJobBelowDesiredSize"
FOR_SECONDS = 8
SCRAPE = "2s"  # the monitors' interval and timeout: a worker starved of CPU may need more than 1 s to answer
RELEASE_NAMESPACE = "llm-system"
MONITORING = ("monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor")


def _values(namespace: str) -> dict[str, Any]:
    """The chart's values for this test: monitors and rules on, 1 s scrapes, a short `for`."""
    return {
        "watch": {"allNamespaces": False, "namespaces": [namespace]},
        "metrics": {
            "serviceMonitor": {"enabled": True, "interval": SCRAPE, "scrapeTimeout": SCRAPE},
            "trainerPodMonitor": {"enabled": True, "interval": SCRAPE},
        },
        "prometheusRule": {"enabled": True, "alerts": {"belowDesiredSize": {"for": f"{FOR_SECONDS}s"}}},
        "grafanaDashboard": {"enabled": True},
    }


@pytest.fixture
def rendered(process_namespace: str, tmp_path: Path) -> list[dict[str, Any]]:
    home = tmp_path / "helm"
    home.mkdir()
    helm = Helm(ensure(["helm"])["helm"], home)
    return helm.template(_values(process_namespace), namespace=RELEASE_NAMESPACE, api_versions=MONITORING)


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def train(
    process_cluster: LocalCluster, process_namespace: str, tmp_path: Path, metrics_port: int
) -> Iterator[Training]:
    """The e2e world with the operator serving /metrics on ``metrics_port``."""
    yield from _training(
        process_cluster, process_namespace, tmp_path, extra_args=["--metrics-port", str(metrics_port)]
    )


@pytest.fixture
def prometheus(
    process_cluster: LocalCluster, rendered: list[dict[str, Any]], metrics_port: int, tmp_path: Path
) -> Iterator[PrometheusServer]:
    folder = tmp_path / "prometheus"
    targets = folder / "pod-targets.json"
    jobs = monitors.scrape_configs(
        rendered, pod_targets_file=targets, operator_address=f"127.0.0.1:{metrics_port}"
    )
    namespaces = monitors.pod_monitor_namespaces(one(rendered, "PodMonitor"))
    assert namespaces, "the test's values name the watched namespace"
    with (
        PodTargets(process_cluster.kube, namespaces, targets),
        PrometheusServer(folder, jobs, monitors.rule_groups(rendered)) as server,
    ):
        yield server


def _seconds(duration: str) -> float:
    return float(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


def _grafana(expr: str, variables: dict[str, str]) -> str:
    """``expr`` with the dashboard's variables replaced as Grafana would (``$name`` and ``${name}``)."""
    for name, value in variables.items():
        expr = re.sub(rf"\$(\{{{name}\}}|{name}\b)", value, expr)
    assert "$" not in expr, f"a dashboard variable this test does not know: {expr}"
    return expr


def _has_data(result: list[dict[str, Any]]) -> bool:
    return any(v[1] not in ("NaN", "+Inf", "-Inf") for series in result for v in series["values"])


def _state(server: PrometheusServer) -> str:
    found = server.alerts(ALERT)
    return str(found[0]["state"]) if found else "inactive"


def test_prometheus_scrapes_the_chart_targets_alerts_and_dashboard_queries_have_data(
    train: Training, prometheus: PrometheusServer, rendered: list[dict[str, Any]], process_namespace: str
) -> None:
    start = time.time()
    ns = process_namespace
    selector = f'namespace="{ns}", llmjob="{JOB}"'
    train.apply(training.training_job(JOB, ns, minimum=1, maximum=2, steps=5000))

    def scraped() -> list[dict[str, Any]] | None:
        up = [t for t in prometheus.targets() if t["health"] == "up"]
        workers = [t for t in up if t["labels"].get("llmjob") == JOB and t["labels"]["namespace"] == ns]
        operator = [t for t in up if t["labels"]["job"].endswith("-metrics")]
        return up if len(workers) == 2 and len(operator) == 1 else None

    wait_for(scraped, STEP_TIMEOUT, "Prometheus scraping the operator and both workers", interval=1)
    # The operator alerts' default selector finds the target the ServiceMonitor made, and it leads.
    rules = {r.get("alert"): r["expr"] for g in monitors.rule_groups(rendered) for r in g["rules"]}
    for quiet in ("LLMJobOperatorDown", "LLMJobOperatorNoLeader"):
        assert not prometheus.query(rules[quiet]), f"{quiet} would fire with the operator up and leading"
    assert prometheus.query(rules["LLMJobOperatorDown"].replace("absent(", "(")), "it selects the operator"
    assert prometheus.query(rules["LLMJobOperatorNoLeader"].replace(" < 1", " == 1")), "one replica leads"
    wait_for(
        lambda: prometheus.query(f"count(llm_trainer_step{{{selector}}} > 0) == 2"),
        STEP_TIMEOUT,
        "both workers' training steps in Prometheus",
        interval=1,
    )
    _check_throughput(prometheus, rendered, ns, selector)
    # Whole: ready == desired, so the alert (which may have fired while the workers started) is inactive.
    wait_for(lambda: _state(prometheus) == "inactive", 60, f"{ALERT} inactive while the job is whole", 0.5)

    node = train.worker_on(1)["spec"]["nodeName"]
    chaos.node_not_ready(node, kube=train.cluster.kube, wait=False)
    lost_at = time.monotonic()
    wait_for(lambda: _state(prometheus) == "pending", 90, f"{ALERT} pending after {node} was lost", 0.25)
    pending_at = time.monotonic()
    alert = prometheus.alerts(ALERT)[0]
    assert alert["labels"]["namespace"] == ns and alert["labels"]["llmjob"] == JOB, alert
    wait_for(lambda: _state(prometheus) == "firing", 60, f"{ALERT} firing after for={FOR_SECONDS}s", 0.25)
    firing_at = time.monotonic()
    assert firing_at - pending_at >= FOR_SECONDS - 1.5, "firing only after `for` (values) has passed"
    assert prometheus.query(f'llmjob_job_replicas{{{selector}, kind="ready"}} == 1'), "held at 1 of 2"

    chaos.node_ready(node, kube=train.cluster.kube)
    wait_for(lambda: _state(prometheus) == "inactive", STEP_TIMEOUT, f"{ALERT} resolved when whole", 0.5)
    ready, desired = (f'llmjob_job_replicas{{{selector}, kind="{k}"}}' for k in ("ready", "desired"))
    whole = f"{ready} == on() {desired}"
    assert prometheus.query(whole), "resolved because ready == desired again"
    print(
        f"{ALERT}: pending {pending_at - lost_at:.1f}s after the loss, "
        f"firing {firing_at - pending_at:.1f}s later"
    )

    _check_dashboard(prometheus, rendered, ns, start)


def _dashboard(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    """The dashboard of the ConfigMap the chart renders."""
    (config_map,) = [
        o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")
    ]
    (text,) = config_map["data"].values()
    dashboard: dict[str, Any] = json.loads(text)
    return dashboard


def _check_throughput(
    prometheus: PrometheusServer, rendered: list[dict[str, Any]], ns: str, selector: str
) -> None:
    """The throughput panel shows the job's rate: the figure a worker's trainer exports itself (every
    worker exports the job's global rate), never the sum over the job's 2 workers (issue 58)."""
    (panel,) = [p for p in _dashboard(rendered)["panels"] if "tokens per second" in p["title"].lower()]
    shown = _grafana(panel["targets"][0]["expr"], {"namespace": ns})
    workers = f"llm_trainer_tokens_per_second{{{selector}}}"
    wait_for(lambda: prometheus.query(f"count({workers} > 0) == 2"), 60, "both workers' tokens/s", 1)
    # One query each, so that every side is read at the same instant.
    assert prometheus.query(f"count({workers} == on(namespace, llmjob) group_left() ({shown})) >= 1"), (
        "the panel equals one worker's own figure"
    )
    assert prometheus.query(f"({shown}) < on(namespace, llmjob) sum by (namespace, llmjob) ({workers})"), (
        "the panel is not the sum over the workers"
    )


def _check_dashboard(
    prometheus: PrometheusServer, rendered: list[dict[str, Any]], ns: str, start: float
) -> None:
    """Every query of the dashboard ConfigMap the chart renders has data over [start, now]."""
    dashboard = _dashboard(rendered)
    step = 2.0
    scrape = _seconds(SCRAPE)
    variables = {
        "namespace": ns,
        # Grafana's $__rate_interval: max($__interval + scrape interval, 4 * scrape interval).
        "__rate_interval": f"{max(step + scrape, 4 * scrape):g}s",
    }
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"]["query"])
            assert found, variable["query"]
            metric, label = found.groups()
            assert ns in prometheus.label_values(label, metric, start), variable["name"]
    end = time.time()
    queries = [
        (panel["title"], _grafana(target["expr"], variables))
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    assert len(queries) >= 10, queries
    empty = [(title, q) for title, q in queries if not _has_data(prometheus.query_range(q, start, end, step))]
    assert not empty, f"dashboard queries without data: {empty}"
