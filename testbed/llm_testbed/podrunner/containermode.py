"""The runner's container mode: a pod's launch plans turned into ``podman run`` of its images.

The runner stays what it is (:mod:`.runner`: watch, start, supervise, kill); with container mode on it
asks this object three things. :meth:`ContainerMode.plans`: the pod's process-mode plans, or, when every
image of the pod is in the local storage, the same plans as ``podman run`` command lines (and the pod's
volumes handed over as a kubelet hands them to a container: ``fsGroup``, writable emptyDir, the
termination-message file). :meth:`ContainerMode.release`: once a container's process tree is dead,
remove the container (podman keeps the record of a container whose ``conmon`` was killed with it).
:meth:`ContainerMode.remove_all`: at shutdown, every container of the cluster, running or not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from llm_testbed.podrunner import containers, incontainer, process
from llm_testbed.podrunner.plan import ContainerPlan
from llm_testbed.podrunner.security import security_of


class ContainerMode:
    def __init__(self, cluster: str, api_env: Mapping[str, str], site_dir: Path) -> None:
        self.cluster = cluster
        self.api_env = dict(api_env)
        self.site_dir = site_dir
        self.podman = containers.make_podman()
        self.images = containers.Images(self.podman)
        self.in_image: set[tuple[str, str]] = set()  # (pod uid, container) run through podman

    async def plans(
        self,
        pod: Mapping[str, Any],
        plans: Mapping[str, ContainerPlan],
        specs: Mapping[str, Mapping[str, Any]],
        *,
        volume_dirs: Mapping[str, str | None],
        pod_dir: Path,
        pod_ip: str,
        host_ip: str,
        say: Callable[[str], None],
    ) -> dict[str, ContainerPlan]:
        """The pod's plans as ``podman run`` of its images, or unchanged when an image is missing."""
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        images, missing = await self.images.of_pod(pod)
        if missing:
            say(f"{key}: runs as processes: image {', '.join(sorted(set(missing)))} is not in the local "
                "podman storage (container mode runs only images `make images` built)")  # fmt: skip
            return dict(plans)
        uid = str(pod["metadata"]["uid"])
        fs_group = security_of(pod, specs[next(iter(specs))]).fs_group if specs else None
        containers.volume_owners(pod, volume_dirs, fs_group)
        out: dict[str, ContainerPlan] = {}
        for name, cplan in plans.items():
            containers.message_file(pod_dir / f"{name}.termination-log")
            containers.make_sources(cplan.mounts)
            cgroup = Path(cplan.cgroup) if cplan.cgroup else None
            out[name] = incontainer.container_run_plan(
                pod, specs[name], cplan,
                podman=self.podman.argv(), podman_env=containers.PODMAN_ENV, cluster=self.cluster,
                image_user=images[name].user, image_pythonpath=images[name].pythonpath,
                pod_ip=pod_ip, host_ip=host_ip, api_env=self.api_env,
                site_dir=str(self.site_dir), cgroup_parent=process.cgroup_parent(cgroup),
                extra=containers.run_flags(),
            )  # fmt: skip
            self.in_image.add((uid, name))
        say(f"{key}: runs in containers of {', '.join(sorted({i.reference for i in images.values()}))}")
        return out

    async def release(self, pod_uid: str, container: str) -> None:
        """Remove the container once its processes are dead (nothing for a process-mode container)."""
        if (pod_uid, container) in self.in_image:
            await containers.remove(self.podman, incontainer.container_name(self.cluster, pod_uid, container))

    async def forget(self, pod_uid: str) -> None:
        """The pod is gone: remove whatever is left of its containers."""
        for uid, name in sorted(self.in_image):
            if uid == pod_uid:
                await self.release(uid, name)
                self.in_image.discard((uid, name))

    def remove_all(self) -> list[str]:
        """Every container of this cluster, removed (the runner stops)."""
        self.in_image.clear()
        return containers.remove_all(self.cluster, self.podman)
