"""What a training job needs from the kubelet tier: its images in the tier's registry, room on the disk for
every node to unpack the trainer image, and a kubelet cluster of its own for a run (tests, the demo).

Each node has its own containerd root, so each node that runs a worker keeps its own unpacked copy of the
trainer image (5.6 GiB); the room is checked before anything is pulled, so a short disk fails at once
naming the space it needs instead of the kubelets evicting every pod half-way (docs/development.md).
"""

from __future__ import annotations

import http.client
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llm_testbed.kubeletnodes import layout
from llm_testbed.kubeletnodes.tier import KubeletTier, active_cluster
from llm_testbed.localcluster import paths
from llm_testbed.localcluster.cluster import LocalCluster, pid_alive
from llm_testbed.localcluster.errors import LocalClusterError

GIB = 2**30
PULL_SPARE = 3 * GIB
"""Beyond the unpacked copies: the kubelets' eviction thresholds (512 MiB each, one shared disk), the
layer in flight of each pull, the job's logs and checkpoints."""
COMPRESSED_SHARE = 0.5
"""The registry's zstd copy of the trainer image, as a share of its unpacked size (2.7 of 5.6 GiB)."""
RUN_CLUSTER = re.compile(r"pytest-kubelet-(\d+)")


class NoRoomError(LocalClusterError):
    """The disk cannot hold the images the nodes are about to pull."""


def room_needed(image_bytes: int, nodes: int, *, pushed: bool) -> int:
    """Free bytes that ``nodes`` pulls of an image of ``image_bytes`` (unpacked) want (pure)."""
    push = 0 if pushed else int(image_bytes * COMPRESSED_SHARE)
    return nodes * image_bytes + push + PULL_SPARE


def free_bytes() -> int:
    """Free bytes on the disk that holds the nodes' containerd roots."""
    folder = layout.STATE_ROOT
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def check_room(image: str, image_bytes: int, nodes: int, *, pushed: bool) -> None:
    """Raise :class:`NoRoomError` naming the free space needed when the disk is too short."""
    need, free = room_needed(image_bytes, nodes, pushed=pushed), free_bytes()
    if free < need:
        push = "" if pushed else f" plus its push to the tier's registry ({COMPRESSED_SHARE:.0%} of it)"
        raise NoRoomError(
            f"the kubelet tier needs about {need / GIB:.1f} GiB free under {layout.STATE_ROOT} and has "
            f"{free / GIB:.1f} GiB: {nodes} node(s) each unpack their own copy of {image} "
            f"({image_bytes / GIB:.1f} GiB){push}, and {PULL_SPARE / GIB:.0f} GiB spare; free the disk "
            "(old images: `llmjob images list`; the tier's registry: <cache>/kubelet-registry)"
        )


def in_registry(registry: str, local: str) -> bool:
    """Whether ``local`` (``localhost/<repository>:<tag>``) is already in the tier's registry."""
    repository, _, tag = local.partition("/")[2].rpartition(":")
    host, _, port = registry.partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json"
        conn.request("HEAD", f"/v2/{repository}/manifests/{tag}", headers={"Accept": accept})
        return conn.getresponse().status == 200
    finally:
        conn.close()


def publish_trainer(tier: KubeletTier, trainer: str, nodes: int) -> str:
    """The trainer image ``make images`` built and the rendezvous etcd, in the tier's registry, once the
    disk is known to hold ``nodes`` unpacked copies; returns the trainer's name for pods (unchanged).

    A trainer already in the registry under its tag is not pushed again: the tag is the build's content key,
    and a push of the 6 GB image took ~60 s here even when every blob was there (podman compressed each
    layer again to learn its digest)."""
    from llm_operator.settings import DEFAULT_RENDEZVOUS_IMAGE

    from llm_testbed.images.podman import Podman

    pushed = in_registry(tier.registry(), trainer)
    check_room(trainer, Podman.of_cache().size(trainer), nodes, pushed=pushed)
    tier.publish_test_images(DEFAULT_RENDEZVOUS_IMAGE.rpartition(":")[2])
    return trainer if pushed else tier.publish_built_image(trainer)


def image_group(local: str) -> int:
    """The numeric group of an image's ``USER`` (its user's when none is named)."""
    from llm_testbed.images.podman import Podman

    user = str(Podman.of_cache().inspect(local)["Config"].get("User") or "0")
    return int(user.split(":")[-1])


@contextmanager
def run_cluster(
    name: str, gpu_nodes: int, cpu_nodes: int, logs: Path | None = None
) -> Iterator[LocalCluster]:
    """A kubelet cluster for one run, down at the end (its logs and the tier's copied to ``logs`` first).
    One kubelet cluster per machine: a killed earlier test run's (``pytest-kubelet-<pid>``) is removed."""
    owner = active_cluster()
    stale = RUN_CLUSTER.fullmatch(owner.name) if owner is not None else None
    if owner is not None and stale is not None and not pid_alive(int(stale.group(1))):
        LocalCluster(owner.name).down()
    local = LocalCluster(name)
    try:
        local.up(gpu_nodes, cpu_nodes, crds_dir=paths.crds_dir(), kubelet=True)
        yield local
    finally:
        try:
            if logs is not None:
                local.collect_logs(logs)
                if local.runs_kubelets:
                    local.kubelet_tier.collect_logs(logs / "kubelet-tier")
        finally:  # a cluster left up holds the machine's kubelet tier and GBs of images
            local.down()
