"""The runtime library installs alone into a user's image: what it pulls, and what it never imports."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime"
ALLOWED = {"torch", "numpy", "python3-etcd3", "protobuf", "grpcio", "prometheus-client"}
"""torch's peers and the etcd client: what a training image needs beside torch."""
OURS_ELSEWHERE = ("llm_trainer", "llm_operator", "llm_testbed", "kopf", "kubernetes", "kubernetes_asyncio")


def test_its_install_pulls_torch_peers_and_the_etcd_client_only() -> None:
    project = tomllib.loads((RUNTIME / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert names <= ALLOWED, names - ALLOWED
    assert "optional-dependencies" not in project or not project["optional-dependencies"]


def test_it_registers_the_etcd_v3_torchrun_handler_like_the_development_install() -> None:
    runtime = tomllib.loads((RUNTIME / "pyproject.toml").read_text())
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    handler = runtime["project"]["entry-points"]["torchrun.handlers"]["etcd-v3"]
    assert handler == root["project"]["entry-points"]["torchrun.handlers"]["etcd-v3"]
    assert handler.startswith("llm_elastic.")


def test_no_module_imports_the_operator_the_trainer_or_the_test_bed() -> None:
    offenders = []
    for path in sorted((RUNTIME / "llm_elastic").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in OURS_ELSEWHERE
            ]
    assert not offenders, offenders
