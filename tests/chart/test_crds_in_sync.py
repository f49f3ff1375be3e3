"""The chart's crds/ folder is the root crds/ folder, byte for byte (make crds writes both)."""

from __future__ import annotations

from typing import Any

import yaml
from chart_helpers import CHART, ROOT

ROOT_CRDS = ROOT / "crds"
CHART_CRDS = CHART / "crds"


def test_same_files_same_bytes() -> None:
    root = {p.name: p.read_bytes() for p in ROOT_CRDS.glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in CHART_CRDS.glob("*.yaml")}
    assert root, "crds/ is empty"
    assert sorted(chart) == sorted(root), "the two folders hold different files"
    stale = sorted(name for name in root if root[name] != chart[name])
    assert not stale, f"charts/elastic-llm-operator/crds/ differs from crds/ for {stale}: run `make crds`"


def _crds() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in CHART_CRDS.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                assert doc["kind"] == "CustomResourceDefinition", path
                out[doc["metadata"]["name"]] = doc
    return out


def test_llmtrainingjob_crd_has_status_and_scale() -> None:
    crd = _crds()["llmtrainingjobs.elasticllm.dev"]
    assert crd["spec"]["names"]["kind"] == "LLMTrainingJob"
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    assert version["name"] == "v1alpha1"
    assert set(version["subresources"]) == {"status", "scale"}


def test_kopf_peering_crds() -> None:
    crds = _crds()
    expected = {
        "clusterkopfpeerings.kopf.dev": ("ClusterKopfPeering", "Cluster"),
        "kopfpeerings.kopf.dev": ("KopfPeering", "Namespaced"),
    }
    for name, (kind, scope) in expected.items():
        spec = crds[name]["spec"]
        assert (spec["group"], spec["names"]["kind"], spec["scope"]) == ("kopf.dev", kind, scope)
        (version,) = spec["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True
        # kopf patches status through the main resource: a status subresource would swallow its writes.
        assert "subresources" not in version
