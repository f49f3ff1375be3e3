"""The live driver's JSON event lines (``formed``, ``waiting``, ``released``) in a member's or pod's log."""

from __future__ import annotations

import json
from typing import Any


def events(log: str) -> list[dict[str, Any]]:
    """Every line of ``log`` that is a JSON object, parsed (other lines are the driver's logging)."""
    found = []
    for line in log.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found
