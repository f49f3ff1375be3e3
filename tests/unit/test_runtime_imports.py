"""The runtime's structure rules (tests/unit/check_runtime_imports.py, run by ``make lint``): the check
finds a facade import, a circle hidden under TYPE_CHECKING and a part over its size; the runtime has none."""

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


def test_the_check_finds_a_module_and_a_function_over_their_limits(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    (tmp_path / "small.py").write_text(f"def fits() -> None:\n{body}")  # 60 lines
    (tmp_path / "big.py").write_text(f"@staticmethod\ndef long() -> None:\n{body}" + "\n" * 240)
    assert problems(tmp_path) == [
        "llm_elastic.big has 301 lines (at most 300)",
        "llm_elastic.big: long has 61 lines (at most 60)",
    ]
