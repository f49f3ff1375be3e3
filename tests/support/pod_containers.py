"""What the pod runner's container mode made of a pod, as podman sees it (tests of container mode)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from llm_testbed.images.podman import Podman
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.podrunner.incontainer import LABEL_CLUSTER, container_name

INSPECT_TRIES = 3  # podman answers "container state improper" now and then while it changes a container


def inspect(
    cluster: LocalCluster, pod: dict[str, Any], container: str | None = None
) -> dict[str, Any] | None:
    """``podman container inspect`` of the pod's container (default: its first), None when there is none."""
    name = container or pod["spec"]["containers"][0]["name"]
    ref = container_name(cluster.name, pod["metadata"]["uid"], name)
    for _ in range(INSPECT_TRIES):
        proc = subprocess.run(
            Podman.of_cache().argv("container", "inspect", ref), capture_output=True, text=True, check=False
        )
        if proc.returncode == 0:
            found: list[dict[str, Any]] = json.loads(proc.stdout)
            return found[0] if found else None
        if "no such container" in proc.stderr.lower():
            return None
    raise AssertionError(f"podman container inspect {ref} failed: {proc.stderr.strip()}")


def running(cluster: LocalCluster, pod: dict[str, Any]) -> bool:
    info = inspect(cluster, pod)
    return bool(info and info["State"]["Running"])


def of_cluster(cluster: LocalCluster) -> list[str]:
    """Names of every container of the cluster's pods, running or not."""
    proc = subprocess.run(
        Podman.of_cache().argv(
            "ps", "--all", "--filter", f"label={LABEL_CLUSTER}={cluster.name}", "--format", "{{.Names}}"
        ),
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.split()


def image_user_id(reference: str) -> int:
    """The numeric UID of an image's ``USER``."""
    user = str(Podman.of_cache().inspect(reference)["Config"].get("User") or "0")
    return int(user.split(":")[0])
