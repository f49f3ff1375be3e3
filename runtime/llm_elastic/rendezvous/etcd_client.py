"""A small typed facade over python3-etcd3: the etcd v3 calls the rendezvous backend and store make.

Everything in the package talks to etcd through :class:`EtcdClient`, so the client library can be swapped
in one place (docs/decisions.md records why python3-etcd3); keeping a lease alive on top of these calls is
:mod:`llm_elastic.rendezvous.etcd_lease`. Two rough edges of that library are handled here rather than at
every call site:

* A single-endpoint client marks its endpoint failed for 300 s after one ``UNAVAILABLE`` answer. We build
  the endpoints ourselves with a short retry window, so a restarted etcd is usable again within a second.
* The library's watch thread crashes (``six`` is gone) instead of telling callbacks that its stream
  broke. We supply the missing function, and waiters still bound each wait and re-read the key
  (see ``etcd_store.EtcdV3Store.wait``).
* With credentials (etcd auth, :mod:`llm_elastic.rendezvous.etcd_auth`) the library would send its token
  as gRPC call credentials, which gRPC refuses on a plaintext channel. We authenticate ourselves and send
  the token as plain metadata; a call refused for its token authenticates again and is sent once more.
"""

from __future__ import annotations

import importlib
import logging
import threading
import types
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from llm_elastic.rendezvous.etcd_auth import (
    METADATA_KEY,
    Credentials,
    Refusal,
    auth_disabled,
    refusal,
)

DEFAULT_PORT = 2379

log = logging.getLogger(__name__)

T = TypeVar("T")


class EtcdError(RuntimeError):
    """etcd could not be reached or refused a request; the message names the endpoint and the call."""


