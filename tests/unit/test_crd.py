"""The CRD is generated from the models and the committed copies do not drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from llm_operator.api.crd import crd, crd_yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "elasticllm.dev_llmtrainingjobs.yaml"


def test_committed_crd_matches_models() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), "crds/ is stale: run `make crds`"


def test_chart_crd_matches_root_copy() -> None:
    chart_copy = ROOT / "charts" / "elastic-llm-operator" / "crds" / CRD_FILE.name
    if chart_copy.exists():
        assert chart_copy.read_text() == CRD_FILE.read_text(), "chart CRD is stale: run `make crds`"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, value in node.get("properties", {}).items():
            out += _walk(value, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            out += _walk(node["items"], f"{path}[]")
    return out


def test_schema_is_structural_and_documented() -> None:
    version = crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(schema)
    assert "$ref" not in text and "anyOf: null" not in text and "title:" not in text
    for path, node in _walk(schema["properties"]["spec"], "spec"):
        assert "type" in node or "x-kubernetes-int-or-string" in node, path
        if path != "spec" and not path.endswith("[]"):
            assert node.get("description"), f"{path} has no description"


def test_subresources_columns_and_names() -> None:
    spec = crd()["spec"]
    version = spec["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    for wanted in ("Min", "Max", "Desired", "Ready", "Phase", "Restarts", "Age"):
        assert wanted in names
    assert "llmjob" in spec["names"]["shortNames"] and "all" in spec["names"]["categories"]


def test_defaults_reach_nested_objects() -> None:
    props = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert props["failurePolicy"]["default"] == {}
    assert props["failurePolicy"]["properties"]["nodeFailureGraceSeconds"]["default"] == 30
    assert props["rendezvous"]["properties"]["backend"]["enum"] == ["etcd-v3", "c10d"]
    assert props["command"]["default"] == ["python", "-m", "llm_trainer"]


def test_api_reference_is_current() -> None:
    from llm_operator.api.reference import reference

    assert (ROOT / "docs" / "api.md").read_text() == reference(), "docs/api.md is stale: run `make crds`"
