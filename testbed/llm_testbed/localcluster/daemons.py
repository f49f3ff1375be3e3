"""Ending a test-bed daemon that this process (or an earlier one) started: one shape for every daemon."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable


def terminate(pid: int, alive: Callable[[], bool], timeout: float) -> None:
    """SIGTERM ``pid``, reap it if it is our child, and SIGKILL it when ``alive()`` still holds after
    ``timeout`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive() and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    if alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
