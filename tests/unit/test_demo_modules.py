"""The two demo stories share ``demo_common`` and never import each other; ``llmjob demo`` picks one."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest
from llm_testbed import cli, demo, demo_training

TESTBED = Path(__file__).resolve().parents[2] / "testbed" / "llm_testbed"


def _imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


@pytest.mark.parametrize(("module", "other"), [("demo", "demo_training"), ("demo_training", "demo")])
def test_a_demo_story_does_not_import_the_other(module: str, other: str) -> None:
    imported = _imported(TESTBED / f"{module}.py")
    assert f"llm_testbed.{other}" not in imported
    assert "llm_testbed.demo_common" in imported


@pytest.mark.parametrize(("fake_nodes", "story"), [(True, "demo"), (False, "demo_training")])
def test_llmjob_demo_runs_the_chosen_story(
    fake_nodes: bool, story: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    monkeypatch.setattr(demo, "run", lambda args: ran.append("demo") or 0)
    monkeypatch.setattr(demo_training, "run", lambda args: ran.append("demo_training") or 0)
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["demo", "--fake-nodes"] if fake_nodes else ["demo"])
    assert args.func(args) == 0
    assert ran == [story]
