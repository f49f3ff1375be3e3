"""`make release` from a clean copy of the tree (what git would commit, nothing it ignores), for real.

The images come from the image builder's cache (the image tests build them; this copy has the same
content, so the same keys), the Python packages and SBOMs are built from scratch, the chart with our pinned
helm. Never skipped: without podman or cyclonedx-py it fails with the reason.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_testbed.images.podman import Podman
from llm_testbed.version import project_version
from packaging.utils import canonicalize_name

pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
CRDS = {
    "llmtrainingjobs.elasticllm.dev",
    "llmtrainingruntimes.elasticllm.dev",
    "clusterllmtrainingruntimes.elasticllm.dev",
    "clusterkopfpeerings.kopf.dev",
    "kopfpeerings.kopf.dev",
}


def _clean_copy(target: Path) -> Path:
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        source = ROOT / rel
        if source.is_file():  # a file deleted in the work tree but not yet in the index is left out
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / rel)
    return target


def _names(bom: dict[str, Any]) -> set[str]:
    return {canonicalize_name(c["name"]) for c in bom["components"]}


def _sbom(path: Path) -> dict[str, Any]:
    bom: dict[str, Any] = json.loads(path.read_text())
    assert (bom["bomFormat"], bom["specVersion"]) == ("CycloneDX", "1.6"), path.name
    assert bom["components"], path.name
    for component in bom["components"]:
        assert component["type"] == "library" and component["name"] and component["version"], component
        purl = component["purl"]
        assert purl.startswith("pkg:pypi/") and purl.endswith(f"@{component['version']}"), component
    refs = {c["bom-ref"] for c in bom["components"]} | {"root-component"}
    assert all(set(d.get("dependsOn", [])) <= refs for d in bom["dependencies"]), path.name
    return bom


def test_make_release_from_a_clean_tree(tmp_path: Path) -> None:
    tree = _clean_copy(tmp_path / "tree")
    venv = Path(sys.prefix)
    version = project_version(ROOT)
    # -o: the virtualenv this test runs in is the one to use; make must not reinstall it from the copy.
    proc = subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(tree),
            "-o",
            f"{venv}/.installed",
            "release",
            f"VENV={venv}",
            # cyclonedx-py's schema check costs about 8 s of CPU per SBOM: the checks below read them instead.
            "RELEASE_ARGS=--no-sbom-validation",
        ],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    assert proc.returncode == 0, f"make release failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    folder = tree / "dist" / "release" / version
    assert not (tree / "dist" / "release" / f"{version}.partial").exists()

    expected = {
        f"chart/elastic-llm-operator-{version}.tgz",
        f"crds-{version}.yaml",
        f"python/elastic_llm_operator-{version}-py3-none-any.whl",
        f"python/elastic_llm_operator-{version}.tar.gz",
        f"python/llm_elastic-{version}-py3-none-any.whl",
        f"python/llm_elastic-{version}.tar.gz",
        f"sbom/elastic-llm-operator-{version}.python.cdx.json",
        f"sbom/llm-elastic-{version}.python.cdx.json",
        f"sbom/operator-image-{version}.cdx.json",
        f"sbom/trainer-image-{version}.cdx.json",
        "RELEASE.txt",
        "SHA256SUMS",
    }
    found = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert found == expected

    # Progress on stderr, the folder's files with sizes on stdout, the limits named.
    assert "[release]" in proc.stderr and "the local build leaves out" in proc.stderr
    for rel in expected:
        assert any(line.strip().startswith(rel + " ") for line in proc.stdout.splitlines()), rel
    assert "total (12 files)" in proc.stdout

    # SHA256SUMS covers every other file, in sha256sum's format.
    sums = dict(reversed(line.split("  ", 1)) for line in (folder / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == expected - {"SHA256SUMS"}
    for rel, digest in sums.items():
        assert hashlib.sha256((folder / rel).read_bytes()).hexdigest() == digest, rel

    # The chart carries the version as version and appVersion.
    with tarfile.open(folder / f"chart/elastic-llm-operator-{version}.tgz") as chart:
        meta = yaml.safe_load(chart.extractfile("elastic-llm-operator/Chart.yaml").read())  # type: ignore[union-attr]
    assert (meta["version"], meta["appVersion"]) == (version, version)

    # The CRD bundle: every CRD, each safe from Argo CD's prune.
    bundle = [d for d in yaml.safe_load_all((folder / f"crds-{version}.yaml").read_text()) if d]
    assert {d["metadata"]["name"] for d in bundle} == CRDS
    assert all(
        d["metadata"]["annotations"]["argocd.argoproj.io/sync-options"] == "Prune=false" for d in bundle
    )

    # The wheels say their version; the project's carries the trainer and its extra.
    with zipfile.ZipFile(folder / f"python/elastic_llm_operator-{version}-py3-none-any.whl") as wheel:
        names = wheel.namelist()
        metadata = wheel.read(f"elastic_llm_operator-{version}.dist-info/METADATA").decode()
    assert "llm_trainer/__init__.py" in names and "llm_operator/cli.py" in names
    assert f"Version: {version}" in metadata and "Provides-Extra: trainer" in metadata
    with zipfile.ZipFile(folder / f"python/llm_elastic-{version}-py3-none-any.whl") as wheel:
        assert all(n.startswith(("llm_elastic/", "llm_elastic-")) for n in wheel.namelist())

    # SBOMs: what each package or image really holds.
    project = _sbom(folder / f"sbom/elastic-llm-operator-{version}.python.cdx.json")
    assert project["metadata"]["component"]["name"] == "elastic-llm-operator"
    assert {"kopf", "torch", "pydantic"} <= _names(project)
    runtime = _sbom(folder / f"sbom/llm-elastic-{version}.python.cdx.json")
    assert "torch" in _names(runtime) and "kopf" not in _names(runtime)
    operator = _sbom(folder / f"sbom/operator-image-{version}.cdx.json")
    assert operator["metadata"]["component"]["type"] == "container"
    assert {"elastic-llm-operator", "kopf"} <= _names(operator) and "torch" not in _names(operator)
    trainer = _sbom(folder / f"sbom/trainer-image-{version}.cdx.json")
    assert {"elastic-llm-operator", "torch"} <= _names(trainer)

    # Both images are tagged with the version and labelled with it.
    podman = Podman.of_cache()
    for image in ("operator", "trainer"):
        labels = podman.inspect(f"localhost/elastic-llm-operator/{image}:{version}")["Config"]["Labels"]
        assert labels["org.opencontainers.image.version"] == version
    release_txt = (folder / "RELEASE.txt").read_text()
    assert release_txt.startswith(f"elastic-llm-operator {version}\ncommit: ")
    assert "leaves out the stages efa" in release_txt
