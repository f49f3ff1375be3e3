"""Fixtures for the chart, kustomize and manifest tests.

Every test here needs the pinned helm and kubectl builds (`make tools`; `ensure` builds them on first
use). Those that also need an API server use the session `cluster` fixture from tests/conftest.py and
carry `@pytest.mark.cluster`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chart_helpers import Helm
from llm_testbed.localcluster.tools import ensure


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure(["helm"])["helm"], tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="session")
def kubectl_bin() -> Path:
    return ensure(["kubectl"])["kubectl"]
