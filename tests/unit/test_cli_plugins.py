"""`llmjob` finds the test bed's commands through an entry point; the operator package never imports it."""

from __future__ import annotations

import argparse
import ast
import sys
import tomllib
from pathlib import Path

import pytest
from llm_operator import cli
from llm_testbed import cli as bed_cli

ROOT = Path(__file__).resolve().parents[2]
TESTBED_COMMANDS = {"cluster", "tools", "chaos", "demo"}


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices or ())


def _install_plugin(root: Path, module: str, target: str) -> None:
    """A distribution on ``root`` (put on sys.path) whose entry point of llmjob's group is ``target``."""
    info = root / "fake_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{cli.PLUGIN_GROUP}]\nfake = {target}\n")
    if module:
        (root / f"{module}.py").write_text(
            "def register(sub):\n"
            "    sub.add_parser('hello', help='from a plugin').set_defaults(func=lambda args: 7)\n"
        )


def test_the_operator_package_never_imports_the_test_bed() -> None:
    found = []
    for path in sorted((ROOT / "operator" / "llm_operator").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n.startswith("llm_testbed")]
    assert found == []


def test_pyproject_registers_the_test_bed_commands() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][cli.PLUGIN_GROUP] == {"testbed": "llm_testbed.cli:register"}
    parser = cli.build_parser([bed_cli.register])
    assert _commands(parser) >= TESTBED_COMMANDS
    assert parser.parse_args(["cluster", "down", "--all"]).all is True


def test_an_installed_plugin_adds_its_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_plugin(tmp_path, "fake_llmjob_plugin", "fake_llmjob_plugin:register")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "hello" in _commands(cli.build_parser())
    assert cli.main(["hello"]) == 7
    sys.modules.pop("fake_llmjob_plugin", None)


def test_a_plugin_is_registered_once_when_also_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_plugin(tmp_path, "fake_llmjob_twice", "fake_llmjob_twice:register")
    monkeypatch.syspath_prepend(str(tmp_path))
    import fake_llmjob_twice  # type: ignore[import-not-found]

    assert "hello" in _commands(cli.build_parser([fake_llmjob_twice.register]))
    sys.modules.pop("fake_llmjob_twice", None)


def test_a_plugin_whose_package_is_absent_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator image: the project's metadata names the test bed, its package is not there."""
    _install_plugin(tmp_path, "", "no_such_llmjob_plugin.cli:register")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("LLMJOB_DEBUG", raising=False)
    assert "render" in _commands(cli.build_parser())
    monkeypatch.setenv("LLMJOB_DEBUG", "1")
    with pytest.raises(ModuleNotFoundError):
        cli.build_parser()
