"""Tenants who cannot become root, on the real API server with the chart's tenant policy and submitter roles.

One walk through named steps: a user who holds only the submitter role (`edit`, which the chart's roles
aggregate into) tries to reach the host through a job, through a namespaced runtime, through a cluster
runtime, through the namespace label and the job's status, each refused with the field named; a legitimate
EFA job in a namespace the platform team labelled is admitted and runs; a job made before the policy is
refused by the operator itself (condition WorkersRefused), with nothing of it made.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from chart_helpers import Helm
from kopf.testing import KopfRunner
from llm_operator.policy.tenancy import PRIVILEGED_LABEL
from support.wait import wait_for

from tests.integration.kube_helpers import job_manifest, status, workers

pytestmark = pytest.mark.cluster
TIMEOUT = 60
USER = "alice"
TEST_LABEL = "elasticllm.dev/tenant-test"
REGISTRIES = ["ghcr.io/elasticllm", "public.ecr.aws"]
KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def _aggregated(obj: dict[str, Any]) -> bool:
    """One of the chart's submitter roles (aggregated into admin, edit or view)."""
    keys = (obj["metadata"].get("labels") or {}).keys()
    return obj["kind"] == "ClusterRole" and any(
        k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in keys
    )


def _sidecar(name: str = "proxy", image: str = "public.ecr.aws/proxy:2", **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "restartPolicy": "Always", **fields}


def _pod(namespace: str, name: str, pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return job_manifest(name, namespace, podTemplate={"spec": pod}, **spec)


def _runtime(namespace: str, name: str, pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingRuntime",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"podTemplate": {"spec": pod}},
    }


HOST = {"volumes": [{"name": "cache", "hostPath": {"path": "/"}}]}


def _attempts(ns: str) -> list[tuple[str, dict[str, Any], str]]:
    """(step, manifest, what the refusal must name): every way in, through a job and a runtime."""
    init = "spec.podTemplate.spec.initContainers"
    return [
        ("job: hostPath volume", _pod(ns, "a1", HOST), "spec.podTemplate.spec.volumes[cache].hostPath"),
        ("job: host network", _pod(ns, "a2", {"hostNetwork": True}), "spec.podTemplate.spec.hostNetwork"),
        ("job: host PID", _pod(ns, "a3", {"hostPID": True}), "spec.podTemplate.spec.hostPID"),
        (
            "job: host port",
            _pod(ns, "a4", {"initContainers": [_sidecar(ports=[{"containerPort": 80, "hostPort": 80}])]}),
            f"{init}[proxy].ports",
        ),
        (
            "job: privileged sidecar",
            _pod(ns, "a5", {"initContainers": [_sidecar(securityContext={"privileged": True})]}),
            f"{init}[proxy].securityContext.privileged",
        ),
        (
            "job: SYS_ADMIN",
            _pod(
                ns,
                "a6",
                {"initContainers": [_sidecar(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}})]},
            ),
            f"{init}[proxy].securityContext.capabilities.add",
        ),
        (
            "job: root pod",
            _pod(ns, "a7", {"securityContext": {"runAsUser": 0}}),
            "spec.podTemplate.spec.securityContext.runAsUser",
        ),
        (
            "job: runAsNonRoot false",
            _pod(ns, "a8", {"securityContext": {"runAsNonRoot": False}}),
            "spec.podTemplate.spec.securityContext.runAsNonRoot",
        ),
        (
            "job: root init container",
            _pod(ns, "a9", {"initContainers": [_sidecar("fetch", securityContext={"runAsUser": 0})]}),
            f"{init}[fetch].securityContext.runAsUser",
        ),
        (
            "job: another ServiceAccount",
            _pod(ns, "a10", {"serviceAccountName": "ci-deployer"}),
            "spec.podTemplate.spec.serviceAccountName",
        ),
        ("job: image from elsewhere", job_manifest("a11", ns, image="docker.io/evil/miner:1"), "spec.image"),
        (
            "job: sidecar from elsewhere",
            _pod(ns, "a12", {"initContainers": [_sidecar("miner", image="quay.io/x/miner:1")]}),
            f"{init}[miner].image",
        ),
        (
            "runtime: hostPath volume",
            _runtime(ns, "r1", HOST),
            "spec.podTemplate.spec.volumes[cache].hostPath",
        ),
        (
            "runtime: privileged init container",
            _runtime(ns, "r2", {"initContainers": [_sidecar("setup", securityContext={"privileged": True})]}),
            f"{init}[setup].securityContext.privileged",
        ),
        (
            "runtime: another ServiceAccount",
            _runtime(ns, "r3", {"serviceAccountName": "ci-deployer"}),
            "spec.podTemplate.spec.serviceAccountName",
        ),
    ]


