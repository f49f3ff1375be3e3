"""The NetworkPolicy that fences a job's managed rendezvous server (pure builder, table-driven)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import labels
from llm_operator.builders.desired import desired_objects, support_objects
from llm_operator.builders.rendezvous import rendezvous_network_policy, rendezvous_objects
from llm_operator.settings import Settings

from .jobs import job, manifest

OPERATOR = {"app.kubernetes.io/name": "elastic-llm-operator", "app.kubernetes.io/component": "operator"}


@pytest.mark.parametrize(
    ("backend", "port"),
    [("etcd-v3", 2379), ("c10d", 29400)],
)
def test_admits_only_this_jobs_workers_and_the_operator_on_the_rendezvous_port(
    backend: str, port: int
) -> None:
    j = job(rendezvous={"backend": backend})
    policy = rendezvous_network_policy(j, Settings())
    assert policy is not None
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["kind"] == "NetworkPolicy"
    meta = policy["metadata"]
    assert meta["name"] == "llama-rdzv" and meta["namespace"] == "ml"
    owner = meta["ownerReferences"][0]
    assert owner["uid"] == "uid-1234" and owner["controller"] is True and owner["kind"] == "LLMTrainingJob"
    spec = policy["spec"]
    # It selects exactly the server pod the Deployment runs.
    deployment = next(o for o in rendezvous_objects(j, Settings()) if o["kind"] == "Deployment")
    server_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"] == {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}
    assert spec["podSelector"]["matchLabels"].items() <= server_labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]
    workers, operator = rule["from"]
    assert workers == {"podSelector": {"matchLabels": {labels.JOB_NAME: "llama", labels.ROLE: "worker"}}}
    assert "namespaceSelector" not in workers, "workers of the job's own namespace only"
    assert operator == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "elastic-llm-operator"}},
        "podSelector": {"matchLabels": OPERATOR},
    }


@pytest.mark.parametrize(
    ("env", "expected_operator_peer"),
    [
        ({}, {"ns": "elastic-llm-operator", "labels": OPERATOR}),
        (
            {"LLMJOB_OPERATOR_NAMESPACE": "ops", "LLMJOB_OPERATOR_POD_LABELS": '{"app": "llmop"}'},
            {"ns": "ops", "labels": {"app": "llmop"}},
        ),
        ({"LLMJOB_OPERATOR_POD_LABELS": "{}"}, None),
    ],
)
def test_operator_peer_comes_from_settings(env: dict[str, str], expected_operator_peer: Any) -> None:
    policy = rendezvous_network_policy(job(), Settings.from_env(env))
    assert policy is not None
    peers = policy["spec"]["ingress"][0]["from"]
    if expected_operator_peer is None:
        assert len(peers) == 1, "workers only"
        return
    operator = peers[1]
    assert operator["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": expected_operator_peer["ns"]
    }
    assert operator["podSelector"]["matchLabels"] == expected_operator_peer["labels"]


@pytest.mark.parametrize("value", ["[1]", "not json", '{"a": 1}'])
def test_bad_operator_labels_setting_names_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match="LLMJOB_OPERATOR_POD_LABELS"):
        Settings.from_env({"LLMJOB_OPERATOR_POD_LABELS": value})


def test_no_policy_for_an_external_endpoint() -> None:
    j = job(rendezvous={"endpoint": "etcd.shared:2379"})
    assert rendezvous_network_policy(j, Settings()) is None
    assert not [o for o in support_objects(j, Settings()) if o["kind"] == "NetworkPolicy"]


def test_support_objects_include_the_policy_whatever_the_size() -> None:
    for size in (0, 2):
        kinds = [o["kind"] for o in desired_objects(job(), Settings(), size=size)]
        assert kinds.count("NetworkPolicy") == 1


def test_llmjob_render_prints_the_policy(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(manifest()))
    result = subprocess.run(
        [sys.executable, "-m", "llm_operator.cli", "render", "-f", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (policy,) = [o for o in yaml.safe_load_all(result.stdout) if o and o["kind"] == "NetworkPolicy"]
    assert policy["metadata"]["name"] == "llama-rdzv"
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 2379}]
