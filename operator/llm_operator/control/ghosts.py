"""Worker pods kopf's index still holds although they are gone (a watch gap).

When the apiserver answers a lagging watch with 410 Gone (or comes back after a restart), kopf lists
the pods again and re-indexes every pod in the list, but it never drops the ones that were deleted
during the gap: no DELETED event ever comes for them. A job would count such a ghost as a live worker
for ever, and never replace it.

So the index is audited: note the uids it holds, then list the workers with a consistent read; a uid the
index held that the list lacks is a pod that is gone (a consistent list sees every pod that existed
before it). After a listing of the pods (a re-list is the only way a ghost is born) the operator audits
the whole index at once (:class:`ListingAudit`: one paged list per namespace, and a wake-up only for the
jobs that had a ghost); each job's controller also audits its own slice every ``index_audit_seconds`` as
a safety net (:class:`IndexAudit`). Ghosts are filtered out of every read of the index
(:class:`LiveWorkers`), never patched into kopf's own structures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import kopf

from llm_operator import labels, metrics
from llm_operator.kube import Kube
from llm_operator.observe import PodView

log = logging.getLogger(__name__)

LISTING_BURST_GAP_S = 1.0
"""Listed pods that arrive this close together belong to one listing (one audit of the whole index)."""
AUDIT_RETRY_S = 5.0
"""An audit after a listing whose list failed tries again after this long."""


class Ghosts:
    """The uids of indexed worker pods found gone, and when the pods were last listed."""

    def __init__(self) -> None:
        self.uids: set[str] = set()
        self.listed_at = 0.0
        """``time.monotonic()`` of the last pod that came from a listing (kopf's event type None)."""
        self.unreported: dict[Any, list[str]] = {}
        """Names of the ghosts the audit after a listing found, by job: its next pass logs them with the
        job's own logger (``IndexAudit.run``)."""

    def note_listed(self, now: float | None = None) -> bool:
        """A pod arrived from a listing. True for the first of a burst: audit the whole index."""
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


class ListingAudit:
    """The audit of the whole index after a listing of the pods: one consistent list of the workers per
    namespace the index holds (paged: ``Kube.pod_uids``), whatever the number of jobs. Only the jobs that
    had a ghost are woken (``wake``); each reports its ghosts at its next pass.

    One audit runs at a time; a listing that comes while one runs makes it run once more (the ghosts of
    that later gap may have been deleted after its lists were read). A failed list is tried again."""

    def __init__(self, kube: Kube, ghosts: Ghosts, wake: Callable[[Any], None]) -> None:
        self.kube = kube
        self.ghosts = ghosts
        self.wake = wake
        self.task: asyncio.Task[None] | None = None
        self.again = False

    def listed(self, pods_index: Mapping[Any, Iterable[PodView]]) -> None:
        """The first pod of a listing came: audit the index (now, or again after the running audit)."""
        if self.task is not None and not self.task.done():
            self.again = True
            return
        self.task = asyncio.get_running_loop().create_task(self._run(pods_index))

    async def _run(self, pods_index: Mapping[Any, Iterable[PodView]]) -> None:
        self.again = True
        while self.again:
            self.again = False
            try:
                await self.audit(pods_index)
            except Exception as exc:  # any failure of the lists (an answer, the network): try again
                log.warning(
                    f"IndexGhosts: the audit after a listing of the pods failed ({exc}); again in "
                    f"{AUDIT_RETRY_S:g}s"
                )
                self.again = True
                await asyncio.sleep(AUDIT_RETRY_S)

    async def audit(self, pods_index: Mapping[Any, Iterable[PodView]]) -> dict[Any, list[PodView]]:
        """Note every indexed pod, list the workers of each namespace, record the ones gone; returns them
        by job."""
        started = time.monotonic()
        indexed = {key: list(views) for key, views in pods_index.items()}  # before the lists
        existing: set[str] = set()
        for namespace in sorted({key[0] for key in indexed}):
            existing |= await self.kube.pod_uids(namespace, labels.WORKERS)
        found: dict[Any, list[PodView]] = {}
        for key, views in indexed.items():
            gone = self.ghosts.record(views, existing)
            if gone:
                found[key] = gone
                self.ghosts.unreported.setdefault(key, []).extend(v.name for v in gone)
                metrics.INDEX_GHOSTS.inc(len(gone))
                self.wake(key)
        count = sum(len(v) for v in indexed.values())
        log.info(
            f"IndexGhosts: audit after a listing of the pods: {sum(len(v) for v in found.values())} of "
            f"{count} indexed workers gone, {len(found)} jobs woken ({time.monotonic() - started:.2f}s)"
        )
        return found

    async def close(self) -> None:
        """Stop an audit in flight (the operator stops)."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


class IndexAudit:
    """One job's audits of its slice of the worker index, every ``every`` seconds (``ghosts`` is shared
    by every job's), and its report of what the audit after a listing found for it."""

    def __init__(self, kube: Kube, namespace: str, name: str, ghosts: Ghosts, every: float) -> None:
        self.kube = kube
        self.key = (namespace, name)
        self.ghosts = ghosts
        self.every = every
        """``index_audit_seconds``: the periodic audit's interval (0: none, only the audits after a
        listing)."""
        self.audited_at = time.monotonic()
        """When this job's slice was last checked (it starts fresh: kopf starts the controllers once the
        initial listing is indexed)."""

    async def run(self, pods_index: Mapping[Any, Iterable[PodView]], logger: kopf.Logger) -> float | None:
        """Report the ghosts the audit after a listing found for this job; check the slice against a
        consistent list when the periodic audit is due. Returns when (monotonic) it is due next, None:
        never."""
        names = self.ghosts.unreported.pop(self.key, None)
        if names:
            self._report(names, logger)
        if self.every <= 0:
            return None
        due = self.audited_at + self.every
        if due > time.monotonic():
            return due
        indexed = list(pods_index.get(self.key, ()))
        namespace, name = self.key
        existing = await self.kube.pod_uids(namespace, labels.selector(name))
        self.audited_at = time.monotonic()
        found = self.ghosts.record(indexed, existing)
        if found:
            metrics.INDEX_GHOSTS.inc(len(found))
            self._report([p.name for p in found], logger)
        return self.audited_at + self.every

    @staticmethod
    def _report(names: list[str], logger: kopf.Logger) -> None:
        logger.warning(
            f"IndexGhosts: {', '.join(sorted(names))} deleted during a watch gap; no longer counted"
        )
