"""Start-up checks before kopf runs: the CRDs are served and the peering object exists.

Without them kopf does not fail: it pauses every watch and waits for ever. So the operator waits here
(bounded, with a line per attempt) for what may still be coming (CRDs being established, `429 storage is
(re)initializing`, an apiserver restarting), creates a missing peering object when its identity may, and
otherwise stops with a message that says what to create.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from llm_operator.api.models import GROUP, PLURAL, VERSION

log = logging.getLogger("llm_operator.startup")

PEERING_GROUP = "kopf.dev"
PEERING_VERSION = "v1"
TRANSIENT_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})
"""HTTP answers worth waiting out at start-up (0: no answer at all, e.g. connection refused)."""
EXIT_NOT_READY = 3
"""Exit code when the cluster lacks something the operator needs (a CRD, the peering object)."""

T = TypeVar("T")


class StartupError(Exception):
    """The operator cannot start; the message says what to do."""


@dataclass(frozen=True)
class PeeringTarget:
    """One kopf peering object: a ClusterKopfPeering (namespace None) or a KopfPeering in a namespace."""

    name: str
    namespace: str | None

    @property
    def kind(self) -> str:
        return "ClusterKopfPeering" if self.namespace is None else "KopfPeering"

    @property
    def plural(self) -> str:
        return "clusterkopfpeerings" if self.namespace is None else "kopfpeerings"

    def describe(self) -> str:
        where = "" if self.namespace is None else f" in namespace {self.namespace!r}"
        return f"{self.kind} {self.name!r}{where}"

    def manifest(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name}
        if self.namespace is not None:
            meta["namespace"] = self.namespace
        return {"apiVersion": f"{PEERING_GROUP}/{PEERING_VERSION}", "kind": self.kind, "metadata": meta}

    def create_hint(self) -> str:
        """A command that creates the object."""
        ns = "" if self.namespace is None else f" -n {self.namespace}"
        api_version = f"{PEERING_GROUP}/{PEERING_VERSION}"
        spec = f"apiVersion: {api_version}\nkind: {self.kind}\nmetadata:\n  name: {self.name}"
        return f"kubectl apply{ns} -f - <<'EOF'\n{spec}\nEOF"


def peering_targets(name: str, namespaces: list[str]) -> list[PeeringTarget]:
    """The objects kopf keeps its keep-alives in: one cluster-wide, or one per served namespace."""
    if not namespaces:
        return [PeeringTarget(name, None)]
    return [PeeringTarget(name, ns) for ns in dict.fromkeys(namespaces)]


def backoff(initial: float = 0.5, factor: float = 2.0, cap: float = 5.0) -> Iterator[float]:
    """Delays between start-up attempts: 0.5, 1, 2, 4, 5, 5, ... seconds."""
    delay = initial
    while True:
        yield delay
        delay = min(cap, delay * factor)


def status_of(exc: BaseException) -> int:
    """HTTP status of an API error; 0 when the apiserver did not answer."""
    if isinstance(exc, ApiException):
        return int(exc.status or 0)
    return 0


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}".strip()
    return f"{type(exc).__name__}: {exc}"[:200]


class Deadline:
    """Retries transient failures until a point in time; one progress line per failed attempt."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.until = time.monotonic() + seconds

    def left(self) -> float:
        return self.until - time.monotonic()

    async def retry(self, what: str, attempt: Callable[[], Awaitable[T]], not_yet: frozenset[int]) -> T:
        """Run ``attempt`` until it succeeds; statuses in ``not_yet`` (and transient ones) are waited out."""
        delays = backoff()
        number = 0
        while True:
            number += 1
            try:
                return await attempt()
            except (ApiException, OSError, TimeoutError) as exc:
                status = status_of(exc)
                if status not in TRANSIENT_STATUSES and status not in not_yet:
                    raise
                delay = next(delays)
                if self.left() < delay:
                    raise StartupError(
                        f"gave up after {self.seconds:.0f} s waiting for {what}: {reason_of(exc)}"
                    ) from None
                log.warning(
                    f"waiting for {what}: {reason_of(exc)} (attempt {number}; next in {delay:.1f} s, "
                    f"{self.left():.0f} s left)"
                )
                await asyncio.sleep(delay)


