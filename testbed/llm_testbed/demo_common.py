"""What both demo stories (``demo``: fake nodes, ``demo_training``: real training) and the end-to-end
benchmarks share: the timeline they print, and the operator started as README says."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Timeline:
    """What happened and when, relative to the job's creation."""

    start: float = field(default_factory=time.monotonic)
    rows: list[tuple[str, float, str]] = field(default_factory=list)

    def mark(self, what: str, reaction: str = "") -> float:
        now = time.monotonic()
        self.rows.append((what, now - self.start, reaction))
        print(f"  [{now - self.start:6.1f}s] {what}" + (f"  ({reaction})" if reaction else ""), flush=True)
        return now

    def table(self) -> str:
        width = max(len(r[0]) for r in self.rows)
        lines = [f"{'what happened':<{width}}  {'at':>7}  reaction", f"{'-' * width}  {'-' * 7}  {'-' * 30}"]
        lines += [f"{what:<{width}}  {at:6.1f}s  {reaction}" for what, at, reaction in self.rows]
        return "\n".join(lines)


def start_operator(log: Path) -> subprocess.Popen[bytes]:
    """`llmjob operator --all-namespaces`, as README says (peering created when missing)."""
    argv = [sys.executable, "-m", "llm_operator.cli", "operator", "--all-namespaces"]
    argv += ["--metrics-port", "0", "--liveness-port", "0"]
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=dict(os.environ))


def stop_operator(operator: subprocess.Popen[bytes]) -> None:
    operator.terminate()
    try:
        operator.wait(timeout=30)
    except subprocess.TimeoutExpired:
        operator.kill()
