"""values.schema.json: wrong values fail `helm template` and `helm install`, naming the bad value."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from chart_helpers import CHART, Helm

BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    # (case, values, a fragment the error must contain: the path of the bad value)
    ("misspelt top-level key", {"replicas": 2}, "replicas"),
    ("misspelt nested key", {"image": {"repo": "x"}}, "repo"),
    ("replicaCount zero", {"replicaCount": 0}, "/replicaCount"),
    ("replicaCount as a string", {"replicaCount": "2"}, "/replicaCount"),
    ("unknown log level", {"logLevel": "verbose"}, "/logLevel"),
    ("unknown log format", {"logFormat": "xml"}, "/logFormat"),
    (
        "alert threshold as a string",
        {"prometheusRule": {"alerts": {"lowGoodput": {"threshold": "80%"}}}},
        "threshold",
    ),
    ("alert for not a duration", {"prometheusRule": {"alerts": {"operatorDown": {"for": "soon"}}}}, "for"),
    ("empty image repository", {"image": {"repository": ""}}, "/image/repository"),
    ("image repository with a tag", {"image": {"repository": "repo/op:1.0"}}, "/image/repository"),
    ("malformed digest", {"image": {"digest": "sha256:xyz"}}, "/image/digest"),
    ("bad pull policy", {"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    (
        "namespaced without namespaces",
        {"watch": {"allNamespaces": False, "namespaces": []}},
        "/watch/namespaces",
    ),
    (
        "namespaces while cluster-wide",
        {"watch": {"allNamespaces": True, "namespaces": ["a"]}},
        "/watch/namespaces",
    ),
    (
        "invalid namespace name",
        {"watch": {"allNamespaces": False, "namespaces": ["Team_A"]}},
        "/watch/namespaces",
    ),
    ("node selector must be strings", {"defaultNodeSelector": {"gpu": True}}, "/defaultNodeSelector"),
    ("rendezvous image with spaces", {"rendezvous": {"image": "etcd latest"}}, "/rendezvous/image"),
    ("root allowed", {"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
    ("writable root fs", {"securityContext": {"readOnlyRootFilesystem": False}}, "readOnlyRootFilesystem"),
    (
        "privilege escalation",
        {"securityContext": {"allowPrivilegeEscalation": True}},
        "allowPrivilegeEscalation",
    ),
    ("bad resource quantity", {"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
    ("bad scrape interval", {"metrics": {"serviceMonitor": {"interval": "often"}}}, "interval"),
    (
        "extraEnv overriding a chart setting",
        {"extraEnv": [{"name": "LLMJOB_RENDEZVOUS_IMAGE"}]},
        "/extraEnv/0/name",
    ),
    ("PDB maxUnavailable zero", {"podDisruptionBudget": {"maxUnavailable": 0}}, "maxUnavailable"),
    ("default runtime misspelt key", {"defaultRuntime": {"enable": True}}, "enable"),
    ("default runtime name not DNS", {"defaultRuntime": {"name": "P5_Big"}}, "/defaultRuntime/name"),
]


@pytest.mark.parametrize(("values", "fragment"), [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES])
def test_bad_values_are_rejected(helm: Helm, values: dict[str, Any], fragment: str) -> None:
    result = helm.run(*helm.template_args(values), check=False)
    assert result.returncode != 0, f"accepted: {values}"
    assert "schema" in result.stderr, result.stderr
    assert fragment in result.stderr, result.stderr


GOOD_VALUES: list[tuple[str, dict[str, Any]]] = [
    ("percent PDB", {"podDisruptionBudget": {"maxUnavailable": "50%"}}),
    ("image tag and digest", {"image": {"tag": "0.2.0-rc.1", "digest": "sha256:" + "0" * 64}}),
    ("registry with a port", {"image": {"repository": "registry.local:5000/team/llm-operator"}}),
    ("cpu as a number", {"resources": {"requests": {"cpu": 0.5, "memory": "300Mi"}}}),
    (
        "extra env from a field",
        {"extraEnv": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]},
    ),
]


@pytest.mark.parametrize("values", [c[1] for c in GOOD_VALUES], ids=[c[0] for c in GOOD_VALUES])
def test_valid_variations_are_accepted(helm: Helm, values: dict[str, Any]) -> None:
    assert "kind: Deployment" in helm.run(*helm.template_args(values)).stdout


def test_defaults_satisfy_the_schema_and_every_key_is_described() -> None:
    """values.yaml and the schema stay in step: no key in one that the other lacks."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        props = node.get("properties", {})
        for key, value in values.items():
            assert key in props, f"{path}/{key} is in values.yaml but not in values.schema.json"
            if isinstance(value, dict) and props[key].get("additionalProperties") is False:
                walk(value, props[key], f"{path}/{key}")

    walk(defaults, schema, "")
    assert set(schema["properties"]) - {"global"} == set(defaults), "schema keys without a default"
