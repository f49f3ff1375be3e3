"""A pod's container as a ``podman run`` command line (pure: no I/O).

In container mode the launcher does not build the container itself: it ``exec``s the argv made here,
and podman + runc run the pod's image. What goes into it, in Kubernetes terms:

- ``command`` replaces the image's ENTRYPOINT (``--entrypoint``, and the image's CMD is dropped),
  ``args`` replace its CMD; neither: the image's own entry point and CMD. Both are ``$(VAR)``-expanded
  and ``0.0.0.0``/``127.0.0.1`` in them become the pod IP, as in process mode.
- env: the pod's own ``env`` over the service env the runner gives every pod (API server address, pod
  IP, hostname, the bind shim); never this machine's PATH, PYTHONPATH or virtualenv. The image's own
  ENV stays (podman merges it below ours).
- volumes: bind mounts of the folders the process mode mounts (PVCs, emptyDir, API volumes, the
  termination-message file); the memory-backed emptyDir at ``/dev/shm`` becomes ``--shm-size`` of its
  ``sizeLimit`` (a node's shm fault: that size); another tmpfs mount a ``--mount type=tmpfs``.
- network: the host's (``--network host``): the pod IP is an address of this machine's loopback, so
  everything that works between process-mode pods works between containers. ``--hostname`` is the
  pod's, ``/etc/hosts`` the pod's hosts file (``--no-hosts`` + a read-only bind).
- cgroup: ``--cgroup-parent`` is the runner's cgroup of this container, so killing that cgroup
  kills the container's processes as well (:mod:`.process`).
- never pulled (``--pull never``), no proxy variables of this machine (``--http-proxy=false``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from llm_testbed.podrunner.expand import expand
from llm_testbed.podrunner.plan import (
    LOOPBACK_ALIASES,
    ContainerPlan,
    Mount,
    PlanError,
    byte_size,
    container_env,
)
from llm_testbed.podrunner.security import security_flags, security_of

SHM_PATH = "/dev/shm"
SITE_MOUNT = "/run/llmjob-podrunner/site"
"""Where a container sees the runner's sitecustomize (wildcard binds -> the pod IP, as in process mode)."""
LABEL_CLUSTER = "dev.elasticllm.podrunner.cluster"
LABEL_POD = "dev.elasticllm.podrunner.pod-uid"


@dataclass(frozen=True)
class ImageArgv:
    """The pod's ``command`` and ``args`` as podman takes them (``None``: the image's own)."""

    entrypoint: list[str] | None
    args: list[str] | None


def _rewrite(arg: str, env: Mapping[str, str], pod_ip: str) -> str:
    arg = expand(arg, env)
    for alias in LOOPBACK_ALIASES:
        arg = arg.replace(alias, pod_ip)
    return arg


def image_argv(container: Mapping[str, Any], env: Mapping[str, str], pod_ip: str) -> ImageArgv:
    """Kubernetes' rules for ``command``/``args`` against the image's ENTRYPOINT/CMD."""
    command = [_rewrite(str(a), env, pod_ip) for a in container.get("command") or []]
    args = [_rewrite(str(a), env, pod_ip) for a in container.get("args") or []]
    if command:
        return ImageArgv(command, args)  # the image's CMD is dropped even when args is empty
    return ImageArgv(None, args or None)


