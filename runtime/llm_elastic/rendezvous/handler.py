"""The ``etcd-v3`` rendezvous handler for torchrun, registered through the ``torchrun.handlers`` entry point.

torch (``torch/distributed/elastic/rendezvous/registry.py``) loads every entry point of the group
``torchrun.handlers``, calls it with no arguments and registers the result under the entry point's name as
a creator ``(RendezvousParameters) -> RendezvousHandler``. So ``handler_creator`` returns
:func:`create_etcd_v3_handler`, and ``torchrun --rdzv-backend=etcd-v3 --rdzv-endpoint=host:2379`` works
once this package is installed.

Settings read from ``--rdzv-conf`` / ``PET_RDZV_CONF`` besides torch's own (``join_timeout``,
``last_call_timeout``, ``close_timeout``, ``heartbeat_timeout``, ``keep_alive_interval``,
``keep_alive_max_attempt``): ``key_prefix`` (default ``/elasticllm/rendezvous``), ``lease_ttl`` seconds
(default 60), ``request_timeout`` seconds per etcd call (default 10), ``store_timeout`` seconds for blocking
store reads (default 300).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta

from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousHandler,
    RendezvousHandlerCreator,
    RendezvousParameters,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

log = logging.getLogger(__name__)

BACKEND_NAME = "etcd-v3"

# With the agent-hosted TCPStore that torch shares by default, a non-zero node caches the master address
# of the first round for ever; when the node that was rank 0 dies, the next round's workers dial a dead
# store. Publishing a fresh address every round (torch's documented opt-out) makes any member loss safe.
SHARED_STORE_OPT_OUT = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


@dataclass(frozen=True)
class EtcdRendezvousConfig:
    """The etcd-specific settings of the ``etcd-v3`` backend (from ``--rdzv-conf``)."""

    key_prefix: str = "/elasticllm/rendezvous"
    """etcd key prefix; each rendezvous id lives under ``<key_prefix>/<run_id>/``."""
    lease_ttl: int = 60
    """Seconds a key outlives the last agent that wrote it."""
    request_timeout: float = 10.0
    """Seconds one etcd call may take (also bounds the reachability check at start)."""
    store_timeout: float = 300.0
    """Seconds the c10d store's ``get``/``wait`` block before failing."""
    store_outage_timeout: float = 120.0
    """Seconds the agent rides out an unreachable etcd (its keep-alive and monitor retry) before it gives
    up; the workers train on meanwhile. A fresh etcd at the same address counts as back."""

    @classmethod
    def from_params(cls, params: RendezvousParameters) -> EtcdRendezvousConfig:
        """Read and validate the settings; a bad value raises ``ValueError`` naming the key."""
        prefix = str(params.get("key_prefix", cls.key_prefix))
        if not prefix.startswith("/"):
            raise ValueError(f"rdzv-conf key_prefix must start with '/': {prefix!r}")
        return cls(
            key_prefix=prefix,
            lease_ttl=int(_positive(params, "lease_ttl", cls.lease_ttl, minimum=2)),
            request_timeout=_positive(params, "request_timeout", cls.request_timeout),
            store_timeout=_positive(params, "store_timeout", cls.store_timeout),
            store_outage_timeout=_positive(params, "store_outage_timeout", cls.store_outage_timeout),
        )


def _positive(params: RendezvousParameters, key: str, default: float, minimum: float = 0.0) -> float:
    """A number > 0 (and >= ``minimum``) from the rendezvous config."""
    raw = params.get(key, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"rdzv-conf {key}={raw!r} is not a number") from None
    if value <= 0 or value < minimum:
        raise ValueError(f"rdzv-conf {key}={raw!r} must be positive and at least {minimum:g}")
    return value


def create_etcd_v3_handler(params: RendezvousParameters) -> RendezvousHandler:
    """Build torch's ``DynamicRendezvousHandler`` on the etcd v3 backend and store.

    Raises ``RendezvousConnectionError`` within ``request_timeout`` when etcd cannot be reached.
    """
    # Imported here, not at module level: torch imports this module while it is still initialising
    # torch.distributed.elastic.rendezvous (entry-point registration), and our modules import from there.
    from llm_elastic.rendezvous.etcd_auth import connection_hint, credentials_from_env
    from llm_elastic.rendezvous.etcd_backend import EtcdV3RendezvousBackend, run_prefix
    from llm_elastic.rendezvous.etcd_client import EtcdClient, EtcdError, parse_endpoints
    from llm_elastic.rendezvous.etcd_lease import LeaseKeeper
    from llm_elastic.rendezvous.etcd_store import EtcdV3Store

    config = EtcdRendezvousConfig.from_params(params)
    endpoints = parse_endpoints(params.endpoint)
    client = EtcdClient(
        endpoints, timeout=config.request_timeout, credentials=credentials_from_env(os.environ)
    )
    try:
        client.check()
    except EtcdError as exc:
        client.close()
        raise RendezvousConnectionError(
            f"etcd-v3 rendezvous: cannot reach etcd at {client.label} ({exc}); {connection_hint(str(exc))}"
        ) from exc
    lease = LeaseKeeper(client, config.lease_ttl)
    prefix = run_prefix(config.key_prefix, params.run_id)
    backend = EtcdV3RendezvousBackend(
        client, params.run_id, config.key_prefix, lease, outage_timeout=config.store_outage_timeout
    )
    store = EtcdV3Store(client, prefix + "store/", lease, timeout=timedelta(seconds=config.store_timeout))
    if os.environ.setdefault(SHARED_STORE_OPT_OUT, "1") != "1":
        log.warning("%s is not 1: a lost rank-0 node can leave the next round hanging", SHARED_STORE_OPT_OUT)
    return create_handler(store, backend, params)


def handler_creator() -> RendezvousHandlerCreator:
    """Entry point of the ``torchrun.handlers`` group: returns the creator torch registers."""
    return create_etcd_v3_handler
