"""The pure parts of `make release`: the folder (partial until whole, checksums, summary), the CRD bundle,
the SBOM's dependency closure and the one-line errors. tests/integration/test_release.py runs it whole."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from llm_testbed.release import chart, sbom
from llm_testbed.release.cli import one_line
from llm_testbed.release.errors import ReleaseError
from llm_testbed.release.folder import ReleaseFolder, summary

ROOT = Path(__file__).resolve().parents[2]


def test_the_folder_is_partial_until_finished_and_sha256sum_checks_it(tmp_path: Path) -> None:
    folder = ReleaseFolder(tmp_path, "9.9.9")
    work = folder.start()
    (work / "sub").mkdir()
    (work / "sub" / "a.txt").write_text("a\n")
    (work / "b.bin").write_bytes(b"\0" * 2048)
    assert not folder.final.exists()
    final = folder.finish()
    assert final == tmp_path / "9.9.9" and not folder.work.exists()
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=final, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.splitlines() == ["b.bin: OK", "sub/a.txt: OK"]
    lines = summary(final)
    assert [line.split()[0] for line in lines[:3]] == ["SHA256SUMS", "b.bin", "sub/a.txt"]
    assert any(line.split()[:3] == ["b.bin", "2.0", "KiB"] for line in lines)
    assert lines[-1].split()[:3] == ["total", "(3", "files)"]


def test_the_crd_bundle_holds_every_crd_of_crds(tmp_path: Path) -> None:
    bundle = chart.write_crd_bundle(ROOT, "9.9.9", tmp_path)
    assert bundle.name == "crds-9.9.9.yaml"
    docs = [d for d in yaml.safe_load_all(bundle.read_text()) if d]
    assert {d["metadata"]["name"] for d in docs} == {
        d["metadata"]["name"] for d in chart.crd_documents(ROOT / "crds")
    }
    assert len(docs) == 5


def test_a_non_crd_in_the_crd_folder_fails_the_release(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(ReleaseError, match="'ConfigMap' in the CRD folder"):
        chart.crd_documents(tmp_path)


def test_the_sbom_closure_follows_extras_and_markers() -> None:
    found = sbom.closure(["PyYAML>=6", 'pydantic>=2; extra == "x"', 'pytest; extra == "dev"'], ["x"])
    assert {"pyyaml", "pydantic", "pydantic-core", "typing-extensions"} <= set(found)
    assert "pytest" not in found
    assert all(text.startswith("Metadata-Version") for text in found.values())


def test_the_sbom_closure_names_a_missing_distribution() -> None:
    with pytest.raises(ReleaseError, match=r"no-such-distribution-xyz .* is not installed"):
        sbom.closure(["no-such-distribution-xyz>=1"], [])


def test_errors_are_one_line_with_the_log() -> None:
    message = (
        "wheel x failed (exit 1) after 2s; the log ends with:\nTraceback\n  boom\n(whole log: /tmp/l.log)"
    )
    assert one_line(message) == "wheel x failed (exit 1) after 2s; the log ends with: (whole log: /tmp/l.log)"
    assert one_line("plain") == "plain"
