"""In process: whether an exception in a step means a lost peer (the membership changed: discard the step and
re-form) or a local failure (leave, and let the exception end the process). Typed failures, decided once.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from llm_elastic.config import ElasticConfig
from llm_elastic.errors import Evicted
from llm_elastic.rendezvous.etcd_client import EtcdError

if TYPE_CHECKING:
    from llm_elastic.live.layout import Generation
    from llm_elastic.live.membership import Membership

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
