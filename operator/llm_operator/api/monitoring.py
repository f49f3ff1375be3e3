"""Monitoring rules (spec.monitoring.rules): the RE2 checks of a log pattern (the workers' env names are
``llm_elastic.contract``'s ``LOSS_RULES_ENV`` and ``LOG_RULES_ENV``).

Patterns are RE2 (the apiserver's CEL ``matches()`` and the supervisor in the pod use RE2, through the
``google-re2`` bindings that cel-python already depends on); Python's ``re`` accepts patterns RE2
refuses (look-arounds, back-references) and reads some RE2 syntax differently, so it is never used here.
"""

from __future__ import annotations

import re2


def _quiet() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # the error comes back as an exception; RE2 would also log it to stderr
    return options


def pattern_problem(pattern: str) -> str:
    """Why ``pattern`` is not a valid RE2 pattern ('' when it is)."""
    try:
        re2.compile(pattern, _quiet())
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        return f"not a valid RE2 pattern: {detail.decode() if isinstance(detail, bytes) else detail}"
    return ""


def groups(pattern: str) -> int:
    """Capture groups of a valid RE2 pattern."""
    return int(re2.compile(pattern, _quiet()).groups)
