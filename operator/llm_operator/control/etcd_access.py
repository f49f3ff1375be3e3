"""The operator's side of the jobs' etcd credentials: it makes each job's Secret, sets up the job's user and
role in the etcd the job uses, removes them with the job, and holds a token of the job's user for its own
calls there (live eviction, generation reads; ``control.live_evict``).

Everything goes through etcd's JSON gateway (``/v3/auth/*``), as the eviction does: no etcd client library in
the operator image. Names and passwords come from ``builders.etcd_auth`` (derived, never read back).

**A per-job etcd** starts without auth. At the first pass that finds its pod running, the operator removes
any user or role it did not make (anyone who reached the etcd before could have added one), adds its root
user and the job's user and role, turns auth on, and checks once more with the root token that no other
user or role exists. Each etcd pod (by UID) is set up once; a replaced one is set up again, at any address,
once the operator looks its pod up again (within a minute: ``LiveEvictor.running_etcd``).
**The shared etcd** runs with auth already (the platform team's root credentials, given to the operator):
the operator adds the job's role and user once per job, and deletes them when the job is deleted.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from llm_elastic.rendezvous.etcd_auth import Credentials, Refusal, auth_disabled, refusal

from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders import etcd_auth, rendezvous
from llm_operator.kube import Kube
from llm_operator.settings import EtcdAuth

log = logging.getLogger(__name__)

T = TypeVar("T")
TIMEOUT = 5.0
"""Seconds one set-up may take."""
RETRY_SECONDS = 2.0
"""A set-up that failed (etcd not running yet, not answering) is tried again this soon."""


class EtcdRefused(RuntimeError):
    """etcd answered a call with an error; ``message`` is etcd's."""

    def __init__(self, path: str, status: int, message: str) -> None:
        super().__init__(f"{path}: HTTP {status}: {message}")
        self.message = message


class TokenRefused(EtcdRefused):
    """The call's token was missing or stale: authenticate again."""


def check_answer(path: str, status: int, text: str) -> dict[str, Any]:
    """etcd's JSON answer; raises :class:`TokenRefused` or :class:`EtcdRefused` for an error answer."""
    if status == 200:
        answer: dict[str, Any] = json.loads(text) if text else {}
        return answer
    try:
        message = str(json.loads(text).get("message", text))
    except (ValueError, AttributeError):
        message = text[:200]
    if refusal(message) is Refusal.REAUTHENTICATE:
        raise TokenRefused(path, status, message)
    raise EtcdRefused(path, status, message)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def base_url(address: str) -> str:
    host, _, port = address.rpartition(":")
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


async def post(
    session: aiohttp.ClientSession, address: str, path: str, body: dict[str, Any], token: str | None = None
) -> dict[str, Any]:
    """One JSON-gateway call; raises :class:`EtcdRefused` (:class:`TokenRefused`) on an error answer."""
    headers = {"Authorization": token} if token else {}
    async with session.post(base_url(address) + path, json=body, headers=headers) as response:
        return check_answer(path, response.status, await response.text())


async def authenticate(session: aiohttp.ClientSession, address: str, who: Credentials) -> str | None:
    """A token for ``who``; None when the etcd runs without auth."""
    try:
        answer = await post(
            session, address, "/v3/auth/authenticate", {"name": who.user, "password": who.password}
        )
    except EtcdRefused as exc:
        if auth_disabled(exc.message):
            return None
        raise
    return str(answer["token"])


