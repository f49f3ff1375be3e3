"""The chart's PrometheusRule: rendered as shipped, checked by promtool, and unit-tested with promtool.

The rules under test are the chart's own render (`helm template --set prometheusRule.enabled=true`, default
values otherwise), never a copy. `promtool test rules` runs the files in tests/chart/promtool/, which feed
series and say when each alert must and must not fire. promtool comes from Debian's `prometheus` package,
installed by `llm_testbed.promtool.ensure` when missing (root and apt-get; otherwise a one-line error).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import CHART, ROOT, Helm, by_kind, one
from llm_testbed import promtool as promtool_setup

UNIT_TESTS = Path(__file__).parent / "promtool"
OPERATIONS = ROOT / "docs" / "operations.md"
SCRAPED = {"serviceMonitor": {"enabled": True}, "trainerPodMonitor": {"enabled": True}}
"""What the alerts read: the chart refuses operator alerts nothing scrapes (test_chart_doc_tables.py)."""
ENABLED = {"prometheusRule": {"enabled": True}, "metrics": SCRAPED}
ALERTS = {
    "LLMJobBelowDesiredSize",
    "LLMJobWaitingForCapacity",
    "LLMJobNoTrainingStep",
    "LLMJobLowGoodput",
    "LLMJobSlowFailureReaction",
    "LLMJobReconcileErrors",
    "LLMJobNodesFailingHealthChecks",
    "LLMJobNodeHealthBraked",
    "LLMJobMonitoringRuleFiring",
    "LLMJobOperatorDown",
    "LLMJobOperatorNoLeader",
}


@pytest.fixture(scope="session")
def promtool() -> Path:
    return promtool_setup.ensure()


def _groups(helm: Helm, values: dict[str, Any]) -> list[dict[str, Any]]:
    rule = one(helm.template(values), "PrometheusRule")
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def _rules(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for g in groups for r in g["rules"]]


def _write_rules(helm: Helm, values: dict[str, Any], folder: Path) -> Path:
    """The rendered groups as a Prometheus rules file, beside copies of the unit-test files."""
    folder.mkdir(parents=True, exist_ok=True)
    for test in UNIT_TESTS.glob("*.yaml"):
        shutil.copy(test, folder / test.name)
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": _groups(helm, values)}, sort_keys=False))
    return path


def _promtool(binary: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _unit_test_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.yaml") if p.name != "rules.yaml")


def test_no_prometheus_rule_by_default(helm: Helm) -> None:
    assert not by_kind(helm.template({}), "PrometheusRule")


def test_helm_lint_with_the_rule(helm: Helm) -> None:
    result = helm.run("lint", "--strict", str(CHART), "-f", str(helm.values_file(ENABLED)))
    assert "0 chart(s) failed" in result.stdout


def test_enabled_renders_every_alert_with_severity_summary_and_runbook(helm: Helm) -> None:
    values = {
        "prometheusRule": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "alertLabels": {"team": "ml-platform"},
        },
        "metrics": SCRAPED,
    }
    rule = one(helm.template(values), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = _rules(rule["spec"]["groups"])
    assert {r["alert"] for r in rules} == ALERTS
    headings = set(re.findall(r"^### (\w+)$", OPERATIONS.read_text(), flags=re.MULTILINE))
    for r in rules:
        assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
        assert r["labels"]["team"] == "ml-platform", r["alert"]
        assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
        url = r["annotations"]["runbook_url"]
        assert url.endswith(f"docs/operations.md#{r['alert'].lower()}"), url
        assert r["alert"] in headings, f"docs/operations.md has no runbook section '### {r['alert']}'"


def test_alerts_and_thresholds_follow_the_values(helm: Helm) -> None:
    values = {
        "prometheusRule": {
            "enabled": True,
            "operatorSelector": 'job="llm-operator"',
            "alerts": {
                "lowGoodput": {"enabled": False},
                "belowDesiredSize": {"for": "30m", "severity": "critical"},
                "noTrainingStep": {"minutes": 45},
            },
        }
    }
    rules = {r["alert"]: r for r in _rules(_groups(helm, values))}
    assert "LLMJobLowGoodput" not in rules
    assert rules["LLMJobBelowDesiredSize"]["for"] == "30m"
    assert rules["LLMJobBelowDesiredSize"]["labels"]["severity"] == "critical"
    assert (
        "[45m]" in rules["LLMJobNoTrainingStep"]["expr"]
        and "time() - 2700" in rules["LLMJobNoTrainingStep"]["expr"]
    )
    assert 'up{job="llm-operator"}' in rules["LLMJobOperatorDown"]["expr"]


def _operator_series() -> set[str]:
    """Every series name the operator exports (counters as _total, histograms as _bucket/_sum/_count)."""
    from llm_operator import metrics  # noqa: F401  (registers the operator's metrics)
    from prometheus_client import REGISTRY

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {f.name + end for f in REGISTRY.collect() for end in suffixes.get(f.type, ())}


def test_the_rules_query_only_series_that_exist(helm: Helm) -> None:
    exprs = " ".join(r["expr"] for r in _rules(_groups(helm, ENABLED)))
    operator = set(re.findall(r"\bllmjob_[a-z_]+\b", exprs))
    unknown = operator - _operator_series()
    assert operator and not unknown, sorted(unknown)
    exporter = (ROOT / "runtime" / "llm_elastic" / "metrics.py").read_text()
    for name in set(re.findall(r"\bllm_trainer_([a-z_]+)\b", exprs)):
        assert f'"{name}":' in exporter, f"llm_trainer_{name} is not a gauge of llm_elastic.metrics.Exporter"


def test_promtool_checks_the_rendered_rules(helm: Helm, promtool: Path, tmp_path: Path) -> None:
    rules = _write_rules(helm, ENABLED, tmp_path)
    result = _promtool(promtool, "check", "rules", rules.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout, result.stdout


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_must_not_fire() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS.glob("*.yaml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fired == ALERTS, f"alerts no unit test fires: {sorted(ALERTS - fired)}"
    assert quiet == ALERTS, f"alerts with no moment at which they must not fire: {sorted(ALERTS - quiet)}"


def test_promtool_unit_tests_pass_on_the_rendered_rules(helm: Helm, promtool: Path, tmp_path: Path) -> None:
    _write_rules(helm, ENABLED, tmp_path)
    result = _promtool(promtool, "test", "rules", *_unit_test_files(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unit_tests_fail_when_a_threshold_changes(helm: Helm, promtool: Path, tmp_path: Path) -> None:
    """The unit tests pin the shipped defaults: a longer `for` makes the below-size test fail."""
    values = {
        "prometheusRule": {"enabled": True, "alerts": {"belowDesiredSize": {"for": "30m"}}},
        "metrics": SCRAPED,
    }
    _write_rules(helm, values, tmp_path)
    result = _promtool(promtool, "test", "rules", "below_desired_size.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "LLMJobBelowDesiredSize" in result.stdout + result.stderr
