"""What a worker's exit means for the job."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from llm_elastic.contract import EXIT_NODE_UNHEALTHY

ExitClass = Literal["success", "retry", "fatal"]

HEALTH_EXIT_CODE = EXIT_NODE_UNHEALTHY
"""A worker that failed a node health check, or was found a straggler, exits with this code (EX_CONFIG):
its node is recorded and avoided, the worker replaced (``policy.health``, ``steps.nodehealth``)."""


def classify_exit(exit_code: int | None, reason: str, non_retryable: Iterable[int]) -> ExitClass:
    """First match wins: evicted -> retry; 0 -> success; listed code -> fatal; anything else -> retry."""
    if reason == "Evicted":
        return "retry"
    if exit_code == 0:
        return "success"
    if exit_code is not None and exit_code in set(non_retryable):
        return "fatal"
    return "retry"