def _as_user(cluster: Any, *args: str, doc: dict[str, Any] | None = None) -> Any:
    stdin = yaml.safe_dump(doc) if doc is not None else None
    return cluster.kubectl("--as", USER, *args, input=stdin, check=False)


@pytest.fixture
def efa_namespace(cluster: Any, namespace: str) -> Iterator[str]:
    name = f"{namespace[:52]}-efa"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_a_submitter_cannot_become_root(
    cluster: Any, namespace: str, efa_namespace: str, helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant, efa = namespace, efa_namespace
    # Step 0: a job made before the policy, with a hostPath: the operator must refuse it on its own.
    legacy = _pod(tenant, "legacy", HOST)
    assert cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(legacy), check=False).returncode == 0

    values = {
        "fullnameOverride": f"tenant-{tenant}"[:40],
        "tenantPolicy": {
            "enabled": True,
            "serviceAccounts": ["training"],
            "registries": REGISTRIES,
            "namespaceSelector": {"matchLabels": {TEST_LABEL: tenant}},  # this test's namespaces only
        },
        "submitterRoles": {"enabled": True},
    }
    rendered = helm.template(values, namespace=tenant)
    installed = [o for o in rendered if o["kind"] in KINDS or _aggregated(o)]
    assert [o["kind"] for o in installed].count("ClusterRole") == 3
    (policy_env,) = [
        e["value"]
        for o in rendered
        if o["kind"] == "Deployment"
        for e in o["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "LLMJOB_TENANT_POLICY"
    ]
    try:
        for ns in (tenant, efa):
            cluster.kubectl("label", "namespace", ns, f"{TEST_LABEL}={tenant}")
            cluster.kubectl(
                "create", "rolebinding", "submitters", "--clusterrole=edit", f"--user={USER}", "-n", ns
            )
        cluster.kubectl("label", "namespace", efa, f"{PRIVILEGED_LABEL}=true")
        cluster.kube.apply(installed)
        probe = _pod(tenant, "probe", HOST)
        wait_for(
            lambda: (
                "tenant rule"
                in cluster.kubectl(
                    "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(probe), check=False
                ).stderr
            ),
            TIMEOUT,
            "the tenant policy to be in force",
        )
        wait_for(
            lambda: (
                _as_user(cluster, "auth", "can-i", "create", "llmtrainingjobs", "-n", tenant).returncode == 0
            ),
            TIMEOUT,
            "the submitter role to aggregate into edit",
        )

        # Steps 1-15: every escalation through a job or a namespaced runtime is refused, naming the field.
        attempts = _attempts(tenant)
        for step, doc, field in attempts:
            answer = _as_user(cluster, "create", "-f", "-", doc=doc)
            assert answer.returncode != 0, f"{step}: admitted"
            assert field in answer.stderr, f"{step}: {answer.stderr}"

        # Step 16: a cluster runtime is the cluster admins' alone.
        cluster_runtime = {
            "apiVersion": "elasticllm.dev/v1alpha1",
            "kind": "ClusterLLMTrainingRuntime",
            "metadata": {"name": f"{tenant}-escape"[:60]},
            "spec": {"podTemplate": {"spec": HOST}},
        }
        answer = _as_user(cluster, "create", "-f", "-", doc=cluster_runtime)
        assert answer.returncode != 0 and "clusterllmtrainingruntimes" in answer.stderr, answer.stderr
        assert "forbidden" in answer.stderr.lower()

        # Step 17: the submitter cannot label its own namespace privileged.
        answer = _as_user(cluster, "label", "namespace", tenant, f"{PRIVILEGED_LABEL}=true")
        assert (
            answer.returncode != 0 and "namespaces" in answer.stderr and "forbidden" in answer.stderr.lower()
        )

        # Step 18: a legitimate job is admitted; changing it into a host job is refused, so is its status.
        assert _as_user(cluster, "create", "-f", "-", doc=job_manifest("ok", tenant)).returncode == 0
        answer = _as_user(cluster, "apply", "-f", "-", doc=_pod(tenant, "ok", HOST))
        assert answer.returncode != 0 and "volumes[cache].hostPath" in answer.stderr, answer.stderr
        patch = json.dumps({"status": {"runtime": {"kind": "LLMTrainingRuntime", "spec": {}}}})
        answer = _as_user(
            cluster,
            "patch",
            "llmjob",
            "ok",
            "-n",
            tenant,
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
        )
        assert answer.returncode != 0 and "forbidden" in answer.stderr.lower(), answer.stderr

        # Step 19: even in the labelled namespace, another ServiceAccount is refused.
        answer = _as_user(cluster, "create", "-f", "-", doc=_pod(efa, "sa", {"serviceAccountName": "admin"}))
        assert answer.returncode != 0 and "serviceAccountName" in answer.stderr, answer.stderr

        # Step 20: an EFA job with a node-local cache and a root sidecar, where the platform team allows it.
        efa_job = _pod(
            efa,
            "efa",
            {"volumes": [{"name": "nvme", "hostPath": {"path": "/opt/cache"}}],
             "initContainers": [_sidecar("warm", securityContext={"runAsUser": 0})]},
            minReplicas=1,
            maxReplicas=2,
            gpusPerNode=8,
            efaPerNode=32,
        )  # fmt: skip
        answer = _as_user(cluster, "create", "-f", "-", doc=efa_job)
        assert answer.returncode == 0, answer.stderr

        # Step 21: the operator, with the same rules: the EFA job runs; the job made before the policy
        # gets no worker and no rendezvous server, and says why.
        monkeypatch.setenv("LLMJOB_TENANT_POLICY", policy_env)
        args = [
            "run",
            "--standalone",
            "--namespace",
            tenant,
            "--namespace",
            efa,
            "-m",
            "llm_operator.handlers",
        ]
        with KopfRunner(args, timeout=60) as runner:
            wait_for(
                lambda: status(cluster, efa, "efa").get("phase") == "Running", TIMEOUT, "the EFA job Running"
            )
            pods = workers(cluster, efa, "efa")
            assert len(pods) == 2 and all(
                p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
                for p in pods
            )

            def refused() -> dict[str, Any] | None:
                conds = status(cluster, tenant, "legacy").get("conditions") or []
                return next(
                    (c for c in conds if c["type"] == "WorkersRefused" and c["status"] == "True"), None
                )

            cond = wait_for(refused, TIMEOUT, "WorkersRefused on the job made before the policy")
            assert cond["message"].startswith("the operator refused worker(s) legacy-worker-0"), cond
            assert "spec.podTemplate.spec.volumes[cache].hostPath" in cond["message"], cond
            assert workers(cluster, tenant, "legacy") == []
            assert cluster.kube.get("deployment", "legacy-rdzv", tenant) is None, "nothing half made"
        assert runner.exception is None, runner.output[-3000:]
    finally:
        for obj in installed:
            cluster.kubectl(
                "delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found", check=False
            )
