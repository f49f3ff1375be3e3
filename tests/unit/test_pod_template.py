"""spec.podTemplate: the merge into worker pods (one table), the refusals that name the field, the runtime's
template under the job's, and `llmjob render` showing it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import labels
from llm_operator.api.validate import validate
from llm_operator.builders.worker import worker_pod

from .jobs import job, manifest

Pod = dict[str, Any]


def _trainer(pod: Pod) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")


SIDECAR = {"name": "log-shipper", "image": "fluent-bit:3", "restartPolicy": "Always"}
SECRET_VOLUME = {"name": "creds", "secret": {"secretName": "creds"}}

# (case, podTemplate, job spec fields, what to read from the worker pod, expected value)
MERGE: list[tuple[str, dict[str, Any], dict[str, Any], Callable[[Pod], Any], Any]] = [
    (
        "labels added, the operator's kept",
        {"metadata": {"labels": {"team": "nlp"}}},
        {},
        lambda p: (p["metadata"]["labels"]["team"], p["metadata"]["labels"][labels.JOB_NAME]),
        ("nlp", "llama"),
    ),
    (
        "annotations beside the operator's",
        {"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}},
        {},
        lambda p: p["metadata"]["annotations"],
        {"sidecar.istio.io/inject": "false", "karpenter.sh/do-not-disrupt": "true"},
    ),
    (
        "a template may let Karpenter disrupt the node",
        {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "false"}}},
        {},
        lambda p: p["metadata"]["annotations"],
        {"karpenter.sh/do-not-disrupt": "false"},
    ),
    (
        "service account and pull secrets",
        {"spec": {"serviceAccountName": "s3-reader", "imagePullSecrets": [{"name": "ecr"}]}},
        {},
        lambda p: (p["spec"]["serviceAccountName"], p["spec"]["imagePullSecrets"]),
        ("s3-reader", [{"name": "ecr"}]),
    ),
    (
        "volumes after the operator's",
        {"spec": {"volumes": [SECRET_VOLUME]}},
        {"fsx": {"claimName": "fsx"}},
        lambda p: [v["name"] for v in p["spec"]["volumes"]],
        ["dshm", "fsx", "creds"],
    ),
    (
        "trainer mounts after the operator's",
        {
            "spec": {
                "volumes": [SECRET_VOLUME],
                "containers": [
                    {"name": "trainer", "volumeMounts": [{"name": "creds", "mountPath": "/creds"}]}
                ],
            }
        },
        {},
        lambda p: [m["mountPath"] for m in _trainer(p)["volumeMounts"]],
        ["/dev/shm", "/creds"],
    ),
    (
        "envFrom on the trainer; its explicit env untouched",
        {"spec": {"containers": [{"name": "trainer", "envFrom": [{"secretRef": {"name": "hf"}}]}]}},
        {"env": [{"name": "A", "value": "1"}]},
        lambda p: (_trainer(p)["envFrom"], _trainer(p)["env"][-1]),
        ([{"secretRef": {"name": "hf"}}], {"name": "A", "value": "1"}),
    ),
    (
        "init containers and native sidecars in order",
        {"spec": {"initContainers": [{"name": "fetch", "image": "aws-cli:2"}, SIDECAR]}},
        {},
        lambda p: [(c["name"], c.get("restartPolicy")) for c in p["spec"]["initContainers"]],
        [("fetch", None), ("log-shipper", "Always")],
    ),
    (
        "pod-level fields set as given",
        {
            "spec": {
                "securityContext": {"fsGroup": 1000},
                "dnsPolicy": "ClusterFirst",
                "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["s3.local"]}],
                "runtimeClassName": "nvidia",
                "automountServiceAccountToken": False,
            }
        },
        {},
        lambda p: {k: p["spec"][k] for k in ("securityContext", "dnsPolicy", "runtimeClassName")},
        {"securityContext": {"fsGroup": 1000}, "dnsPolicy": "ClusterFirst", "runtimeClassName": "nvidia"},
    ),
    (
        "the training container stays the only container",
        {"spec": {"initContainers": [SIDECAR]}},
        {},
        lambda p: [c["name"] for c in p["spec"]["containers"]],
        ["trainer"],
    ),
    (
        "operator-owned fields unchanged by a template",
        {"metadata": {"labels": {"team": "nlp"}}, "spec": {"serviceAccountName": "x"}},
        {"efaPerNode": 32},
        lambda p: (
            _trainer(p)["resources"]["limits"]["vpc.amazonaws.com/efa"],
            _trainer(p)["securityContext"],
            p["spec"]["restartPolicy"],
        ),
        ("32", {"capabilities": {"add": ["IPC_LOCK"]}}, "Never"),
    ),
    (
        "an empty template adds nothing",
        {},
        {},
        lambda p: sorted(p["spec"]),
        sorted(worker_pod(job(), 0, 0)["spec"]),
    ),
]


@pytest.mark.parametrize(("case", "template", "spec", "read", "expected"), MERGE, ids=[c[0] for c in MERGE])
def test_merge(case: str, template: dict[str, Any], spec: dict[str, Any], read: Any, expected: Any) -> None:
    pod = worker_pod(job(podTemplate=template, **spec), 1, 0, avoid_nodes=())
    assert read(pod) == expected, case


def test_no_template_is_the_pod_as_before() -> None:
    assert worker_pod(job(), 0, 0) == worker_pod(job(podTemplate=None), 0, 0)


def test_operator_annotations_stay_beside_the_templates() -> None:
    pod = worker_pod(job(podTemplate={"metadata": {"annotations": {"a": "b"}}}), 0, 0, avoid_nodes=["n1"])
    assert pod["metadata"]["annotations"] == {
        "a": "b",
        labels.AVOIDED_NODES: "n1",
        labels.DO_NOT_DISRUPT: "true",
    }


# (case, podTemplate, job spec fields, the line that names the field)
REFUSED: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (
        "operator label",
        {"metadata": {"labels": {"elasticllm.dev/role": "x"}}},
        {},
        "spec.podTemplate.metadata.labels: keys under elasticllm.dev/*",
    ),
    (
        "kueue label",
        {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q"}}},
        {},
        "spec.podTemplate.metadata.labels",
    ),
    (
        "managed-by label",
        {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}},
        {},
        "spec.podTemplate.metadata.labels",
    ),
    (
        "operator annotation",
        {"metadata": {"annotations": {"elasticllm.dev/avoided-nodes": "node-1"}}},
        {},
        "spec.podTemplate.metadata.annotations: keys under elasticllm.dev/*",
    ),
    (
        "volume named dshm",
        {"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}},
        {},
        "spec.podTemplate.spec.volumes: the names dshm and fsx are owned by the operator",
    ),
    (
        "second regular container",
        {"spec": {"containers": [{"name": "sidecar"}]}},
        {},
        "spec.podTemplate.spec.containers: only the training container (name: trainer) can be listed",
    ),
    (
        "trainer image",
        {"spec": {"containers": [{"name": "trainer", "image": "other:1"}]}},
        {},
        "spec.podTemplate.spec.containers[0].image: unknown field",
    ),
    (
        "trainer resources",
        {"spec": {"containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}},
        {},
        "spec.podTemplate.spec.containers[0].resources: unknown field",
    ),
    (
        "trainer env",
        {"spec": {"containers": [{"name": "trainer", "env": [{"name": "PET_NNODES", "value": "1"}]}]}},
        {},
        "spec.podTemplate.spec.containers[0].env: unknown field",
    ),
    (
        "mount over /dev/shm",
        {
            "spec": {
                "containers": [
                    {"name": "trainer", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
                ]
            }
        },
        {},
        "spec.podTemplate.spec.containers[trainer].volumeMounts: the mount paths /dev/shm",
    ),
    (
        "mount over the FSx path",
        {
            "spec": {
                "volumes": [SECRET_VOLUME],
                "containers": [{"name": "trainer", "volumeMounts": [{"name": "creds", "mountPath": "/fsx"}]}],
            }
        },
        {"fsx": {"claimName": "c"}},
        "spec.podTemplate.spec.containers[trainer].volumeMounts",
    ),
    (
        "init container named trainer",
        {"spec": {"initContainers": [{"name": "trainer", "image": "x"}]}},
        {},
        "spec.podTemplate.spec.initContainers: the name trainer is the training container",
    ),
    (
        "sidecar restartPolicy other than Always",
        {"spec": {"initContainers": [{"name": "s", "image": "x", "restartPolicy": "OnFailure"}]}},
        {},
        "spec.podTemplate.spec.initContainers[0].restartPolicy",
    ),
    (
        "sidecar without image",
        {"spec": {"initContainers": [{"name": "s"}]}},
        {},
        "spec.podTemplate.spec.initContainers[0].image",
    ),
    (
        "service account not a DNS name",
        {"spec": {"serviceAccountName": "Not_A_Name"}},
        {},
        "spec.podTemplate.spec.serviceAccountName",
    ),
    (
        "unknown pod field",
        {"spec": {"nodeName": "n1"}},
        {},
        "spec.podTemplate.spec.nodeName: unknown field",
    ),
]
REFUSED_MANIFESTS = [(case, manifest(podTemplate=t, **spec), line) for case, t, spec, line in REFUSED]


@pytest.mark.parametrize(("case", "doc", "line"), REFUSED_MANIFESTS, ids=[c[0] for c in REFUSED])
def test_operator_owned_fields_are_refused_with_the_field_named(
    case: str, doc: dict[str, Any], line: str
) -> None:
    result = validate(doc)
    assert result.job is None, case
    assert any(line in p for p in result.problems), result.problems


def test_render_only_checks_name_the_field() -> None:
    """What CEL cannot see: a mount of no volume, two init containers with one name."""
    doc = manifest(
        podTemplate={
            "spec": {
                "initContainers": [{"name": "a", "image": "x"}, {"name": "a", "image": "y"}],
                "containers": [{"name": "trainer", "volumeMounts": [{"name": "nope", "mountPath": "/n"}]}],
            }
        }
    )
    problems = validate(doc).problems
    assert any(
        "spec.podTemplate.spec.containers[0].volumeMounts[0].name: nope names no volume" in p
        for p in problems
    )
    assert any("spec.podTemplate.spec.initContainers: two containers named a" in p for p in problems)


def test_mounts_of_the_operators_volumes_elsewhere_are_allowed() -> None:
    mounts = [{"name": "fsx", "mountPath": "/data", "subPath": "data", "readOnly": True}]
    doc = manifest(
        fsx={"claimName": "c"},
        podTemplate={"spec": {"containers": [{"name": "trainer", "volumeMounts": mounts}]}},
    )
    assert validate(doc).problems == []


def test_runtime_template_under_the_jobs() -> None:
    runtime = {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingRuntime",
        "metadata": {"name": "rt", "namespace": "ml"},
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"team": "platform", "cost": "gpu"}},
                "spec": {
                    "serviceAccountName": "platform",
                    "volumes": [SECRET_VOLUME, {"name": "cache", "emptyDir": {}}],
                    "initContainers": [SIDECAR],
                },
            }
        },
    }
    doc = manifest(
        runtimeRef={"name": "rt"},
        podTemplate={
            "metadata": {"labels": {"team": "nlp"}},
            "spec": {"serviceAccountName": "nlp", "volumes": [{"name": "cache", "configMap": {"name": "c"}}]},
        },
    )
    result = validate(doc, runtime)
    assert result.job is not None, result.problems
    pod = worker_pod(result.job, 0, 0)
    assert pod["metadata"]["labels"]["team"] == "nlp" and pod["metadata"]["labels"]["cost"] == "gpu"
    assert pod["spec"]["serviceAccountName"] == "nlp"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert list(volumes) == ["dshm", "creds", "cache"] and "configMap" in volumes["cache"]
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["log-shipper"]
    assert result.merged is not None
    assert result.merged.origin("spec.podTemplate.spec.serviceAccountName") == "the job"


def test_runtime_template_is_checked_on_its_own() -> None:
    from llm_operator.api.validate import validate_runtime

    runtime = {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "ClusterLLMTrainingRuntime",
        "metadata": {"name": "rt"},
        "spec": {"podTemplate": {"spec": {"volumes": [{"name": "fsx", "emptyDir": {}}]}}},
    }
    assert any(
        "spec.podTemplate.spec.volumes: the names dshm and fsx" in p for p in validate_runtime(runtime)
    )


def test_render_shows_the_template_in_the_worker_pods(tmp_path: Path) -> None:
    doc = manifest(
        podTemplate={
            "metadata": {"annotations": {"sidecar.istio.io/inject": "false"}},
            "spec": {"serviceAccountName": "s3-reader", "initContainers": [SIDECAR]},
        }
    )
    doc["metadata"].pop("uid")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = subprocess.run(
        [sys.executable, "-m", "llm_operator.cli", "render", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    pods = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Pod"]
    assert pods and all(p["spec"]["serviceAccountName"] == "s3-reader" for p in pods)
    assert all(p["spec"]["initContainers"][0]["restartPolicy"] == "Always" for p in pods)


def test_every_rule_reason_is_one_the_apiserver_accepts() -> None:
    from llm_operator.api.crd import CRD_KINDS, crd, runtime_crd

    allowed = {"FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"}

    def reasons(node: Any) -> list[str]:
        if isinstance(node, dict):
            own = [r.get("reason", "FieldValueInvalid") for r in node.get("x-kubernetes-validations", [])]
            return own + [r for value in node.values() for r in reasons(value)]
        if isinstance(node, list):
            return [r for value in node for r in reasons(value)]
        return []

    for kind in CRD_KINDS:
        doc = crd() if kind == "LLMTrainingJob" else runtime_crd(kind)
        assert set(reasons(doc)) <= allowed, kind


def test_kueue_workload_accounts_the_sidecars_requests() -> None:
    from llm_operator.builders.workload import pod_template

    sidecar = {**SIDECAR, "resources": {"requests": {"cpu": "500m"}}, "env": [{"name": "A", "value": "1"}]}
    template = pod_template(job(podTemplate={"spec": {"initContainers": [sidecar]}}))
    assert template["spec"]["initContainers"] == [
        {
            "name": "log-shipper",
            "image": "fluent-bit:3",
            "restartPolicy": "Always",
            "resources": {"requests": {"cpu": "500m"}},
        }
    ]
    assert "initContainers" not in pod_template(job())["spec"]
