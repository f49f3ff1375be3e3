"""Workers the API server refused to create (admission: Pod Security, a webhook, a quota): the job says so.

Pure. A refused worker never exists, so nothing watched would ever show it: the pass that tried to create
it reports it at once, as condition ``WorkersRefused`` (True, quoting the API server's message) and one
Warning Event per new refusal. The condition stays True while a pass still has refused workers or creates
none (nothing new is known), and turns False when a pass creates its workers again. A job that was never
refused carries no such condition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_operator.policy.status import condition

CONDITION = "WorkersRefused"
REASON = "AdmissionRefused"
REFUSED_STATUSES = frozenset({400, 403, 422})
"""HTTP answers to a create that are a refusal of the object itself (Forbidden: admission or quota;
BadRequest/Invalid: a webhook or validation); a conflict (409) or a throttle (429) is not."""
REFUSED_BY_OPERATOR = 0
"""The status of a worker the operator itself refused (the tenant rules: ``control.tenant_gate``)."""


@dataclass(frozen=True)
class Refusal:
    """One worker the API server would not create."""

    pod: str
    status: int
    message: str


def refusal_message(status: int, body: str) -> str:
    """The API server's own words: the ``message`` of the ``Status`` it answered, else the body."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    message = answer.get("message") if isinstance(answer, dict) else None
    return str(message or body or f"HTTP {status}").strip()


def describe(refused: Sequence[Refusal]) -> str:
    """One line quoting every refusal (the same admission rule usually refuses each worker alike)."""
    messages = sorted({r.message for r in refused})
    names = ", ".join(sorted(r.pod for r in refused))
    who = "the operator" if all(r.status == REFUSED_BY_OPERATOR for r in refused) else "the API server"
    return f"{who} refused worker(s) {names}: " + "; ".join(messages)


def refusal_condition(
    previous: Sequence[Mapping[str, Any]], refused: Sequence[Refusal], created: int, generation: int
) -> dict[str, Any] | None:
    """The condition after a pass that refused ``refused`` and created ``created`` workers (None: none)."""
    before = next((c for c in previous if c.get("type") == CONDITION), None)
    if refused:
        return condition(CONDITION, True, REASON, describe(refused), generation)
    if before is None:
        return None
    if created:
        return condition(CONDITION, False, "Created", "the API server created the workers", generation)
    return condition(
        CONDITION,
        before.get("status") == "True",
        str(before.get("reason")),
        str(before.get("message")),
        generation,
    )


def refusal_event(
    previous: Sequence[Mapping[str, Any]], cond: Mapping[str, Any] | None
) -> tuple[str, str, str] | None:
    """A Warning Event when the refusal is new or its message changed (a retry refused alike posts none)."""
    if cond is None or cond["status"] != "True":
        return None
    before = next((c for c in previous if c.get("type") == CONDITION), None)
    if before is not None and before.get("status") == "True" and before.get("message") == cond["message"]:
        return None
    return ("Warning", REASON, str(cond["message"]))
