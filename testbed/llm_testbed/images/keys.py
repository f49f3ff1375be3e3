"""Content keys: one hash over named parts, so the same inputs give the same image name on every machine."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

KEY_LENGTH = 16


def content_key(parts: Iterable[tuple[str, bytes]]) -> str:
    """SHA-256 over (name, bytes) pairs, each length-prefixed (no two inputs collide by concatenation)."""
    digest = hashlib.sha256()
    for name, data in parts:
        for piece in (name.encode(), data):
            digest.update(len(piece).to_bytes(8, "big"))
            digest.update(piece)
    return digest.hexdigest()[:KEY_LENGTH]


def file_parts(root: Path, paths: Iterable[str]) -> list[tuple[str, bytes]]:
    """``(path, bytes)`` of repository files, for :func:`content_key`; the executable bit counts too."""
    parts: list[tuple[str, bytes]] = []
    for rel in paths:
        full = root / rel
        mode = b"x" if full.stat().st_mode & 0o111 else b"-"
        parts.append((f"file:{rel}", mode + full.read_bytes()))
    return parts


def text_part(name: str, value: str) -> tuple[str, bytes]:
    return (name, value.encode())
