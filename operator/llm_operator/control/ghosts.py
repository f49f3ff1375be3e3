"""Worker pods kopf's index still holds although they are gone (a watch gap).

When the apiserver answers a lagging watch with 410 Gone (or comes back after a restart), kopf lists
the pods again and re-indexes every pod in the list, but it never drops the ones that were deleted
during the gap: no DELETED event ever comes for them. A job would count such a ghost as a live worker
for ever, and never replace it.

So each job's controller audits its slice of the index: it notes the uids the index holds, then lists
its workers with a consistent read; a uid the index held that the list lacks is a pod that is gone (a
consistent list sees every pod that existed before it). Audits run at each job's first pass after a
listing of the pods (a re-list is the only way a ghost is born; the listing wakes every job, spread over
time: ``jobs.LISTING_WAKES_PER_SECOND``) and every ``index_audit_seconds`` as a safety net.
Ghosts are filtered out of every read of the index (:class:`LiveWorkers`), never patched into kopf's
own structures.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import kopf

from llm_operator import labels, metrics
from llm_operator.kube import Kube
from llm_operator.observe import PodView

LISTING_BURST_GAP_S = 1.0
"""Listed pods that arrive this close together belong to one listing (one wake-up of every job)."""
AUDIT_MIN_INTERVAL_S = 5.0
"""A controller audits at most this often, however many listings come in."""


class Ghosts:
    """The uids of indexed worker pods found gone, and when the pods were last listed."""

    def __init__(self) -> None:
        self.uids: set[str] = set()
        self.listed_at = 0.0
        """``time.monotonic()`` of the last pod that came from a listing (kopf's event type None)."""

    def note_listed(self, now: float | None = None) -> bool:
        """A pod arrived from a listing. True for the first of a burst: wake every job to audit."""
        clock = time.monotonic() if now is None else now
        first = clock - self.listed_at > LISTING_BURST_GAP_S
        self.listed_at = clock
        return first

    def visible(self, views: Iterable[PodView]) -> Iterable[PodView]:
        """``views`` without the ghosts (``views`` itself while there are none: no copy per read)."""
        if not self.uids:
            return views
        return [v for v in views if v.uid not in self.uids]

    def record(self, indexed: Iterable[PodView], existing: set[str]) -> list[PodView]:
        """The pods of ``indexed`` (read from the index before the list) whose uid the consistent list
        ``existing`` lacks: gone. They are ghosts from now on; returns the new ones."""
        found = [v for v in indexed if v.uid and v.uid not in existing and v.uid not in self.uids]
        self.uids.update(v.uid for v in found)
        return found


def audit_due(listed_at: float, audited_at: float, now: float, every: float) -> float | None:
    """When (monotonic) the next audit of a controller last audited at ``audited_at`` is due: at once
    (``now``) after a listing it has not audited since, else ``every`` seconds after the last one
    (None: ``every`` is 0, no periodic audit); never sooner than AUDIT_MIN_INTERVAL_S after it."""
    earliest = audited_at + AUDIT_MIN_INTERVAL_S
    due: float | None = None
    if listed_at > audited_at:
        due = now
    elif every > 0:
        due = audited_at + every
    return None if due is None else max(due, earliest)


class LiveWorkers(Mapping[Any, Iterable[PodView]]):
    """kopf's worker index as the operator reads it: every value without the ghosts."""

    def __init__(self, index: Mapping[Any, Iterable[PodView]], ghosts: Ghosts) -> None:
        self.index = index
        self.ghosts = ghosts

    def __getitem__(self, key: Any) -> Iterable[PodView]:
        return self.ghosts.visible(self.index[key])

    def __iter__(self) -> Iterator[Any]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: object) -> bool:
        return key in self.index


class IndexAudit:
    """One job's audits of its slice of the worker index (``ghosts`` is shared by every job's)."""

    def __init__(self, kube: Kube, namespace: str, name: str, ghosts: Ghosts, every: float) -> None:
        self.kube = kube
        self.key = (namespace, name)
        self.ghosts = ghosts
        self.every = every
        """``index_audit_seconds``: the periodic audit's interval (0: only after a re-list)."""
        self.audited_at = time.monotonic()
        """When this job's slice was last checked (it starts fresh: kopf starts the controllers once the
        initial listing is indexed)."""

    async def run(self, pods_index: Mapping[Any, Iterable[PodView]], logger: kopf.Logger) -> float | None:
        """Check the slice against a consistent list when due (after a re-list of the pods, and every
        ``every`` seconds); pods gone from the list become ghosts, filtered out of every read. Returns
        when (monotonic) the next audit is due, None: only after a re-list."""
        due = audit_due(self.ghosts.listed_at, self.audited_at, time.monotonic(), self.every)
        if due is None or due > time.monotonic():
            return due
        indexed = list(pods_index.get(self.key, ()))
        namespace, name = self.key
        existing = await self.kube.pod_uids(namespace, labels.selector(name))
        self.audited_at = time.monotonic()
        found = self.ghosts.record(indexed, existing)
        if found:
            metrics.INDEX_GHOSTS.inc(len(found))
            names = ", ".join(sorted(p.name for p in found))
            logger.warning(f"IndexGhosts: {names} deleted during a watch gap; no longer counted")
        return audit_due(self.ghosts.listed_at, self.audited_at, self.audited_at, self.every)
