"""What platform teams rely on for the CRDs' life: Argo CD never prunes them, and the uninstall steps name
every one of them (README.md and docs/install.md alike)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_FOLDERS = (ROOT / "crds", ROOT / "charts" / "elastic-llm-operator" / "crds")
UNINSTALL_DOCS = (ROOT / "README.md", ROOT / "docs" / "install.md")
PRUNE_FALSE = ("argocd.argoproj.io/sync-options", "Prune=false")
DELETE_CRD = re.compile(r"kubectl delete crd ([^#`\n]+)")


def _crds(folder: Path) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                found[doc["metadata"]["name"]] = doc
    return found


def test_every_crd_the_project_installs_is_the_five_expected() -> None:
    # The list the docs must name; a new CRD shows up here first.
    assert sorted(_crds(ROOT / "crds")) == [
        "clusterkopfpeerings.kopf.dev",
        "clusterllmtrainingruntimes.elasticllm.dev",
        "kopfpeerings.kopf.dev",
        "llmtrainingjobs.elasticllm.dev",
        "llmtrainingruntimes.elasticllm.dev",
    ]


@pytest.mark.parametrize("folder", CRD_FOLDERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_crd_carries_argocd_prune_false(folder: Path) -> None:
    crds = _crds(folder)
    assert crds, f"no CRD in {folder}"
    key, value = PRUNE_FALSE
    missing = sorted(
        name for name, crd in crds.items() if crd["metadata"].get("annotations", {}).get(key) != value
    )
    assert not missing, f"{missing} lack the annotation {key}: {value} (make crds; kopf.dev_peerings by hand)"


@pytest.mark.parametrize("doc", UNINSTALL_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_uninstall_deletes_every_crd(doc: Path) -> None:
    named = {name for match in DELETE_CRD.finditer(doc.read_text()) for name in match.group(1).split()}
    missing = sorted(set(_crds(ROOT / "crds")) - named)
    assert not missing, f"{doc.relative_to(ROOT)}: no `kubectl delete crd` line names {missing}"
