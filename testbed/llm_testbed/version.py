"""The project's one version: ``[project] version`` in pyproject.toml, defined there and nowhere else.

What carries a version reads it from there: the images' ``VERSION`` build argument (their OCI labels),
``make release`` (the folder, the images' tags, the chart's ``--version``/``--app-version``), and
``llmjob --version`` through the installed metadata that pip writes from it. Copies that cannot read it
(Chart.yaml, runtime/pyproject.toml) are checked against it by tests/unit/test_version.py.
Standard library only: the image builder runs before any virtualenv exists.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

PYPROJECT = "pyproject.toml"


def project_version(root: Path) -> str:
    """The version in ``root/pyproject.toml`` (ValueError naming the file when there is none)."""
    path = root / PYPROJECT
    with path.open("rb") as handle:
        project = tomllib.load(handle).get("project", {})
    version = project.get("version")
    if not isinstance(version, str) or not version:
        raise ValueError(f"{path}: [project] version is missing (it must be a literal string)")
    return version
