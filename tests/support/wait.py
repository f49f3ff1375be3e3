"""``wait_for``: the only way tests wait (poll a probe; never a fixed sleep)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
from llm_testbed.localcluster.waiting import WaitTimeout, poll

T = TypeVar("T")


def wait_for(fn: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Return the first truthy value of ``fn()``; fail the test naming ``what`` and the last value seen."""
    try:
        return poll(fn, timeout=timeout, what=what, interval=interval)
    except WaitTimeout as exc:
        pytest.fail(str(exc), pytrace=False)
