"""The job's etcd credentials as a worker holds them, and what an etcd refusal means for its token.

With etcd auth on (docs/security.md, "The etcd credentials"), the operator gives every worker of a job the
job's etcd user in ``$LLMJOB_ETCD_USER`` and a file holding its password in ``$LLMJOB_ETCD_PASSWORD_FILE``
(a Secret volume). :class:`~llm_elastic.rendezvous.etcd_client.EtcdClient` authenticates with them and
sends the token etcd hands out as plain gRPC metadata with every call. Pure: the client asks
:func:`refusal` what to do when etcd refuses a call, and reads the credentials with
:func:`credentials_from_env`.

etcd's simple tokens live in the memory of the member that issued them: a restarted or replaced etcd
refuses them (``invalid auth token``), an idle token expires after 5 minutes, and an etcd that turned auth
on after the token-less calls began refuses those (``user name is empty``). Each means "authenticate
again and send the call once more". An etcd without auth (a per-job etcd the operator has not set up yet,
or a fresh one replacing it) answers ``authentication is not enabled``: the client then sends no token
until it is refused.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llm_elastic.contract import ETCD_PASSWORD_FILE_ENV, ETCD_USER_ENV
from llm_elastic.errors import contract_error

METADATA_KEY = "token"
"""The gRPC metadata key etcd reads the token from."""

# What etcd says (gRPC details, also the JSON gateway's "message"), etcd 3.4 to 3.6.
SAYS_STALE = "invalid auth token"
SAYS_MISSING = "user name is empty"
SAYS_AUTH_OFF = "authentication is not enabled"
SAYS_BAD_CREDENTIALS = "authentication failed"
SAYS_DENIED = "permission denied"


@dataclass(frozen=True)
class Credentials:
    """An etcd user and its password; the password never appears in a repr or a log line."""

    user: str
    password: str = field(repr=False)


class Refusal(enum.Enum):
    """What a refused call means for the client's token."""

    REAUTHENTICATE = "reauthenticate"
    """The token is missing or stale: authenticate again, send the call once more."""
    FINAL = "final"
    """Anything else (permission denied, a bad password, an unreachable etcd): the caller's error."""


def refusal(details: str) -> Refusal:
    """Classify an etcd error message (gRPC details or the gateway's ``message``)."""
    if SAYS_STALE in details or SAYS_MISSING in details:
        return Refusal.REAUTHENTICATE
    return Refusal.FINAL


def credentials_refused(details: str) -> bool:
    """Whether etcd refused a call for its credentials: none sent, a wrong password, or a key outside the
    user's role."""
    return any(says in details for says in (SAYS_MISSING, SAYS_BAD_CREDENTIALS, SAYS_DENIED))


def connection_hint(error: str) -> str:
    """What a torchrun agent should check when its first etcd call fails: the credentials when etcd refused
    them, else the endpoint."""
    if credentials_refused(error):
        return (
            f"etcd runs with auth: the agent needs the job's credentials (${ETCD_USER_ENV} and "
            f"${ETCD_PASSWORD_FILE_ENV}, which the operator sets with rendezvous.auth on)"
        )
    return "check --rdzv-endpoint and that etcd is running"


def auth_disabled(details: str) -> bool:
    """Whether an ``Authenticate`` refusal says the etcd runs without auth (then calls need no token)."""
    return SAYS_AUTH_OFF in details


def credentials_from_env(env: Mapping[str, str]) -> Credentials | None:
    """The job's etcd credentials, None when the operator gave none (etcd auth off for the job).

    Exits 2 with one line naming the variable when only one of the two is set or the file cannot be read.
    """
    user = env.get(ETCD_USER_ENV, "").strip()
    path = env.get(ETCD_PASSWORD_FILE_ENV, "").strip()
    if not user and not path:
        return None
    if not user or not path:
        missing = ETCD_USER_ENV if not user else ETCD_PASSWORD_FILE_ENV
        contract_error(f"${missing} must be set with ${ETCD_USER_ENV} and ${ETCD_PASSWORD_FILE_ENV}")
    try:
        password = Path(path).read_text().strip()
    except OSError as exc:
        contract_error(f"${ETCD_PASSWORD_FILE_ENV}={path!r} cannot be read: {exc.strerror or exc}")
    if not password:
        contract_error(f"${ETCD_PASSWORD_FILE_ENV}={path!r} is empty")
    return Credentials(user, password)
