"""The import contract (our own programs are clients like any other): the reference trainer and the
examples import only ``llm_elastic``'s public names (its ``__all__``, docs/runtime-api.md); a benchmark may
reach an internal module only where it measures that part itself, listed below with the reason."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import llm_elastic

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ("trainer", "bench", "examples")
PUBLIC = set(llm_elastic.__all__)

MEASURED_PARTS: dict[str, set[str]] = {
    # It times the checkpointer's and the snapshotter's saves and restores themselves.
    "bench/trainer_checkpoint.py": {
        "llm_elastic.checkpoint",
        "llm_elastic.persistence",
        "llm_elastic.snapshot.manager",
    },
    # It times the health checks themselves.
    "bench/runtime_overhead.py": {"llm_elastic.health"},
    # It times the membership's rendezvous against etcd.
    "bench/rendezvous_cost.py": {"llm_elastic.live.membership", "llm_elastic.rendezvous.etcd_client"},
    # It plays the operator: evicts a member in etcd.
    "bench/live_recovery.py": {"llm_elastic.live.membership", "llm_elastic.rendezvous.etcd_client"},
}
"""Benchmark file -> internal modules it may import."""


def _ours(module: str | None) -> bool:
    return module is not None and module.split(".")[0] == "llm_elastic"


def imports(tree: ast.AST) -> Iterator[tuple[int, str, str | None]]:
    """``(line, module, name)`` of every import of ``llm_elastic`` (name None for ``import module``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "llm_elastic":
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _ours(node.module):
            for alias in node.names:
                yield node.lineno, str(node.module), alias.name


def violations(path: Path, source: str) -> list[str]:
    """What ``source`` (the file at ``path``, relative to the repository) imports beyond the contract."""
    allowed = MEASURED_PARTS.get(path.as_posix(), set())
    out = []
    for line, module, name in imports(ast.parse(source)):
        if module == "llm_elastic":
            if name is not None and name not in PUBLIC:
                out.append(f"{path}:{line}: llm_elastic.{name} is not public")
        elif module not in allowed:
            out.append(f"{path}:{line}: {module} is internal (import from llm_elastic)")
    return out


def test_the_trainer_benchmarks_and_examples_import_only_public_names() -> None:
    found = []
    for folder in CLIENTS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += violations(path.relative_to(ROOT), path.read_text())
    assert not found, "\n".join(found)


def test_the_check_catches_an_internal_module_and_a_private_name() -> None:
    source = (
        "import llm_elastic\n"
        "from llm_elastic import Elastic, session\n"
        "from llm_elastic.wrap import DDP\n"
        "import llm_elastic.checkpoint\n"
    )
    assert violations(Path("trainer/llm_trainer/x.py"), source) == [
        "trainer/llm_trainer/x.py:2: llm_elastic.session is not public",
        "trainer/llm_trainer/x.py:3: llm_elastic.wrap is internal (import from llm_elastic)",
        "trainer/llm_trainer/x.py:4: llm_elastic.checkpoint is internal (import from llm_elastic)",
    ]
    assert violations(Path("bench/trainer_checkpoint.py"), "import llm_elastic.checkpoint\n") == []


def test_every_public_name_exists() -> None:
    missing = [name for name in llm_elastic.__all__ if not hasattr(llm_elastic, name)]
    assert not missing


def test_every_public_name_resolves_from_the_module_the_package_names_for_it() -> None:
    """``llm_elastic`` resolves its names on first use: ``__all__``, the table of homes and the typed imports
    for checkers must name the same set, and each name must come from its home."""
    tree = ast.parse(Path(llm_elastic.__file__).read_text())
    typed = {name for _, _, name in imports(tree) if name is not None}
    homes = llm_elastic._HOME
    assert set(llm_elastic.__all__) == set(homes) == typed
    for name, home in homes.items():
        assert getattr(llm_elastic, name) is getattr(importlib.import_module(home), name), name
