"""The job's live membership as the operator reaches it (failurePolicy.recovery inProcess): remove a lost
worker's members at once, and read which workers the training generation holds.

The training processes of an inProcess job are members of a live membership in the job's etcd
(``llm_elastic.live``): one lease-backed key ``<prefix>members/<pod>.<pid>`` per process. When the
operator gives up on a worker (its node is gone or not ready, its pod failed, it stalled), it deletes that
pod's keys before it deletes the pod, so the survivors re-form at once instead of waiting for the dead
members' leases to expire. One ``deleterange`` call per pod through etcd's JSON gateway
(``POST /v3/kv/deleterange``, keys base64): no etcd client library in the operator image.

Where etcd is: the job's ``rendezvous.endpoint`` when given; otherwise the operator-managed rendezvous
pod's IP (reachable from the operator in a cluster, where the job's NetworkPolicy admits the operator's
pods, and on the local pod runner, where pod IPs are loopback addresses), else its Service name.
Best effort and bounded: on any failure the lease (a few seconds) still removes the members.

The generation record (``<prefix>generation``, written by the members) is read the same way
(``POST /v3/kv/range``): the progress prober folds it into ``status.members``
(``llm_operator.policy.membership``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp
import kopf
from llm_elastic.contract import GENERATION_KEY, GENERATION_MEMBERS_FIELD, MEMBER_SEPARATOR, MEMBERS_DIR

from llm_operator import metrics
from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders import rendezvous
from llm_operator.builders.worker import live_prefix
from llm_operator.control.endpoints import Endpoints, session_of
from llm_operator.control.etcd_access import EtcdAccess, check_answer
from llm_operator.kube import Kube, KubeError
from llm_operator.policy.membership import member_pods

log = logging.getLogger(__name__)

EVICT_TIMEOUT = 2.0
"""Seconds the whole eviction may take before the operator goes on deleting the pods."""
ADDRESS_SECONDS = 60.0
"""How long a looked-up etcd address is reused by the generation reads."""
RETRY_SECONDS = 10.0
"""After a failed generation read the address is looked up again this long after the last look-up; each
look-up whose read fails too doubles the wait, up to ``ADDRESS_SECONDS``: a job whose etcd does not answer
lists its rendezvous pod about once a minute, not at every probe round."""


def member_range(prefix: str, pod: str) -> tuple[str, str]:
    """The etcd key range ``[key, range_end)`` of every member of ``pod``: ids ``<pod>.<anything>``.

    ``<pod>.`` ends in ``.`` (0x2E), so the range ends at ``<pod>/``: ``worker-1.`` never matches
    ``worker-10.<pid>``."""
    if not prefix.startswith("/") or not prefix.endswith("/"):
        raise ValueError(f"live prefix must start and end with '/': {prefix!r}")
    if not pod or "/" in pod or MEMBER_SEPARATOR in pod:
        raise ValueError(f"pod name {pod!r} is not a member-id host part")
    key = f"{prefix}{MEMBERS_DIR}{pod}{MEMBER_SEPARATOR}"
    return key, key[:-1] + chr(ord(MEMBER_SEPARATOR) + 1)


def deleterange_body(prefix: str, pod: str) -> dict[str, str]:
    """The JSON body of etcd's ``/v3/kv/deleterange`` for ``pod``'s members."""
    key, end = member_range(prefix, pod)
    return {
        "key": base64.b64encode(key.encode()).decode(),
        "range_end": base64.b64encode(end.encode()).decode(),
    }


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": token} if token else {}


async def _delete_one(
    session: aiohttp.ClientSession, url: str, prefix: str, pod: str, token: str | None
) -> int:
    async with session.post(url, json=deleterange_body(prefix, pod), headers=_auth(token)) as response:
        answer = check_answer("/v3/kv/deleterange", response.status, await response.text())
    return int(answer.get("deleted", 0))


async def evict_pods(
    address: str, prefix: str, pods: Iterable[str], timeout: float = EVICT_TIMEOUT, token: str | None = None
) -> int:
    """Delete the member keys of ``pods`` at etcd ``address`` (host:port); returns how many were deleted.
    ``token``: the job user's, with etcd auth on (``control.etcd_access``).

    Raises ``RuntimeError`` (with the reason) when etcd cannot be reached or refuses (``TokenRefused``: the
    token), or the timeout passed.
    """
    names = sorted(set(pods))
    if not names:
        return 0
    host, _, port = address.rpartition(":")
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/v3/kv/deleterange"
    try:
        # A session of its own: an eviction is on a lost worker's reaction path and must not wait for a
        # connection the probes of hung trainers hold in the shared pool.
        async with asyncio.timeout(timeout), aiohttp.ClientSession() as session:
            counts = await asyncio.gather(*(_delete_one(session, url, prefix, pod, token) for pod in names))
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
        raise RuntimeError(f"etcd at {address}: {type(exc).__name__}: {exc}") from exc
    return sum(counts)


async def read_generation_members(
    address: str,
    prefix: str,
    timeout: float = EVICT_TIMEOUT,
    endpoints: Endpoints | None = None,
    token: str | None = None,
) -> list[str]:
    """The member ids of the generation stored under ``prefix`` at etcd ``address`` ([] when none yet).

    Raises ``RuntimeError`` (with the reason) when etcd cannot be reached, refuses, or the record is not
    one the runtime writes."""
    host, _, port = address.rpartition(":")
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/v3/kv/range"
    body = {"key": base64.b64encode(f"{prefix}{GENERATION_KEY}".encode()).decode()}
    try:
        async with (
            asyncio.timeout(timeout),
            session_of(endpoints) as session,
            session.post(url, json=body, headers=_auth(token)) as response,
        ):
            answer = check_answer("/v3/kv/range", response.status, await response.text())
        kvs = answer.get("kvs") or []
        if not kvs:
            return []
        record = json.loads(base64.b64decode(kvs[0]["value"]))
        return [str(member) for member in record[GENERATION_MEMBERS_FIELD]]
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"etcd at {address}: {type(exc).__name__}: {exc}") from exc


class LiveEvictor:
    """Evicts the live members of a job's lost workers through the job's etcd, and reads its generation,
    for its controller."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        endpoints: Endpoints | None = None,
        clock: Callable[[], float] = time.monotonic,
        access: EtcdAccess | None = None,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.endpoints = endpoints
        self.access = access if access is not None else EtcdAccess(kube, namespace, None)
        """The job's etcd credentials: the token its calls carry."""
        self.clock = clock
        self._address: str | None = None
        """The address the generation reads use."""
        self._looked_up = 0.0
        """When it was looked up (``clock``)."""
        self._due = 0.0
        """When the next read looks it up again."""
        self._retry = RETRY_SECONDS
        """After a failed read, the next look-up is due this long after the last one."""
        self._running: tuple[str, str] | None = None
        """The managed etcd pod last found running: (host:port, pod UID)."""
        self._running_at = 0.0

    async def generation_pods(self, job: LLMTrainingJob) -> frozenset[str] | None:
        """The workers (pod names) of the training generation, None when etcd cannot be read now."""
        now = self.clock()
        if self._address is None or now >= self._due:
            try:
                self._address = await self.address(job)
            except KubeError:
                return None
            self._looked_up, self._due = now, now + ADDRESS_SECONDS
        address = self._address
        try:
            members = await self.access.with_token(
                job,
                address,
                lambda token: read_generation_members(
                    address, live_prefix(job), endpoints=self.endpoints, token=token
                ),
            )
        except (RuntimeError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.debug("reading the live generation failed: %s", exc)
            self._due = min(self._due, self._looked_up + self._retry)
            if self._looked_up == now:  # the address just looked up fails too: wait longer next time
                self._retry = min(ADDRESS_SECONDS, 2 * self._retry)
            return None
        self._retry = RETRY_SECONDS
        return member_pods(members)

    async def running_etcd(
        self, job: LLMTrainingJob, max_age: float = ADDRESS_SECONDS
    ) -> tuple[str, str] | None:
        """host:port of the job's etcd as it runs now, and which etcd it is (the managed rendezvous pod's UID,
        or the given endpoint); None while the managed pod does not run. A pod found at most ``max_age``
        seconds ago is not looked up again: every pass asks (``control.etcd_access``), the generation reads
        look it up about once a minute, an eviction every time."""
        if not rendezvous.managed(job):
            return job.spec.rendezvous.endpoint, job.spec.rendezvous.endpoint
        now = self.clock()
        if self._running is not None and now - self._running_at < max_age:
            return self._running
        pods = await self.kube.running_pods(self.namespace, rendezvous.server_selector(job))
        self._running = (f"{pods[0][1]}:{rendezvous.port(job)}", pods[0][0]) if pods else None
        self._running_at = now
        return self._running

    async def address(self, job: LLMTrainingJob) -> str:
        """host:port of the job's etcd as the operator reaches it (see the module's docstring)."""
        found = await self.running_etcd(job, max_age=0)
        return found[0] if found is not None else rendezvous.endpoint(job)

    async def evict(self, job: LLMTrainingJob, pods: list[str], body: kopf.Body, logger: kopf.Logger) -> None:
        """Best effort: on failure a Warning Event; the members' leases remove them a few seconds later."""
        started = time.monotonic()
        try:
            address = await self.address(job)
            deleted = await self.access.with_token(
                job, address, lambda token: evict_pods(address, live_prefix(job), pods, token=token)
            )
        except (RuntimeError, KubeError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            message = f"could not evict the live members of {', '.join(pods)}: {exc}; their leases expire"
            logger.warning(f"LiveEvictionFailed: {message}")
            kopf.event(body, type="Warning", reason="LiveEvictionFailed", message=message)
            return
        metrics.LIVE_EVICTIONS.inc(deleted)
        logger.info(
            f"LiveMembersEvicted: {deleted} member(s) of {', '.join(pods)} at {address}"
            f" in {1000 * (time.monotonic() - started):.0f} ms"
        )
