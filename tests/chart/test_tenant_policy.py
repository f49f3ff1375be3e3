"""The chart's tenant policy and submitter roles, rendered (no cluster): every CEL expression of the rendered
ValidatingAdmissionPolicy is evaluated with cel-python on the shared table of cases
(tests/support/tenant_cases.py), and must refuse exactly what the operator's rules refuse, in the same words.
tests/chart/test_tenant_cluster.py runs the same policy in the real API server."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
from celpy import celtypes
from celpy.adapter import json_to_cel
from chart_helpers import Helm, by_kind, one
from llm_operator.policy.tenancy import PRIVILEGED_LABEL, violations
from support.tenant_cases import CASES, CHART_VALUES, POLICY, Case

NAMESPACE = "team-a"


def _run(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate(activation)


def _activation(case: Case, old: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the API server hands the policy for the case's object (a CREATE unless ``old`` is given)."""
    labels = {PRIVILEGED_LABEL: "true"} if case.privileged else {"team": "a"}
    cluster = case.kind == "ClusterLLMTrainingRuntime"
    meta: dict[str, Any] = {"name": "x"} if cluster else {"name": "x", "namespace": NAMESPACE}
    if cluster:
        meta["labels"] = labels
    obj = {"apiVersion": "elasticllm.dev/v1alpha1", "kind": case.kind, "metadata": meta, "spec": case.spec}
    request = {"operation": "UPDATE" if old else "CREATE", "namespace": "" if cluster else NAMESPACE}
    namespace = None if cluster else {"metadata": {"name": NAMESPACE, "labels": labels}}
    return {
        "object": json_to_cel(obj),
        "oldObject": json_to_cel(old),
        "request": json_to_cel(request),
        "namespaceObject": json_to_cel(namespace),
    }


def _judge(policy: dict[str, Any], activation: dict[str, Any]) -> list[str] | None:
    """The messages of the validations that fail (None: a match condition leaves the object alone)."""
    spec = policy["spec"]
    if not all(_run(c["expression"], activation) for c in spec["matchConditions"]):
        return None
    variables = celtypes.MapType()
    for variable in spec["variables"]:
        value = _run(variable["expression"], {**activation, "variables": variables})
        variables[celtypes.StringType(variable["name"])] = value
    scope = {**activation, "variables": variables}
    failed = []
    for check in spec["validations"]:
        if not _run(check["expression"], scope):
            expression = check.get("messageExpression")
            failed.append(str(_run(expression, scope)) if expression else check["message"])
    return failed


@pytest.fixture(scope="module")
def policy(helm: Helm) -> dict[str, Any]:
    return one(helm.template(CHART_VALUES), "ValidatingAdmissionPolicy")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_cel_refuses_each_case_exactly_as_the_operator_does(policy: dict[str, Any], case: Case) -> None:
    expected = [v.message for v in violations(case.spec, POLICY, case.privileged)]
    assert _judge(policy, _activation(case)) == expected
    assert len(expected) == (1 if case.refused else 0)


def test_an_update_that_leaves_the_spec_alone_is_not_judged(policy: dict[str, Any]) -> None:
    root = next(c for c in CASES if c.refused and c.refused[1] == "root")
    old = {"metadata": {"name": "x"}, "spec": root.spec}
    assert _judge(policy, _activation(root, old=old)) is None
    changed = {"metadata": {"name": "x"}, "spec": {**root.spec, "maxReplicas": 8}}
    assert _judge(policy, _activation(root, old=changed)) == [
        v.message for v in violations(root.spec, POLICY, False)
    ]


def test_the_binding_and_the_operator_follow_the_values(helm: Helm) -> None:
    values = {
        "tenantPolicy": {
            **CHART_VALUES["tenantPolicy"],
            "validationActions": ["Warn", "Audit"],
            "namespaceSelector": {"matchLabels": {"tenancy": "on"}},
        }
    }
    objects = helm.template(values)
    policy, binding = (
        one(objects, "ValidatingAdmissionPolicy"),
        one(objects, "ValidatingAdmissionPolicyBinding"),
    )
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Warn", "Audit"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": {"tenancy": "on"}}
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules[0]["resources"] == ["llmtrainingjobs", "llmtrainingruntimes", "clusterllmtrainingruntimes"]
    (deployment,) = by_kind(objects, "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LLMJOB_TENANT_POLICY"] == (
        '{"registries":["registry.example.com/ml","public.ecr.aws/"],"serviceAccounts":["trainer"]}'
    )
    (role,) = by_kind(objects, "ClusterRole")
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]} in role["rules"]


def test_off_by_default_and_no_registry_rule_without_registries(helm: Helm) -> None:
    defaults = helm.template({})
    assert not by_kind(defaults, "ValidatingAdmissionPolicy") and not by_kind(
        defaults, "ValidatingAdmissionPolicyBinding"
    )
    env = {e["name"] for e in one(defaults, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "LLMJOB_TENANT_POLICY" not in env
    policy = one(helm.template({"tenantPolicy": {"enabled": True}}), "ValidatingAdmissionPolicy")
    assert not [v for v in policy["spec"]["validations"] if "registry" in v.get("message", "")]


def test_submitter_roles_aggregate_and_leave_cluster_runtimes_read_only(helm: Helm) -> None:
    assert not [r for r in by_kind(helm.template({}), "ClusterRole") if "aggregate" in str(r["metadata"])]
    roles = {
        label.removeprefix("rbac.authorization.k8s.io/aggregate-to-"): role
        for role in by_kind(helm.template({"submitterRoles": {"enabled": True}}), "ClusterRole")
        for label in role["metadata"]["labels"]
        if label.startswith("rbac.authorization.k8s.io/aggregate-to-")
    }
    assert set(roles) == {"admin", "edit", "view"}
    for name, role in roles.items():
        verbs: dict[str, set[str]] = {}
        for rule in role["rules"]:
            for resource in rule["resources"]:
                verbs.setdefault(resource, set()).update(rule["verbs"])
        assert verbs["clusterllmtrainingruntimes"] == {"get", "list", "watch"}, name
        assert verbs["llmtrainingjobs/status"] == {"get"}, name
        writes = {"create", "update", "patch", "delete"}
        assert (writes <= verbs["llmtrainingjobs"]) is (name != "view"), name
        assert (writes <= verbs["llmtrainingruntimes"]) is (name != "view"), name
