"""Polling until a condition holds: the only way this package waits (never a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from llm_testbed.localcluster.errors import LocalClusterError

T = TypeVar("T")


class WaitTimeout(LocalClusterError):
    """The condition did not hold in time; ``last`` is the last value the probe returned."""

    def __init__(self, what: str, timeout: float, last: object) -> None:
        self.what = what
        self.last = last
        super().__init__(f"timed out after {timeout:g}s waiting for {what} (last seen: {last!r})")


def poll(fn: Callable[[], T], *, timeout: float, what: str, interval: float = 0.1) -> T:
    """Call ``fn`` until it returns something truthy and return that; raise :class:`WaitTimeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(what, timeout, value)
        time.sleep(interval)
