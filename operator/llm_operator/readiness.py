"""Is this operator serving? Read from the kopf peering object, served at /readyz and /healthz.

kopf pauses an operator (all watches stopped, no handler runs) while another live peer has a higher or the
same priority. The peering object's status is the shared record of who is alive: ``{identity: {priority,
lifetime, lastseen}}``. The same rule applied to it says which replica serves:
- ``active``: this replica holds the single highest priority: it reconciles.
- ``standby``: another live replica holds the single highest priority: that one serves, this one waits.
- ``conflict``: two or more live peers share the highest priority: kopf pauses all of them; nobody serves.
- ``missing``: the peering object is gone: nobody can be sure to serve.
- ``absent``: this replica's own keep-alive is not (or no longer) in the object.
- ``starting`` / ``unknown``: before the first check, or the object could not be read.

Ready (``/readyz`` 200) in ``active`` and ``standby``: the operator as a whole serves. A standby must be
ready, or a two-replica Deployment could never roll out (maxUnavailable 0) nor be drained (its
PodDisruptionBudget). Live (``/healthz`` 200) unless nobody has served for ``LIVENESS_GRACE_SECONDS``: a
restart re-runs the start-up checks (recreates a deleted peering object or says why it cannot) and draws a
new priority.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from llm_operator import metrics
from llm_operator.peering import PEERING_GROUP, PEERING_VERSION, PeeringTarget, reason_of

log = logging.getLogger("llm_operator.readiness")

CHECK_SECONDS = 2.0
"""How often the peering object is read."""
REPEAT_WARNING_SECONDS = 30.0
"""While not serving, the warning is repeated this often: the operator never idles silently."""
LIVENESS_GRACE_SECONDS = 90.0
"""Not serving for longer than this (and not merely standing by) fails liveness, so the pod restarts."""
DEFAULT_LIFETIME = 60
SERVING = frozenset({"active", "standby"})
STATES = ("starting", "active", "standby", "conflict", "missing", "absent", "unknown")
"""Every state a :class:`Verdict` can have (the ``state`` label of ``llmjob_operator_state``)."""


@dataclass(frozen=True)
class Verdict:
    """Whether this replica serves, and why (one line for logs and probes)."""

    state: str
    detail: str

    @property
    def ready(self) -> bool:
        return self.state in SERVING


@dataclass(frozen=True)
class _Peer:
    identity: str
    priority: int
    alive: bool


def _peers(status: Mapping[str, Any], now: datetime.datetime) -> list[_Peer]:
    out = []
    for identity, info in status.items():
        if not isinstance(info, Mapping):
            continue
        try:
            priority = int(info.get("priority", 0))
            lifetime = int(info.get("lifetime", DEFAULT_LIFETIME))
            seen_text = info.get("lastseen")
            seen = datetime.datetime.fromisoformat(seen_text) if seen_text else now
        except (TypeError, ValueError):
            continue
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=datetime.UTC)
        out.append(_Peer(str(identity), priority, seen + datetime.timedelta(seconds=lifetime) > now))
    return out


def verdict(status: Mapping[str, Any] | None, identity: str, now: datetime.datetime) -> Verdict:
    """Apply kopf's pause rule to a peering object's status (None: the object does not exist)."""
    if status is None:
        return Verdict("missing", "the peering object does not exist")
    peers = _peers(status, now)
    me = next((p for p in peers if p.identity == identity), None)
    if me is None or not me.alive:
        return Verdict("absent", f"no live keep-alive of {identity!r} in the peering object")
    live = [p for p in peers if p.alive]
    top = max(p.priority for p in live)
    holders = sorted(p.identity for p in live if p.priority == top)
    if len(holders) > 1:
        return Verdict("conflict", f"live peers {holders} share priority {top}: kopf pauses all of them")
    if holders == [identity]:
        return Verdict("active", f"serving (priority {me.priority}, highest of {len(live)} live peer(s))")
    return Verdict("standby", f"paused in favour of {holders[0]!r} (priority {top} > {me.priority})")


def combine(verdicts: list[Verdict]) -> Verdict:
    """Several peering objects (one per namespace): kopf pauses everything when any of them says so."""
    for v in verdicts:
        if not v.ready:
            return v
    for v in verdicts:
        if v.state == "standby":
            return v
    return verdicts[0]


class ServingMonitor:
    """Re-checks the peering objects every CHECK_SECONDS; logs every change and repeats warnings."""

    def __init__(self, targets: list[PeeringTarget], identity: str, standalone: bool) -> None:
        self.targets = targets
        self.identity = identity
        self.standalone = standalone
        self.current = Verdict("starting", "start-up checks running")
        metrics.observe_operator_state(self.current.state, STATES)
        self.not_serving_since: float | None = time.monotonic()
        self._last_warning = 0.0
        self._keepalive_seen = False

    def set(self, new: Verdict) -> None:
        """Record a verdict; log changes, and repeat the warning while not serving."""
        now = time.monotonic()
        changed = new != self.current
        if new.ready:
            self.not_serving_since = None
        elif self.not_serving_since is None:
            self.not_serving_since = now
        self.current = new
        metrics.observe_operator_state(new.state, STATES)
        if new.ready or new.state == "starting":
            if changed:
                log.info(f"operator {new.state}: {new.detail}")
        elif changed or now - self._last_warning >= REPEAT_WARNING_SECONDS:
            log.warning(f"operator NOT serving ({new.state}): {new.detail}")
            self._last_warning = now

    def alive(self) -> bool:
        """False once nobody has served for LIVENESS_GRACE_SECONDS (never merely for standing by)."""
        since = self.not_serving_since
        return since is None or time.monotonic() - since < LIVENESS_GRACE_SECONDS

    async def check(self, api: client.ApiClient) -> Verdict:
        if self.standalone:
            return Verdict("active", "serving (standalone, no peering)")
        custom = client.CustomObjectsApi(api)
        verdicts = []
        now = datetime.datetime.now(datetime.UTC)
        for target in self.targets:
            try:
                if target.namespace is None:
                    body = await custom.get_cluster_custom_object(
                        PEERING_GROUP, PEERING_VERSION, target.plural, target.name
                    )
                else:
                    body = await custom.get_namespaced_custom_object(
                        PEERING_GROUP, PEERING_VERSION, target.namespace, target.plural, target.name
                    )
            except ApiException as exc:
                if exc.status == 404:
                    verdicts.append(Verdict("missing", f"{target.describe()} does not exist"))
                    continue
                verdicts.append(Verdict("unknown", f"cannot read {target.describe()}: {reason_of(exc)}"))
                continue
            except (OSError, TimeoutError) as exc:
                verdicts.append(Verdict("unknown", f"cannot read {target.describe()}: {reason_of(exc)}"))
                continue
            found = verdict(dict(body.get("status") or {}), self.identity, now)
            verdicts.append(Verdict(found.state, f"{target.describe()}: {found.detail}"))
        return combine(verdicts)

    def settle(self, found: Verdict) -> Verdict:
        """Until kopf's first keep-alive shows up, an absent one means "starting", not a failure."""
        if found.state in ("active", "standby", "conflict"):
            self._keepalive_seen = True
        if found.state == "absent" and not self._keepalive_seen:
            return Verdict("starting", f"waiting for kopf's first keep-alive: {found.detail}")
        return found

    async def run(self, api: client.ApiClient) -> None:
        """Forever: check, record, sleep."""
        while True:
            self.set(self.settle(await self.check(api)))
            await asyncio.sleep(CHECK_SECONDS)


async def serve_probes(monitor: ServingMonitor, port: int) -> web.AppRunner:
    """/healthz (liveness) and /readyz (readiness) on ``port``, answered from the monitor."""

    def answer(ok: bool) -> web.Response:
        body = {
            "state": monitor.current.state,
            "detail": monitor.current.detail,
            "identity": monitor.identity,
        }
        return web.Response(
            status=200 if ok else 503, text=json.dumps(body) + "\n", content_type="application/json"
        )

    async def healthz(_: web.Request) -> web.Response:
        return answer(monitor.alive())

    async def readyz(_: web.Request) -> web.Response:
        return answer(monitor.current.ready)

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()  # noqa: S104  (kubelet probes from outside the pod)
    return runner
