"""Helpers of the trainer tests: waiting on conditions (never fixed sleeps)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")


def wait_for(fn: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Return ``fn()``'s first truthy value; fail naming ``what`` and the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T = fn()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last value: {last!r}")
        time.sleep(interval)
        last = fn()
    return last


WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "elastic",
    "workers",
    "join",
    "and",
    "leave",
    "the",
    "ring",
    "checkpoints",
    "land",
    "on",
    "shared",
    "storage",
    "and",
    "every",
    "sample",
    "is",
    "seen",
    "exactly",
    "once",
]


def write_corpus(folder: Path, documents: int = 6, words: int = 2500, seed: int = 7) -> list[Path]:
    """Deterministic text documents."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(documents):
        path = folder / f"doc{index}.txt"
        path.write_text(" ".join(rng.choice(WORDS) for _ in range(words)))
        paths.append(path)
    return paths


def trainer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of trainer subprocesses: one thread each (2-core CI), unbuffered output."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "LOGLEVEL": "WARNING"})
    env.pop("LLMJOB_CHECKPOINT_DIR", None)
    env.update(extra or {})
    return env


class Processes:
    """Starts processes in their own process group and kills every group that is still alive at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(
        self, argv: Sequence[str], name: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Run ``argv`` with output in ``<logs>/<name>.log``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env or trainer_env(),
                start_new_session=True,
            )
        self.started.append((proc, log_path))
        return proc

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        """Everything the process printed so far."""
        for candidate, path in self.started:
            if candidate is proc:
                return path.read_text(errors="replace")
        return ""

    @staticmethod
    def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        """Signal the process, its process group and every descendant (torchrun puts its workers in
        sessions of their own, so a lost node is the whole tree)."""
        try:
            tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        except psutil.NoSuchProcess:
            tree = []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def close(self) -> None:
        """SIGKILL every group still alive and reap it."""
        for proc, _ in self.started:
            self.kill_group(proc)
        for proc, _ in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)

    def dump(self) -> str:
        """The tail of every log, for failure messages."""
        parts = []
        for proc, path in self.started:
            tail = "\n".join(path.read_text(errors="replace").splitlines()[-40:])
            parts.append(f"--- {path.name} (pid {proc.pid}, rc {proc.poll()}) ---\n{tail}")
        return "\n".join(parts)


def train_argv(data: Path, checkpoint_dir: Path, *extra: str) -> list[str]:
    """``python -m llm_trainer`` with the tiny model and small, fast settings."""
    return [
        sys.executable,
        "-m",
        "llm_trainer",
        "--data",
        str(data),
        "--checkpoint-dir",
        str(checkpoint_dir),
        "--model",
        "tiny",
        "--seq-len",
        "32",
        "--global-batch",
        "12",
        "--micro-batch",
        "2",
        "--metrics-port",
        "0",
        *extra,
    ]


def launch_world(
    procs: Processes, argv: Sequence[str], world_size: int, name: str
) -> list[subprocess.Popen[bytes]]:
    """Start ``world_size`` ranks of ``argv`` with the env torchrun would set (no agent: faster)."""
    from llm_testbed.local_etcd import free_port

    port = str(free_port())
    started = []
    for rank in range(world_size):
        env = trainer_env(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            }
        )
        started.append(procs.start(argv, f"{name}-rank{rank}", env=env))
    return started
