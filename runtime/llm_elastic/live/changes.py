"""A count of watch events that never loses a wake-up.

A watch thread calls :meth:`Changes.bump` for every event. A reader takes a :meth:`~Changes.mark` *before*
it reads the state the events guard, and later asks :meth:`~Changes.since` or waits with
:meth:`~Changes.wait`: an event that came after the mark, and so perhaps after the read, shows as a
difference, whatever any other reader did meanwhile. Nothing is ever cleared, so one reader's wait cannot
consume the event another reader needed (a shared flag cleared by one loop lost a joiner's registration:
docs/runtime-design.md, "A wake-up is never lost").
"""

from __future__ import annotations

import threading


class Changes:
    """Monotonic event counter with waiting; each reader keeps its own marks."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0

    def bump(self) -> None:
        """One more event (from a watch thread): wakes every waiter."""
        with self._cond:
            self._count += 1
            self._cond.notify_all()

    def nudge(self) -> None:
        """Wake every waiter without an event (a reader that stops checks its own flag after waking)."""
        with self._cond:
            self._cond.notify_all()

    def mark(self) -> int:
        """The count now: take it before reading the guarded state."""
        with self._cond:
            return self._count

    def since(self, mark: int) -> bool:
        """Whether an event came after ``mark``."""
        with self._cond:
            return self._count != mark

    def wait(self, mark: int, timeout: float | None) -> bool:
        """Wait until an event after ``mark``, a :meth:`nudge` or ``timeout``; True when an event came."""
        with self._cond:
            if self._count == mark:
                self._cond.wait(timeout)
            return self._count != mark
