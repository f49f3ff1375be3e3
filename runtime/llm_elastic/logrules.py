r"""Log rules (spec.monitoring.rules with logPattern), evaluated on a program's output lines.

Pure and clocked by its caller: :class:`LogRules` is fed each output line (``line``) and the time
(``tick``) and answers the rules that fire. The supervisor (``llm_elastic.supervise``) owns the reading
and the actions. The rules come as JSON in ``$LLMJOB_LOG_RULES`` (the operator renders every field the rule
sets, ``after`` filled): ``[{"name", "logPattern", "expectedStartCutOffSeconds",
"expectedRecurringSeconds", "metricThreshold", "operator", "dataPoints", "action", "after"}]``.

A rule *breaks*:

- ``expectedStartCutOffSeconds``: no matching line this long after the program started (once per start);
- ``expectedRecurringSeconds``: no matching line this long after the last one (or after the start, when
  no start cut-off is set); each further interval without one is another break;
- ``metricThreshold``: the first group of each of the last ``dataPoints`` matching lines is a number for
  which ``number <operator> threshold`` holds (the window then starts empty again);
- a pattern alone: every matching line.

On its ``after``-th consecutive break it *fires* (and the count starts again); a matching line (a number
that does not break, for a threshold) resets the count.

Patterns are RE2 (the API server and the operator refuse anything else) and are matched on the line's
bytes. A pattern that Python's ``re`` compiles without complaint is matched by ``re``: on a bytes pattern it
reads that RE2 syntax the same way (ASCII classes, the same anchors and flags; RE2-only syntax such as
``\pN``, ``\z`` or ``(?U)`` is an error there) and it costs about a fifth of the ``google-re2`` binding
per line (docs/decisions.md, "Log rules match with Python's re where it reads the pattern as RE2 does").
The others, and POSIX classes (``[[:alpha:]]``, which ``re`` would read as a set), use ``google-re2``.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import re2

ACTIONS = ("event", "restartWorker", "replaceNode", "restartJob", "failJob")
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "lt": lambda v, t: v < t,
    "lte": lambda v, t: v <= t,
    "gt": lambda v, t: v > t,
    "gte": lambda v, t: v >= t,
}


def compile_pattern(pattern: str) -> Any:
    """A compiled bytes pattern with ``search`` and ``pattern``: Python's ``re`` where it reads the RE2
    pattern alike, else RE2. Raises :class:`RuleError` when RE2 refuses it."""
    options = re2.Options()
    options.log_errors = False
    data = pattern.encode()
    try:
        fallback = re2.compile(data, options)
    except re2.error as exc:
        raise RuleError(f"logPattern {pattern!r} is not valid RE2") from exc
    if "[:" in pattern:  # a POSIX class: RE2 knows it, re reads a set of characters
        return fallback
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "possible nested set" and the like: not read alike
        try:
            return re.compile(data)
        except (re.error, Warning):
            return fallback


class RuleError(ValueError):
    """The rules' JSON is not what the operator renders (one line naming the rule and field)."""


@dataclass(frozen=True)
class Firing:
    """A rule that fired: what the supervisor acts on and prints."""

    rule: str
    action: str
    detail: str
    """Why, in one line: ``no match of 'step (\\d+)' for 30.0 s``."""

    def event(self, now: float) -> dict[str, Any]:
        """The JSON line the supervisor prints to the pod log."""
        return {
            "event": "rule-fired",
            "rule": self.rule,
            "action": self.action,
            "detail": self.detail,
            "time": now,
        }


