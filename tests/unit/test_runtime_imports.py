"""The runtime's import rules (tests/unit/check_runtime_imports.py, run by ``make lint``): the check finds a
facade import and a circle hidden under TYPE_CHECKING, and the runtime has neither."""

from __future__ import annotations

from pathlib import Path

from tests.unit.check_runtime_imports import ROOT, problems


def test_the_check_finds_a_facade_import_and_a_typing_only_circle(tmp_path: Path) -> None:
    (tmp_path / "live").mkdir()
    files = {
        "__init__.py": "from llm_elastic.session import Elastic\n",
        "session.py": "from llm_elastic.step import Step\n",
        "step.py": "import typing\nif typing.TYPE_CHECKING:\n    from llm_elastic.session import E\n",
        "live/__init__.py": "",
        "live/a.py": "def f() -> None:\n    from llm_elastic.live import b\n",
        "live/b.py": "from . import a\n",
        "alone.py": "import llm_elastic.live.a\n",
    }
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    assert problems(tmp_path) == [
        "llm_elastic.step imports llm_elastic.session (depend on an interface, not the facade)",
        "import circle of 2 modules:\n    llm_elastic.live.a -> llm_elastic.live.b"
        "\n    llm_elastic.live.b -> llm_elastic.live.a",
        "import circle of 2 modules:\n    llm_elastic.session -> llm_elastic.step"
        "\n    llm_elastic.step -> llm_elastic.session",
    ]


def test_the_runtime_keeps_its_import_rules() -> None:
    assert problems(ROOT) == []
