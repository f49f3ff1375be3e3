"""The long-running processes of the kubelet tier: started in sessions of their own (they outlive
``llmjob cluster up``), their pids in ``<root>/pids/<name>.pid``, their output in ``<root>/logs/<name>.log``.

A pid file is trusted only while the process's command line names ``root`` (every process of the tier is
given a path below its folder) or the process is our own child that has not yet exec'd its program: a pid
reused by something else is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.waiting import poll


class ProcessStartError(LocalClusterError):
    """A process of the tier exited at start; the message carries the tail of its log."""


def _stat_fields(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def alive(pid: int) -> bool:
    """Running (a zombie, killed and not yet reaped by its parent, is not)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is our child (a process started by this Python process and
    killed would otherwise stay a zombie until we exit)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _parent(pid: int) -> int:
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else 0


@dataclass(frozen=True)
class Processes:
    """The processes whose pid and log files live under ``root``."""

    root: Path

    def pid_file(self, name: str) -> Path:
        return self.root / "pids" / f"{name}.pid"

    def log_file(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def launch(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in its own session, its output appended to the log of ``name``."""
        for folder in (self.root / "pids", self.root / "logs"):
            folder.mkdir(parents=True, exist_ok=True)
        with self.log_file(name).open("ab") as log:
            proc = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, **(env or {})}, cwd=self.root,
            )  # fmt: skip
        self.pid_file(name).write_text(f"{proc.pid}\n")
        return proc

    def wait_started(
        self, name: str, proc: subprocess.Popen[bytes], ready: Callable[[], bool], timeout: float
    ) -> int:
        """Until ``ready()``; raises ProcessStartError with the log's tail if the process exits first."""

        def up() -> bool:
            if proc.poll() is not None:
                raise ProcessStartError(
                    f"{name} exited at start (code {proc.returncode}):\n{self.tail(name)}"
                )
            return ready()

        poll(up, timeout=timeout, what=f"{name} to answer", interval=0.2)
        return proc.pid

    def running(self, name: str) -> int | None:
        """The pid of ``name`` if it runs (see the module's docstring for when a pid file is trusted)."""
        try:
            pid = int(self.pid_file(name).read_text().strip())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        ours = str(self.root).encode() in argv or _parent(pid) == os.getpid()
        return pid if alive(pid) and ours else None

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 10.0) -> bool:
        """Signal ``name`` and wait until it is gone (SIGKILL after ``timeout``); False if it did not run."""
        pid = self.running(name)
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while alive(pid) and time.monotonic() < deadline + timeout:
                time.sleep(0.05)
        reap(pid)
        self.pid_file(name).unlink(missing_ok=True)
        return True
