"""Graceful stop: SIGTERM (or SIGINT) asks the trainer to finish the current step, save and exit."""

from __future__ import annotations

import signal
import threading
from types import FrameType


class StopRequest:
    """Records a stop signal; the training loop polls :attr:`requested` once per step."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""

    def install(self) -> StopRequest:
        """Handle SIGTERM and SIGINT in this (main) thread."""
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name
        self._event.set()

    @property
    def requested(self) -> bool:
        """Whether this process received a stop signal."""
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Block until a stop signal arrives or ``timeout`` passes; True when one arrived."""
        return self._event.wait(timeout)
