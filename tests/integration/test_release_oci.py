"""A release as its users take it: the chart and the operator image from an OCI registry.

A real registry (CNCF Distribution's reference ``registry``, pinned in deploy/local/tools/distribution)
runs on loopback. The test pushes the packaged chart (``helm push``) and the operator image (``podman
push``) to it, then installs the operator with ``helm install oci://...`` on the container-mode cluster and
checks that the operator comes up and reconciles a job.

What the local pod runner cannot do: pull. It runs a pod in a container only when the pod's image
reference is already in the image builder's podman storage (``--pull=never``). So the test does the
kubelet's pull itself: ``podman pull`` of the reference the chart renders, from the registry, into that
storage (the reference was not there before: a fresh port each run). The pod then runs the image that
came back from the registry, and the test checks it is the image that was built (same image ID).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_testbed.images.podman import Podman
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.localcluster.tools import ensure
from llm_testbed.registry import LocalRegistry, registry_binary
from llm_testbed.release.chart import package_chart
from llm_testbed.version import project_version
from support import pod_containers
from support.images import make_images
from support.wait import wait_for

from .kube_helpers import job_manifest, status

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.images,
    pytest.mark.tools("distribution"),
    pytest.mark.timeout(900),
]

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "oci"
START_TIMEOUT = 240.0  # the operator container's start on a loaded 2-core machine


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    with LocalRegistry(registry_binary(), tmp_path / "registry") as reg:
        yield reg


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, f"{' '.join(argv[:3])} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return proc


def _helm_env(cluster: LocalCluster, home: Path) -> dict[str, str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    env.update({f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CONFIG", "CACHE", "DATA")})
    return env


def test_oci_release_installs_from_the_registry_and_reconciles(
    container_cluster: LocalCluster, container_namespace: str, registry: LocalRegistry, tmp_path: Path
) -> None:
    c, ns = container_cluster, container_namespace
    version = project_version(ROOT)
    refs, _ = make_images()
    podman = Podman.of_cache()
    helm = str(ensure(["helm"])["helm"])
    env = _helm_env(c, tmp_path / "helm")

    # Publish: the chart and the operator image, as docs/install.md ("Publish to your own registry") says.
    chart = package_chart(ROOT, version, tmp_path / "chart", tmp_path)
    pushed = _run([helm, "push", str(chart), f"oci://{registry.address}/charts", "--plain-http"], env)
    assert f"{registry.address}/charts/elastic-llm-operator:{version}" in pushed.stdout + pushed.stderr
    remote = f"{registry.address}/elastic-llm-operator/operator:{version}"
    _run(podman.argv("push", "--tls-verify=false", refs["operator"], remote))

    # The kubelet's pull (the pod runner never pulls): the reference the chart renders, from the registry.
    assert not podman.image_exists(remote)
    _run(podman.argv("pull", "--tls-verify=false", "--quiet", remote))
    try:
        assert podman.inspect(remote)["Id"] == podman.inspect(refs["operator"])["Id"]
        values = {
            "image": {"repository": f"{registry.address}/elastic-llm-operator/operator"},  # tag: appVersion
            "replicaCount": 1,
            "watch": {"allNamespaces": False, "namespaces": [ns]},
        }
        (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
        chart_url = f"oci://{registry.address}/charts/elastic-llm-operator"
        install = [helm, "install", RELEASE, chart_url, "--version", version, "--plain-http"]
        _run([*install, "--namespace", ns, "-f", str(tmp_path / "values.yaml")], env)
        try:
            _operator_reconciles(c, ns, remote)
        finally:
            _run([helm, "uninstall", RELEASE, "--namespace", ns, "--wait", "--timeout", "120s"], env)
    finally:
        podman.remove(remote)


def _operator_reconciles(c: LocalCluster, ns: str, image: str) -> None:
    selector = f"app.kubernetes.io/instance={RELEASE}"

    def ready() -> dict[str, Any] | None:
        pods = c.kube.items("pods", labels=selector, namespace=ns)
        statuses = [s for p in pods for s in p.get("status", {}).get("containerStatuses") or []]
        return pods[0] if pods and any(s.get("ready") for s in statuses) else None

    pod = wait_for(ready, START_TIMEOUT, "the operator pod from the OCI chart to be Ready")
    assert pod["spec"]["containers"][0]["image"] == image
    info = pod_containers.inspect(c, pod)
    assert info is not None and info["State"]["Running"], "the operator runs in a container of the image"
    assert info["ImageName"] == image

    job = job_manifest("oci", ns, minReplicas=1, maxReplicas=1)
    job["spec"].update(command=["python", "-c", "import time; time.sleep(100000)"])
    c.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    wait_for(
        lambda: (
            status(c, ns, "oci").get("phase") == "Running" and status(c, ns, "oci").get("readyReplicas") == 1
        ),
        START_TIMEOUT,
        "the operator from the registry to run the job's worker and write its status",
    )
    c.kubectl("delete", "llmtrainingjob", "oci", "-n", ns, "--wait=true", "--timeout=120s")
