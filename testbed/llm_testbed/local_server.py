"""One local server process of the test bed (etcd, a registry): started in its own session with its log in
a file, waited on until it answers, stopped with SIGTERM then SIGKILL. The servers differ only in their
command line and in how they say they are ready."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self


class LocalServer:
    """The process, its log and its lifetime; subclasses build the command line and define ``start``."""

    STOP_TIMEOUT_S = 3.0
    """How long ``stop`` waits after SIGTERM before SIGKILL."""

    def __init__(self, binary: Path, workdir: Path, log_name: str, host: str = "127.0.0.1") -> None:
        self.binary = binary
        self.workdir = workdir
        self.host = host
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / log_name

    def start(self) -> Self:
        raise NotImplementedError

    def _launch(
        self,
        argv: Sequence[str],
        ready: Callable[[], bool],
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> bool:
        """Start ``argv`` (its output appended to the log) and wait up to ``timeout`` s for ``ready()``.
        False: it exited or never answered (the caller stops it and may try another port)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=None if env is None else {**os.environ, **env},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            if ready():
                return True
            time.sleep(0.1)
        return False

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` (``STOP_TIMEOUT_S``); waits for the process to exit."""
        timeout = self.STOP_TIMEOUT_S if timeout is None else timeout
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> Self:
        return self.start() if self.proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
