"""``RendezvousBackend`` on the etcd v3 API: the shared rendezvous state behind one key.

torch's ``DynamicRendezvousHandler`` keeps the whole rendezvous state (round, participants, wait list,
heartbeats) as one pickled blob and updates it with compare-and-set. Here the blob is the value of
``<prefix>/<run_id>/state`` and the fencing token is the key's ``mod_revision``: a write is a transaction
"if mod_revision == token then put" (or "if the key does not exist" when there is no token), and the
transaction also reads the key back so a losing writer gets the winner's state without another round trip.

The key is attached to this process's lease. Every live agent rewrites the state at least once per
keep-alive interval, so the key lives while any agent does and vanishes ``lease_ttl`` seconds after the
last one died.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from llm_trainer.rendezvous.etcd_client import EtcdClient, EtcdError, LeaseKeeper


def run_prefix(key_prefix: str, run_id: str) -> str:
    """The folder-like prefix that holds everything of one rendezvous id (ends with "/")."""
    if not run_id or "/" in run_id:
        raise ValueError(f"invalid rendezvous id {run_id!r}: it must be non-empty and contain no '/'")
    return f"{key_prefix.rstrip('/')}/{run_id}/"


class EtcdV3RendezvousBackend(RendezvousBackend):
    """Rendezvous state in etcd v3 with compare-and-set on the key's mod revision."""

    def __init__(self, client: EtcdClient, run_id: str, key_prefix: str, lease: LeaseKeeper) -> None:
        self._client = client
        self._lease = lease
        self.key = run_prefix(key_prefix, run_id) + "state"

    @property
    def name(self) -> str:
        """See base class."""
        return "etcd-v3"

    def get_state(self) -> tuple[bytes, Token] | None:
        """See base class."""
        try:
            kv = self._client.get(self.key)
        except EtcdError as exc:
            raise RendezvousConnectionError(str(exc)) from exc
        if kv is None:
            return None
        return kv.value, kv.mod_revision

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        """See base class."""
        expected = _as_revision(token)
        if token is not None and expected is None:
            # A token we did not issue: never overwrite, report what is there.
            current = self.get_state()
            return None if current is None else (current[0], current[1], False)
        try:
            ok, kv = self._client.swap(self.key, state, expected, lease=self._lease.lease_id)
        except EtcdError as exc:
            raise RendezvousConnectionError(str(exc)) from exc
        if kv is None:
            # Our token named a state that no longer exists (expired): the caller starts from scratch.
            return None
        return kv.value, kv.mod_revision, ok


def _as_revision(token: Any) -> int | None:
    if token is None or isinstance(token, bool):
        return None
    try:
        revision = int(token)
    except (TypeError, ValueError):
        return None
    return revision if revision > 0 else None
