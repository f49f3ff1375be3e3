"""What this operator just did and has not seen in its watch yet (the controller 'expectations' pattern).

Watches lag behind writes. Without this, a pass that runs before the watch catches up would create
a second pod for a slot it already filled, or count one lost worker twice.

Both kinds are settled by the watch, by UID, as Kubernetes' own controllers settle theirs: a pod created
is expected under the UID its creation answered until the index shows that UID (or the watch reports that
UID deleted: created and deleted before a pass saw it); a pod deleted is marked deleting until its UID
leaves the index. Never by name: a replacement takes its predecessor's name, so the predecessor still in
the index must not stand for it. A lagging watch only makes an expectation older, never gone: after
``TTL_SECONDS`` (Kubernetes' ExpectationsTimeout, 5 min) a creation the watch never showed is checked
against the API server (``overdue`` / ``confirm``), not trusted absent, so the slot is never filled twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from llm_operator.observe import PodView

TTL_SECONDS = 300.0


@dataclass
class Expectations:
    """Per job: pods created and deleted (by UID) that the index does not show yet."""

    created: dict[str, tuple[PodView, float]] = field(default_factory=dict)
    """By UID: the pod as created (its view) and when it was created or last confirmed (monotonic)."""
    deleted: dict[str, float] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    """Of ``deleted``, the pods whose deletion answered that no object is left (forced, no finalizer):
    their names are free, so a pass plans without them rather than waiting for the watch."""

    def expect_created(self, pod: PodView, now: float | None = None) -> None:
        """``pod`` carries the UID its creation answered."""
        if not pod.uid:
            raise ValueError(f"expected pod {pod.name!r} has no uid: a creation is expected by its uid")
        self.created[pod.uid] = (pod, now if now is not None else time.monotonic())

    def expect_deleted(self, uid: str, now: float | None = None, gone: bool = False) -> None:
        self.deleted[uid] = now if now is not None else time.monotonic()
        if gone:
            self.gone.add(uid)

    def watched_deleted(self, uid: str) -> None:
        """The watch reported ``uid`` deleted: neither expectation of it waits any longer."""
        self.created.pop(uid, None)

    def overdue(self, now: float | None = None) -> list[tuple[str, str]]:
        """(uid, name) of the creations the watch has not shown for ``TTL_SECONDS``: ask the API server."""
        clock = now if now is not None else time.monotonic()
        return [(uid, pod.name) for uid, (pod, at) in self.created.items() if clock - at > TTL_SECONDS]

    def confirm(self, uid: str, exists: bool, now: float | None = None) -> None:
        """The API server's answer for an overdue creation: it exists (the watch lags: expect it another
        ``TTL_SECONDS``) or it does not (gone before the watch showed it: the slot is free)."""
        entry = self.created.pop(uid, None)
        if entry is not None and exists:
            self.created[uid] = (entry[0], now if now is not None else time.monotonic())

    def apply(self, observed: list[PodView], now: float | None = None) -> list[PodView]:
        """The observed pods corrected by what we know we did: created ones added, deleted ones marked
        (or left out once gone)."""
        clock = now if now is not None else time.monotonic()
        seen_uids = {p.uid for p in observed}
        for uid in [uid for uid in self.created if uid in seen_uids]:
            del self.created[uid]
        for uid, at in list(self.deleted.items()):
            if uid not in seen_uids or clock - at > TTL_SECONDS:
                del self.deleted[uid]
                self.gone.discard(uid)
        out = [
            replace(p, deleting=True) if p.uid in self.deleted and not p.deleting else p
            for p in observed
            if p.uid not in self.gone
        ]
        out += [pod for pod, _ in self.created.values()]
        return out
