"""Helpers of the trainer tests: waiting on conditions (never fixed sleeps)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(fn: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Return ``fn()``'s first truthy value; fail naming ``what`` and the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T = fn()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last value: {last!r}")
        time.sleep(interval)
        last = fn()
    return last
