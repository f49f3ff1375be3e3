"""`helm lint` and `helm template` of the chart: the defaults and three other value sets.

What each rendered configuration must contain is checked here without a cluster; that the API server
accepts every object is checked in test_chart_cluster.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from chart_helpers import (
    CHART,
    FULLNAME,
    MONITORING_APIS,
    RELEASE,
    VALUE_SET_NAMES,
    Helm,
    by_kind,
    one,
    value_sets,
)

VALUES = value_sets()


@pytest.mark.parametrize("name", VALUE_SET_NAMES)
def test_helm_lint(helm: Helm, name: str) -> None:
    result = helm.run("lint", "--strict", str(CHART), "-f", str(helm.values_file(VALUES[name])))
    assert "0 chart(s) failed" in result.stdout


def _kinds_and_names(objects: list[dict[str, Any]]) -> set[tuple[str, str, str | None]]:
    return {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects}


def test_defaults_render_exactly_the_expected_objects(helm: Helm) -> None:
    objects = helm.template({})
    ns = "llm-system"
    assert _kinds_and_names(objects) == {
        ("ServiceAccount", FULLNAME, ns),
        ("ClusterRole", FULLNAME, None),
        ("ClusterRoleBinding", FULLNAME, None),
        ("ClusterKopfPeering", FULLNAME, None),
        ("Deployment", FULLNAME, ns),
        ("Service", f"{FULLNAME}-metrics", ns),
        ("PodDisruptionBudget", FULLNAME, ns),
    }


def test_include_crds_renders_the_five_crds(helm: Helm) -> None:
    crds = by_kind(helm.template({}, include_crds=True), "CustomResourceDefinition")
    assert {c["metadata"]["name"] for c in crds} == {
        "llmtrainingjobs.elasticllm.dev",
        "llmtrainingruntimes.elasticllm.dev",
        "clusterllmtrainingruntimes.elasticllm.dev",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_default_deployment(helm: Helm) -> None:
    deployment = one(helm.template({}), "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    container = _container(deployment)
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert pod["serviceAccountName"] == FULLNAME
    assert container["image"] == "ghcr.io/elasticllm/llm-operator:0.1.0"
    assert container["command"] == ["llmjob"]
    assert container["args"] == [
        "operator",
        "--peering",
        FULLNAME,
        "--liveness-port",
        "8080",
        "--metrics-port",
        "9090",
        "--all-namespaces",
        "--log-level",
        "info",
        "--log-format",
        "text",
    ]
    env = _env(container)
    assert env["LLMJOB_RENDEZVOUS_IMAGE"] == "quay.io/coreos/etcd:v3.6.16"
    assert json.loads(env["LLMJOB_DEFAULT_NODE_SELECTOR"]) == {}
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_security_context(helm: Helm) -> None:
    deployment = one(helm.template({}), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"/tmp"}, "only a scratch /tmp is writable"


def test_rendezvous_network_policy_admits_the_operator_pods(helm: Helm) -> None:
    """The operator learns its own namespace and pod labels, which every rendezvous NetworkPolicy admits."""
    deployment = one(helm.template({}), "Deployment")
    env = _env(_container(deployment))
    assert env["LLMJOB_OPERATOR_NAMESPACE"] == deployment["metadata"]["namespace"]
    operator_labels = json.loads(env["LLMJOB_OPERATOR_POD_LABELS"])
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert operator_labels and operator_labels.items() <= pod_labels.items()
    assert operator_labels == deployment["spec"]["selector"]["matchLabels"]


def test_service_and_pdb_select_the_operator_pods(helm: Helm) -> None:
    objects = helm.template({})
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1


def test_replicas_spread_over_nodes(helm: Helm) -> None:
    pod = one(helm.template({}), "Deployment")["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    single = one(helm.template({"replicaCount": 1}), "Deployment")["spec"]["template"]["spec"]
    assert "affinity" not in single, "no anti-affinity for a single replica"


def test_namespaced_mode(helm: Helm) -> None:
    objects = helm.template(VALUES["namespaced"])
    container = _container(one(objects, "Deployment"))
    assert container["args"] == [
        "operator",
        "--peering",
        FULLNAME,
        "--liveness-port",
        "8080",
        "--metrics-port",
        "9090",
        "--namespace",
        "team-a",
        "--namespace",
        "team-b",
        "--log-level",
        "debug",
        "--log-format",
        "text",
    ]
    peerings = by_kind(objects, "KopfPeering")
    assert {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings} == {
        ("team-a", FULLNAME),
        ("team-b", FULLNAME),
    }
    assert not by_kind(objects, "ClusterKopfPeering")
    roles = by_kind(objects, "Role")
    bindings = by_kind(objects, "RoleBinding")
    assert {r["metadata"]["namespace"] for r in roles} == {"team-a", "team-b"}
    assert {b["metadata"]["namespace"] for b in bindings} == {"team-a", "team-b"}
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": FULLNAME, "namespace": "llm-system"}
        ]
    (cluster_role,) = by_kind(objects, "ClusterRole")
    assert cluster_role["metadata"]["name"] == f"{FULLNAME}-nodes"
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["elasticllm.dev"],
            "resources": ["clusterllmtrainingruntimes"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    assert "affinity" not in one(objects, "Deployment")["spec"]["template"]["spec"]


def test_duplicate_namespaces_are_rejected(helm: Helm) -> None:
    result = helm.run(
        *helm.template_args({"watch": {"allNamespaces": False, "namespaces": ["a", "a"]}}), check=False
    )
    assert result.returncode != 0 and "/watch/namespaces" in result.stderr


def test_customized_values(helm: Helm) -> None:
    objects = helm.template(VALUES["customized"])
    assert not by_kind(objects, "PodDisruptionBudget")
    assert not by_kind(objects, "Service")
    deployment = one(objects, "Deployment")
    assert deployment["metadata"]["name"] == "llmop"
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert (
        container["image"] == "123456789012.dkr.ecr.us-west-2.amazonaws.com/llm-operator@sha256:" + "ab" * 32
    )
    assert pod["serviceAccountName"] == "llm-operator-sa"
    sa = one(objects, "ServiceAccount")
    assert sa["metadata"]["name"] == "llm-operator-sa"
    assert sa["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/llmop"
    }
    assert one(objects, "ClusterRoleBinding")["subjects"][0]["name"] == "llm-operator-sa"
    assert one(objects, "ClusterKopfPeering")["metadata"]["name"] == "llmop-peering"
    assert container["args"][1:3] == ["--peering", "llmop-peering"]
    assert container["args"][-4:] == ["--log-level", "warning", "--log-format", "text"]
    env = _env(container)
    assert env["LLMJOB_RENDEZVOUS_IMAGE"] == "registry.example.com/etcd:v3.6.16"
    assert json.loads(env["LLMJOB_DEFAULT_NODE_SELECTOR"]) == {"node.kubernetes.io/purpose": "system"}
    assert env["LLMJOB_DEBUG"] == "1"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"key": "CriticalAddonsOnly", "operator": "Exists"}]


def test_release_name_containing_the_chart_name_is_not_repeated(helm: Helm) -> None:
    args = helm.template_args({})
    args[1] = "elastic-llm-operator"
    out = helm.run(*args).stdout
    assert "name: elastic-llm-operator\n" in out and "elastic-llm-operator-elastic-llm-operator" not in out


def test_monitoring_objects_need_the_prometheus_operator_apis(helm: Helm) -> None:
    without = helm.template(VALUES["monitoring"])
    assert not by_kind(without, "ServiceMonitor") and not by_kind(without, "PodMonitor")
    with_apis = helm.template(VALUES["monitoring"], api_versions=MONITORING_APIS)
    monitor = one(with_apis, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["honorLabels"]) == ("metrics", "/metrics", True)
    service = one(with_apis, "Service")
    assert monitor["spec"]["selector"]["matchLabels"] == {
        k: v
        for k, v in service["metadata"]["labels"].items()
        if k in monitor["spec"]["selector"]["matchLabels"]
    }
    pod_monitor = one(with_apis, "PodMonitor")
    assert pod_monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "elastic-llm-operator",
        "elasticllm.dev/role": "worker",
    }
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    (pod_endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    assert pod_endpoint["port"] == "metrics" and pod_endpoint["interval"] == "15s"
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in pod_endpoint["relabelings"]}
    assert relabel["llmjob"] == ["__meta_kubernetes_pod_label_elasticllm_dev_job_name"]
    # The toggle still decides when the API exists.
    assert not by_kind(helm.template({}, api_versions=MONITORING_APIS), "ServiceMonitor")


def test_pod_monitor_follows_watched_namespaces(helm: Helm) -> None:
    values = {**VALUES["namespaced"], "metrics": {"trainerPodMonitor": {"enabled": True}}}
    pod_monitor = one(helm.template(values, api_versions=MONITORING_APIS), "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_dashboard_configmap_carries_the_dashboard_file(helm: Helm) -> None:
    objects = helm.template(VALUES["monitoring"])
    configmap = one(objects, "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "elastic-llm-operator.json").read_text())
    assert json.loads(configmap["data"]["elastic-llm-operator.json"]) == shipped
    elsewhere = helm.template({"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}})
    assert one(elsewhere, "ConfigMap")["metadata"]["namespace"] == "monitoring"


def test_every_object_is_labelled_for_the_release(helm: Helm) -> None:
    for name in VALUE_SET_NAMES:
        for obj in helm.template(VALUES[name], api_versions=MONITORING_APIS):
            labels = obj["metadata"]["labels"]
            assert labels["app.kubernetes.io/instance"] == RELEASE, (name, obj["kind"])
            assert labels["app.kubernetes.io/part-of"] == "elastic-llm-operator", (name, obj["kind"])


def test_notes_give_next_steps_and_say_when_monitors_are_skipped(helm: Helm) -> None:
    """`helm install --dry-run=client` renders NOTES.txt without a cluster (no monitoring APIs there)."""
    values = str(helm.values_file(VALUES["monitoring"]))
    out = helm.run(
        "install", RELEASE, str(CHART), "-n", "llm-system", "--dry-run=client", "-f", values
    ).stdout
    notes = out[out.index("NOTES:") :]
    assert f"rollout status deployment/{FULLNAME}" in notes
    assert "does not serve monitoring.coreos.com/v1\n   ServiceMonitor, so none was created" in notes
    assert "PodMonitor, so none was created" in notes
    assert "keeps the CRDs" in notes


def test_default_runtime_is_opt_in_and_valid(helm: Helm) -> None:
    """defaultRuntime.enabled installs a ClusterLLMTrainingRuntime for p5.48xlarge that render accepts."""
    from llm_operator.api.validate import validate_runtime

    assert not by_kind(helm.template({}), "ClusterLLMTrainingRuntime")
    values = {
        "defaultRuntime": {
            "enabled": True,
            "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-trainer:0.1.0",
            "priorityClassName": "training",
            "spec": {"failurePolicy": {"maxRestarts": 100}, "scheduling": {"nodeSelector": {"pool": "p5"}}},
        }
    }
    (runtime,) = by_kind(helm.template(values), "ClusterLLMTrainingRuntime")
    assert runtime["metadata"]["name"] == "p5-48xlarge" and "namespace" not in runtime["metadata"]
    spec = runtime["spec"]
    assert (spec["gpusPerNode"], spec["efaPerNode"], spec["sharedMemory"]) == (8, 32, "64Gi")
    assert spec["fsx"] == {"claimName": "fsx-claim", "mountPath": "/fsx"}
    assert spec["image"].endswith("llm-trainer:0.1.0")
    assert "NCCL_DEBUG" in [e["name"] for e in spec["env"]]
    assert spec["scheduling"] == {
        "instanceTypes": ["p5.48xlarge"],
        "priorityClassName": "training",
        "nodeSelector": {"pool": "p5"},
    }
    policy = spec["failurePolicy"]
    assert policy["maxRestarts"] == 100 and policy["pendingTimeoutSeconds"] == 300
    assert validate_runtime(runtime) == []


def test_log_format_reaches_the_operator(helm: Helm) -> None:
    deployment = one(helm.template({"logFormat": "json"}), "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--log-format") + 1] == "json"
