"""Wall time per test tier, printed at the end of a run (``.ci/run`` and docs/development.md read it).

A tier is the folder under ``tests/`` (unit, trainer, chart, integration). pytest runs them one after the
other in ``testpaths`` order, so a tier's wall time is from its first test's set-up to its last test's
teardown; the waits for tools and clusters that its first test pays for are in it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest


@dataclass
class Tier:
    first: float
    last: float
    tests: int = 0


class TierTimes:
    """A pytest plugin: ``config.pluginmanager.register(TierTimes())``."""

    def __init__(self) -> None:
        self.tiers: dict[str, Tier] = {}

    @staticmethod
    def tier_of(nodeid: str) -> str:
        parts = nodeid.split("/")
        return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        now = time.monotonic()
        tier = self.tiers.setdefault(self.tier_of(nodeid), Tier(now, now))
        tier.tests += 1

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        tier = self.tiers.get(self.tier_of(nodeid))
        if tier is not None:
            tier.last = time.monotonic()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.tiers:
            return
        terminalreporter.write_sep("=", "wall time per test tier")
        for name, tier in self.tiers.items():
            minutes, seconds = divmod(round(tier.last - tier.first), 60)
            line = f"tier {name:<12} {minutes:3d} min {seconds:02d} s  {tier.tests:5d} tests"
            terminalreporter.write_line(line)
