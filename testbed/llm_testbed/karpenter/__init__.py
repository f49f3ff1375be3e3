"""Real Karpenter in the test bed: the upstream core's kwok cloud provider as a local process.

``llmjob cluster up --karpenter`` (or ``LocalCluster.up(karpenter=True)``) installs Karpenter's CRDs,
a KWOKNodeClass and two NodePools (:mod:`.manifests`), writes the instance-type catalog
(:mod:`.catalog`) and starts the pinned binary (tool ``karpenter``, :mod:`.daemon`). A Pending pod that
fits no node makes Karpenter create a NodeClaim and a Node; kwok-controller manages that Node like every
other fake node (the node Stages make it Ready; with ``--run-pods`` the pod runner runs its pods), and
Karpenter's consolidation deletes it once it is empty. docs/development.md, "Karpenter", has the whole
picture.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llm_testbed.karpenter import control, daemon, manifests
from llm_testbed.karpenter.daemon import ProcessSettings
from llm_testbed.karpenter.manifests import CPU_POOL, GPU_POOL, KarpenterError, PoolSettings
from llm_testbed.localcluster import nodes
from llm_testbed.localcluster.kubectl import Kubectl

__all__ = [
    "CPU_POOL",
    "GPU_POOL",
    "KarpenterError",
    "KarpenterSetup",
    "PoolSettings",
    "ProcessSettings",
    "start",
    "stop",
]


@dataclass(frozen=True)
class KarpenterSetup:
    """Everything ``cluster up`` needs to run Karpenter: its NodePools and its process options."""

    pools: Mapping[nodes.NodeKind, PoolSettings] = field(default_factory=manifests.default_pools)
    process: ProcessSettings = field(default_factory=ProcessSettings)
    registration_delay: str = "0s"
    """The KWOKNodeClass's ``nodeRegistrationDelay``: how long a launched node takes to appear."""


def start(kube: Kubectl, cluster_dir: Path, setup: KarpenterSetup | None = None) -> int:
    """Install the CRDs and objects (a resumed cluster keeps what it has) and start the process."""
    s = setup or KarpenterSetup()
    folder = daemon.state_dir(cluster_dir)
    control.install(kube, s.pools, registration_delay=s.registration_delay)
    assert kube.kubeconfig is not None
    return daemon.start(kube.kubeconfig, folder, s.process)


def stop(cluster_dir: Path) -> bool:
    return daemon.stop(daemon.state_dir(cluster_dir))


def enabled(cluster_dir: Path) -> bool:
    """The cluster was started with Karpenter (its catalog is there)."""
    return daemon.catalog_path(daemon.state_dir(cluster_dir)).is_file()


def alive(cluster_dir: Path) -> bool:
    return daemon.alive(daemon.state_dir(cluster_dir))
