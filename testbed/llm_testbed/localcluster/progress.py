"""Progress lines on stderr, so stdout stays clean for what scripts read (paths, exports)."""

from __future__ import annotations

import sys


def say(topic: str, message: str) -> None:
    print(f"[{topic}] {message}", file=sys.stderr, flush=True)
