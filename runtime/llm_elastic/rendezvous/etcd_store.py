"""A c10d ``Store`` on etcd v3, shared by every agent of one rendezvous.

torchrun's agents use the rendezvous store to publish the master address and port (rank 0 sets them, the
others ``get`` them, which blocks until they exist), to assign worker ranks and for the exit barrier.
Keys live under ``<prefix>/<run_id>/store/`` and are attached to the writer's lease, so a dead job leaves
nothing behind. Blocking reads (``get``, ``wait``, ``multi_get``) read the keys, and for the missing ones
open etcd watches from the revision of that read, so they wake as soon as a key is put; a slow re-check
bounds each wait because a broken watch stream is not always reported (see ``etcd_client``).

The method names ``deleteKey`` and ``getNumKeys`` are what torch's C++ trampoline looks up when the store
is wrapped in a ``PrefixStore`` (as the rendezvous handler does); they alias the Python names. The store
claims the "extended API" (``has_extended_api``), so ``PrefixStore`` forwards ``append``, ``multi_get``
and ``multi_set`` to the native versions here (one etcd transaction or CAS loop each) instead of emulating
them. ``clone()`` (which C++ users of a store such as process groups call) returns another store object on
the same client, lease and prefix. Queues (``queue_push``/``queue_pop``) are not provided: torch reports
them as ``NotImplementedError``. A blocking read that runs out of time raises ``DistStoreError`` whose
message says "timeout", the word torch's own stores use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from torch._C._distributed_c10d import Store
from torch.distributed import DistStoreError

from llm_elastic.rendezvous.etcd_client import EtcdClient, EtcdError, WatchCallback
from llm_elastic.rendezvous.etcd_lease import LeaseKeeper

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = timedelta(seconds=300)
MAX_CAS_ATTEMPTS = 1000

_Updater = Callable[[bytes | None], bytes | None]


def _to_bytes(value: bytes | bytearray | str | Sequence[int]) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def _waker(event: threading.Event) -> WatchCallback:
    def wake(_keys: list[bytes] | None) -> None:
        event.set()

    return wake


class EtcdV3Store(Store):
    """c10d key-value store on etcd v3 (``set``/``get``/``add``/``compare_set``/``wait``/...)."""

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        lease: LeaseKeeper,
        timeout: timedelta = DEFAULT_TIMEOUT,
        recheck_seconds: float = 5.0,
    ) -> None:
        super().__init__()
        if not prefix.endswith("/"):
            raise ValueError(f"store prefix must end with '/': {prefix!r}")
        self._client = client
        self._prefix = prefix
        self._lease = lease
        self._recheck = recheck_seconds
        # Clones handed to C++ stay alive as long as this store: pybind11 keeps only the C++ half of a
        # Python subclass alive, and a clone whose Python half was collected answers every call with
        # "Not implemented" (measured: tests/trainer/test_rendezvous_contract.py fails without this list).
        self._clones: list[EtcdV3Store] = []
        super().set_timeout(timeout)

    def clone(self) -> EtcdV3Store:
        """Another store on the same etcd prefix (same client and lease), with its own timeout setting."""
        twin = EtcdV3Store(self._client, self._prefix, self._lease, self._default_timeout(), self._recheck)
        self._clones.append(twin)
        return twin

    def _default_timeout(self) -> timedelta:
        """The C++ base's timeout: ``set_timeout`` on a ``PrefixStore`` around this store lands there, not
        in any Python attribute (torch's type stubs do not declare the property)."""
        value: timedelta = getattr(self, "timeout")  # noqa: B009
        return value

    def has_extended_api(self) -> bool:
        """``append``, ``multi_get`` and ``multi_set`` are native here (``PrefixStore`` forwards them)."""
        return True

    @property
    def prefix(self) -> str:
        """The etcd key prefix under which this store keeps its keys."""
        return self._prefix

    def _key(self, key: str) -> str:
        return self._prefix + key

    # -- plain operations ---------------------------------------------------------------------------------

    def set(self, key: str, value: bytes | str) -> None:
        """Set ``key`` to ``value``."""
        self._client.put(self._key(key), _to_bytes(value), lease=self._lease.lease_id)

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        """Set several keys atomically."""
        if len(keys) != len(values):
            raise ValueError("multi_set needs as many values as keys")
        items = [(self._key(k), _to_bytes(v)) for k, v in zip(keys, values, strict=True)]
        self._client.put_many(items, lease=self._lease.lease_id)

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting up to the store timeout for it to be set."""
        return self._await([key], None)[key]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """The values of ``keys``, waiting up to the store timeout for all of them."""
        found = self._await(list(keys), None)
        return [found[k] for k in keys]

    def check(self, keys: list[str]) -> bool:
        """Whether every key exists (does not wait)."""
        return all(self._client.get(self._key(k)) is not None for k in keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Block until every key exists, or raise ``DistStoreError`` after ``timeout`` (store default)."""
        self._await(list(keys), timeout)

    def delete_key(self, key: str) -> bool:
        """Delete ``key``; True when it existed."""
        return self._client.delete(self._key(key))

    def num_keys(self) -> int:
        """How many keys this store holds."""
        return self._client.count_prefix(self._prefix)

    deleteKey = delete_key  # the name torch's C++ trampoline calls
    getNumKeys = num_keys  # the name torch's C++ trampoline calls

    # -- read-modify-write --------------------------------------------------------------------------------

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (missing: 0) and return the new value."""

        def update(current: bytes | None) -> bytes | None:
            return str(int(current or b"0") + amount).encode()

        return int(self._update(key, update))

    def append(self, key: str, value: bytes | str) -> None:
        """Atomically append ``value`` to the bytes at ``key`` (missing: empty)."""
        suffix = _to_bytes(value)
        self._update(key, lambda current: (current or b"") + suffix)

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value`` (or is missing and
        ``expected_value`` is empty). Returns the value now stored; for a missing key with a non-empty
        expectation, returns ``expected_value`` (the c10d ``TCPStore`` semantics)."""
        expected = _to_bytes(expected_value)
        desired = _to_bytes(desired_value)
        result: list[bytes] = []

        def update(current: bytes | None) -> bytes | None:
            result.clear()
            if current is None:
                if expected:
                    result.append(expected)
                    return None
                result.append(desired)
                return desired
            if current == expected:
                result.append(desired)
                return desired
            result.append(current)
            return None

        self._update(key, update)
        return result[0]

    def _update(self, key: str, fn: _Updater) -> bytes:
        """Apply ``fn(current) -> new | None`` with compare-and-set, retrying on conflicts."""
        full = self._key(key)
        current = self._client.get(full)
        for _ in range(MAX_CAS_ATTEMPTS):
            new = fn(None if current is None else current.value)
            if new is None:
                return b"" if current is None else current.value
            expected = None if current is None else current.mod_revision
            ok, stored = self._client.swap(full, new, expected, lease=self._lease.lease_id)
            if ok:
                return new
            current = stored
        raise DistStoreError(f"etcd store: too much contention updating {key!r}")

    # -- waiting ------------------------------------------------------------------------------------------

    def _await(self, keys: list[str], timeout: timedelta | None) -> dict[str, bytes]:
        limit = (timeout if timeout is not None else self._default_timeout()).total_seconds()
        deadline = time.monotonic() + limit
        found: dict[str, bytes] = {}
        pending = list(dict.fromkeys(keys))
        while True:
            changed = threading.Event()
            watches: list[int] = []
            try:
                for key in list(pending):
                    kv, revision = self._client.get_at(self._key(key))
                    if kv is not None:
                        found[key] = kv.value
                        pending.remove(key)
                    else:
                        watches.append(self._client.watch(self._key(key), revision + 1, _waker(changed)))
                if not pending:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DistStoreError(
                        f"etcd store: wait timeout after {limit:g}s, keys not set: {pending} "
                        f"(under {self._prefix})"
                    )
                changed.wait(min(remaining, self._recheck))
            except EtcdError as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DistStoreError(
                        f"etcd store: wait timeout after {limit:g}s, etcd failing: {exc}"
                    ) from exc
                log.warning("etcd store: %s; retrying", exc)
                time.sleep(min(remaining, 0.5))
            finally:
                for watch_id in watches:
                    self._client.cancel_watch(watch_id)
