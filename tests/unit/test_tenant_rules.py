"""policy.tenancy: the operator's tenant rules on the shared table (the chart's CEL runs on it too)."""

from __future__ import annotations

import pytest
from llm_operator.policy.tenancy import (
    RULES,
    TenantPolicy,
    Violation,
    is_privileged,
    lifted_by_label,
    refusal,
    violations,
)
from support.tenant_cases import CASES, POLICY, Case


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_case_gets_exactly_its_refusal(case: Case) -> None:
    found = violations(case.spec, POLICY, case.privileged)
    assert [(v.field, v.rule) for v in found] == ([case.refused] if case.refused else [])


def test_the_table_covers_every_rule_both_ways() -> None:
    refused = {c.refused[1] for c in CASES if c.refused}
    assert refused == set(RULES)
    assert len([c for c in CASES if c.refused is None]) >= 10


def test_messages_name_the_field_the_rule_and_what_is_allowed() -> None:
    (account,) = violations({"podTemplate": {"spec": {"serviceAccountName": "x"}}}, POLICY, False)
    assert account.message == (
        "spec.podTemplate.spec.serviceAccountName: refused by tenant rule service-account: only these"
        " ServiceAccounts are allowed: default, trainer"
    )
    (image,) = violations({"image": "quay.io/a:1"}, POLICY, False)
    assert image.message.endswith("allowed: registry.example.com/ml, public.ecr.aws")
    host = Violation("spec.podTemplate.spec.volumes[h].hostPath", "host-volumes")
    assert host.message == (
        "spec.podTemplate.spec.volumes[h].hostPath: refused by tenant rule host-volumes: a hostPath volume"
        " needs the namespace label elasticllm.dev/privileged-workloads=true"
    )


def test_every_offender_is_found_and_the_refusal_lists_them() -> None:
    pod = {
        "volumes": [{"name": "a", "hostPath": {"path": "/"}}, {"name": "b", "hostPath": {"path": "/"}}],
        "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
        "serviceAccountName": "admin",
    }
    found = violations({"image": "x:1", "podTemplate": {"spec": pod}}, POLICY, False)
    assert [v.rule for v in found] == [
        "host-volumes",
        "host-volumes",
        "root",
        "root",
        "service-account",
        "registry",
    ]
    line = refusal(found)
    assert line.startswith("tenant policy: spec.podTemplate.spec.volumes[a].hostPath: ")
    assert line.count("refused by tenant rule") == 6
    assert not lifted_by_label(found), "the label does not lift the ServiceAccount or the registry rule"
    assert lifted_by_label(found[:4]) and not lifted_by_label([])


def test_an_empty_policy_allows_any_registry_and_only_the_default_account() -> None:
    anything = TenantPolicy()
    assert violations({"image": "ubuntu"}, anything, False) == []
    assert [
        v.rule for v in violations({"podTemplate": {"spec": {"serviceAccountName": "x"}}}, anything, True)
    ] == ["service-account"]


def test_only_the_label_value_true_is_privileged() -> None:
    assert is_privileged({"elasticllm.dev/privileged-workloads": "true"})
    assert not is_privileged({"elasticllm.dev/privileged-workloads": "yes"})
    assert not is_privileged(None)


def test_a_bool_is_not_user_zero() -> None:
    pod = {"securityContext": {"runAsUser": False}}
    assert violations({"podTemplate": {"spec": pod}}, TenantPolicy(), False) == []
