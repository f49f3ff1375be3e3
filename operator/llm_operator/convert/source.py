"""A source manifest read field by field: every field not taken is reported, never silently dropped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NO_EQUIVALENT = "no equivalent in LLMTrainingJob; dropped"


class ConvertError(Exception):
    """Invalid input; each problem names the source field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class Report:
    """The warnings of one conversion: one line per source field that has no equivalent."""

    lines: list[str] = field(default_factory=list)

    def warn(self, path: str, reason: str = NO_EQUIVALENT) -> None:
        line = f"{path}: {reason}"
        if line not in self.lines:
            self.lines.append(line)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number"
    )


class Node:
    """A mapping of the source being consumed; ``done()`` reports what was not taken."""

    def __init__(self, data: Any, path: str, report: Report) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConvertError([f"{path}: must be a mapping, got {_kind(data)}"])
        self.data = dict(data)
        self.path = path
        self.report = report

    def at(self, key: str) -> str:
        """The path of ``key`` under this node."""
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def take(self, key: str) -> Any:
        """The value at ``key`` (None when absent), taken: it is no longer reported."""
        return self.data.pop(key, None)

    def take_typed(self, key: str, kind: type | tuple[type, ...], what: str) -> Any:
        value = self.take(key)
        if value is None:
            return None
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise ConvertError([f"{self.at(key)}: must be {what}, got {_kind(value)}"])
        if not isinstance(value, kind):
            raise ConvertError([f"{self.at(key)}: must be {what}, got {_kind(value)}"])
        return value

    def take_int(self, key: str) -> int | None:
        value = self.take(key)
        if value is None:
            return None
        if isinstance(value, str) and value.isdigit():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConvertError([f"{self.at(key)}: must be an integer, got {value!r}"])
        return value

    def take_str(self, key: str) -> str | None:
        value: str | None = self.take_typed(key, str, "a string")
        return value

    def take_list(self, key: str) -> list[Any]:
        value: list[Any] | None = self.take_typed(key, list, "a list")
        return value or []

    def take_map(self, key: str) -> dict[str, Any]:
        value: dict[str, Any] | None = self.take_typed(key, dict, "a mapping")
        return value or {}

    def child(self, key: str) -> Node:
        """The mapping at ``key`` as a node of its own (taken; call its ``done()``)."""
        return Node(self.take(key), self.at(key), self.report)

    def drop(self, key: str, reason: str = NO_EQUIVALENT) -> None:
        """Take ``key`` and report it with ``reason`` when it is set."""
        if self.take(key) is not None:
            self.report.warn(self.at(key), reason)

    def ignore(self, *keys: str) -> None:
        """Take fields that carry no setting (type markers, server-set values)."""
        for key in keys:
            self.take(key)

    def done(self) -> None:
        """Report every field not taken."""
        for key, value in self.data.items():
            if value is not None and value != {} and value != []:
                self.report.warn(self.at(key))
        self.data = {}
