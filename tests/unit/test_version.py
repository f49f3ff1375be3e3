"""One version, pyproject.toml's: the copies that cannot read it must equal it; `llmjob --version` says it."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from llm_operator.cli import DISTRIBUTION, main
from llm_testbed.images import build
from llm_testbed.images.recipe import RECIPES
from llm_testbed.version import project_version

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "elastic-llm-operator" / "Chart.yaml"


def test_the_version_is_read_from_pyproject() -> None:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        assert project_version(ROOT) == tomllib.load(handle)["project"]["version"]


def test_the_runtime_library_has_the_same_version() -> None:
    assert project_version(ROOT / "runtime") == project_version(ROOT), (
        "runtime/pyproject.toml's version differs from pyproject.toml's: set both"
    )


def test_chart_version_and_app_version_equal_the_project_version() -> None:
    chart = yaml.safe_load(CHART.read_text())
    wanted = project_version(ROOT)
    assert (chart["version"], str(chart["appVersion"])) == (wanted, wanted), (
        f"Chart.yaml: version {chart['version']}, appVersion {chart['appVersion']}; pyproject.toml: {wanted}"
    )


def test_llmjob_version_prints_the_installed_project_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"llmjob {version(DISTRIBUTION)}"
    # The installed metadata is written from pyproject.toml: a stale install (make setup) fails here.
    assert version(DISTRIBUTION) == project_version(ROOT)


def test_the_images_are_labelled_with_the_project_version() -> None:
    for recipe in RECIPES.values():
        assert build.plan(ROOT, recipe).build_args["VERSION"] == project_version(ROOT)
        dockerfile = (ROOT / recipe.dockerfile).read_text()
        assert 'org.opencontainers.image.version="${VERSION}"' in dockerfile, recipe.dockerfile
