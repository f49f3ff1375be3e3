"""Keeping one etcd lease alive: grant on first use, refresh from a daemon thread, replace an expired one.

Keys attached to the lease (the rendezvous state and store, a live member's key) vanish ``ttl`` seconds
after the process stops refreshing it, so a dead process leaves nothing behind. The lease calls
themselves (grant, refresh, revoke) are :class:`~llm_elastic.rendezvous.etcd_client.EtcdClient`'s, like
every other etcd call; this module is the policy around them: when to refresh, what to do when the lease
was lost anyway (an etcd outage longer than the TTL, or a fresh etcd), and revoking it on the way out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from llm_elastic.rendezvous.etcd_client import EtcdClient, EtcdError

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Holds one lease alive from a daemon thread; a lease that expired anyway is replaced by a new one."""

    def __init__(
        self, client: EtcdClient, ttl: int, on_new_lease: Callable[[int], None] | None = None
    ) -> None:
        if ttl < 2:
            raise ValueError(f"lease ttl must be at least 2 seconds, got {ttl}")
        self._client = client
        self._ttl = ttl
        self.on_new_lease = on_new_lease
        """Called (from the keeper's thread) with a lease that replaced an expired one: the keys that were
        attached to the old one are gone (an etcd outage longer than the TTL, or a fresh etcd)."""
        self._lock = threading.Lock()
        self._renewing = threading.Lock()
        """One renewal at a time (the keeper's thread, or a member that found its key gone)."""
        self._lease: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lease_id(self) -> int:
        """The current lease (granted on first use)."""
        with self._lock:
            if self._lease is None:
                self._lease = self._client.grant_lease(self._ttl)
                self._start()
            return self._lease

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="etcd-lease-keeper", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._ttl / 3) and not self._client.closed:
            try:
                self.renew()
            except EtcdError as exc:
                log.warning("could not refresh etcd lease: %s", exc)
            except Exception:  # a callback's failure must not end the keeper
                log.exception("re-registering after a new etcd lease failed")

    def renew(self) -> bool:
        """Refresh the lease now; when it is gone (expired, or a fresh etcd), grant a new one and tell
        ``on_new_lease``. Returns True when the lease was replaced. Raises ``EtcdError`` when etcd is out."""
        with self._renewing:
            with self._lock:
                lease = self._lease
            if lease is None or self._client.refresh_lease(lease) > 0:
                return False
            log.warning("etcd lease %x expired; granting a new one", lease)
            with self._lock:
                self._lease = self._client.grant_lease(self._ttl)
                fresh = self._lease
            if self.on_new_lease is not None:
                self.on_new_lease(fresh)
            return True

    def close(self, revoke: bool = False) -> None:
        """Stop refreshing; with ``revoke`` also delete every key attached to the lease now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._client.timeout)
        with self._lock:
            lease, self._lease = self._lease, None
        if revoke and lease is not None:
            try:
                self._client.revoke_lease(lease)
            except EtcdError as exc:
                log.warning("could not revoke etcd lease %x: %s", lease, exc)
