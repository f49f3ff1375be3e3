"""The live membership's keys in etcd as anyone reads and writes them (a member, the operator, a test):
evict a member or a host, list the live members, read the stored generation. Layout:
:mod:`llm_elastic.live.layout`; one member's own view: :mod:`llm_elastic.live.membership`.
"""

from __future__ import annotations

import logging

from llm_elastic.live import layout
from llm_elastic.live.layout import Generation, View, view_of
from llm_elastic.rendezvous.etcd_client import EtcdClient, EtcdError

log = logging.getLogger(__name__)


def evict(client: EtcdClient, prefix: str, member: str) -> bool:
    """Remove ``member`` from the job under ``prefix`` at once; True when it was a member.

    The survivors see the deletion through their watch and re-form without waiting for a lease to expire.
    """
    return client.delete(layout.member_key(prefix, member))


def evict_host(client: EtcdClient, prefix: str, host: str) -> int:
    """Remove every member of pod/host ``host`` (member ids ``<host>.<n>``, the driver's default) at once;
    returns how many were removed. This is what the operator calls when it sees a node die."""
    if not layout.valid_member_id(host):
        raise ValueError(f"host {host!r} must be printable ASCII without '/'")
    return client.delete_prefix(f"{layout.members_prefix(prefix)}{host}.")


def live_members(client: EtcdClient, prefix: str) -> list[str]:
    """Ids of the members whose keys exist now, sorted."""
    folder = layout.members_prefix(prefix)
    return [key[len(folder) :] for key in client.keys_with_prefix(folder)]


def read_view(client: EtcdClient, prefix: str) -> View:
    """The job's whole membership at one revision: one round trip (what a member decides from)."""
    found, revision = client.read_prefix(prefix)
    return view_of(prefix, found, revision)


def read_generation(client: EtcdClient, prefix: str) -> tuple[Generation | None, int | None]:
    """The stored generation and its mod revision (None, None when there is none yet)."""
    kv = client.get(layout.generation_key(prefix))
    if kv is None:
        return None, None
    return Generation.decode(kv.value), kv.mod_revision


def finish(client: EtcdClient, prefix: str) -> None:
    """Mark the run done (rank 0 at the end): every member and a late joiner then end."""
    client.put(layout.done_key(prefix), b"1")


def forget_generation(client: EtcdClient, prefix: str, number: int) -> None:
    """Delete what belonged to generation ``number`` (its arrivals and store); best effort."""
    try:
        client.delete_prefix(layout.generation_prefix(prefix, number))
    except EtcdError as exc:
        log.warning("could not clean generation %d: %s", number, exc)
