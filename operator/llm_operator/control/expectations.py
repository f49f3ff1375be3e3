"""What this operator just did and has not seen in its watch yet (the controller 'expectations' pattern).

Watches lag behind writes. Without this, a pass that runs before the watch catches up would create
a second pod for a slot it already filled, or count one lost worker twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from llm_operator.observe import PodView

TTL_SECONDS = 30.0


@dataclass
class Expectations:
    """Per job: pods created (by name) and deleted (by uid) that the index does not show yet."""

    created: dict[str, tuple[PodView, float]] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    gone: set[str] = field(default_factory=set)
    """Of ``deleted``, the pods whose deletion answered that no object is left (forced, no finalizer):
    their names are free, so a pass plans without them rather than waiting for the watch."""

    def expect_created(self, pod: PodView, now: float | None = None) -> None:
        self.created[pod.name] = (pod, now if now is not None else time.monotonic())

    def expect_deleted(self, uid: str, now: float | None = None, gone: bool = False) -> None:
        self.deleted[uid] = now if now is not None else time.monotonic()
        if gone:
            self.gone.add(uid)

    def apply(self, observed: list[PodView], now: float | None = None) -> list[PodView]:
        """The observed pods corrected by what we know we did: created ones added, deleted ones marked
        (or left out once gone)."""
        clock = now if now is not None else time.monotonic()
        # A gone pod's name is its successor's: it must not settle the successor's expectation.
        seen_names = {p.name for p in observed if p.uid not in self.gone}
        seen_uids = {p.uid for p in observed}
        for name, (_, at) in list(self.created.items()):
            if name in seen_names or clock - at > TTL_SECONDS:
                del self.created[name]
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
