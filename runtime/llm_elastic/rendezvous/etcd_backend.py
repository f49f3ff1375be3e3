"""``RendezvousBackend`` on the etcd v3 API: the shared rendezvous state behind one key.

torch's ``DynamicRendezvousHandler`` keeps the whole rendezvous state (round, participants, wait list,
heartbeats) as one pickled blob and updates it with compare-and-set. Here the blob is the value of
``<prefix>/<run_id>/state`` and the fencing token is the key's ``mod_revision``: a write is a transaction
"if mod_revision == token then put" (or "if the key does not exist" when there is no token), and the
transaction also reads the key back so a losing writer gets the winner's state without another round trip.

The key is attached to this process's lease. Every live agent rewrites the state at least once per
keep-alive interval, so the key lives while any agent does and vanishes ``lease_ttl`` seconds after the
last one died.

Stored format: the state base64-encoded, as torch's own ``etcd-v2`` and ``c10d`` backends store it, so a
value that is not valid base64 is reported as ``RendezvousStateError`` (torch's backend contract) instead
of being handed to the handler's unpickler. Versions before this format stored the bare pickle; such a
value (it starts with the pickle protocol byte 0x80, which base64 text never contains) is still read as is
and is replaced by the base64 form on the next write, so agents can be upgraded while a state written by
the old format is alive (at most ``lease_ttl`` after the last old agent).
"""

from __future__ import annotations

import binascii
import logging
import time
from base64 import b64decode, b64encode
from collections.abc import Callable
from typing import Any, TypeVar

from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from llm_elastic.rendezvous.etcd_client import EtcdClient, EtcdError
from llm_elastic.rendezvous.etcd_lease import LeaseKeeper

log = logging.getLogger(__name__)
T = TypeVar("T")

PICKLE_PROTOCOL_BYTE = b"\x80"
"""First byte of a pickle of protocol 2 or later: marks state stored by versions before base64."""


def run_prefix(key_prefix: str, run_id: str) -> str:
    """The folder-like prefix that holds everything of one rendezvous id (ends with "/")."""
    if not run_id or "/" in run_id:
        raise ValueError(f"invalid rendezvous id {run_id!r}: it must be non-empty and contain no '/'")
    return f"{key_prefix.rstrip('/')}/{run_id}/"


class EtcdV3RendezvousBackend(RendezvousBackend):
    """Rendezvous state in etcd v3 with compare-and-set on the key's mod revision.

    An unreachable etcd is ridden out: each call retries (backing off up to 2 s) for ``outage_timeout``
    seconds before it raises ``RendezvousConnectionError`` (which ends torchrun's agent). torch calls the
    backend from the agent's keep-alive and monitor only; the workers train on meanwhile. When a fresh,
    empty etcd answers at the same address, ``get_state`` returns None and the handler carries on with a
    fresh state: the running round needs no store, the next re-rendezvous starts a new one."""

    def __init__(
        self,
        client: EtcdClient,
        run_id: str,
        key_prefix: str,
        lease: LeaseKeeper,
        outage_timeout: float = 120.0,
    ) -> None:
        self._client = client
        self._lease = lease
        self.key = run_prefix(key_prefix, run_id) + "state"
        self.outage_timeout = outage_timeout

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """``call()``, retried while etcd is unreachable, for at most ``outage_timeout`` seconds."""
        deadline = time.monotonic() + self.outage_timeout
        delay = 0.2
        warned = False
        while True:
            try:
                result = call()
            except EtcdError as exc:
                if time.monotonic() + delay > deadline:
                    raise RendezvousConnectionError(
                        f"{exc} (etcd unreachable for {self.outage_timeout:g}s: giving up)"
                    ) from exc
                if not warned:
                    log.warning("etcd-v3 rendezvous: %s; retrying for up to %gs", exc, self.outage_timeout)
                    warned = True
                time.sleep(delay)  # back-off between attempts at an unreachable server
                delay = min(2.0, delay * 2)
                continue
            if warned:
                log.warning("etcd-v3 rendezvous: %s answers again", what)
            return result

    @property
    def name(self) -> str:
        """See base class."""
        return "etcd-v3"

    def get_state(self) -> tuple[bytes, Token] | None:
        """See base class."""
        kv = self._retrying(f"get {self.key}", lambda: self._client.get(self.key))
        if kv is None:
            return None
        return self._decode(kv.value), kv.mod_revision

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        """See base class."""
        expected = _as_revision(token)
        if token is not None and expected is None:
            # A token we did not issue: never overwrite, report what is there.
            current = self.get_state()
            return None if current is None else (current[0], current[1], False)
        ok, kv = self._retrying(
            f"set {self.key}",
            lambda: self._client.swap(self.key, b64encode(state), expected, lease=self._lease.lease_id),
        )
        if kv is None:
            # Our token named a state that no longer exists (expired): the caller starts from scratch.
            return None
        return (state if ok else self._decode(kv.value)), kv.mod_revision, ok

    def _decode(self, stored: bytes) -> bytes:
        """The state from its stored form; ``RendezvousStateError`` when it is neither base64 nor legacy."""
        if stored.startswith(PICKLE_PROTOCOL_BYTE):
            return stored  # written by a version that stored the bare pickle
        try:
            return b64decode(stored, validate=True)
        except binascii.Error as exc:
            raise RendezvousStateError(
                f"etcd-v3 rendezvous: the state at {self.key} is corrupt (not base64: {exc}); "
                "delete the key or wait for its lease to expire"
            ) from exc


def _as_revision(token: Any) -> int | None:
    if token is None or isinstance(token, bool):
        return None
    try:
        revision = int(token)
    except (TypeError, ValueError):
        return None
    return revision if revision > 0 else None
