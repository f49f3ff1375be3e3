"""The CI summary's per-tier wall time and core use, and the tests that left the cores idlest."""

from __future__ import annotations

from typing import Any

import pytest
from support import tier_times
from support.tier_times import TierTimes


class Lines:
    """What the summary writes, as a terminal reporter would receive it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_sep(self, sep: str, title: str) -> None:
        self.lines.append(f"== {title}")

    def write_line(self, line: str) -> None:
        self.lines.append(line)


def test_each_tier_says_how_busy_the_cores_were_and_the_idlest_tests_come_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two cores: 200 ticks a second. (busy, all) ticks as each hook reads them.
    ticks = iter([(0, 0), (150, 200), (150, 200), (170, 1200), (170, 1200), (370, 1400)])
    monkeypatch.setattr(tier_times, "cpu_ticks", lambda: next(ticks))
    plugin = TierTimes()
    for nodeid in [
        "tests/unit/test_a.py::t",
        "tests/integration/test_b.py::slow",
        "tests/integration/test_c.py::t",
    ]:
        plugin.pytest_runtest_logstart(nodeid)
        plugin.pytest_runtest_logfinish(nodeid)
    out = Lines()
    reporter: Any = out
    plugin.pytest_terminal_summary(reporter)

    tiers = [line for line in out.lines if line.startswith("tier ")]
    assert tiers[0].startswith("tier unit") and tiers[0].endswith("cores busy  75 %"), tiers
    assert tiers[1].startswith("tier integration") and tiers[1].endswith("cores busy  18 %"), tiers
    idlest = out.lines[out.lines.index("== the 3 tests that left the cores idlest") + 1 :]
    assert [line.split()[-1] for line in idlest] == [
        "tests/integration/test_b.py::slow",  # 980 idle ticks
        "tests/unit/test_a.py::t",  # 50
        "tests/integration/test_c.py::t",  # 0
    ]
    assert idlest[0].split()[:3] == ["9.8", "core-s", "idle"] and "busy   2 %" in idlest[0], idlest


def test_the_cores_are_read_from_proc_stat() -> None:
    busy, total = tier_times.cpu_ticks()
    assert 0 < busy < total
