"""Wall time per test tier, printed at the end of a run (``.ci/run`` and docs/development.md read it).

A tier is the folder under ``tests/`` (unit, trainer, chart, integration). pytest runs them one after the
other in ``testpaths`` order, so a tier's wall time is from its first test's set-up to its last test's
teardown; the waits for tools and clusters that its first test pays for are in it.

Each tier's line also gives how busy the machine's cores were (``/proc/stat``), and the run ends with the
tests that left the cores idlest: their time is waiting (poll intervals, grace periods, batching windows),
which more cores would not shorten and a shorter wait would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

IDLEST_TESTS = 15
"""How many of the tests that left the cores idlest the summary names."""
CLOCK_TICKS = 100
"""``/proc/stat`` counts in USER_HZ, 100 a second on Linux."""


def cpu_ticks() -> tuple[int, int]:
    """(busy, all) ticks of every core since boot, from ``/proc/stat``; (0, 0) where it cannot be read."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return 0, 0
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


@dataclass
class Tier:
    first: float
    last: float
    tests: int = 0
    busy: int = 0
    ticks: int = 0


@dataclass
class Running:
    """A test from its set-up on: when it started and the cores' ticks then."""

    started: float
    busy: int
    ticks: int


@dataclass
class Idle:
    """What a test left idle: core-seconds nobody used while it ran, and its wall time."""

    nodeid: str
    idle_s: float
    wall_s: float
    busy_share: float


class TierTimes:
    """A pytest plugin: ``config.pluginmanager.register(TierTimes())``."""

    def __init__(self) -> None:
        self.tiers: dict[str, Tier] = {}
        self.running: dict[str, Running] = {}
        self.idle: list[Idle] = []

    @staticmethod
    def tier_of(nodeid: str) -> str:
        parts = nodeid.split("/")
        return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        now = time.monotonic()
        tier = self.tiers.setdefault(self.tier_of(nodeid), Tier(now, now))
        tier.tests += 1
        self.running[nodeid] = Running(now, *cpu_ticks())

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        now = time.monotonic()
        tier = self.tiers.get(self.tier_of(nodeid))
        if tier is not None:
            tier.last = now
        began = self.running.pop(nodeid, None)
        busy, ticks = cpu_ticks()
        if began is None or ticks <= began.ticks:
            return
        used, passed = busy - began.busy, ticks - began.ticks
        if tier is not None:
            tier.busy, tier.ticks = tier.busy + used, tier.ticks + passed
        idle = Idle(nodeid, (passed - used) / CLOCK_TICKS, now - began.started, used / passed)
        self.idle = sorted([*self.idle, idle], key=lambda i: -i.idle_s)[:IDLEST_TESTS]

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.tiers:
            return
        terminalreporter.write_sep("=", "wall time per test tier")
        for name, tier in self.tiers.items():
            minutes, seconds = divmod(round(tier.last - tier.first), 60)
            line = f"tier {name:<12} {minutes:3d} min {seconds:02d} s  {tier.tests:5d} tests"
            if tier.ticks:
                line += f"   cores busy {100 * tier.busy / tier.ticks:3.0f} %"
            terminalreporter.write_line(line)
        if self.idle:
            terminalreporter.write_sep("=", f"the {len(self.idle)} tests that left the cores idlest")
            for i in self.idle:
                busy = f"busy {100 * i.busy_share:3.0f} %"
                terminalreporter.write_line(
                    f"{i.idle_s:7.1f} core-s idle {i.wall_s:6.1f} s wall  {busy}  {i.nodeid}"
                )
