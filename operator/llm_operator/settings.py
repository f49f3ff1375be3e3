"""Operator settings that come from its environment (the Helm chart sets them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from llm_elastic.contract import METRICS_PORT
from llm_elastic.rendezvous.etcd_auth import Credentials

from llm_operator.policy.brake import BrakeLimits
from llm_operator.policy.tenancy import TenantPolicy

DEFAULT_RENDEZVOUS_IMAGE = "quay.io/coreos/etcd:v3.6.16"
ETCD_CLIENT_PORT = 2379
C10D_PORT = 29400
TRAINER_METRICS_PORT = METRICS_PORT
DEFAULT_PROGRESS_SECONDS = 30.0
"""One status.progress write per job per 30 s at most: 33 writes/s for 1,000 jobs (decision G2)."""
DEFAULT_INDEX_AUDIT_SECONDS = 300.0
"""Each job checks its slice of the pod index against a consistent list this often, besides after every
re-list (llm_operator.control.ghosts): 3.3 small LISTs/s for 1,000 jobs."""
DEFAULT_PEERING_LIFETIME_S = 4
"""A replica's peering entry counts as alive this long after its last keep-alive (kopf renews it 5-10 s
before it runs out, at least every second: every second at 4, so a keep-alive may be 3 s late): a standby
takes over within this much of the active one's crash (3.6 s at most from a node loss to its replacement,
docs/benchmarks.md, "HA failover"; kopf's own default, 60 s, took up to a minute; docs/decisions.md UF4)."""
DEFAULT_GC_THAW_SECONDS = 3600.0
"""The heap frozen after each full garbage collection is thawed this often, so that the next full collection
frees what died in cycles among frozen objects (llm_operator.loop_health.HeapFreeze)."""
DEFAULT_NODE_CONDITIONS: dict[str, str] = {
    "AcceleratedHardwareReady": "False",
    "NetworkingReady": "False",
    "StorageReady": "False",
    "KernelReady": "False",
    "ContainerRuntimeReady": "False",
}
"""Node condition types that mean the node is unhealthy, each with the status that says so: the five the
EKS node monitoring agent sets on GPU nodes (EKS node auto repair acts on them minutes later)."""
DEFAULT_OPERATOR_NAMESPACE = "elastic-llm-operator"
DEFAULT_OPERATOR_POD_LABELS: dict[str, str] = {
    "app.kubernetes.io/name": "elastic-llm-operator",
    "app.kubernetes.io/component": "operator",
}


@dataclass(frozen=True)
class EtcdAuth:
    """The operator's etcd auth settings (LLMJOB_ETCD_AUTH_KEY and the shared etcd's)."""

    key: bytes = field(repr=False)
    """What the passwords are derived from (the chart's generated Secret)."""
    shared_endpoint: str = ""
    """The shared etcd's endpoint exactly as jobs name it in ``spec.rendezvous.endpoint``; only there are
    the root credentials used (never sent to an etcd a job chose)."""
    shared_root: Credentials | None = None
    """Root of the shared etcd (the platform team's Secret); None: jobs naming an endpoint get no user."""


