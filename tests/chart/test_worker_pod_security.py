"""The Pod Security levels docs/install.md gives for training namespaces, against the real PodSecurity
admission: a worker of an EFA job (IPC_LOCK) is refused by "baseline" and admitted by "privileged"; a worker
without EFA is admitted by "baseline" and refused by "restricted" (the operator owns the trainer
container's securityContext). Server-side dry runs of the pods `llmjob render` makes for the examples."""

from __future__ import annotations

import io
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from chart_helpers import ROOT
from llm_operator.render import render_documents
from llm_operator.settings import Settings
from llm_testbed.localcluster.cluster import LocalCluster
from support.wait import wait_for

pytestmark = pytest.mark.cluster

EFA_JOB = ROOT / "deploy" / "examples" / "llama-8b-p5.yaml"
CPU_JOB = ROOT / "deploy" / "examples" / "smoke-cpu.yaml"
LEVELS = ("restricted", "baseline", "privileged")


@pytest.fixture(scope="module")
def level_namespaces(cluster: LocalCluster) -> Iterator[dict[str, str]]:
    """A namespace enforcing each level, with its default ServiceAccount (pods are refused without it)."""
    names = {level: f"pss-{level}-{secrets.token_hex(3)}" for level in LEVELS}
    for level, name in names.items():
        cluster.kubectl("create", "namespace", name)
        cluster.kubectl("label", "namespace", name, f"pod-security.kubernetes.io/enforce={level}")
    for name in names.values():
        wait_for(
            lambda n=name: cluster.kube.get("serviceaccount", "default", n),
            timeout=30,
            what=f"{name}/default",
        )
    yield names
    cluster.kubectl("delete", "namespace", *names.values(), "--wait=false", check=False)


def _worker(job: Any, namespace: str) -> dict[str, Any]:
    rendered = render_documents([str(job)], Settings(), namespace=namespace, warnings=io.StringIO())
    pods = [obj for obj, _ in rendered if obj["kind"] == "Pod" and "-worker-" in obj["metadata"]["name"]]
    pod = pods[0]
    pod["metadata"]["namespace"] = namespace
    pod["metadata"].pop("ownerReferences", None)
    return pod


@pytest.mark.parametrize(
    ("job", "level", "admitted"),
    [
        (EFA_JOB, "baseline", False),
        (EFA_JOB, "privileged", True),
        (CPU_JOB, "baseline", True),
        (CPU_JOB, "restricted", False),
    ],
    ids=["efa-baseline", "efa-privileged", "cpu-baseline", "cpu-restricted"],
)
def test_worker_admission_per_level(
    cluster: LocalCluster, level_namespaces: dict[str, str], job: Any, level: str, admitted: bool
) -> None:
    pod = _worker(job, level_namespaces[level])
    result = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False)
    if admitted:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0 and "violates PodSecurity" in result.stderr, result.stderr
        if job == EFA_JOB:
            assert "IPC_LOCK" in result.stderr, result.stderr
