"""What a tenant's job or runtime may ask of the nodes (docs/security.md, "The tenant policy").

Pure. The same rules run twice: at the API, as the chart's ValidatingAdmissionPolicy (CEL, in
charts/elastic-llm-operator/templates/tenant-policy.yaml), and in the operator on the spec it is about to
run (a job made while the policy was off, or one whose runtime sets a field), where a violation refuses
every worker of the pass (condition ``WorkersRefused``). One table of cases (tests/support/tenant_cases.py)
checks both, message for message, so the two cannot drift.

The rules, each on ``spec`` of an LLMTrainingJob, LLMTrainingRuntime or ClusterLLMTrainingRuntime:

- without the namespace label ``elasticllm.dev/privileged-workloads: "true"`` (a ClusterLLMTrainingRuntime:
  the label on the runtime itself): no hostPath volume, no host port, no privileged container, no added
  capability beyond ``IPC_LOCK`` (what the operator adds for EFA), no root (``runAsUser: 0``,
  ``runAsNonRoot: false``), in the pod's security context and in every init or sidecar container;
- always: ``spec.podTemplate.spec.serviceAccountName`` unset, ``default`` or one of the allowed names;
  every image (``spec.image``, each init and sidecar container's) under an allowed registry when the
  list is not empty.

The pod template's schema has no ``hostNetwork``, ``hostPID`` or ``hostIPC``: the API server refuses them as
unknown fields before any policy runs, so no rule here needs to.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PRIVILEGED_LABEL = "elasticllm.dev/privileged-workloads"
"""The label (value ``"true"``) the platform team sets on a namespace whose jobs may use the host."""
OPERATOR_CAPABILITIES = ("IPC_LOCK",)
"""Capabilities the operator itself adds (``builders.worker``, EFA): a container may add these too."""
DEFAULT_SERVICE_ACCOUNT = "default"
"""The namespace's own ServiceAccount: always allowed (it is what an unset name means)."""

_NEEDS_LABEL = f"needs the namespace label {PRIVILEGED_LABEL}=true"
RULES: dict[str, str] = {
    "host-volumes": f"a hostPath volume {_NEEDS_LABEL}",
    "host-ports": f"a host port {_NEEDS_LABEL}",
    "privileged": f"a privileged container {_NEEDS_LABEL}",
    "capabilities": f"adding a capability other than {', '.join(OPERATOR_CAPABILITIES)} {_NEEDS_LABEL}",
    "root": f"running as root {_NEEDS_LABEL}",
    "service-account": "only these ServiceAccounts are allowed",
    "registry": "only images from these registries are allowed",
}
"""Rule name -> why it refuses (the message's tail). The last two end with the allowed list."""
LABELLED = frozenset({"host-volumes", "host-ports", "privileged", "capabilities", "root"})
"""The rules the namespace label lifts."""


@dataclass(frozen=True)
class TenantPolicy:
    """What the platform allows every namespace (the chart's ``tenantPolicy`` values)."""

    service_accounts: tuple[str, ...] = ()
    """ServiceAccount names a pod template may set besides ``default``."""
    registries: tuple[str, ...] = ()
    """Registries (a host, or a host and path) every image must come from; empty: any."""

    @property
    def allowed_service_accounts(self) -> tuple[str, ...]:
        """``default`` first, then the allowed names in their order (without a repeat)."""
        names = [DEFAULT_SERVICE_ACCOUNT, *self.service_accounts]
        return tuple(dict.fromkeys(names))

    @property
    def registry_prefixes(self) -> tuple[str, ...]:
        """Each registry as the prefix an image starts with (``<registry>/``)."""
        return tuple(r.rstrip("/") + "/" for r in self.registries)