async def wait_for_crds(
    api: client.ApiClient, deadline: Deadline, standalone: bool, namespaced: bool
) -> None:
    """Wait until the apiserver serves the job CRD (and the peering CRD): kopf looks them up only once."""
    custom = client.CustomObjectsApi(api)
    needed = [(GROUP, VERSION, PLURAL, f"{PLURAL}.{GROUP}")]
    if not standalone:
        plural = "kopfpeerings" if namespaced else "clusterkopfpeerings"
        needed.append((PEERING_GROUP, PEERING_VERSION, plural, f"{plural}.{PEERING_GROUP}"))
    for group, version, plural, crd in needed:

        async def served(group: str = group, version: str = version, plural: str = plural) -> None:
            found = await custom.get_api_resources(group, version)
            if plural not in {r.name for r in found.resources or []}:
                raise ApiException(status=404, reason=f"{plural} not in {group}/{version} yet")

        try:
            await deadline.retry(f"the CRD {crd} to be served", served, not_yet=frozenset({404}))
        except StartupError as exc:
            raise StartupError(
                f"{exc}. Install the CRDs first: kubectl apply -f crds/ (or the Helm chart's crds/)"
            ) from None


async def wait_for_job_storage(api: client.ApiClient, deadline: Deadline, namespaces: list[str]) -> None:
    """List jobs once: a CRD that was just created answers 429 or 503 until its storage is ready."""
    custom = client.CustomObjectsApi(api)

    async def listed() -> None:
        if namespaces:
            for ns in namespaces:
                await custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, limit=1)
        else:
            await custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)

    await deadline.retry(f"{PLURAL}.{GROUP} to answer a list", listed, not_yet=frozenset())


async def ensure_peering(api: client.ApiClient, deadline: Deadline, target: PeeringTarget) -> str:
    """Make sure the peering object exists: "found" or "created"; StartupError when it cannot."""
    custom = client.CustomObjectsApi(api)

    async def get() -> Any:
        if target.namespace is None:
            return await custom.get_cluster_custom_object(
                PEERING_GROUP, PEERING_VERSION, target.plural, target.name
            )
        return await custom.get_namespaced_custom_object(
            PEERING_GROUP, PEERING_VERSION, target.namespace, target.plural, target.name
        )

    async def create() -> Any:
        body: Any = target.manifest()
        if target.namespace is None:
            return await custom.create_cluster_custom_object(
                PEERING_GROUP, PEERING_VERSION, target.plural, body
            )
        return await custom.create_namespaced_custom_object(
            PEERING_GROUP, PEERING_VERSION, target.namespace, target.plural, body
        )

    missing = f"{target.describe()} does not exist, and without it kopf pauses every watch and serves nothing"
    try:
        await deadline.retry(f"{target.describe()}", get, not_yet=frozenset())
        return "found"
    except ApiException as exc:
        if exc.status == 403:
            raise StartupError(
                f"this identity may not read {target.describe()} (forbidden): grant get, list, watch and "
                f"patch on {target.plural}.{PEERING_GROUP}, or run a single replica with --standalone"
            ) from None
        if exc.status != 404:
            raise
    try:
        await deadline.retry(f"creating {target.describe()}", create, not_yet=frozenset())
    except ApiException as exc:
        if exc.status == 409:  # another replica made it at the same moment
            return "found"
        if exc.status == 403:
            raise StartupError(
                f"{missing}; this identity may not create it (forbidden). Create it:\n"
                f"{target.create_hint()}\n"
                "or install the Helm chart with peering.create=true, or run one replica with --standalone"
            ) from None
        raise
    return "created"


async def prepare(
    api: client.ApiClient,
    *,
    namespaces: list[str],
    standalone: bool,
    peering_name: str,
    timeout: float,
) -> None:
    """Everything kopf needs before it starts; StartupError when the cluster cannot provide it in time."""
    deadline = Deadline(timeout)
    await wait_for_crds(api, deadline, standalone=standalone, namespaced=bool(namespaces))
    await wait_for_job_storage(api, deadline, namespaces)
    if standalone:
        log.info("standalone: no peering; run only one operator for these namespaces")
        return
    for target in peering_targets(peering_name, namespaces):
        outcome = await ensure_peering(api, deadline, target)
        if outcome == "created":
            log.warning(f"{target.describe()} was missing: created it (kopf peering needs it)")
        else:
            log.info(f"peering through {target.describe()}")
