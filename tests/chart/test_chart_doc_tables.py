"""What docs/operations.md says of the chart is what the chart renders (issue 58).

- The RBAC and alert tables are `llmjob doc-tables`'s, generated from `helm template` of the chart.
- Alerts that read series nothing scrapes: the chart refuses the operator's (naming them), and NOTES.txt
  warns about the workers'; which alert reads what is checked against each alert's expression.
- The chart's default runtime has the failure policy of the example runtime, as docs/platform.md says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import CHART, RELEASE, ROOT, Helm, by_kind
from llm_testbed import doctables
from llm_testbed.doctables import chart

DOC = (ROOT / doctables.DOC).read_text()


@pytest.fixture(scope="module")
def rows() -> list[chart.Row]:
    return chart.rbac_rows(CHART)


@pytest.fixture(scope="module")
def needs() -> dict[str, set[str]]:
    """Alert -> the scrapes its expression reads, from the rule rendered with every alert on."""
    return {r["alert"]: chart.needs(r["expr"]) for r in chart.rendered_alerts(CHART)}


def test_the_rbac_table_is_what_the_rendered_chart_generates(rows: list[chart.Row]) -> None:
    assert doctables.committed(DOC, "rbac") == chart.rbac_table(CHART, rows), (
        "docs/operations.md: the RBAC table is stale: run `llmjob doc-tables`"
    )


def test_the_alerts_table_is_what_the_rendered_chart_generates() -> None:
    assert doctables.committed(DOC, "alerts") == chart.alerts_table(CHART), (
        "docs/operations.md: the alerts table is stale: run `llmjob doc-tables`"
    )


def test_the_rbac_table_covers_every_option_and_both_modes(rows: list[chart.Row]) -> None:
    resources = {r.resource for r in rows}
    assert {"events", "workloads", "podgroups", "clusterkopfpeerings", "kopfpeerings"} <= resources
    (listing,) = [r for r in rows if (r.group, r.resource) == ("", "events")]
    assert "list" in listing.verbs, "the operator lists FailedScheduling Events"
    (patch,) = [r for r in rows if r.resource == "nodes" and r.option]
    assert patch.verbs == {"patch"} and patch.namespaced == "ClusterRole `<release>-nodes`"
    (peering,) = [r for r in rows if r.resource == "kopfpeerings"]
    assert (peering.cluster_wide, peering.namespaced) == ("not granted", "Role in each watched namespace")


def test_operator_alerts_nothing_scrapes_are_refused_by_name(helm: Helm, needs: dict[str, set[str]]) -> None:
    blind = sorted(a for a, n in needs.items() if chart.OPERATOR_SCRAPE in n)
    assert "LLMJobOperatorDown" in blind and "LLMJobNoTrainingStep" not in blind
    values = helm.values_file({"prometheusRule": {"enabled": True}})
    refused = helm.run("template", RELEASE, str(CHART), "-f", str(values), check=False)
    assert refused.returncode != 0
    assert f"prometheusRule: the alerts {', '.join(blind)} read the operator's metrics" in refused.stderr
    for fix in (
        {"metrics": {"serviceMonitor": {"enabled": True}}},
        {"prometheusRule": {"enabled": True, "operatorSelector": 'job="my-operator-scrape"'}},
        {"prometheusRule": {"enabled": True, "alerts": {_key(a): {"enabled": False} for a in blind}}},
    ):
        values = {"prometheusRule": {"enabled": True}, **fix}
        assert by_kind(helm.template(values), "PrometheusRule"), fix
    values = {"prometheusRule": {"enabled": True}, "metrics": {"serviceMonitor": {"enabled": True}}}
    values["metrics"]["service"] = {"enabled": False}  # the ServiceMonitor needs the Service
    assert helm.run(*helm.template_args(values), check=False).returncode != 0


def test_notes_warn_about_worker_alerts_and_panels_nothing_scrapes(
    helm: Helm, needs: dict[str, set[str]]
) -> None:
    trainer = sorted(a for a, n in needs.items() if chart.TRAINER_SCRAPE in n)
    assert trainer == ["LLMJobNoTrainingStep"]
    warned = _notes(
        helm, {"prometheusRule": {"enabled": True}, "metrics": {"serviceMonitor": {"enabled": True}}}
    )
    assert f"WARNING: {', '.join(trainer)} read the workers' metrics" in warned
    scraped = {"serviceMonitor": {"enabled": True}, "trainerPodMonitor": {"enabled": True}}
    quiet = _notes(
        helm, {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}, "metrics": scraped}
    )
    assert "WARNING" not in quiet
    dashboard = _notes(helm, {"grafanaDashboard": {"enabled": True}})
    assert (
        "training panels (tokens/s, step,\n   loss) stay empty" in dashboard
        and "operator\n   panels" in dashboard
    )


def test_the_default_runtime_has_the_example_runtimes_failure_policy(helm: Helm) -> None:
    (example,) = [d for d in yaml.safe_load_all((ROOT / "deploy/examples/runtime-p5.yaml").read_text()) if d]
    (runtime,) = by_kind(helm.template({"defaultRuntime": {"enabled": True}}), "ClusterLLMTrainingRuntime")
    assert runtime["spec"]["failurePolicy"] == example["spec"]["failurePolicy"]


def _key(alert: str) -> str:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["alerts"]
    return chart.alert_key(alert, defaults)


def _notes(helm: Helm, values: dict[str, Any]) -> str:
    """NOTES.txt as `helm install` prints it (a client-side dry run: no cluster, no monitoring APIs)."""
    path: Path = helm.values_file(values)
    out = helm.run(
        "install", RELEASE, str(CHART), "-n", "llm-system", "--dry-run=client", "-f", str(path)
    ).stdout
    return out[out.index("NOTES:") :]
