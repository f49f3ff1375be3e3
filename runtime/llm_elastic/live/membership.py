"""Live membership in etcd: register with a lease, agree on the next generation, evict, watch changes.

See :mod:`llm_elastic.live.layout` for the keys. A member is one training process. Agreement is a
compare-and-set on the generation key; a generation is only used once every member it names has
arrived, and it is abandoned (superseded by the next one) as soon as one of them is no longer live.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from llm_elastic.errors import Evicted, RunFinished
from llm_elastic.live import layout
from llm_elastic.live.changes import Changes
from llm_elastic.live.keys import evict, evict_host, live_members, read_generation, read_view
from llm_elastic.live.layout import Action, Generation, View
from llm_elastic.rendezvous.etcd_client import EtcdClient, EtcdError
from llm_elastic.rendezvous.etcd_lease import LeaseKeeper

log = logging.getLogger(__name__)

ARRIVAL_WAIT_SECONDS = 0.25
"""The longest wait for the others' arrivals before reading again (a watch event ends it at once)."""
FORCE_READ = -1
"""A mark no count equals: the next :meth:`Membership.changed_since` reads the members."""
OUTAGE_RETRY_SECONDS = 1.0
"""While etcd is out, how often a commit tries the read again (a change during the outage is not lost)."""


__all__ = ["Evicted", "Membership", "RunFinished", "evict", "evict_host", "live_members", "read_generation"]