def shm_limit(pod: Mapping[str, Any], container: Mapping[str, Any]) -> int | None:
    """The ``sizeLimit`` of the memory emptyDir the container mounts at /dev/shm (None: no such
    volume, or no limit); the container's memory limit caps it, as it caps a kubelet's tmpfs."""
    volumes = {v["name"]: v for v in pod.get("spec", {}).get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        empty = (volumes.get(mount["name"]) or {}).get("emptyDir") or {}
        if mount.get("mountPath") != SHM_PATH or empty.get("medium") != "Memory":
            continue
        limits = [byte_size(f"volume {mount['name']}: emptyDir.sizeLimit", str(empty["sizeLimit"]))
                  ] if empty.get("sizeLimit") else []  # fmt: skip
        memory = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        if memory:
            limits.append(byte_size(f"container {container.get('name')}: resources.limits.memory", memory))
        return min(limits) if limits else None
    return None


def mount_flags(mounts: Sequence[Mount], shm_target: bool) -> list[str]:
    """``-v``/``--mount`` flags; the /dev/shm mount is left out when ``--shm-size`` stands for it."""
    flags: list[str] = []
    for m in mounts:
        if shm_target and m.target == SHM_PATH:
            continue
        if m.tmpfs_bytes:
            flags += ["--mount", f"type=tmpfs,destination={m.target},tmpfs-size={m.tmpfs_bytes}"]
            continue
        if "," in m.source or ":" in m.source or ":" in m.target:
            raise PlanError(f"mount {m.target}: podman cannot bind a path with ':' or ',' ({m.source})")
        flags += ["-v", f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}"]
    return flags


@dataclass(frozen=True)
class PodmanRun:
    """Everything a ``podman run`` of one pod container needs beside the pod spec."""

    podman: list[str]
    """``podman`` with its global options (storage, runtime): ``llm_testbed.images.podman.Podman.argv()``."""
    name: str
    image: str
    cluster: str
    pod_uid: str
    hostname: str
    hosts_file: str
    site_dir: str
    env: dict[str, str]
    argv: ImageArgv
    mounts: list[Mount]
    security: list[str]
    cwd: str | None = None
    shm_bytes: int | None = None
    cgroup_parent: str | None = None
    extra: list[str] = field(default_factory=list)
    """Further flags (``--ulimit``...)."""


def run_argv(run: PodmanRun) -> list[str]:
    """The whole ``podman run`` command line (in the foreground: its exit code is the container's)."""
    shm_mount = run.shm_bytes is not None or any(m.target == SHM_PATH and m.tmpfs_bytes for m in run.mounts)
    shm = next((m.tmpfs_bytes for m in run.mounts if m.target == SHM_PATH and m.tmpfs_bytes), run.shm_bytes)
    argv = [*run.podman, "run", "--rm", "--replace", "--name", run.name, "--pull=never"]
    argv += ["--label", f"{LABEL_CLUSTER}={run.cluster}", "--label", f"{LABEL_POD}={run.pod_uid}"]
    argv += ["--network", "host", "--hostname", run.hostname, "--no-hosts", "--http-proxy=false"]
    argv += ["-v", f"{run.hosts_file}:/etc/hosts:ro", "-v", f"{run.site_dir}:{SITE_MOUNT}:ro"]
    if run.cgroup_parent:
        argv += ["--cgroup-parent", run.cgroup_parent]
    argv += run.extra
    argv += run.security
    if shm is not None:
        argv += ["--shm-size", str(shm)]
    argv += mount_flags(run.mounts, shm_mount)
    if run.cwd:
        argv += ["--workdir", run.cwd]
    for name, value in run.env.items():
        argv += ["--env", f"{name}={value}"]
    if run.argv.entrypoint is not None:
        argv += ["--entrypoint", json.dumps(run.argv.entrypoint)]
    return [*argv, run.image, *(run.argv.args or [])]


def container_name(cluster: str, pod_uid: str, container: str) -> str:
    """The podman name of a pod's container (a restart replaces it: ``--replace``)."""
    return f"llmjob-{cluster}-{pod_uid}-{container}"


def service_env(
    api_env: Mapping[str, str], pod_ip: str, hostname: str, image_pythonpath: str = ""
) -> dict[str, str]:
    """What the runner gives every container beside its own ``env``: the API server's address, the pod
    IP and hostname, and the bind shim on PYTHONPATH (:data:`SITE_MOUNT`, after the image's own)."""
    path = f"{image_pythonpath}:{SITE_MOUNT}" if image_pythonpath else SITE_MOUNT
    return {**api_env, "HOSTNAME": hostname, "LLMJOB_PODRUNNER_POD_IP": pod_ip, "PYTHONPATH": path}


def container_run_plan(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    base: ContainerPlan,
    *,
    podman: Sequence[str],
    podman_env: Mapping[str, str],
    cluster: str,
    image_user: str,
    image_pythonpath: str = "",
    pod_ip: str,
    host_ip: str,
    api_env: Mapping[str, str],
    site_dir: str,
    cgroup_parent: str | None,
    extra: Sequence[str] = (),
) -> ContainerPlan:
    """``base`` (the process-mode plan: mounts, hosts file, cgroups) as a ``podman run`` of the image."""
    name = str(container["name"])
    env = container_env(
        pod,
        container,
        pod_ip=pod_ip,
        host_ip=host_ip,
        base=service_env(api_env, pod_ip, base.hostname, image_pythonpath),
    )
    run = PodmanRun(
        podman=list(podman),
        name=container_name(cluster, str(pod["metadata"]["uid"]), name),
        image=str(container.get("image") or ""),
        cluster=cluster,
        pod_uid=str(pod["metadata"]["uid"]),
        hostname=base.hostname,
        hosts_file=base.hosts_file,
        site_dir=site_dir,
        env=env,
        argv=image_argv(container, env, pod_ip),
        mounts=base.mounts,
        security=security_flags(security_of(pod, container), image_user, name),
        cwd=base.cwd,
        shm_bytes=shm_limit(pod, container),
        cgroup_parent=cgroup_parent,
        extra=list(extra),
    )
    return replace(base, argv=run_argv(run), env=dict(podman_env), cwd=None, mounts=[], in_image=True)
