"""The chart against a real API server: server-side validation, install, uninstall, schema at install.

The operator image cannot run here (no container runtime); kwok marks the operator pods Running and
Ready, which is enough to show the Deployment is schedulable and complete.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from chart_helpers import CHART, MONITORING_APIS, RELEASE, ROOT, VALUE_SET_NAMES, Helm, value_sets
from llm_testbed.localcluster.cluster import LocalCluster
from support.wait import wait_for

pytestmark = pytest.mark.cluster

CRD_NAMES = ("llmtrainingjobs.elasticllm.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")
MONITORING_CRDS = ROOT / "tests" / "chart" / "fixtures" / "monitoring-crds.yaml"


@pytest.fixture(scope="module")
def monitoring_crds(cluster: LocalCluster) -> Iterator[None]:
    """Stand-in Prometheus Operator CRDs, so monitors render (Capabilities) and validate."""
    cluster.kubectl("apply", "--server-side", "-f", str(MONITORING_CRDS))
    for name in ("servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    yield
    cluster.kubectl("delete", "-f", str(MONITORING_CRDS), "--ignore-not-found", "--wait=false")


@pytest.fixture
def cluster_helm(cluster: LocalCluster, helm: Helm) -> Helm:
    return Helm(helm.binary, helm.home, cluster.kubeconfig)


@pytest.fixture
def watched(cluster: LocalCluster) -> Iterator[list[str]]:
    """Two extra namespaces for the namespaced mode, removed afterwards."""
    names = [f"watched-{secrets.token_hex(3)}" for _ in range(2)]
    for name in names:
        cluster.kubectl("create", "namespace", name)
    yield names
    cluster.kubectl("delete", "namespace", *names, "--ignore-not-found", "--wait=false")


def _manifest(helm: Helm, values: dict[str, Any], namespace: str, *, include_crds: bool) -> str:
    args = helm.template_args(
        values, namespace=namespace, api_versions=MONITORING_APIS, include_crds=include_crds
    )
    return helm.run(*args).stdout


def _identities(manifest: str) -> list[tuple[str, str, str | None]]:
    return [
        (doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace"))
        for doc in yaml.safe_load_all(manifest)
        if doc
    ]


@pytest.mark.parametrize("name", VALUE_SET_NAMES)
def test_every_rendered_object_passes_server_side_validation(
    cluster: LocalCluster, helm: Helm, namespace: str, watched: list[str], monitoring_crds: None, name: str
) -> None:
    manifest = _manifest(helm, value_sets(watched)[name], namespace, include_crds=True)
    objects = _identities(manifest)
    result = cluster.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        "--field-manager=chart-test",
        "-f",
        "-",
        input=manifest,
    )
    accepted = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(objects), f"{len(objects)} objects, the API server accepted:\n{result.stdout}"


def _gone(cluster: LocalCluster, manifest: str) -> bool:
    left = cluster.kubectl("get", "-f", "-", "--ignore-not-found", "-o", "name", input=manifest).stdout
    return not left.strip()


def _labelled(cluster: LocalCluster, release: str) -> str:
    kinds = ",".join(
        (
            "pods,deployments,replicasets,services,serviceaccounts,roles,rolebindings",
            "poddisruptionbudgets,configmaps,servicemonitors,podmonitors",
        )
    )
    namespaced = cluster.kubectl(
        "get", kinds, "-A", "-l", f"app.kubernetes.io/instance={release}", "-o", "name"
    )
    cluster_scoped = cluster.kubectl(
        "get",
        "clusterroles,clusterrolebindings,clusterkopfpeerings,kopfpeerings",
        "-A",
        "-l",
        f"app.kubernetes.io/instance={release}",
        "-o",
        "name",
    )
    return str(namespaced.stdout + cluster_scoped.stdout).strip()


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_install_creates_every_object_and_uninstall_leaves_only_the_crds(
    cluster: LocalCluster,
    cluster_helm: Helm,
    namespace: str,
    watched: list[str],
    monitoring_crds: None,
    mode: str,
) -> None:
    release = f"it-{secrets.token_hex(3)}"
    # The chart's own pods pass Pod Security "restricted": the install below goes into a namespace that
    # enforces it, and the Deployment's replicas only become ready if admission let its pods in.
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    values = value_sets(watched)["monitoring" if mode == "cluster-wide" else "namespaced"]
    values_file = str(cluster_helm.values_file(values))
    manifest = cluster_helm.run(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "-f",
        values_file,
        "--api-versions",
        MONITORING_APIS[0],
        "--api-versions",
        MONITORING_APIS[1],
    ).stdout
    expected = _identities(manifest)
    assert expected

    installed = cluster_helm.run("install", release, str(CHART), "--namespace", namespace, "-f", values_file)
    assert "rollout status" in installed.stdout, "NOTES.txt is printed"
    if mode == "cluster-wide":
        # Helm saw the monitoring APIs in the cluster (Capabilities), so the monitors are there.
        assert ("ServiceMonitor", f"{release}-elastic-llm-operator", namespace) in expected
    # Every object the chart renders exists now (kubectl get -f fails on the first missing one).
    found = cluster.kubectl("get", "-f", "-", "-o", "name", input=manifest).stdout.split()
    assert len(found) == len(expected)

    replicas = values.get("replicaCount", 2)
    deployment = f"deployment/{release}-elastic-llm-operator"

    def ready() -> bool:
        got = cluster.kubectl(
            "get", deployment, "-n", namespace, "-o", "jsonpath={.status.readyReplicas}", check=False
        ).stdout
        return bool(got == str(replicas))

    wait_for(ready, timeout=120, what=f"{deployment} to have {replicas} ready replicas")

    cluster_helm.run("uninstall", release, "--namespace", namespace)
    wait_for(lambda: _gone(cluster, manifest), timeout=120, what="every chart object to be deleted")
    wait_for(lambda: not _labelled(cluster, release), timeout=120, what=f"nothing labelled {release} left")
    assert cluster_helm.run("status", release, "--namespace", namespace, check=False).returncode != 0
    # Helm does not delete what it installed from crds/: the CRDs (and any jobs) stay.
    cluster.kubectl("get", "crd", *CRD_NAMES)


def test_install_rejects_bad_values_and_installs_nothing(cluster_helm: Helm, namespace: str) -> None:
    release = f"bad-{secrets.token_hex(3)}"
    values_file = str(cluster_helm.values_file({"logLevel": "verbose", "watch": {"allNamespaces": False}}))
    result = cluster_helm.run(
        "install", release, str(CHART), "--namespace", namespace, "-f", values_file, check=False
    )
    assert result.returncode != 0
    assert "schema" in result.stderr and "/logLevel" in result.stderr, result.stderr
    assert cluster_helm.run("status", release, "--namespace", namespace, check=False).returncode != 0


@pytest.fixture
def restricted_namespace(cluster: LocalCluster) -> Iterator[str]:
    name = f"restricted-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    # Pod admission looks the pod's ServiceAccount up; the chart's would exist after an install.
    cluster.kubectl("create", "serviceaccount", "-n", name, f"{RELEASE}-elastic-llm-operator")
    yield name
    cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")


def test_operator_pod_meets_the_restricted_pod_security_standard(
    cluster: LocalCluster, helm: Helm, restricted_namespace: str
) -> None:
    objects = helm.template({}, namespace=restricted_namespace)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    template = deployment["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "operator-pss-check", "namespace": restricted_namespace, **template["metadata"]},
        "spec": template["spec"],
    }

    def create(manifest: dict[str, Any]) -> Any:
        return cluster.kubectl(
            "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(manifest), check=False
        )

    accepted = create(pod)
    assert accepted.returncode == 0, accepted.stderr
    # Control: the PodSecurity admission is really enforcing in this namespace.
    weakened = yaml.safe_load(yaml.safe_dump(pod))
    weakened["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    rejected = create(weakened)
    assert rejected.returncode != 0 and "allowPrivilegeEscalation" in rejected.stderr
