"""A job's status: what its controller decided last, and the one place that writes it.

Every status write of a job goes through :meth:`StatusWriter.write`: the record of a pass
(``llm_operator.control.apply`` carried it out) and the RuntimeResolved=False record of a pass that could not
resolve the job's runtime. A write is one merge patch, sent only when a field differs from what was
written last; watches lag behind, so the next pass starts from the decided status, not the watched one.

A write that changes only the counters of :data:`HELD_FIELDS` (workers coming up one by one) waits
:data:`HOLD_SECONDS` from the first such change, :data:`STARTING_HOLD_SECONDS` while the job has not
started yet, and the counter changes meanwhile join it: :attr:`StatusWriter.due` tells the controller when to
pass again, and any other change (phase, conditions, a restart) writes everything at once.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from llm_operator.kube import Kube

HELD_FIELDS = frozenset({"replicas", "readyReplicas"})
"""Counters whose change alone waits for the hold (``docs/decisions.md``: status writes at start)."""
HOLD_SECONDS = 5.0
"""A held counter change is written at the latest this long after it arose."""
STARTING_HOLD_SECONDS = 120.0
"""The same while the job has not started (no ``startTime``): its workers come up over image pulls and node
launches, and the write of ``Running``, which carries the final counts, comes at once; a start that needs a
person shows it as a condition (``WaitingForCapacity``), written at once too (``docs/decisions.md``, SW6
and SW9)."""


def hold_seconds(decided: Mapping[str, Any]) -> float:
    """How long a change of the counters alone waits for more of them."""
    return HOLD_SECONDS if decided.get("startTime") else STARTING_HOLD_SECONDS


def changed(previous: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a merge patch of ``new`` would change any field of ``previous``."""
    return bool(changes(previous, new))


def changes(previous: Mapping[str, Any], new: Mapping[str, Any]) -> set[str]:
    """The fields of ``new`` that a merge patch would change in ``previous``."""
    return {k for k, v in new.items() if previous.get(k) != v}


class StatusWriter:
    """One job's status, as decided and as written."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.decided: dict[str, Any] | None = None
        """The status this controller decided last (the next pass starts from it)."""
        self.written: dict[str, Any] | None = None
        """The status as last written successfully."""
        self.held_since: float | None = None
        """``time.monotonic()`` when the counter change now held first arose (later ones join it)."""
        self.due: float | None = None
        """``time.monotonic()`` by which a held change must be written (a pass then); None: none held."""

    def current(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The status a pass starts from: the one decided last, else the job's as watched."""
        return self.decided if self.decided is not None else dict(body.get("status") or {})

    async def write(
        self, body: Mapping[str, Any], decided: dict[str, Any], patch: dict[str, Any] | None = None
    ) -> None:
        """Record ``decided`` as the job's status and merge-patch ``patch`` (default: all of ``decided``)
        when it changes anything written before, unless only :data:`HELD_FIELDS` change within the hold
        (:func:`hold_seconds`).
        The decision stands even if the write fails (pods were already changed): the next pass plans from
        it and writes it again."""
        self.decided = decided
        fields = decided if patch is None else patch
        previous = self.written if self.written is not None else dict(body.get("status") or {})
        diff = changes(previous, fields)
        if diff and diff <= HELD_FIELDS and self.written is not None:  # a first write is never held
            now = time.monotonic()
            since = self.held_since if self.held_since is not None else now
            if now < (due := since + hold_seconds(decided)):
                self.held_since, self.due = since, due
                return
        if diff:
            await self.kube.patch_job_status(self.namespace, self.name, fields)
            self.written = {**previous, **fields}
        if patch is None:  # all of the decision is written (or was): nothing held; a partial record holds on
            self.due = self.held_since = None
