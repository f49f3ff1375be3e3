"""Least privilege: the chart grants exactly the API calls the operator makes (docs/CONTRACTS.md)."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helpers import MONITORING_APIS, VALUE_SET_NAMES, Helm, by_kind, value_sets

VALUES = value_sets()
RULE_KINDS = ("ClusterRole", "Role")

# (API group, resource) -> verbs: the operator's API calls as listed in docs/CONTRACTS.md.
IN_EVERY_SERVED_NAMESPACE = {
    ("elasticllm.dev", "llmtrainingjobs"): {"get", "list", "watch", "patch"},
    ("elasticllm.dev", "llmtrainingjobs/status"): {"get", "patch"},
    ("elasticllm.dev", "llmtrainingruntimes"): {"get", "list", "watch"},
    ("", "pods"): {"get", "list", "watch", "create", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "delete"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "delete"},
    ("networking.k8s.io", "networkpolicies"): {"create"},
    ("", "events"): {"create", "patch", "list"},
    ("events.k8s.io", "events"): {"create", "patch"},
}
# Cluster-scoped reads: nodes and ClusterLLMTrainingRuntimes (read-only, also in namespaced mode).
NODES = {
    ("", "nodes"): {"get", "list", "watch"},
    ("elasticllm.dev", "clusterllmtrainingruntimes"): {"get", "list", "watch"},
}
CLUSTER_PEERING = {("kopf.dev", "clusterkopfpeerings"): {"get", "list", "watch", "patch"}}
NAMESPACED_PEERING = {("kopf.dev", "kopfpeerings"): {"get", "list", "watch", "patch"}}


def grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """Flatten a role's rules to (group, resource) -> verbs, failing on any non-resource or named rule."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule and "resourceNames" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def all_roles(helm: Helm, name: str) -> list[dict[str, Any]]:
    objects = helm.template(VALUES[name], api_versions=MONITORING_APIS)
    return [o for o in objects if o["kind"] in RULE_KINDS]


@pytest.mark.parametrize("name", VALUE_SET_NAMES)
def test_no_wildcards_and_no_secrets(helm: Helm, name: str) -> None:
    roles = all_roles(helm, name)
    assert roles, "the chart renders RBAC"
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in item for item in rule[field]), (role["metadata"]["name"], rule)
            assert not {"secrets", "configmaps"} & set(rule["resources"]), rule
            assert not {"escalate", "bind", "impersonate", "deletecollection", "update"} & set(rule["verbs"])


def test_cluster_wide_grants_exactly_the_contract(helm: Helm) -> None:
    (role,) = all_roles(helm, "defaults")
    assert role["kind"] == "ClusterRole"
    assert grants(role) == {**IN_EVERY_SERVED_NAMESPACE, **NODES, **CLUSTER_PEERING}


def test_namespaced_grants_exactly_the_contract_per_namespace(helm: Helm) -> None:
    roles = all_roles(helm, "namespaced")
    cluster_roles = by_kind(roles, "ClusterRole")
    assert [grants(r) for r in cluster_roles] == [NODES], (
        "cluster scope: nodes and cluster runtimes, read-only"
    )
    namespaced = by_kind(roles, "Role")
    assert sorted(r["metadata"]["namespace"] for r in namespaced) == ["team-a", "team-b"]
    for role in namespaced:
        assert grants(role) == {**IN_EVERY_SERVED_NAMESPACE, **NAMESPACED_PEERING}


def test_bindings_point_at_the_rendered_roles_and_service_account(helm: Helm) -> None:
    for name in VALUE_SET_NAMES:
        objects = helm.template(VALUES[name])
        roles = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects}
        (sa,) = by_kind(objects, "ServiceAccount")
        bindings = by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding")
        assert bindings
        for binding in bindings:
            ref = binding["roleRef"]
            scope = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
            assert (ref["kind"], ref["name"], scope) in roles, (name, binding["metadata"]["name"])
            assert binding["subjects"] == [
                {
                    "kind": "ServiceAccount",
                    "name": sa["metadata"]["name"],
                    "namespace": sa["metadata"]["namespace"],
                }
            ]


