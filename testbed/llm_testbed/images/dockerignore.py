"""Which files of the repository a build context holds: the ``.dockerignore`` rules, as Docker reads them.

The rules are moby's ``patternmatcher`` (what BuildKit applies): lines are cleaned paths relative to the
context, ``#`` starts a comment, ``!`` lets a path back in, the last rule that matches a path decides, and a
rule matches a file when it matches the file's path or the path of any folder above it. ``*`` and ``?``
stay within one path segment, ``**`` spans any number of them. The image builder stages exactly these
files (and hashes them for the cache key), so podman sees the context Docker would send.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_SPECIAL = "*?[\\"


@dataclass(frozen=True)
class Rule:
    """One line of an ignore file: ``pattern`` (cleaned) and whether it lets paths back in (``!``)."""

    pattern: str
    include: bool
    regex: re.Pattern[str]

    def matches(self, path: str) -> bool:
        """The path itself or one of the folders above it matches."""
        if self.regex.match(path):
            return True
        parts = path.split("/")[:-1]
        return any(self.regex.match("/".join(parts[: i + 1])) for i in range(len(parts)))

    def may_match_below(self, folder: str) -> bool:
        """Whether some path inside ``folder`` could match (decided on the literal start of the pattern)."""
        literal = self.pattern
        for index, char in enumerate(self.pattern):
            if char in _SPECIAL:
                literal = self.pattern[:index]
                break
        below = folder + "/"
        return below.startswith(literal) or literal.startswith(below)


def _translate(pattern: str) -> re.Pattern[str]:
    out = "^"
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "*" and pattern[i + 1 : i + 2] == "*":
            i += 2
            if pattern[i : i + 1] == "/":
                i += 1
            out += ".*" if i >= len(pattern) else "(.*/)?"
            continue
        if char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        elif char in "[]^-":
            out += char  # character classes keep their meaning
        else:
            out += re.escape(char)
        i += 1
    return re.compile(out + "$")


def parse(lines: Iterable[str]) -> list[Rule]:
    """The rules of an ignore file's lines, in order; a lone ``!`` is an error."""
    rules: list[Rule] = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        if include:
            line = line[1:].strip()
            if not line:
                raise ValueError("a .dockerignore line '!' names no path")
        cleaned = posixpath.normpath(line).lstrip("/") or "."
        rules.append(Rule(cleaned, include, _translate(cleaned)))
    return rules


def excluded(rules: list[Rule], path: str) -> bool:
    """Whether the context leaves ``path`` (relative, ``/``-separated) out: the last matching rule decides."""
    out = False
    for rule in rules:
        if rule.matches(path):
            out = not rule.include
    return out


def _skippable(rules: list[Rule], folder: str) -> bool:
    return excluded(rules, folder) and not any(r.include and r.may_match_below(folder) for r in rules)


def context_files(root: Path, ignore_file: Path) -> list[str]:
    """Every regular file under ``root`` the ignore file lets into the context, sorted, ``/``-separated.

    Folders that are left out and that no ``!`` rule reaches into are not walked (``.git``, ``.venv``).
    """
    rules = parse(ignore_file.read_text().splitlines())
    found: list[str] = []
    for current, folders, files in os.walk(root):
        rel = Path(current).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        folders[:] = sorted(f for f in folders if not _skippable(rules, prefix + f))
        for name in files:
            path = prefix + name
            full = Path(current) / name
            if full.is_file() and not full.is_symlink() and not excluded(rules, path):
                found.append(path)
    return sorted(found)
