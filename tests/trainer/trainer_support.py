"""Helpers of the trainer tests: waiting on conditions (never fixed sleeps)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

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