def job_calls(user: Credentials, ranges: list[tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    """The calls that give ``user`` a role of its name with read/write on ``ranges`` only (pure)."""
    grants = [
        (
            "/v3/auth/role/grant",
            {"name": user.user, "perm": {"permType": "READWRITE", "key": b64(k), "range_end": b64(e)}},
        )
        for k, e in ranges
    ]
    return [
        ("/v3/auth/role/add", {"name": user.user}),
        *grants,
        ("/v3/auth/user/add", {"name": user.user, "password": user.password}),
        ("/v3/auth/user/grant", {"user": user.user, "role": user.user}),
    ]


def root_calls(root: Credentials) -> list[tuple[str, dict[str, Any]]]:
    """The calls that make ``root`` etcd's root user (before ``/v3/auth/enable``; pure)."""
    return [
        ("/v3/auth/role/add", {"name": etcd_auth.ROOT_USER}),
        ("/v3/auth/user/add", {"name": root.user, "password": root.password}),
        ("/v3/auth/user/grant", {"user": root.user, "role": etcd_auth.ROOT_USER}),
    ]


def already(message: str) -> bool:
    """An add that found its object there: the set-up is idempotent."""
    return "already exists" in message


async def _run(
    session: aiohttp.ClientSession, address: str, calls: list[tuple[str, dict[str, Any]]], token: str | None
) -> None:
    for path, body in calls:
        try:
            await post(session, address, path, body, token)
        except EtcdRefused as exc:
            if not already(exc.message):
                raise


async def _strangers(session: aiohttp.ClientSession, address: str, token: str | None, keep: set[str]) -> None:
    """Delete every user and role but ``keep``: nobody else has any business in a job's own etcd."""
    users = (await post(session, address, "/v3/auth/user/list", {}, token)).get("users") or []
    roles = (await post(session, address, "/v3/auth/role/list", {}, token)).get("roles") or []
    for user in set(users) - keep:
        log.warning("deleting etcd user %r at %s: the operator did not make it", user, address)
        await post(session, address, "/v3/auth/user/delete", {"name": user}, token)
    for role in set(roles) - keep:
        await post(session, address, "/v3/auth/role/delete", {"role": role}, token)


class EtcdAccess:
    """One job's etcd credentials, as its controller sees them."""

    def __init__(self, kube: Kube, namespace: str, auth: EtcdAuth | None) -> None:
        self.kube = kube
        self.namespace = namespace
        self.auth = auth
        self._secret_of: str | None = None
        """The job UID whose Secret this controller made (or found)."""
        self._ready: set[tuple[str, str]] = set()
        """(job UID, which etcd) set up: a replaced per-job etcd pod is a new one, even at the same IP."""
        self._tokens: dict[str, str | None] = {}
        """etcd address -> the job user's token there (None: that etcd runs without auth)."""

    def applies(self, job: LLMTrainingJob) -> bool:
        return etcd_auth.applies(job, self.auth)

    def dress(self, pod: dict[str, Any], job: LLMTrainingJob) -> dict[str, Any]:
        """A worker pod with the job's credentials mounted (unchanged when etcd auth does not apply)."""
        return etcd_auth.dress(pod, job) if self.applies(job) else pod

    async def ensure(
        self, job: LLMTrainingJob, etcd: Callable[[], Awaitable[tuple[str, str] | None]]
    ) -> float | None:
        """Make the job's Secret and set up its user at the etcd ``etcd()`` names ((address, which etcd);
        None: not running yet) unless done; returns when to try again after a failure, None when set up."""
        if self.auth is None or not self.applies(job):
            return None
        uid = job.metadata.uid or ""
        if self._secret_of != uid:
            await self.kube.create(etcd_auth.secret(job, self.auth))
            self._secret_of = uid
        found = await etcd()
        if found is None:
            return RETRY_SECONDS
        where, which = found
        if (uid, which) in self._ready:
            return None
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session:
                if rendezvous.managed(job):
                    await self._own_etcd(session, where, job, self.auth)
                else:
                    await self._shared_etcd(session, where, job, self.auth)
        except (EtcdRefused, aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError) as exc:
            log.info(
                "setting up the etcd user of %s/%s at %s: %s", self.namespace, job.metadata.name, where, exc
            )
            return RETRY_SECONDS
        self._ready.add((uid, which))
        log.info("etcd user of %s/%s set up at %s", self.namespace, job.metadata.name, where)
        return None

    async def _own_etcd(
        self, session: aiohttp.ClientSession, address: str, job: LLMTrainingJob, auth: EtcdAuth
    ) -> None:
        root, user = etcd_auth.root_credentials(job, auth), etcd_auth.job_credentials(job, auth)
        keep = {root.user, etcd_auth.ROOT_USER, user.user}
        token = await authenticate(session, address, root)
        if token is None:  # auth off: a fresh etcd; whatever is there, nobody made it with our say
            await _strangers(session, address, None, keep)
            await _run(
                session, address, [*root_calls(root), *job_calls(user, etcd_auth.key_ranges(job))], None
            )
            await post(session, address, "/v3/auth/enable", {})
            token = await authenticate(session, address, root)
        else:
            await _run(session, address, job_calls(user, etcd_auth.key_ranges(job)), token)
        await _strangers(session, address, token, keep)

    async def _shared_etcd(
        self, session: aiohttp.ClientSession, address: str, job: LLMTrainingJob, auth: EtcdAuth
    ) -> None:
        root, user = etcd_auth.root_credentials(job, auth), etcd_auth.job_credentials(job, auth)
        token = await authenticate(session, address, root)
        if token is None:
            raise EtcdRefused(
                "/v3/auth/authenticate", 400, "the shared etcd runs without auth: turn it on first"
            )
        await _run(session, address, job_calls(user, etcd_auth.key_ranges(job)), token)
        try:  # a user from before an operator restart: its password is ours unless the key changed
            await authenticate(session, address, user)
        except EtcdRefused:
            await post(
                session,
                address,
                "/v3/auth/user/changepw",
                {"name": user.user, "password": user.password},
                token,
            )

    async def forget(self, job: LLMTrainingJob) -> None:
        """The job is deleted: delete its user and role in the shared etcd (its own etcd goes with it).
        Best effort: a failure is logged (docs/security.md says what is left then)."""
        if self.auth is None or not self.applies(job) or rendezvous.managed(job):
            return
        address = job.spec.rendezvous.endpoint
        name = etcd_auth.user_name(job)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session:
                token = await authenticate(session, address, etcd_auth.root_credentials(job, self.auth))
                for path, body in (
                    ("/v3/auth/user/delete", {"name": name}),
                    ("/v3/auth/role/delete", {"role": name}),
                ):
                    try:
                        await post(session, address, path, body, token)
                    except EtcdRefused as exc:
                        if "not found" not in exc.message:
                            raise
        except (EtcdRefused, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("could not delete the etcd user %r at %s: %s", name, address, exc)
            return
        log.info("deleted the etcd user and role %r at %s", name, address)

    async def with_token(
        self, job: LLMTrainingJob, address: str, call: Callable[[str | None], Awaitable[T]]
    ) -> T:
        """``call(token)`` with the job user's token at ``address`` (None without auth); a refused token is
        renewed once. Raises what ``call`` and the authentication raise."""
        if self.auth is None or not self.applies(job):
            return await call(None)
        if address not in self._tokens:
            await self._renew(job, address, self.auth)
        try:
            return await call(self._tokens[address])
        except TokenRefused:
            await self._renew(job, address, self.auth)
            return await call(self._tokens[address])

    async def _renew(self, job: LLMTrainingJob, address: str, auth: EtcdAuth) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session:
            self._tokens[address] = await authenticate(session, address, etcd_auth.job_credentials(job, auth))
