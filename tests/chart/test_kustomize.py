"""kustomize: the base and overlays are generated from the chart, stay in sync, and build.

Server-side validation of the built overlays is in test_manifests_cluster.py.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from chart_helpers import ROOT, Helm, kubectl

KUSTOMIZE = ROOT / "deploy" / "kustomize"
OVERLAYS = ("cluster-wide", "namespaced")
CM_KEY = "resource.customizations.health.elasticllm.dev_LLMTrainingJob"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build(kubectl_bin: Path, target: Path) -> list[dict[str, Any]]:
    out = kubectl(kubectl_bin, "kustomize", str(target)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_generated_files_match_the_chart(helm: Helm) -> None:
    renderer = _load(KUSTOMIZE / "render_base.py", "render_base")
    rendered: dict[str, str] = renderer.render(str(helm.binary))
    assert set(rendered) == {
        "base/generated.yaml",
        "overlays/cluster-wide/generated.yaml",
        "overlays/namespaced/generated.yaml",
    }
    stale = [name for name, text in rendered.items() if (KUSTOMIZE / name).read_text() != text]
    assert not stale, f"out of date: {stale}; run `python deploy/kustomize/render_base.py`"


def _deployment_args(objects: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    return args


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_builds(kubectl_bin: Path, overlay: str) -> None:
    objects = build(kubectl_bin, KUSTOMIZE / "overlays" / overlay)
    kinds = {o["kind"] for o in objects}
    assert {"CustomResourceDefinition", "Namespace", "ServiceAccount", "Deployment", "Service"} <= kinds
    for obj in objects:
        labels = obj["metadata"].get("labels", {})
        assert "helm.sh/chart" not in labels and labels.get("app.kubernetes.io/managed-by") != "Helm"
    namespaced_kinds = {"ServiceAccount", "Deployment", "Service", "PodDisruptionBudget"}
    for obj in objects:
        if obj["kind"] in namespaced_kinds:
            assert obj["metadata"]["namespace"] == "elastic-llm-operator", obj["kind"]
    args = _deployment_args(objects)
    assert args[:2] == ["operator", "--peering"]
    if overlay == "cluster-wide":
        assert args.count("--all-namespaces") == 1 and "--namespace" not in args
        assert {"ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"} <= kinds
        assert "Role" not in kinds and "KopfPeering" not in kinds
    else:
        assert "--all-namespaces" not in args
        assert args[args.index("--namespace") + 1] == "ml-training"
        roles = [o for o in objects if o["kind"] in ("Role", "RoleBinding", "KopfPeering")]
        assert {o["metadata"]["namespace"] for o in roles} == {"ml-training"}
        assert len(roles) == 3
        (cluster_role,) = [o for o in objects if o["kind"] == "ClusterRole"]
        assert [r["resources"] for r in cluster_role["rules"]] == [["nodes"], ["clusterllmtrainingruntimes"]]
        assert "ClusterKopfPeering" not in kinds


def test_argocd_health_component_merges_the_lua_into_argocd_cm(kubectl_bin: Path, tmp_path: Path) -> None:
    """deploy/argocd is a kustomize Component: used by an Argo CD install, it adds health.lua unchanged."""
    (tmp_path / "argocd-cm.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                # As in Argo CD's install.yaml: no namespace; the kustomization sets it.
                "metadata": {"name": "argocd-cm"},
                "data": {"url": "https://argocd.example.com"},
            }
        )
    )
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "argocd",
                "resources": ["argocd-cm.yaml"],
                # kustomize takes relative paths only, as an Argo CD install's kustomization would.
                "components": [os.path.relpath(ROOT / "deploy" / "argocd", tmp_path)],
            }
        )
    )
    (configmap,) = build(kubectl_bin, tmp_path)
    assert configmap["metadata"] == {"name": "argocd-cm", "namespace": "argocd"}, "merged in place, no suffix"
    assert configmap["data"]["url"] == "https://argocd.example.com", "existing keys are kept"
    assert configmap["data"][CM_KEY] == (ROOT / "deploy" / "argocd" / "health.lua").read_text()
