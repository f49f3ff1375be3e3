"""A job's status: what its controller decided last, and the one place that writes it.

Every status write of a job goes through :meth:`StatusWriter.write`: the record of a pass
(``llm_operator.apply`` carried it out) and the RuntimeResolved=False record of a pass that could not
resolve the job's runtime. A write is one merge patch, sent only when a field differs from what was
written last; watches lag behind, so the next pass starts from the decided status, not the watched one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_operator.kube import Kube


def changed(previous: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a merge patch of ``new`` would change any field of ``previous``."""
    return any(previous.get(k) != v for k, v in new.items())


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

    def current(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The status a pass starts from: the one decided last, else the job's as watched."""
        return self.decided if self.decided is not None else dict(body.get("status") or {})

    async def write(
        self, body: Mapping[str, Any], decided: dict[str, Any], patch: dict[str, Any] | None = None
    ) -> None:
        """Record ``decided`` as the job's status and merge-patch ``patch`` (default: all of ``decided``)
        when it changes anything written before. The decision stands even if the write fails (pods were
        already changed): the next pass plans from it and writes it again."""
        self.decided = decided
        fields = decided if patch is None else patch
        previous = self.written if self.written is not None else dict(body.get("status") or {})
        if changed(previous, fields):
            await self.kube.patch_job_status(self.namespace, self.name, fields)
            self.written = {**previous, **fields}
