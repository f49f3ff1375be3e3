"""The live process group of one member, in process: the generation it trains in, that generation's store
and ``init_process_group``, the pid exchange, the abort watchdog (NCCL), and the judgement of a failed
collective. :class:`LiveGroup` offers :meth:`~LiveGroup.form`, :meth:`~LiveGroup.changed`,
:meth:`~LiveGroup.judge` and :meth:`~LiveGroup.close`; the membership (etcd) stays with
:mod:`llm_elastic.live.membership`.

The judgement (:func:`judge`): whether an exception in a step means a lost peer (the membership changed:
discard the step and re-form) or a local failure (leave, and let the exception end the process). A
collective or store error counts when the membership shows a change within a lease's time.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from llm_elastic.abort import Watchdog, every_group
from llm_elastic.config import ElasticConfig
from llm_elastic.errors import Evicted
from llm_elastic.live import layout
from llm_elastic.live.layout import Generation
from llm_elastic.live.membership import Membership
from llm_elastic.rendezvous.etcd_client import EtcdError

if TYPE_CHECKING:
    from llm_elastic.rendezvous.etcd_store import EtcdV3Store

log = logging.getLogger("llm_elastic")


COMM_WORDS = ("gloo", "nccl", "connection", "timed out", "timeout", "closed by peer", "abort", "socket")


def looks_like_communication(exc: BaseException) -> bool:
    """Whether ``exc`` came from a collective or the store (what a vanished peer raises)."""
    if isinstance(exc, dist.DistError):
        return True
    if isinstance(exc, torch.OutOfMemoryError) or not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return any(word in text for word in COMM_WORDS)


def judge(exc: BaseException, membership: Membership, gen: Generation, config: ElasticConfig) -> bool:
    """Whether ``exc`` means the membership changed (a peer is gone), not a local error.

    A collective or store error counts when the membership shows a change within a lease's time (a peer
    that died takes at most its lease TTL to disappear); anything else, or no change, is local."""
    comm = looks_like_communication(exc)
    started = time.monotonic()
    deadline = started + (config.lease_ttl + 1.0 if comm else 0.0)
    while True:
        mark = membership.changes.mark()
        try:
            if membership.differs(gen):
                return True
        except Evicted:
            return True  # the next generation attempt finds out and exits
        except EtcdError as store_error:
            # The store is out as well: wait for it (bounded) rather than call a lost peer local.
            if comm and deadline < started + config.store_outage_seconds:
                log.warning("judging a failed collective needs etcd, which is out: %s", store_error)
                deadline = started + config.store_outage_seconds
        if time.monotonic() >= deadline:
            return False
        membership.changes.wait(mark, 0.05)


class LiveGroup:
    """This member's process group in the current generation (None between generations)."""

    def __init__(self, membership: Membership, config: ElasticConfig) -> None:
        self.membership = membership
        self.config = config
        self.gen: Generation | None = None
        """The generation agreed on and trained in (None between generations): the one copy; the mode
        reads it here."""
        self.pids: list[int] | None = None
        """Every rank's pid in the current generation (the step log records them)."""
        self.watchdog: Watchdog | None = None
        self.store: EtcdV3Store | None = None
        """The generation's store, held while the generation lives: a store written in Python loses its
        methods in C++ once its Python object is gone (``new_group`` then fails with "Not implemented")."""

    def agreed(self, gen: Generation) -> None:
        """The membership agreed on ``gen``: this member's next generation (formed by :meth:`form`)."""
        self.gen = gen
        self.membership.current = gen

    def form(self, backend: str, job_prefix: str) -> int:
        """Join the agreed generation's process group on its own store prefix and exchange pids; returns
        this rank."""
        from llm_elastic.rendezvous.etcd_store import EtcdV3Store

        membership, gen = self.membership, self.gen
        assert gen is not None, "form() before agreed()"
        rank = gen.rank_of(membership.member)
        timeout = timedelta(seconds=self.config.live_collective_timeout)
        prefix = layout.store_prefix(job_prefix, gen.number)
        self.store = store = EtcdV3Store(membership.client, prefix, membership.lease, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=gen.world_size, timeout=timeout)
        pid = torch.tensor([os.getpid()], dtype=torch.int64)
        gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(gen.world_size)]
        dist.all_gather(gathered, pid)
        self.pids = [int(t.item()) for t in gathered]
        return rank

    def watch(self, device: torch.device) -> None:
        """On NCCL a lost peer raises nothing: abort the generation's groups when the watch sees it gone."""
        gen, membership = self.gen, self.membership
        if device.type == "cuda" and gen is not None:
            self.watchdog = Watchdog(lambda: membership.member_gone(gen), membership.changes, every_group)
            self.watchdog.start()

    def changed(self) -> bool:
        """At a commit: whether the membership changed since the generation formed (raises ``Evicted``)."""
        return self.gen is not None and self.membership.changed_since(self.gen)

    def judge(self, exc: BaseException) -> bool:
        """Whether ``exc`` means a lost peer (see :func:`judge`), not a local error."""
        return self.gen is not None and judge(exc, self.membership, self.gen, self.config)

    def close(self) -> None:
        """The generation ended: stop the watchdog (the groups themselves go with the wrapped model)."""
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
        self.gen = None
        self.store = None