def test_rbac_can_be_left_to_the_user(helm: Helm) -> None:
    objects = helm.template({"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "mine"}})
    assert not [o for o in objects if o["kind"] in (*RULE_KINDS, "ClusterRoleBinding", "RoleBinding")]
    assert not by_kind(objects, "ServiceAccount")
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "mine"


def test_podgroup_creation_is_opt_in(helm: Helm) -> None:
    """Gang scheduling makes the operator create PodGroups; only then may it."""
    podgroups = ("scheduling.x-k8s.io", "podgroups")
    for name in ("defaults", "namespaced"):
        assert all(podgroups not in grants(r) for r in all_roles(helm, name))
    cluster_wide = helm.template({"rbac": {"create": True, "podGroups": True}})
    (role,) = by_kind(cluster_wide, "ClusterRole")
    assert grants(role)[podgroups] == {"create"}
    namespaced = helm.template({**VALUES["namespaced"], "rbac": {"create": True, "podGroups": True}})
    for role in by_kind(namespaced, "Role"):
        assert grants(role)[podgroups] == {"create"}


@pytest.mark.parametrize("name", VALUE_SET_NAMES)
def test_runtimes_are_read_only(helm: Helm, name: str) -> None:
    """Runtimes belong to the platform team: the operator may read them, never write them."""
    runtimes = {"llmtrainingruntimes", "clusterllmtrainingruntimes"}
    seen = set()
    for role in all_roles(helm, name):
        for (group, resource), verbs in grants(role).items():
            if resource.split("/")[0] in runtimes:
                assert group == "elasticllm.dev" and verbs == {"get", "list", "watch"}, (resource, verbs)
                seen.add(resource)
    assert seen == runtimes


def test_node_marking_is_opt_in(helm: Helm) -> None:
    """Nodes stay read-only unless nodeHealth.markNodes: then `patch` on nodes, and the operator is told."""
    nodes = ("", "nodes")
    for values, verbs, flag in (
        ({}, {"get", "list", "watch"}, "false"),
        ({"nodeHealth": {"markNodes": True}}, {"get", "list", "watch", "patch"}, "true"),
        (
            {**VALUES["namespaced"], "nodeHealth": {"markNodes": True}},
            {"get", "list", "watch", "patch"},
            "true",
        ),
    ):
        objects = helm.template(values)
        (cluster_role,) = by_kind(objects, "ClusterRole")
        assert grants(cluster_role)[nodes] == verbs, values
        (deployment,) = by_kind(objects, "Deployment")
        env = {
            e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["LLMJOB_MARK_UNHEALTHY_NODES"] == flag


def test_secret_creation_is_opt_in_and_create_only(helm: Helm) -> None:
    """rendezvous.auth makes the operator create each job's etcd Secret: `create` only, never a read
    (docs/decisions.md TN3); the derivation key and the shared etcd's root reach it as env from Secrets."""
    secrets = ("", "secrets")
    auth = {
        "rendezvous": {
            "auth": {"enabled": True, "sharedEtcd": {"endpoint": "etcd.rdzv.svc:2379", "rootSecret": "root"}}
        }
    }
    for values in ({"rbac": {"create": True}, **auth}, {**VALUES["namespaced"], **auth}):
        objects = helm.template(values)
        for role in by_kind(objects, "ClusterRole") + by_kind(objects, "Role"):
            granted = grants(role)
            if role["kind"] == "Role" or "nodes" not in role["metadata"]["name"]:
                assert granted[secrets] == {"create"}, role["metadata"]["name"]
        (deployment,) = by_kind(objects, "Deployment")
        env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        key_ref = env["LLMJOB_ETCD_AUTH_KEY"]["valueFrom"]["secretKeyRef"]
        assert any(s["metadata"]["name"] == key_ref["name"] for s in by_kind(objects, "Secret"))
        assert env["LLMJOB_SHARED_ETCD_ROOT_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "root",
            "key": "password",
        }
