"""Health failures reported by workers (exit code 78): what failed, whether it costs a restart, and the
job's bounded record of unhealthy nodes (status.unhealthyNodes) that new workers avoid.

Pure. The runtime (llm_elastic) writes one line to the container's termination message file before it
exits 78 (docs/CONTRACTS.md): ``[preflight|periodic] <check>: <detail>``, e.g.
``preflight checkpoint-write: 4 MiB write+fsync took 3.1 s > 2.0 s``. Anything else still counts as a
health failure (check ``other``, not pre-flight).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from llm_elastic.contract import HEALTH_PHASES

UNHEALTHY_LIMIT = 16
"""Entries kept in status.unhealthyNodes (newest); older nodes are no longer avoided."""
REASON_LIMIT = 256
"""Characters of the termination message kept in the record and the Event."""

# Check names in the message -> the bounded `reason_kind` label of llmjob_unhealthy_nodes_total.
CHECKS: dict[str, str] = {
    "checkpoint-write": "checkpoint-write",
    "checkpoint": "checkpoint-write",
    "shared-memory": "shared-memory",
    "shm": "shared-memory",
    "gpu": "gpu",
    "gpu-count": "gpu",
    "gpu-matmul": "gpu",
    "matmul": "gpu",
    "nccl": "nccl",
    "nccl-allreduce": "nccl",
    "efa": "efa",
    "command": "command",
    "straggler": "straggler",
    "rule-fired": "rule",  # a log rule with action replaceNode (policy.rules)
}
KINDS = (*sorted(set(CHECKS.values())), "other")
STRAGGLER = "straggler"
PREFLIGHT_WORDS = (HEALTH_PHASES[0], "pre-flight")
PHASE_WORDS = (*PREFLIGHT_WORDS, *HEALTH_PHASES[1:])


@dataclass(frozen=True)
class HealthFailure:
    """What a worker's termination message says."""

    check: str
    """One of KINDS."""
    preflight: bool
    """Found before the worker became a member (the membership did not change)."""
    reason: str
    """The message's first line, bounded."""

    @property
    def straggler(self) -> bool:
        return self.check == STRAGGLER


def parse_failure(message: str) -> HealthFailure:
    """Read ``[preflight|periodic] <check>: <detail>``; unknown checks are ``other``."""
    line = next((ln.strip() for ln in message.splitlines() if ln.strip()), "")
    words = line.split(None, 1)
    preflight = False
    rest = line
    if words and words[0].lower() in PHASE_WORDS:
        preflight = words[0].lower() in PREFLIGHT_WORDS
        rest = words[1] if len(words) > 1 else ""
    head = rest.split(":", 1)[0].strip().lower() if ":" in rest else (rest.split() or [""])[0].lower()
    check = CHECKS.get(head, "other")
    return HealthFailure(
        check, preflight, (line or "exit code 78 without a termination message")[:REASON_LIMIT]
    )


def record(
    entries: Iterable[dict[str, Any]], new: dict[str, Any], limit: int = UNHEALTHY_LIMIT
) -> list[dict[str, Any]]:
    """Append ``new`` (a node's latest entry replaces its older one); keep the newest ``limit``."""
    kept = [dict(e) for e in entries if e.get("node") != new.get("node")]
    kept.append(dict(new))
    return kept[-limit:]


def unhealthy_names(entries: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """Sorted node names of the record (what new workers avoid)."""
    return tuple(sorted({str(e["node"]) for e in entries if e.get("node")}))
