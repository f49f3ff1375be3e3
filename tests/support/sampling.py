"""Readings taken in the background while a test drives the cluster: ``with sampled(read) as readings:``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")


@contextmanager
def sampled(
    read: Callable[[], T], every: float, on_error: Callable[[Exception], T] | None = None
) -> Iterator[list[T]]:
    """``read()`` every ``every`` seconds in a thread for the ``with`` block's length, appended to the list
    it yields. A read that raises is recorded as ``on_error(exc)``; without ``on_error`` the sampling stops
    and the error is raised when the block ends (a sampler never dies unseen)."""
    readings: list[T] = []
    errors: list[Exception] = []
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            try:
                readings.append(read())
            except Exception as exc:  # recorded or raised at the end of the block
                if on_error is None:
                    errors.append(exc)
                    return
                readings.append(on_error(exc))
            done.wait(every)

    thread = threading.Thread(target=loop, name="sampler", daemon=True)
    thread.start()
    try:
        yield readings
    finally:
        done.set()
        thread.join(timeout=60)
    if errors:
        raise errors[0]