@dataclass(frozen=True)
class Settings:
    """What the builders need beyond the job itself."""

    rendezvous_image: str = DEFAULT_RENDEZVOUS_IMAGE
    """Image of the operator-managed etcd rendezvous server."""
    rendezvous_node_selector: dict[str, str] = field(default_factory=dict)
    """Node selector for rendezvous servers (keep them off GPU nodes)."""
    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE
    """Namespace of the operator's pods: the rendezvous NetworkPolicy admits them (with the labels below)."""
    operator_pod_labels: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_OPERATOR_POD_LABELS))
    """Labels of the operator's pods; empty = the rendezvous NetworkPolicy admits workers only."""
    kueue: bool = True
    """Kueue admission for jobs with a kueue.x-k8s.io/queue-name label (LLMJOB_KUEUE=false turns it off)."""
    progress_seconds: float = DEFAULT_PROGRESS_SECONDS
    """At most one status.progress update per job this often (LLMJOB_PROGRESS_SECONDS; 0: no progress)."""
    mark_unhealthy_nodes: bool = False
    """Label and taint (NoSchedule) a node a worker found unhealthy, for every workload
    (LLMJOB_MARK_UNHEALTHY_NODES=true; needs `patch` on nodes). Off: only the job avoids it."""
    index_audit_seconds: float = DEFAULT_INDEX_AUDIT_SECONDS
    """How often each job audits the pod index for pods deleted during a watch gap, besides after every
    re-list (LLMJOB_INDEX_AUDIT_SECONDS; 0: only after re-lists)."""
    karpenter: bool = False
    """Karpenter launches the cluster's nodes (LLMJOB_KARPENTER; the chart's karpenter.enabled, auto by
    default): a worker avoids a node that repels pods by itself (a taint, a cordon, gone) with a preferred
    term, since Karpenter launches nothing for a pod with a matchFields term."""
    node_conditions: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_NODE_CONDITIONS))
    """Node condition type -> the status that means unhealthy (LLMJOB_NODE_CONDITIONS, a JSON object; the
    chart's nodeHealth.conditions; {} reads none): a worker on such a node is replaced at once and the node
    avoided until the condition clears."""
    peering_lifetime_seconds: int = DEFAULT_PEERING_LIFETIME_S
    """kopf's settings.peering.lifetime (LLMJOB_PEERING_LIFETIME, whole seconds >= 1; the chart's
    peering.lifetimeSeconds): how soon a standby replica takes over from a crashed one."""
    gc_thaw_seconds: float = DEFAULT_GC_THAW_SECONDS
    """Survivors of each full garbage collection are frozen out of the next ones, and thawed this often
    (LLMJOB_GC_THAW_SECONDS; 0: never frozen, Python's own collector as it is)."""
    tenant_policy: TenantPolicy | None = None
    """The tenant rules applied to the pods the operator builds (LLMJOB_TENANT_POLICY, a JSON object with
    serviceAccounts and registries: the chart's tenantPolicy; unset: not applied)."""
    health_brake: BrakeLimits = field(default_factory=BrakeLimits)
    """The brake on node marking and health replacements (LLMJOB_NODE_HEALTH_BRAKE, a JSON object with
    maxMarkedShare and maxReplacementsPerMinute: the chart's nodeHealth)."""
    etcd_auth: EtcdAuth | None = None
    """Each etcd-v3 job gets its own etcd user (LLMJOB_ETCD_AUTH_KEY and the shared etcd's endpoint and root
    credentials: the chart's rendezvous.auth; unset: no etcd auth, ``builders.etcd_auth``)."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        """Read LLMJOB_RENDEZVOUS_IMAGE, LLMJOB_DEFAULT_NODE_SELECTOR (a JSON object),
        LLMJOB_OPERATOR_NAMESPACE, LLMJOB_OPERATOR_POD_LABELS (a JSON object), LLMJOB_KUEUE and
        LLMJOB_PROGRESS_SECONDS, LLMJOB_MARK_UNHEALTHY_NODES, LLMJOB_INDEX_AUDIT_SECONDS,
        LLMJOB_NODE_CONDITIONS, LLMJOB_PEERING_LIFETIME, LLMJOB_GC_THAW_SECONDS, LLMJOB_TENANT_POLICY and
        LLMJOB_NODE_HEALTH_BRAKE."""
        env = dict(os.environ) if environ is None else environ
        operator_labels = _string_map(env, "LLMJOB_OPERATOR_POD_LABELS")
        conditions = _string_map(env, "LLMJOB_NODE_CONDITIONS")
        return cls(
            rendezvous_image=env.get("LLMJOB_RENDEZVOUS_IMAGE") or DEFAULT_RENDEZVOUS_IMAGE,
            rendezvous_node_selector=_string_map(env, "LLMJOB_DEFAULT_NODE_SELECTOR") or {},
            operator_namespace=env.get("LLMJOB_OPERATOR_NAMESPACE", "").strip() or DEFAULT_OPERATOR_NAMESPACE,
            operator_pod_labels=(
                dict(DEFAULT_OPERATOR_POD_LABELS) if operator_labels is None else operator_labels
            ),
            kueue=kueue_enabled(env),
            progress_seconds=_seconds(env, "LLMJOB_PROGRESS_SECONDS", DEFAULT_PROGRESS_SECONDS),
            mark_unhealthy_nodes=_flag(env, "LLMJOB_MARK_UNHEALTHY_NODES", default=False),
            index_audit_seconds=_seconds(env, "LLMJOB_INDEX_AUDIT_SECONDS", DEFAULT_INDEX_AUDIT_SECONDS),
            node_conditions=dict(DEFAULT_NODE_CONDITIONS) if conditions is None else conditions,
            karpenter=_flag(env, "LLMJOB_KARPENTER", default=False),
            peering_lifetime_seconds=_whole_seconds(
                env, "LLMJOB_PEERING_LIFETIME", DEFAULT_PEERING_LIFETIME_S
            ),
            gc_thaw_seconds=_seconds(env, "LLMJOB_GC_THAW_SECONDS", DEFAULT_GC_THAW_SECONDS),
            tenant_policy=tenant_policy(env),
            health_brake=health_brake(env),
            etcd_auth=etcd_auth(env),
        )


def _seconds(env: dict[str, str], name: str, default: float) -> float:
    """A non-negative number of seconds from the environment variable ``name``; ``default`` when unset."""
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number of seconds, not {text!r}") from exc
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, not {text!r}")
    return value


def _whole_seconds(env: dict[str, str], name: str, default: int) -> int:
    """A whole number of seconds >= 1 from the environment variable ``name``; ``default`` when unset."""
    value = _seconds(env, name, float(default))
    if value < 1 or value != int(value):
        raise ValueError(f"{name} must be a whole number of seconds >= 1, not {env.get(name)!r}")
    return int(value)


def _string_map(env: dict[str, str], name: str) -> dict[str, str] | None:
    """A JSON object of strings from the environment variable ``name``; None when unset or blank."""
    parsed = _json_object(env, name, "a JSON object of strings")
    if parsed is not None and not all(isinstance(v, str) for v in parsed.values()):
        raise ValueError(f"{name} must be a JSON object of strings")
    return parsed


def _flag(env: dict[str, str], name: str, default: bool) -> bool:
    """A boolean setting: true/1/yes/on or false/0/no/off (case-insensitive); unset or blank: default."""
    text = env.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {text!r}")


def kueue_enabled(environ: dict[str, str] | None = None) -> bool:
    """LLMJOB_KUEUE: anything but false/0/no/off (case-insensitive) keeps Kueue support on."""
    env = dict(os.environ) if environ is None else environ
    return env.get("LLMJOB_KUEUE", "true").strip().lower() not in ("false", "0", "no", "off")


def _json_object(env: dict[str, str], name: str, what: str = "a JSON object") -> dict[str, Any] | None:
    """A JSON object from the environment variable ``name``; None when unset or blank."""
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"{name} must be {what}")
    return parsed


def _strings(parsed: dict[str, Any], name: str, key: str) -> tuple[str, ...]:
    value = parsed.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{name}: {key} must be a list of non-empty strings")
    return tuple(value)


def tenant_policy(env: dict[str, str]) -> TenantPolicy | None:
    """LLMJOB_TENANT_POLICY: {"serviceAccounts": [...], "registries": [...]}; unset: no tenant rules."""
    parsed = _json_object(env, "LLMJOB_TENANT_POLICY")
    if parsed is None:
        return None
    name = "LLMJOB_TENANT_POLICY"
    return TenantPolicy(_strings(parsed, name, "serviceAccounts"), _strings(parsed, name, "registries"))


BRAKE_ENV = "LLMJOB_NODE_HEALTH_BRAKE"


def health_brake(env: dict[str, str]) -> BrakeLimits:
    """LLMJOB_NODE_HEALTH_BRAKE: {"maxMarkedShare": 0.2, "maxReplacementsPerMinute": 10}; unset: those."""
    parsed = _json_object(env, BRAKE_ENV) or {}
    default = BrakeLimits()
    share = parsed.get("maxMarkedShare", default.max_marked_share)
    rate = parsed.get("maxReplacementsPerMinute", default.max_replacements_per_minute)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
        raise ValueError(
            f"LLMJOB_NODE_HEALTH_BRAKE: maxMarkedShare must be a number in [0, 1], not {share!r}"
        )
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < 0:
        raise ValueError(
            f"LLMJOB_NODE_HEALTH_BRAKE: maxReplacementsPerMinute must be an int >= 0, not {rate!r}"
        )
    return BrakeLimits(float(share), rate)


AUTH_KEY_ENV = "LLMJOB_ETCD_AUTH_KEY"
SHARED_ETCD_ENV = "LLMJOB_SHARED_ETCD_ENDPOINT"
SHARED_ROOT_USER_ENV = "LLMJOB_SHARED_ETCD_ROOT_USER"
SHARED_ROOT_PASSWORD_ENV = "LLMJOB_SHARED_ETCD_ROOT_PASSWORD"  # noqa: S105 (a variable name)


def etcd_auth(env: dict[str, str]) -> EtcdAuth | None:
    """LLMJOB_ETCD_AUTH_KEY (at least 16 characters) turns etcd auth on; the shared etcd's endpoint, root
    user and password come with it or not at all. Unset: no etcd auth."""
    key = env.get(AUTH_KEY_ENV, "").strip()
    shared = {name: env.get(name, "").strip() for name in (SHARED_ETCD_ENV, SHARED_ROOT_USER_ENV)}
    password = env.get(SHARED_ROOT_PASSWORD_ENV, "")
    if not key:
        if any(shared.values()) or password:
            raise ValueError(f"{SHARED_ETCD_ENV} and its root credentials need {AUTH_KEY_ENV} (etcd auth on)")
        return None
    if len(key) < 16:
        raise ValueError(f"{AUTH_KEY_ENV} must be at least 16 characters, got {len(key)}")
    given = [name for name, value in (*shared.items(), (SHARED_ROOT_PASSWORD_ENV, password)) if value]
    if given and len(given) < 3:
        raise ValueError(
            f"{SHARED_ETCD_ENV}, {SHARED_ROOT_USER_ENV} and {SHARED_ROOT_PASSWORD_ENV} go together; "
            f"only {', '.join(given)} set"
        )
    root = Credentials(shared[SHARED_ROOT_USER_ENV], password) if given else None
    return EtcdAuth(key.encode(), shared[SHARED_ETCD_ENV], root)
