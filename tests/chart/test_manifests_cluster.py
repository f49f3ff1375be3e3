"""Every other manifest we ship, validated by the real API server (server-side dry run).

deploy/examples (the example jobs, validated against the generated CRD), deploy/fsx, deploy/etcd and
the two kustomize overlays.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import ROOT, kubectl
from llm_testbed.localcluster.cluster import LocalCluster

pytestmark = pytest.mark.cluster

DEPLOY = ROOT / "deploy"


def dry_run(cluster: LocalCluster, objects: list[dict[str, Any]], namespace: str | None = None) -> list[str]:
    """Server-side dry-run apply; returns the per-object lines, one per object or the test fails."""
    args = [
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        "--field-manager=manifest-test",
    ]
    if namespace is not None:
        args += ["-n", namespace]
    manifest = yaml.safe_dump_all(objects, sort_keys=False)
    result = cluster.kubectl(*args, "-f", "-", input=manifest)
    accepted = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(objects), f"{len(objects)} objects sent, accepted:\n{result.stdout}"
    return accepted


def in_namespace(path: Path) -> list[dict[str, Any]]:
    """The file's objects without their namespace, so they can be validated in the test's namespace."""
    objects = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for obj in objects:
        obj["metadata"].pop("namespace", None)
    return objects


def manifest_files(folder: str) -> list[Path]:
    files = sorted((DEPLOY / folder).glob("*.yaml"))
    assert files, f"deploy/{folder} holds no manifests"
    return files


@pytest.mark.parametrize("path", manifest_files("examples"), ids=lambda p: p.name)
def test_example_jobs_are_valid(cluster: LocalCluster, namespace: str, path: Path) -> None:
    objects = in_namespace(path)
    assert {o["kind"] for o in objects} <= {
        "LLMTrainingJob",
        "LLMTrainingRuntime",
        "ClusterLLMTrainingRuntime",
    }
    dry_run(cluster, objects, namespace)


def test_invalid_job_is_rejected(cluster: LocalCluster, namespace: str) -> None:
    """The dry run is a real check: the CRD's validation rejects a broken copy of an example."""
    (job,) = in_namespace(manifest_files("examples")[0])
    job["spec"]["minReplicas"] = 0  # the schema's minimum is 1
    manifest = yaml.safe_dump(job)
    result = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-", input=manifest, check=False
    )
    assert result.returncode != 0 and "minReplicas" in (result.stderr + result.stdout)


@pytest.mark.parametrize("path", manifest_files("fsx") + manifest_files("etcd"), ids=lambda p: p.name)
def test_fsx_and_etcd_manifests_are_valid(cluster: LocalCluster, namespace: str, path: Path) -> None:
    dry_run(cluster, in_namespace(path), namespace)


@pytest.fixture
def two_namespaces(cluster: LocalCluster) -> Iterator[tuple[str, str]]:
    names = (f"op-{secrets.token_hex(3)}", f"jobs-{secrets.token_hex(3)}")
    for name in names:
        cluster.kubectl("create", "namespace", name)
    yield names
    cluster.kubectl("delete", "namespace", *names, "--ignore-not-found", "--wait=false")


def _moved(objects: list[dict[str, Any]], moves: dict[str, str]) -> list[dict[str, Any]]:
    """Point the overlay's namespaces at the test's (the overlays hard-code theirs)."""
    out = []
    for obj in objects:
        if obj["kind"] == "Namespace":
            continue
        meta = obj["metadata"]
        if meta.get("namespace") in moves:
            meta["namespace"] = moves[meta["namespace"]]
        for subject in obj.get("subjects", []):
            if subject.get("namespace") in moves:
                subject["namespace"] = moves[subject["namespace"]]
        out.append(obj)
    return out


@pytest.mark.parametrize("overlay", ["cluster-wide", "namespaced"])
def test_kustomize_overlays_are_valid(
    cluster: LocalCluster, kubectl_bin: Path, two_namespaces: tuple[str, str], overlay: str
) -> None:
    built = kubectl(kubectl_bin, "kustomize", str(DEPLOY / "kustomize" / "overlays" / overlay)).stdout
    objects = [doc for doc in yaml.safe_load_all(built) if doc]
    assert any(o["kind"] == "Namespace" for o in objects)
    moved = _moved(objects, {"elastic-llm-operator": two_namespaces[0], "ml-training": two_namespaces[1]})
    dry_run(cluster, moved)
