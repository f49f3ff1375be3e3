"""One long command of the image build: output to a log file, progress lines with the elapsed time.

A command's own output goes to its log; stderr gets ``[images] <what>: ...`` lines: when it starts (with
the log's path), whenever ``progress`` picks a line out of the output (podman's ``STEP n/m``), at least
every ``HEARTBEAT_SECONDS`` while it is quiet, and when it ends. A failure raises :class:`ImageError`
naming the step, the exit status, the last progress line, the log's tail and its path.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from llm_testbed.images.errors import ImageError
from llm_testbed.localcluster.progress import say

HEARTBEAT_SECONDS = 30.0
TAIL_LINES = 25

Progress = Callable[[str], str | None]
"""Picks the lines worth a progress line out of a command's output (``None``: not this one)."""


def report(message: str, topic: str = "images") -> None:
    say(topic, message)


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last non-blank lines of a log file."""
    if not path.is_file():
        return "(no log)"
    kept = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return "\n".join(kept[-lines:]) or "(empty log)"


def _pump(stream: IO[str], log: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        log.write(line)
        log.flush()
        lines.put(line.rstrip("\n"))
    lines.put(None)


def run_step(
    what: str,
    argv: Sequence[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    progress: Progress | None = None,
    topic: str = "images",
) -> float:
    """Run ``argv`` with its output in ``log_path``; the seconds it took. ImageError if it fails.
    Progress lines read ``[<topic>] <what>: ...``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    report(f"{what}: started (log: {log_path})", topic)
    started = time.monotonic()
    last_said = started
    latest = ""
    with log_path.open("w") as log:
        log.write(f"# {' '.join(argv)}\n")
        log.flush()
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
        except OSError as exc:
            raise ImageError(f"{what}: cannot run {argv[0]}: {exc}") from None
        assert proc.stdout is not None
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(proc.stdout, log, lines), daemon=True)
        reader.start()
        while True:
            try:
                line = lines.get(timeout=HEARTBEAT_SECONDS)
            except queue.Empty:
                line = ""
            now = time.monotonic()
            if line is None:
                break
            picked = progress(line) if (progress is not None and line) else None
            if picked is not None:
                latest = picked
                report(f"{what}: {picked} ({now - started:.0f}s)", topic)
                last_said = now
            elif now - last_said >= HEARTBEAT_SECONDS:
                report(f"{what}: still running ({now - started:.0f}s)", topic)
                last_said = now
        code = proc.wait()
        reader.join()
    elapsed = time.monotonic() - started
    if code != 0:
        where = f" at {latest}" if latest else ""
        raise ImageError(
            f"{what} failed (exit {code}) after {elapsed:.0f}s{where}; the log ends with:\n"
            f"{tail(log_path)}\n(whole log: {log_path})"
        )
    report(f"{what}: done in {elapsed:.0f}s", topic)
    return elapsed