class Membership:
    """One member's view: its lease-backed key, the generation it is in, and the count of watch events.

    Every read of the members is preceded by a mark of :attr:`changes` (``llm_elastic.live.changes``), and
    every wait is for an event after that mark: a member key put while this member proposes, arrives or
    trains is never swallowed by a wait that was looking for something else.
    """

    def __init__(
        self, client: EtcdClient, prefix: str, member: str, ttl: int, shard_size: int = 1, target: int = 0
    ) -> None:
        if not prefix.endswith("/"):
            raise ValueError(f"live prefix must end with '/': {prefix!r}")
        if not layout.valid_member_id(member):
            raise ValueError(f"member id {member!r} must be printable ASCII without '/'")
        self.client = client
        self.prefix = prefix
        self.member = member
        self.shard_size = shard_size
        """Processes per host that shard the state (HSDP); only complete hosts form generations."""
        self.target = target
        """Most members a generation takes (0: all); the others wait as standby spares."""
        self.standby = False
        """Whether this member waits as a spare (a full generation trains without it)."""
        self.lease = LeaseKeeper(client, ttl, self._reregister)
        self.changes = Changes()
        """Counts the watch events on the members and the generation record; each reader (the commit's
        check, the NCCL watchdog, the peer-loss judge, the waits while forming) keeps its own mark."""
        self.checked = FORCE_READ
        """The mark taken before the last read that found the training generation still right
        (:meth:`changed_since`); a new generation starts at ``FORCE_READ``: its first commit reads."""
        self.outside_since: float | None = None
        """When this member started waiting outside a healthy generation that is not full (monotonic), or
        None: a joiner the running generation should take in at its next step boundary."""
        self.arriving: Callable[[Generation], None] | None = None
        """A test seam: called after this member announced its arrival in a generation, before it waits
        for the others."""
        self._watches: list[int] = []
        self._watch_lock = threading.Lock()
        """The lease keeper's thread (after a lost lease) and a commit (after a broken stream) re-watch."""
        self._broken = False
        """A watch stream broke (etcd went away): the watches are made again at the next commit."""
        self._retry_at = 0.0
        """While the store is out, the next commit's read waits until then (monotonic)."""
        self._info = b""
        self.current: Generation | None = None
        """The generation this member agreed on and trains in (the live group sets it): re-published after
        an outage."""
        self.last_step = 0
        """The job step rank 0 last recorded (re-published after an outage)."""
        self.store_out = False
        """Whether the last write to etcd failed (its warning is logged once per outage)."""
        self.reset_at = -1e9
        """When this member last found the store empty of its keys and registered again (monotonic)."""
        self.grace = ttl + 1.0
        """After a store reset, how long a missing member is given to register again before it counts as
        gone (every member's lease keeper notices the fresh store within a third of the TTL)."""

    def register(self) -> None:
        """Put this member's key on its lease and start watching members and the generation record."""
        self._info = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        _, revision = self.client.get_at(layout.generation_key(self.prefix))
        self.client.put(layout.member_key(self.prefix, self.member), self._info, lease=self.lease.lease_id)
        self._watch(revision)

    def _watch(self, revision: int) -> None:
        def wake(keys: list[bytes] | None) -> None:
            if keys is None:  # the stream broke (a deletion, an eviction, comes with its key)
                self._broken = self._broken or not self.client.closed
            self.changes.bump()

        with self._watch_lock:
            for watch_id in self._watches:
                self.client.cancel_watch(watch_id)
            self._watches = [
                self.client.watch(layout.members_prefix(self.prefix), revision + 1, wake),
                self.client.watch(layout.generation_key(self.prefix), revision + 1, wake),
            ]

    def _reregister(self, lease: int) -> None:
        """The store lost our keys (an outage longer than the lease, or a fresh etcd at the same address):
        put this member back, watch again from the store's revision, and, as the generation's rank 0,
        publish the generation and the step again so that joiners wait for a step boundary instead of
        forming a generation of their own. Training never stopped: it needs the store only to re-form."""
        if not self._info:
            return
        _, revision = self.client.get_at(layout.generation_key(self.prefix))
        self.client.put(layout.member_key(self.prefix, self.member), self._info, lease=lease)
        self.reset_at = time.monotonic()
        self._watch(revision)
        current = self.current
        if current is not None and current.members and current.members[0] == self.member:
            self.client.swap(layout.generation_key(self.prefix), current.encode(), None)
            self.client.put(layout.step_key(self.prefix), str(self.last_step).encode())
        log.warning("etcd lost this member's keys; registered again as %s", self.member)

    def differs(self, generation: Generation) -> bool:
        """Whether the live members or the stored generation no longer match ``generation`` (one read of
        the job's view; take a mark of :attr:`changes` before calling it)."""
        view = read_view(self.client, self.prefix)
        if self.member not in view.members:
            self._missing_self()
            return False  # the store had lost our keys: registered again, nothing else is known yet
        live = layout.complete_hosts(list(view.members), self.shard_size)
        if time.monotonic() < self.reset_at + self.grace and set(live) < set(generation.members):
            return False  # after a store reset the others may not have registered again yet
        stored = view.generation
        wanted = layout.select(generation, live, self.target, self.shard_size)
        return wanted != generation.members or (stored is not None and stored != generation)

    def member_gone(self, generation: Generation) -> bool:
        """Whether a member of ``generation`` left the membership (one read; does not clear the flags).
        Right after a store reset, members that have not registered again yet do not count."""
        live = set(live_members(self.client, self.prefix))
        if time.monotonic() < self.reset_at + self.grace or self.member not in live:
            return False
        return not live.issuperset(generation.members)

    def _missing_self(self) -> None:
        """Our key was missing from a read: evicted (the operator deletes the key, our lease lives on),
        unless the lease is gone too (an outage longer than the TTL, or a fresh etcd): then register again.
        The lease keeper's thread may have registered us again between that read and this renewal (the
        renewal then finds the new lease alive): the key is read once more before calling it an eviction."""
        if self.lease.renew():
            return
        if self.client.get(layout.member_key(self.prefix, self.member)) is None:
            raise Evicted(f"member {self.member} was removed from {self.prefix}")

    def job_step(self) -> int:
        """The job's last completed step as rank 0 recorded it (0 when none, or the store is unreadable)."""
        try:
            kv = self.client.get(layout.step_key(self.prefix))
        except EtcdError as exc:
            log.warning("could not read the job's step: %s", exc)
            return 0
        return int(kv.value) if kv is not None else 0

    def set_job_step(self, step: int) -> None:
        """Rank 0 after each step; an unreachable store is ridden out (training needs it only to re-form)."""
        self.last_step = step
        try:
            self.client.put(layout.step_key(self.prefix), str(step).encode())
        except EtcdError as exc:
            if not self.store_out:  # once per outage
                log.warning("etcd is out: training goes on without it (step %d): %s", step, exc)
            self.store_out = True
            return
        if self.store_out:
            log.warning("etcd answers again (step %d)", step)
        self.store_out = False

    def changed_since(self, gen: Generation) -> bool:
        """At a commit: whether the membership differs from ``gen``. It reads the store only when a watch
        event came after the last read (and always at a generation's first commit); the mark is taken
        before the read, so an event during the read is seen at the next commit. An unreadable store
        counts as no change: training goes on, etcd is needed only to re-form; the read is tried again
        at the next event, and every event of the outage is counted. Raises :class:`Evicted` when this
        member was evicted."""
        if not self.changes.since(self.checked) or time.monotonic() < self._retry_at:
            return False
        mark = self.changes.mark()
        try:
            if self._broken:  # watch again from now; the read below covers what the gap hid
                self._broken = False
                _, revision = self.client.get_at(layout.generation_key(self.prefix))
                self._watch(revision)
            differs = self.differs(gen)
        except EtcdError as exc:
            if not self.store_out:
                logging.getLogger("llm_elastic").warning("membership unreadable (training goes on): %s", exc)
            self.store_out = True
            self._retry_at = time.monotonic() + OUTAGE_RETRY_SECONDS
            return False  # ``checked`` stays: the read is tried again until etcd answers
        if not differs:
            self.checked = mark
        return differs

    def next_generation(
        self, left: int, min_members: int, timeout: float, check: Callable[[], None] | None = None
    ) -> Generation:
        """Agree on the generation after ``left`` and wait until all its members arrived.

        Loops until a generation forms whose members are all live and arrived; raises :class:`Evicted`
        when this member's key is gone and :class:`RunFinished` when the run is done.
        """
        deadline = time.monotonic() + timeout
        while True:
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no generation after {left} formed within {timeout:g}s")
            mark = self.changes.mark()  # before every read: an event after it ends the wait below
            view = read_view(self.client, self.prefix)  # the one read this round decides from
            if view.done:
                raise RunFinished("the run finished")
            if self.member not in view.members:
                self._missing_self()
                continue
            live = layout.complete_hosts(list(view.members), self.shard_size)
            if self.member not in live:  # HSDP: this host misses a process; wait for it
                self.changes.wait(mark, 0.25)
                continue
            stored = view.generation
            action = layout.decide(stored, live, self.member, left, min_members, self.target)
            self.standby = (
                action is Action.WAIT and stored is not None and 0 < self.target <= stored.world_size
            )
            self._outside(action is Action.WAIT and stored is not None and not self.standby)
            if action is Action.WAIT:
                self.changes.wait(mark, 0.25)
                continue
            arrived = False
            if action is Action.PROPOSE:
                proposal = layout.propose(stored, live, self.target, self.shard_size)
                member_of = self.member in proposal.members
                # The proposal and, when it names us, our arrival in it: one transaction.
                also = [self._arrival(proposal)] if member_of else []
                ok, _ = self.client.swap(
                    layout.generation_key(self.prefix), proposal.encode(), view.generation_revision, also=also
                )
                if not ok:
                    continue  # another member won; read its proposal
                log.info("proposed generation %d: %s", proposal.number, ",".join(proposal.members))
                if not member_of:
                    continue  # a full generation without us: we wait as a spare
                stored, arrived = proposal, True
            assert stored is not None
            if self._arrive(stored, deadline, view if not arrived else None):
                self.checked = FORCE_READ  # the others' reads may have seen members ours did not
                self._outside(False)
                return stored
            left = max(left, stored.number)

    def _outside(self, waiting: bool) -> None:
        """Track how long this member waits outside a healthy generation that should take it in."""
        if not waiting:
            self.outside_since = None
        elif self.outside_since is None:
            self.outside_since = time.monotonic()

    def _arrival(self, generation: Generation) -> tuple[str, bytes, int | None]:
        """Our arrival key in ``generation`` (on our lease), as a write for a transaction."""
        return layout.arrived_key(self.prefix, generation.number, self.member), b"1", self.lease.lease_id

    def _arrive(self, generation: Generation, deadline: float, view: View | None) -> bool:
        """Announce arrival (unless ``view`` shows it, or the proposal carried it: ``view`` None) and wait for
        every member; False when the generation must be superseded. Each round decides from one read."""
        if view is not None and self.member not in view.arrived_in(generation.number):
            self.client.put(*self._arrival(generation)[:2], lease=self.lease.lease_id)
        if self.arriving is not None:
            self.arriving(generation)
        watch: int | None = None
        try:
            while time.monotonic() < deadline:
                mark = self.changes.mark()
                view = read_view(self.client, self.prefix)
                if view.arrived_in(generation.number).issuperset(generation.members):
                    return True
                if not set(view.members).issuperset(generation.members):
                    return False
                if view.generation is not None and view.generation.number > generation.number:
                    return False
                if watch is None:  # arrivals wake us from this view on (members and the record already do)
                    folder = f"{layout.generation_prefix(self.prefix, generation.number)}arrived/"
                    watch = self.client.watch(folder, view.revision + 1, lambda _: self.changes.bump())
                self.changes.wait(mark, ARRIVAL_WAIT_SECONDS)
            return False
        finally:
            if watch is not None:
                self.client.cancel_watch(watch)

    def leave(self) -> None:
        """Stop watching, delete this member's key (revoking the lease) and close."""
        for watch_id in self._watches:
            self.client.cancel_watch(watch_id)
        self.lease.close(revoke=True)
