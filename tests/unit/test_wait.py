"""support.wait.wait_for: returns the first truthy value, fails naming what it waited for."""

from __future__ import annotations

import itertools

import pytest
from support.wait import wait_for


def test_returns_first_truthy_value() -> None:
    values = iter([None, 0, "", "ready", "later"])
    assert wait_for(lambda: next(values), timeout=5, what="a value", interval=0.001) == "ready"


def test_fails_with_what_and_last_value() -> None:
    counter = itertools.count()
    with pytest.raises(pytest.fail.Exception, match=r"waiting for the pod to run \(last seen: \[\]\)"):
        wait_for(
            lambda: [] if next(counter) >= 0 else None, timeout=0.05, what="the pod to run", interval=0.01
        )
