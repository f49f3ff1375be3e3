"""The Argo CD Applications point at real paths, and the operator one renders with its values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from chart_helpers import ROOT, Helm, one

ARGOCD = ROOT / "deploy" / "argocd"


def _app(name: str) -> dict[str, Any]:
    app: dict[str, Any] = yaml.safe_load((ARGOCD / name).read_text())
    assert (app["apiVersion"], app["kind"]) == ("argoproj.io/v1alpha1", "Application")
    return app


def test_operator_application_renders_the_chart_with_its_values(helm: Helm) -> None:
    app = _app("operator-application.yaml")
    source = app["spec"]["source"]
    chart = ROOT / source["path"]
    assert (chart / "Chart.yaml").is_file()
    namespace = app["spec"]["destination"]["namespace"]
    # What Argo CD does: helm template with the valuesObject, against the chart's values.schema.json.
    values = source["helm"]["valuesObject"]
    result = helm.run(
        "template",
        source["helm"]["releaseName"],
        str(chart),
        "--namespace",
        namespace,
        "-f",
        str(helm.values_file(values)),
        "--include-crds",
        "--api-versions",
        "monitoring.coreos.com/v1/ServiceMonitor",
        "--api-versions",
        "monitoring.coreos.com/v1/PodMonitor",
    )
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    deployment = one(objects, "Deployment")
    assert deployment["metadata"]["namespace"] == namespace
    assert one(objects, "ServiceMonitor") and one(objects, "ConfigMap")
    assert "elastic-llm-operator" in deployment["metadata"]["name"]


def test_operator_application_sync_options_fit_crds() -> None:
    app = _app("operator-application.yaml")
    options = set(app["spec"]["syncPolicy"]["syncOptions"])
    assert {"ServerSideApply=true", "CreateNamespace=true"} <= options
    # Deleting the Application must not cascade to the CRDs (and every training job with them).
    assert "resources-finalizer.argocd.argoproj.io" not in app["metadata"].get("finalizers", [])


def test_jobs_application_points_at_job_manifests() -> None:
    app = _app("jobs-application.yaml")
    folder = ROOT / app["spec"]["source"]["path"]
    manifests = sorted(folder.glob("*.yaml"))
    assert manifests, f"{folder} holds no manifests"
    kinds = {doc["kind"] for path in manifests for doc in yaml.safe_load_all(path.read_text()) if doc}
    assert "LLMTrainingJob" in kinds
    policy = app["spec"]["syncPolicy"]
    assert policy["automated"]["prune"] is False
    assert {"ServerSideApply=true", "RespectIgnoreDifferences=true"} <= set(policy["syncOptions"])
    (ignored,) = app["spec"]["ignoreDifferences"]
    assert (ignored["group"], ignored["kind"], ignored["jsonPointers"]) == (
        "elasticllm.dev",
        "LLMTrainingJob",
        ["/spec/replicas"],
    )


def test_every_argocd_manifest_is_valid_yaml() -> None:
    """Every YAML file there parses, and all but the Helm values snippet are Kubernetes-style objects."""
    for path in sorted(Path(ARGOCD).glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        assert docs, path.name
        if path.name != "argo-cd-helm-values.yaml":
            assert all({"apiVersion", "kind"} <= d.keys() for d in docs), path.name
