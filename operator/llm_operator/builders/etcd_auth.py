"""A job's own etcd credentials: names, key ranges, passwords, the Secret and what a worker pod gets (pure).

With etcd auth on (the chart's ``rendezvous.auth``; docs/security.md, "The etcd credentials"), every job
whose rendezvous is etcd-v3 gets an etcd user and a role of the same name that may read and write its own
key prefixes only: ``/llmjob/<uid>/`` (the live membership) and ``/elasticllm/rendezvous/<uid>/`` (torchrun's
etcd-v3 rendezvous, the handler's default ``key_prefix``). The operator sets them up in the job's own etcd
(where it also turns auth on, with a root user of that etcd alone) or in the shared etcd it holds the root
credentials of (``control.etcd_access``).

Passwords are derived, never stored by the operator: HMAC-SHA256 of the job's UID under the operator's key
(a Secret the chart makes and keeps). A restarted operator derives the same passwords, so it needs no read
access to Secrets; it only creates the job's Secret, owned by the job (garbage collection deletes it).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from llm_elastic.contract import ETCD_PASSWORD_FILE_ENV, ETCD_USER_ENV
from llm_elastic.rendezvous.etcd_auth import Credentials

from llm_operator.api.models import LLMTrainingJob
from llm_operator.api.rules import TRAINER_CONTAINER
from llm_operator.builders import rendezvous
from llm_operator.builders.common import child_metadata, job_uid
from llm_operator.settings import EtcdAuth

LIVE_ROOT = "/llmjob/"
"""``<LIVE_ROOT><uid>/``: the job's live membership (``builders.worker.live_prefix``) lives under it."""
TORCHRUN_ROOT = "/elasticllm/rendezvous/"
"""``<TORCHRUN_ROOT><uid>/``: torchrun's etcd-v3 rendezvous (``llm_elastic.rendezvous.handler``'s default
``key_prefix``, run id = the job's UID)."""
USER_PREFIX = "llmjob/"
"""Users and roles the operator made are named ``llmjob/<namespace>/<job>/<uid>``."""
ROOT_USER = "root"
"""etcd's root user (and role): what turns auth on in a per-job etcd."""
SECRET_KEY = "password"  # noqa: S105 (a key name)
"""The key of the password in the job's Secret."""
VOLUME = "llmjob-etcd-auth"
MOUNT_DIR = "/var/run/secrets/elasticllm.dev/etcd"
ROLE_ROLE = "etcd-auth"
"""``elasticllm.dev/role`` of the job's Secret."""


def applies(job: LLMTrainingJob, auth: EtcdAuth | None) -> bool:
    """Whether the job gets its own etcd user: auth on, etcd-v3, and an etcd the operator can set up (its
    own per-job etcd, or the shared etcd whose root credentials it holds)."""
    if auth is None or job.spec.rendezvous.backend != "etcd-v3":
        return False
    if rendezvous.managed(job):
        return True
    return auth.shared_root is not None and job.spec.rendezvous.endpoint == auth.shared_endpoint


def user_name(job: LLMTrainingJob) -> str:
    """The job's etcd user and role: unique per job object (the UID), readable by a platform admin."""
    return f"{USER_PREFIX}{job.metadata.namespace}/{job.metadata.name}/{job_uid(job)}"


def prefix_range(prefix: str) -> tuple[str, str]:
    """etcd's ``[key, range_end)`` of every key starting with ``prefix`` (its last byte plus one)."""
    if not prefix:
        raise ValueError("an empty prefix is every key, never a job's")
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def key_ranges(job: LLMTrainingJob) -> list[tuple[str, str]]:
    """The ranges the job's role may read and write."""
    uid = job_uid(job)
    return [prefix_range(f"{LIVE_ROOT}{uid}/"), prefix_range(f"{TORCHRUN_ROOT}{uid}/")]


def derive(key: bytes, job: LLMTrainingJob, who: str) -> str:
    """A password for ``who`` (the job's user, or the root of its own etcd): 43 URL-safe characters."""
    digest = hmac.new(key, f"{job_uid(job)}:{who}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def job_credentials(job: LLMTrainingJob, auth: EtcdAuth) -> Credentials:
    return Credentials(user_name(job), derive(auth.key, job, "user"))


def root_credentials(job: LLMTrainingJob, auth: EtcdAuth) -> Credentials:
    """Root of the etcd the job uses: the shared one's, or its own etcd's (derived)."""
    if not rendezvous.managed(job):
        if auth.shared_root is None:
            raise ValueError("the shared etcd's root credentials are not configured")
        return auth.shared_root
    return Credentials(ROOT_USER, derive(auth.key, job, ROOT_USER))


def secret_name(job: LLMTrainingJob) -> str:
    return f"{job.metadata.name}-etcd-auth"


def secret(job: LLMTrainingJob, auth: EtcdAuth) -> dict[str, Any]:
    """The job's Secret: its etcd password, owned by the job."""
    password = job_credentials(job, auth).password
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(job, secret_name(job), ROLE_ROLE),
        "type": "Opaque",
        "data": {SECRET_KEY: base64.b64encode(password.encode()).decode()},
    }


def dress(pod: dict[str, Any], job: LLMTrainingJob) -> dict[str, Any]:
    """Mount the job's Secret into the trainer container of ``pod`` (a worker of ``job``) and point the
    runtime at it; other containers (the user's sidecars) get nothing."""
    spec = pod["spec"]
    spec.setdefault("volumes", []).append(
        {"name": VOLUME, "secret": {"secretName": secret_name(job), "defaultMode": 0o444}}
    )
    for container in spec["containers"]:
        if container["name"] != TRAINER_CONTAINER:
            continue
        container.setdefault("volumeMounts", []).append(
            {"name": VOLUME, "mountPath": MOUNT_DIR, "readOnly": True}
        )
        container.setdefault("env", []).extend(
            [
                {"name": ETCD_USER_ENV, "value": user_name(job)},
                {"name": ETCD_PASSWORD_FILE_ENV, "value": f"{MOUNT_DIR}/{SECRET_KEY}"},
            ]
        )
    return pod
