"""The Grafana dashboard: valid JSON that queries the metrics the operator and trainer expose, by name."""

from __future__ import annotations

import json
import re
from typing import Any

from chart_helpers import CHART

DASHBOARD = CHART / "dashboards" / "elastic-llm-operator.json"
OPERATOR_METRICS = {
    "llmjob_reconcile_total",
    "llmjob_reconcile_duration_seconds",
    "llmjob_reconcile_errors_total",
    "llmjob_jobs",
    "llmjob_job_replicas",
    "llmjob_failures_detected_total",
    "llmjob_replacements_total",
    "llmjob_resizes_total",
    "llmjob_reaction_seconds",
    "llmjob_pods_created_total",
}
TRAINER_METRICS = {
    "llm_trainer_tokens_per_second",
    "llm_trainer_step",
    "llm_trainer_loss",
    "llm_trainer_last_step_timestamp_seconds",
}
HISTOGRAMS = {"llmjob_reconcile_duration_seconds", "llmjob_reaction_seconds"}
METRIC = re.compile(r"\b(llmjob_[a-z_]+|llm_trainer_[a-z_]+)\b")


def _panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _queried() -> dict[str, str]:
    """metric name (histogram suffixes stripped) -> the first expression using it."""
    found: dict[str, str] = {}
    for panel in _panels():
        for target in panel["targets"]:
            for name in METRIC.findall(target["expr"]):
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                found.setdefault(base, target["expr"])
    return found


def test_every_metric_is_on_the_dashboard() -> None:
    missing = (OPERATOR_METRICS | TRAINER_METRICS) - set(_queried())
    assert not missing, f"not on any panel: {sorted(missing)}"


def test_no_panel_queries_an_unknown_metric() -> None:
    unknown = set(_queried()) - OPERATOR_METRICS - TRAINER_METRICS
    assert not unknown, f"typo or undeclared metric: {sorted(unknown)}"


def test_histograms_are_read_through_their_buckets() -> None:
    queried = _queried()
    for name in HISTOGRAMS:
        assert f"{name}_bucket" in queried[name] and "histogram_quantile" in queried[name]


def test_the_four_views_the_issue_asks_for() -> None:
    titles = " | ".join(p["title"].lower() for p in _panels())
    for topic in ("jobs by phase", "replicas", "reaction latency", "tokens per second"):
        assert topic in titles, topic


def test_panels_are_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in _panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            for var in re.findall(r"\$(\w+)", target["expr"]):
                assert var in variables | {"__rate_interval"}, (panel["title"], var)


def test_worker_panels_show_one_series_per_job_never_a_sum_over_workers() -> None:
    """Every worker exports the job's global figures (tokens/s, step): a sum over a job's workers would show
    N times the truth for N workers (issue 58), so a per-job panel takes one series: max (or an average)."""
    for panel in _panels():
        for target in panel["targets"]:
            expr = target["expr"]
            if "llm_trainer_" in expr:
                assert not re.search(r"\b(sum|count)\b", expr), (panel["title"], expr)
                assert re.search(r"\b(max|avg|min) by \(namespace, llmjob\)", expr), (panel["title"], expr)
    (throughput,) = [p for p in _panels() if "tokens per second" in p["title"].lower()]
    assert throughput["targets"][0]["expr"].startswith(
        "max by (namespace, llmjob) (llm_trainer_tokens_per_second"
    )