@dataclass(frozen=True)
class Endpoint:
    """One etcd client URL, without its scheme."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_endpoints(text: str, default_port: int = DEFAULT_PORT) -> list[Endpoint]:
    """Parse ``host[:port][,host[:port]...]`` (an ``http://`` scheme and IPv6 brackets are accepted)."""
    endpoints: list[Endpoint] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        for scheme in ("http://", "https://"):
            if item.startswith(scheme):
                item = item[len(scheme) :]
        item = item.rstrip("/")
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        elif item.count(":") == 1:
            host, _, port_text = item.partition(":")
        else:
            host, port_text = item, ""
        if not host:
            raise ValueError(f"etcd endpoint {raw.strip()!r} has no host")
        try:
            port = int(port_text) if port_text else default_port
        except ValueError:
            raise ValueError(f"etcd endpoint {raw.strip()!r} has an invalid port") from None
        if not 0 < port < 65536:
            raise ValueError(f"etcd endpoint {raw.strip()!r} has an invalid port")
        endpoints.append(Endpoint(host, port))
    if not endpoints:
        raise ValueError("no etcd endpoint given (expected host:port)")
    return endpoints


@dataclass(frozen=True)
class KeyValue:
    """A value read from etcd and the revision that last modified it (the CAS token)."""

    value: bytes
    mod_revision: int


WatchCallback = Callable[[list[bytes] | None], None]
"""Called from the watch thread with the keys put or deleted in one watch response, or with None when the
watch's stream broke (etcd went away): a deletion is a change, never a broken stream."""


def _load_library() -> Any:
    try:
        lib = importlib.import_module("etcd3")
    except ImportError as exc:  # the operator image does not ship the trainer extras
        raise EtcdError(
            "the etcd-v3 rendezvous needs python3-etcd3: pip install 'elastic-llm-operator[trainer]'"
        ) from exc
    watch_module = importlib.import_module("etcd3.watch")
    if not hasattr(watch_module, "six"):
        # python3-etcd3 0.13 dropped `six` but its watch thread still calls six.itervalues() when the
        # stream breaks, so callbacks were never told. Give it the one function it uses.
        shim = types.SimpleNamespace(itervalues=lambda mapping: iter(mapping.values()))
        setattr(watch_module, "six", shim)  # noqa: B010
    return lib


def _details(exc: BaseException) -> str:
    """What etcd said: a gRPC error's details, else the exception's text."""
    details = getattr(exc, "details", None)
    if callable(details):
        try:
            text = details()
        except Exception:  # not a call error after all
            text = None
        if text:
            return str(text)
    return str(exc) or type(exc).__name__


class EtcdClient:
    """Blocking etcd v3 calls with a per-call timeout; every failure surfaces as :class:`EtcdError`."""

    def __init__(
        self, endpoints: Sequence[Endpoint], timeout: float = 10.0, credentials: Credentials | None = None
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is required")
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.credentials = credentials
        """The job's etcd user (None: calls carry no token)."""
        self._authenticated = False
        """Whether the current token (or "no token: auth is off") came from an Authenticate call."""
        self._lib = _load_library()
        grpc = importlib.import_module("grpc")
        self._rpc_error: type[BaseException] = grpc.RpcError
        self._errors: tuple[type[BaseException], ...] = (self._lib.Etcd3Exception, grpc.RpcError)
        self.closed = False
        self.requests: Counter[str] = Counter()
        """Round trips sent, by call (``get``, ``list``, ``read``, ``compare-and-set``...): the membership's
        cost per recovery is counted from it (tests/trainer/test_live_membership.py)."""
        self._client: Any = self._make_client()
        self._watch_lock = threading.Lock()
        self._watch_seq = 0
        self._watches: dict[int, tuple[Any, int]] = {}
        """Our watch id -> (the library's watcher, its id on that watcher's stream): ids are per stream, and
        a new token opens a new stream."""

    def _make_client(self) -> Any:
        endpoints = [
            # time_retry: how long an endpoint stays "failed" after an error (library default: 300 s).
            self._lib.Endpoint(ep.host, ep.port, secure=False, time_retry=1.0)
            for ep in self.endpoints
        ]
        return self._lib.MultiEndpointEtcd3Client(endpoints=endpoints, timeout=self.timeout, failover=True)

    @property
    def label(self) -> str:
        """The endpoints as the user gave them, for error messages."""
        return ",".join(str(ep) for ep in self.endpoints)

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        if self.credentials is not None and not self._authenticated:
            self.authenticate()
        self.requests[what.split(" ", 1)[0]] += 1
        try:
            try:
                return fn(self._client)
            except self._rpc_error as exc:
                if self.credentials is None or refusal(_details(exc)) is not Refusal.REAUTHENTICATE:
                    raise
            self.authenticate()  # a stale or missing token: once more with a fresh one
            self.requests[what.split(" ", 1)[0]] += 1
            return fn(self._client)
        except self._errors as exc:
            raise EtcdError(f"etcd at {self.label}: {what} failed: {_details(exc)}") from exc
        except ValueError as exc:  # the library's "Trying to use a failed node"
            raise EtcdError(f"etcd at {self.label}: {what} failed: {exc}") from exc

    # -- auth ---------------------------------------------------------------------------------------------

    def authenticate(self) -> None:
        """Get a token for :attr:`credentials` and send it with every later call (watches included); an
        etcd without auth gets none. Raises :class:`EtcdError` when etcd refuses the credentials or cannot
        be reached."""
        if self.credentials is None:
            return
        self.requests["authenticate"] += 1
        request = self._lib.etcdrpc.AuthenticateRequest(
            name=self.credentials.user, password=self.credentials.password
        )
        try:
            token: str | None = str(self._client.authstub.Authenticate(request, self.timeout).token)
        except self._errors as exc:
            if not auth_disabled(_details(exc)):
                raise EtcdError(
                    f"etcd at {self.label}: authenticate as {self.credentials.user!r} failed: {_details(exc)}"
                ) from exc
            token = None
        except ValueError as exc:
            raise EtcdError(f"etcd at {self.label}: authenticate failed: {exc}") from exc
        metadata = ((METADATA_KEY, token),) if token is not None else None
        self._client.metadata = metadata
        watcher = self._client._stubs.get("watcher")
        if watcher is not None and watcher._metadata != metadata:
            # etcd checks a new watch against the token its stream was opened with, and cancels it without a
            # word when that token is missing or stale: new watches go to a new stream with this token. The
            # watches of the old stream keep delivering (they were admitted) until they are cancelled.
            del self._client._stubs["watcher"]
        self._authenticated = True

    # -- health -------------------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`EtcdError` unless a member answers within the client timeout."""
        self._call("status", lambda c: c.status())

    # -- reads --------------------------------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        """The value of ``key`` and its mod revision, or None when it does not exist."""
        value, meta = self._call(f"get {key}", lambda c: c.get(key))
        if value is None:
            return None
        return KeyValue(bytes(value), int(meta.mod_revision))

    def get_at(self, key: str) -> tuple[KeyValue | None, int]:
        """Like :meth:`get` plus the store revision of the read: a watch from revision + 1 misses nothing."""
        response = self._call(f"get {key}", lambda c: c.get_response(key))
        revision = int(response.header.revision)
        if not response.kvs:
            return None, revision
        kv = response.kvs[0]
        return KeyValue(bytes(kv.value), int(kv.mod_revision)), revision

    def count_prefix(self, prefix: str) -> int:
        """How many keys start with ``prefix``."""
        response = self._call(
            f"count {prefix}*", lambda c: c.get_prefix_response(prefix, keys_only=True, count_only=True)
        )
        return int(response.count)

    def read_prefix(self, prefix: str) -> tuple[dict[str, KeyValue], int]:
        """Every key under ``prefix`` with its value, and the store revision they were read at: one round
        trip, one consistent view (a watch from revision + 1 misses nothing that came after it)."""
        response = self._call(f"read {prefix}*", lambda c: c.get_prefix_response(prefix))
        found = {
            bytes(kv.key).decode(): KeyValue(bytes(kv.value), int(kv.mod_revision)) for kv in response.kvs
        }
        return found, int(response.header.revision)

    def keys_with_prefix(self, prefix: str) -> list[str]:
        """The keys that start with ``prefix``, sorted."""
        response = self._call(f"list {prefix}*", lambda c: c.get_prefix_response(prefix, keys_only=True))
        return sorted(bytes(kv.key).decode() for kv in response.kvs)

    # -- writes -------------------------------------------------------------------------------------------

    def put(self, key: str, value: bytes, lease: int | None = None) -> None:
        """Set ``key`` unconditionally, attached to ``lease`` when given."""
        self._call(f"put {key}", lambda c: c.put(key, value, lease=lease))

    def put_many(self, items: Sequence[tuple[str, bytes]], lease: int | None = None) -> None:
        """Set several keys in one transaction."""
        if not items:
            return

        def run(c: Any) -> None:
            ops = [c.transactions.put(k, v, lease=lease) for k, v in items]
            c.transaction(compare=[], success=ops, failure=[])

        self._call(f"put {len(items)} keys", run)

    def swap(
        self,
        key: str,
        value: bytes,
        expected: int | None,
        lease: int | None = None,
        also: Sequence[tuple[str, bytes, int | None]] = (),
    ) -> tuple[bool, KeyValue | None]:
        """Compare-and-set on the mod revision; ``expected=None`` means "only if the key does not exist".
        ``also``: more keys (key, value, lease) written in the same transaction when it succeeds.

        Returns whether the write happened and the value now stored (ours on success, the winner's or None
        on failure), read in the same transaction.
        """

        def run(c: Any) -> tuple[bool, Any]:
            t = c.transactions
            guard = t.create(key) == 0 if expected is None else t.mod(key) == expected
            writes = [t.put(key, value, lease=lease), *(t.put(k, v, lease=le) for k, v, le in also)]
            ok, responses = c.transaction(
                compare=[guard], success=[*writes, t.get(key)], failure=[t.get(key)]
            )
            return bool(ok), responses[-1]

        ok, ranged = self._call(f"compare-and-set {key}", run)
        if not ranged:
            return ok, None
        stored, meta = ranged[0]
        return ok, KeyValue(bytes(stored), int(meta.mod_revision))

    def delete(self, key: str) -> bool:
        """Delete ``key``; True when it existed."""
        return bool(self._call(f"delete {key}", lambda c: c.delete(key)))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; returns how many were deleted."""
        response = self._call(f"delete {prefix}*", lambda c: c.delete_prefix(prefix))
        return int(response.deleted)

    # -- leases -------------------------------------------------------------------------------------------

    def grant_lease(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; keys attached to it vanish when it is not refreshed in time."""
        lease = self._call(f"grant lease ttl={ttl}", lambda c: c.lease(ttl))
        return int(lease.id)

    def refresh_lease(self, lease_id: int) -> int:
        """Refresh a lease; returns its new TTL (<= 0: it had already expired)."""

        def run(c: Any) -> int:
            ttl = 0
            for response in c.refresh_lease(lease_id):
                ttl = int(response.TTL)
            return ttl

        return self._call(f"refresh lease {lease_id:x}", run)

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease, deleting every key attached to it."""
        self._call(f"revoke lease {lease_id:x}", lambda c: c.revoke_lease(lease_id))

    # -- watches ------------------------------------------------------------------------------------------

    def watch(self, key: str, start_revision: int, callback: WatchCallback) -> int:
        """Call ``callback`` with the keys put or deleted at or after ``start_revision`` (one key, or a prefix
        if it ends with "/"), and with None if the stream breaks. Returns the id for :meth:`cancel_watch`."""

        def on_response(response: Any) -> None:
            events = getattr(response, "events", None)
            if events is None:  # an exception object: the stream broke
                callback(None)
                return
            callback([bytes(ev.key) for ev in events])

        def run(c: Any) -> tuple[Any, int]:
            watcher = c.watcher  # the stream of the current token (see authenticate)
            end = self._lib.utils.prefix_range_end(key.encode()) if key.endswith("/") else None
            return watcher, int(
                watcher.add_callback(key, on_response, range_end=end, start_revision=start_revision)
            )

        watcher, stream_id = self._call(f"watch {key}", run)
        with self._watch_lock:
            self._watch_seq += 1
            self._watches[self._watch_seq] = (watcher, stream_id)
            return self._watch_seq

    def cancel_watch(self, watch_id: int) -> None:
        """Stop a watch; errors are ignored (the stream may already be gone)."""
        with self._watch_lock:
            found = self._watches.pop(watch_id, None)
        if found is None:
            return
        watcher, stream_id = found
        try:
            watcher.cancel(stream_id)
        except Exception:  # best effort: the watch dies with its stream anyway
            log.debug("cancel_watch(%s) failed", watch_id, exc_info=True)

    def close(self) -> None:
        """Close the gRPC channels; lease keepers of this client stop."""
        self.closed = True
        try:
            self._client.close()
        except Exception:  # closing twice or after a failure is harmless
            log.debug("closing the etcd client failed", exc_info=True)