@dataclass
class Rule:
    """One log rule and its state."""

    name: str
    pattern: Any
    """The compiled bytes pattern (``compile_pattern``)."""
    action: str
    after: int = 1
    start_cutoff: float | None = None
    recurring: float | None = None
    threshold: float | None = None
    operator: str = "lt"
    data_points: int = 1
    breaks: int = 0
    """Consecutive breaks so far."""
    last_match: float | None = None
    started: float = 0.0
    start_broken: bool = False
    window: deque[float] = field(default_factory=deque)

    @property
    def timed(self) -> bool:
        return self.start_cutoff is not None or self.recurring is not None

    def restart(self, now: float) -> None:
        """The program (re)started: timing starts again; the consecutive break count is kept."""
        self.started, self.last_match, self.start_broken = now, None, False
        self.window.clear()

    def _break(self, detail: str) -> Firing | None:
        self.breaks += 1
        if self.breaks < self.after:
            return None
        self.breaks = 0
        return Firing(self.name, self.action, detail)

    def line(self, text: bytes, now: float) -> Firing | None:
        match = self.pattern.search(text)
        if match is None:
            return None
        if self.timed:
            self.last_match = now
        if self.threshold is None:
            if self.timed:
                self.breaks = 0
                return None
            return self._break(f"line matched '{self.pattern.pattern.decode(errors='replace')}'")
        try:
            value = float(match.group(1))
        except (TypeError, ValueError, IndexError):
            return None  # a line whose group is no number tells nothing
        if not _COMPARE[self.operator](value, self.threshold) or math.isnan(value):
            self.window.clear()
            self.breaks = 0
            return None
        self.window.append(value)
        if len(self.window) < self.data_points:
            return None
        values = list(self.window)
        self.window.clear()
        shown = ", ".join(f"{v:g}" for v in values[-3:])
        more = "..., " if len(values) > 3 else ""
        return self._break(
            f"the last {len(values)} value(s) ({more}{shown}) {self.operator} {self.threshold:g}"
        )

    def due(self) -> float | None:
        """When the rule breaks next if no line matches (None: not timed)."""
        if self.last_match is None:
            if self.start_cutoff is not None:
                return None if self.start_broken else self.started + self.start_cutoff
            if self.recurring is not None:
                return self.started + self.recurring
            return None
        return self.last_match + self.recurring if self.recurring is not None else None

    def tick(self, now: float) -> Firing | None:
        due = self.due()
        if due is None or now < due:
            return None
        shown = self.pattern.pattern.decode(errors="replace")
        if self.last_match is None and self.start_cutoff is not None:
            self.start_broken = True
            return self._break(f"no line matched '{shown}' within {self.start_cutoff:g} s of the start")
        assert self.recurring is not None  # due() is set only then
        since = self.last_match if self.last_match is not None else self.started
        self.last_match = now  # the next break is one more interval away
        return self._break(
            f"no line matched '{shown}' for {now - since:.1f} s (expected every {self.recurring:g} s)"
        )


def _number(item: dict[str, Any], key: str, name: str) -> float | None:
    value = item.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RuleError(f"log rule {name}: {key} must be a number, got {value!r}")
    return float(value)


def parse(text: str) -> list[Rule]:
    """The rules of ``$LLMJOB_LOG_RULES`` (empty text: none)."""
    if not text.strip():
        return []
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuleError(f"log rules: not JSON: {exc}") from exc
    if not isinstance(items, list):
        raise RuleError("log rules: must be a JSON list")
    rules = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise RuleError(f"log rules[{i}]: must be an object")
        name = str(item.get("name") or f"rule-{i}")
        action = item.get("action")
        if action not in ACTIONS:
            raise RuleError(f"log rule {name}: action {action!r} is not one of {', '.join(ACTIONS)}")
        pattern = item.get("logPattern")
        if not isinstance(pattern, str) or not pattern:
            raise RuleError(f"log rule {name}: logPattern is missing")
        try:
            compiled = compile_pattern(pattern)
        except RuleError as exc:
            raise RuleError(f"log rule {name}: {exc}") from exc
        operator = str(item.get("operator") or "lt")
        if operator not in _COMPARE:
            raise RuleError(f"log rule {name}: operator {operator!r} is not one of lt, lte, gt, gte")
        rules.append(
            Rule(
                name=name,
                pattern=compiled,
                action=str(action),
                after=int(item.get("after") or 1),
                start_cutoff=_number(item, "expectedStartCutOffSeconds", name),
                recurring=_number(item, "expectedRecurringSeconds", name),
                threshold=_number(item, "metricThreshold", name),
                operator=operator,
                data_points=int(item.get("dataPoints") or 1),
            )
        )
    return rules


class LogRules:
    """Every log rule of a program, fed its lines and the clock. Not thread-safe: one caller at a time."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules

    def start(self, now: float) -> None:
        """The program (re)started now."""
        for rule in self.rules:
            rule.restart(now)

    def line(self, text: bytes, now: float) -> list[Firing]:
        """One output line (without its newline)."""
        return [f for f in (rule.line(text, now) for rule in self.rules) if f is not None]

    def tick(self, now: float) -> list[Firing]:
        """Timed rules whose deadline passed."""
        return [f for f in (rule.tick(now) for rule in self.rules) if f is not None]

    def next_due(self) -> float | None:
        """The earliest deadline of a timed rule (None: none)."""
        dues = [d for d in (rule.due() for rule in self.rules) if d is not None]
        return min(dues) if dues else None
