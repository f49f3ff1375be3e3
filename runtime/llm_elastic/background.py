"""One background job at a time (a checkpoint persist, a snapshot's buddy copy) whose failure surfaces in the
training thread: ``wait()`` joins it and re-raises what it raised."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Background:
    """A daemon thread slot; ``what`` names the job in the error ``wait()`` raises."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, name: str, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` in a new thread (the caller waits for the previous one first)."""

        def run() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # reported to the training thread by wait()
                self._error = exc

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Whether the job is still running."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Wait for the job (if any); raise if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"{self.what} failed: {error}") from error