@dataclass(frozen=True)
class Violation:
    """One field a rule refuses."""

    field: str
    """The field, e.g. ``spec.podTemplate.spec.initContainers[proxy].securityContext.privileged``."""
    rule: str
    """A key of :data:`RULES`."""
    allowed: tuple[str, ...] = ()
    """For service-account and registry: what is allowed (named in the message)."""

    @property
    def message(self) -> str:
        """One line naming the field and the rule; the policy's CEL writes the same words."""
        tail = f": {', '.join(self.allowed)}" if self.rule not in LABELLED else ""
        return f"{self.field}: refused by tenant rule {self.rule}: {RULES[self.rule]}{tail}"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


POD = "spec.podTemplate.spec"


def _containers(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(field path, container) of every init and sidecar container of the pod template."""
    for item in _items(pod.get("initContainers")):
        yield f"{POD}.initContainers[{item.get('name', '')}]", item


def _root(where: str, holder: Mapping[str, Any]) -> Iterator[str]:
    """The fields of ``holder``'s securityContext that run it as root."""
    context = _map(holder.get("securityContext"))
    user = context.get("runAsUser")
    if isinstance(user, int) and not isinstance(user, bool) and user == 0:
        yield f"{where}.securityContext.runAsUser"
    if context.get("runAsNonRoot") is False:
        yield f"{where}.securityContext.runAsNonRoot"


def _labelled(pod: Mapping[str, Any]) -> Iterator[Violation]:
    """The rules the namespace label lifts, in the policy's order."""
    for volume in _items(pod.get("volumes")):
        if "hostPath" in volume:
            yield Violation(f"{POD}.volumes[{volume.get('name', '')}].hostPath", "host-volumes")
    for where, container in _containers(pod):
        for port in _items(container.get("ports")):
            if port.get("hostPort", 0) != 0:
                yield Violation(f"{where}.ports", "host-ports")
                break
    for where, container in _containers(pod):
        if _map(container.get("securityContext")).get("privileged") is True:
            yield Violation(f"{where}.securityContext.privileged", "privileged")
    for where, container in _containers(pod):
        added = _map(_map(container.get("securityContext")).get("capabilities")).get("add")
        if isinstance(added, list) and any(c not in OPERATOR_CAPABILITIES for c in added):
            yield Violation(f"{where}.securityContext.capabilities.add", "capabilities")
    for field in _root(POD, pod):
        yield Violation(field, "root")
    for where, container in _containers(pod):
        for field in _root(where, container):
            yield Violation(field, "root")


def violations(spec: Mapping[str, Any], policy: TenantPolicy, privileged: bool) -> list[Violation]:
    """Every field of ``spec`` (a job's, a runtime's, or a job's merged over its runtime's) the rules
    refuse; ``privileged``: the namespace (or the cluster runtime) carries :data:`PRIVILEGED_LABEL`."""
    pod = _map(_map(spec.get("podTemplate")).get("spec"))
    found = [] if privileged else list(_labelled(pod))
    account = pod.get("serviceAccountName")
    allowed = policy.allowed_service_accounts
    if isinstance(account, str) and account not in allowed:
        found.append(Violation(f"{POD}.serviceAccountName", "service-account", allowed))
    prefixes = policy.registry_prefixes
    if prefixes:
        images = [("spec.image", spec.get("image"))]
        images += [(f"{where}.image", c.get("image")) for where, c in _containers(pod)]
        for field, image in images:
            if isinstance(image, str) and not image.startswith(prefixes):
                found.append(Violation(field, "registry", tuple(p[:-1] for p in prefixes)))
    return found


def is_privileged(labels: Mapping[str, str] | None) -> bool:
    """Whether these labels (a namespace's, or a ClusterLLMTrainingRuntime's) lift the labelled rules."""
    return (labels or {}).get(PRIVILEGED_LABEL) == "true"


def lifted_by_label(found: Sequence[Violation]) -> bool:
    """Whether the namespace label alone would clear every violation found (then its labels matter)."""
    return bool(found) and all(v.rule in LABELLED for v in found)


def refusal(found: Sequence[Violation]) -> str:
    """One line for the job's condition and Event: every violation's message."""
    return "tenant policy: " + "; ".join(v.message for v in found)
