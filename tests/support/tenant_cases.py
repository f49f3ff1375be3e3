"""The one table of tenant-policy cases: the operator's rules (tests/unit/test_tenant_rules.py) and the
chart's CEL (tests/chart/test_tenant_policy.py) must both give each case exactly the refusal written here.

Every case is a job or runtime spec, whether its namespace (or, for a ClusterLLMTrainingRuntime, the
runtime itself) carries the privileged label, and the one refusal expected: (field, rule), or None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llm_operator.policy.tenancy import TenantPolicy

SERVICE_ACCOUNTS = ("trainer",)
REGISTRIES = ("registry.example.com/ml", "public.ecr.aws/")
POLICY = TenantPolicy(service_accounts=SERVICE_ACCOUNTS, registries=REGISTRIES)
"""The policy every case is judged by."""
CHART_VALUES: dict[str, Any] = {
    "tenantPolicy": {
        "enabled": True,
        "serviceAccounts": list(SERVICE_ACCOUNTS),
        "registries": list(REGISTRIES),
    }
}
"""The chart's values for the same policy."""
IMAGE = "registry.example.com/ml/trainer:1"
POD = "spec.podTemplate.spec"


@dataclass(frozen=True)
class Case:
    name: str
    pod: dict[str, Any] = field(default_factory=dict)
    """spec.podTemplate.spec of the job."""
    refused: tuple[str, str] | None = None
    """(field, rule) of the one refusal, or None: admitted."""
    privileged: bool = False
    """The namespace (or the cluster runtime) carries elasticllm.dev/privileged-workloads=true."""
    image: str | None = IMAGE
    """spec.image (None: a runtime that leaves it to its jobs)."""
    kind: str = "LLMTrainingJob"

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"minReplicas": 1, "maxReplicas": 2}
        if self.image is not None:
            spec["image"] = self.image
        if self.pod:
            spec["podTemplate"] = {"spec": self.pod}
        return spec


def sidecar(name: str = "proxy", image: str = "public.ecr.aws/proxy:2", **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "restartPolicy": "Always", **fields}


def context(**fields: Any) -> dict[str, Any]:
    return {"securityContext": fields}


INIT = f"{POD}.initContainers"
CASES: tuple[Case, ...] = (
    Case("a plain job"),
    Case("a runtime without an image", image=None, kind="LLMTrainingRuntime"),
    Case("a ConfigMap volume", {"volumes": [{"name": "cfg", "configMap": {"name": "c"}}]}),
    Case(
        "a hostPath volume",
        {
            "volumes": [
                {"name": "cfg", "configMap": {"name": "c"}},
                {"name": "host", "hostPath": {"path": "/"}},
            ]
        },
        (f"{POD}.volumes[host].hostPath", "host-volumes"),
    ),
    Case(
        "a hostPath volume, labelled",
        {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]},
        privileged=True,
    ),
    Case("a container port", {"initContainers": [sidecar(ports=[{"containerPort": 8080}])]}),
    Case(
        "a host port",
        {"initContainers": [sidecar(ports=[{"containerPort": 8080, "hostPort": 8080}])]},
        (f"{INIT}[proxy].ports", "host-ports"),
    ),
    Case("host port 0", {"initContainers": [sidecar(ports=[{"containerPort": 80, "hostPort": 0}])]}),
    Case(
        "a privileged sidecar",
        {"initContainers": [sidecar("ok"), sidecar(**context(privileged=True))]},
        (f"{INIT}[proxy].securityContext.privileged", "privileged"),
    ),
    Case("privileged: false", {"initContainers": [sidecar(**context(privileged=False))]}),
    Case(
        "a privileged sidecar, labelled",
        {"initContainers": [sidecar(**context(privileged=True))]},
        privileged=True,
    ),
    Case(
        "SYS_ADMIN added",
        {"initContainers": [sidecar("init", **context(capabilities={"add": ["IPC_LOCK", "SYS_ADMIN"]}))]},
        (f"{INIT}[init].securityContext.capabilities.add", "capabilities"),
    ),
    Case(
        "IPC_LOCK added (as the operator does for EFA)",
        {"initContainers": [sidecar(**context(capabilities={"add": ["IPC_LOCK"]}))]},
    ),
    Case("capabilities dropped", {"initContainers": [sidecar(**context(capabilities={"drop": ["ALL"]}))]}),
    Case(
        "the pod as user 0",
        context(runAsUser=0),
        (f"{POD}.securityContext.runAsUser", "root"),
    ),
    Case("the pod as user 1000", context(runAsUser=1000, runAsNonRoot=True)),
    Case(
        "the pod with runAsNonRoot false",
        context(runAsNonRoot=False),
        (f"{POD}.securityContext.runAsNonRoot", "root"),
    ),
    Case(
        "a sidecar as user 0",
        {"initContainers": [sidecar(**context(runAsUser=0))]},
        (f"{INIT}[proxy].securityContext.runAsUser", "root"),
    ),
    Case(
        "an init container with runAsNonRoot false",
        {"initContainers": [sidecar("fetch", **context(runAsNonRoot=False))]},
        (f"{INIT}[fetch].securityContext.runAsNonRoot", "root"),
    ),
    Case("root, labelled", context(runAsUser=0), privileged=True),
    Case("the default ServiceAccount", {"serviceAccountName": "default"}),
    Case("an allowed ServiceAccount", {"serviceAccountName": "trainer"}),
    Case(
        "another ServiceAccount",
        {"serviceAccountName": "ci-deployer"},
        (f"{POD}.serviceAccountName", "service-account"),
    ),
    Case(
        "another ServiceAccount, labelled",
        {"serviceAccountName": "ci-deployer"},
        (f"{POD}.serviceAccountName", "service-account"),
        privileged=True,
    ),
    Case("an image under an allowed path", image="registry.example.com/ml/team/trainer@sha256:ab"),
    Case("an image from Docker Hub", image="docker.io/evil/miner:1", refused=("spec.image", "registry")),
    Case("a lookalike path", image="registry.example.com/mlx/trainer:1", refused=("spec.image", "registry")),
    Case("an image without a registry", image="ubuntu", refused=("spec.image", "registry")),
    Case(
        "a sidecar from elsewhere",
        {"initContainers": [sidecar("ok"), sidecar("miner", image="quay.io/x/miner:1")]},
        (f"{INIT}[miner].image", "registry"),
    ),
    Case(
        "a cluster runtime with a hostPath",
        {"volumes": [{"name": "nccl", "hostPath": {"path": "/opt/nccl"}}]},
        (f"{POD}.volumes[nccl].hostPath", "host-volumes"),
        kind="ClusterLLMTrainingRuntime",
        image=None,
    ),
    Case(
        "a cluster runtime with a hostPath, labelled",
        {"volumes": [{"name": "nccl", "hostPath": {"path": "/opt/nccl"}}]},
        kind="ClusterLLMTrainingRuntime",
        image=None,
        privileged=True,
    ),
)
