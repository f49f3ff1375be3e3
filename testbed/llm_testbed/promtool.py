"""promtool, Prometheus's rule checker and rule unit-test runner, from Debian's ``prometheus`` package.

The alert tests (tests/chart/test_alert_rules.py) check the chart's PrometheusRule with
``promtool check rules`` and run the unit tests under tests/chart/promtool/ with ``promtool test rules``.
:func:`ensure` installs the package when promtool is missing (root, apt-get, once per machine: see
:mod:`llm_testbed.host_packages`); the same package brings the ``prometheus`` server.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from llm_testbed.host_packages import HostPackageError, ensure_commands, logged_run
from llm_testbed.localcluster.paths import cache_root
from llm_testbed.localcluster.progress import say

COMMANDS: dict[str, str] = {"promtool": "prometheus", "prometheus": "prometheus"}
"""Command -> the Debian package that provides it."""


def _say(message: str) -> None:
    say("prometheus", message)


def ensure() -> Path:
    """The path of promtool, installed first when missing; HostPackageError when it cannot be."""
    ensure_commands(COMMANDS, logged_run(cache_root() / "logs", _say), _say)
    found = shutil.which("promtool")
    if found is None:  # ensure_commands checked it; a PATH change in between is the only way here
        raise HostPackageError("promtool is not on PATH after installing the prometheus package")
    return Path(found)
