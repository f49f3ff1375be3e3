"""A program's output read through the log rules (:mod:`llm_elastic.logrules`) for the supervisor
(:mod:`llm_elastic.supervise`): every byte passes on unchanged to the supervisor's own stdout and stderr, each
line is matched, and a firing is handed to the supervisor, which decides what it does. No torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from typing import IO

from llm_elastic.logrules import Firing, LogRules

CHUNK = 1 << 16
MAX_LINE = 1 << 16
"""Bytes of one line the rules see (the output passes through whole)."""


class Output:
    """Writes to the supervisor's own stdout/stderr, whole chunks under one lock per stream."""

    def __init__(self) -> None:
        self.locks = {1: threading.Lock(), 2: threading.Lock()}

    def write(self, fd: int, data: bytes) -> None:
        with self.locks[fd]:
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:  # pragma: no cover - a non-blocking reader of our stdout
                    time.sleep(0.001)
                except OSError:  # our stdout is gone: keep reading, or the program blocks on a full pipe
                    return

    def event(self, event: dict[str, object]) -> None:
        self.write(1, (json.dumps(event) + "\n").encode())


class Watched:
    """One run of the program with its output read, passed through and matched against the rules."""

    def __init__(self, child: subprocess.Popen[bytes], rules: LogRules, out: Output) -> None:
        self.child = child
        self.rules = rules
        self.out = out
        self.lock = threading.Lock()
        self.firings: queue.Queue[Firing] = queue.Queue()
        self.readers = [
            threading.Thread(target=self._read, args=(stream, fd), daemon=True)
            for stream, fd in ((child.stdout, 1), (child.stderr, 2))
            if stream is not None
        ]
        for reader in self.readers:
            reader.start()

    def _read(self, stream: IO[bytes], fd: int) -> None:
        pending = b""
        raw = stream.fileno()
        while True:
            try:
                data = os.read(raw, CHUNK)
            except OSError:
                data = b""
            if not data:
                break
            self.out.write(fd, data)  # every byte, unchanged, before it is looked at
            pending += data
            *lines, pending = pending.split(b"\n")
            if len(pending) > MAX_LINE:
                lines.append(pending[:MAX_LINE])
                pending = b""
            self._match(lines)
        if pending:
            self._match([pending])

    def _match(self, lines: list[bytes]) -> None:
        if not lines:
            return
        now = time.monotonic()
        with self.lock:
            found = [f for line in lines for f in self.rules.line(line[:MAX_LINE].rstrip(b"\r"), now)]
        for firing in found:
            self.firings.put(firing)

    def wait(self) -> tuple[int | None, Firing | None]:
        """Until the program exits (its code) or a rule fires (the firing, the program still running)."""
        while True:
            try:
                return None, self.firings.get_nowait()
            except queue.Empty:
                pass
            code = self.child.poll()
            if code is not None:
                for reader in self.readers:
                    reader.join(timeout=5)
                try:  # a line written just before the exit still counts
                    return None, self.firings.get_nowait()
                except queue.Empty:
                    return code, None
            with self.lock:
                due = self.rules.tick(time.monotonic())
                next_due = self.rules.next_due()
            for firing in due:
                self.firings.put(firing)
            if due:
                continue
            timeout = POLL if next_due is None else max(0.0, min(POLL, next_due - time.monotonic()))
            try:
                return None, self.firings.get(timeout=timeout)
            except queue.Empty:
                continue

    def stop(self, grace: float) -> int:
        """SIGTERM the program's process group, SIGKILL after ``grace`` seconds; its exit code."""
        for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child.pid, signum)
            try:
                code = self.child.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            for reader in self.readers:
                reader.join(timeout=5)
            return code
        return self.child.wait()


POLL = 0.2
"""Seconds between two looks at the program and the rules' clocks while nothing happens."""
