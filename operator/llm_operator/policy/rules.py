"""Monitoring rules that ended a worker, as its termination message says (pure).

The supervisor in a worker (``llm_elastic.supervise``) that acts on a log rule writes one line to the
termination message file, ``rule-fired: <rule> <action>: <detail>``, and exits 78 (replaceNode: handled as a
node health failure, check ``rule``) or 79 (restartJob, failJob, or restartWorker past its restarts).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_elastic.contract import EXIT_RULE_FIRED, RULE_FIRED_PREFIX

RULE_EXIT_CODE = EXIT_RULE_FIRED
"""A log rule ended the worker (restartJob, failJob, restartWorker past its restarts)."""
PREFIX = RULE_FIRED_PREFIX
DETAIL_LIMIT = 256


@dataclass(frozen=True)
class RuleFiring:
    """One firing of a rule, read from a worker's termination message."""

    rule: str
    action: str
    detail: str


def parse_firing(message: str) -> RuleFiring | None:
    """``rule-fired: <rule> <action>: <detail>`` (the first non-empty line), or None."""
    line = next((ln.strip() for ln in message.splitlines() if ln.strip()), "")
    if not line.startswith(PREFIX):
        return None
    head, _, detail = line[len(PREFIX) :].partition(":")
    words = head.split()
    if len(words) != 2:
        return None
    return RuleFiring(words[0], words[1], detail.strip()[:DETAIL_LIMIT])
