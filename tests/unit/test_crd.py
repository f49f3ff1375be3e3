"""The CRD is generated from the models and the committed copies do not drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from llm_operator.api.crd import CRD_KINDS, crd, crd_file, crd_yaml, documented_spec_schema, runtime_crd

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "elasticllm.dev_llmtrainingjobs.yaml"


def test_committed_crd_matches_models() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), "crds/ is stale: run `make crds`"
    for kind in CRD_KINDS:
        assert (ROOT / "crds" / crd_file(kind)).read_text() == crd_yaml(kind), f"{kind}: run `make crds`"


def test_chart_crd_matches_root_copy() -> None:
    for kind in CRD_KINDS:
        chart_copy = ROOT / "charts" / "elastic-llm-operator" / "crds" / crd_file(kind)
        assert chart_copy.read_text() == (ROOT / "crds" / crd_file(kind)).read_text(), "run `make crds`"


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


def _defaults(node: dict[str, Any], path: str = "spec") -> list[str]:
    found = [path] if "default" in node else []
    for key, prop in node.get("properties", {}).items():
        found += _defaults(prop, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        found += _defaults(node["items"], f"{path}[]")
    return found


def test_stored_specs_have_no_defaults_and_runtimes_no_required_fields() -> None:
    """A field a job leaves out may come from its runtime: the apiserver must not fill it in."""
    job_spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert _defaults(job_spec) == []
    assert "required" not in job_spec and "required" not in job_spec["properties"]["fsx"]
    rules = [r["rule"] for r in job_spec["x-kubernetes-validations"]]
    assert "has(self.runtimeRef) || has(self.image)" in rules
    for kind, scope in (("LLMTrainingRuntime", "Namespaced"), ("ClusterLLMTrainingRuntime", "Cluster")):
        definition = runtime_crd(kind)
        assert definition["spec"]["scope"] == scope
        version = definition["spec"]["versions"][0]
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        assert _defaults(spec) == [] and "required" not in spec
        assert "runtimeRef" not in spec["properties"]
        assert set(spec["properties"]) == set(job_spec["properties"]) - {"runtimeRef"}
        assert not any("runtimeRef" in r["rule"] for r in spec["x-kubernetes-validations"])
        assert "subresources" not in version


def test_defaults_reach_nested_objects() -> None:
    props = documented_spec_schema()["properties"]
    assert props["failurePolicy"]["default"] == {}
    assert props["failurePolicy"]["properties"]["nodeFailureGraceSeconds"]["default"] == 30
    assert props["rendezvous"]["properties"]["backend"]["enum"] == ["etcd-v3", "c10d"]
    assert props["command"]["default"] == ["python", "-m", "llm_trainer"]


def test_api_reference_is_current() -> None:
    from llm_operator.api.reference import reference

    assert (ROOT / "docs" / "api.md").read_text() == reference(), "docs/api.md is stale: run `make crds`"
