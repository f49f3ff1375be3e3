"""From a pod spec to what the runner launches for each container (pure: no I/O).

The image is not pulled: the container's ``command`` + ``args`` run with the runner's own Python
environment (its venv first on ``PATH``); ``programs`` maps a few image commands to local binaries
(``etcd`` -> the pinned etcd). Inside a pod its loopback is its own: ``0.0.0.0`` and ``127.0.0.1`` in
the argv become the pod IP, so two pods that listen on the same port do not collide.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_testbed.podrunner.expand import expand

LOOPBACK_ALIASES = ("0.0.0.0", "127.0.0.1")  # noqa: S104 - rewritten to the pod IP in argv
_LABEL_REF = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


class PlanError(ValueError):
    """The pod asks for something the runner cannot do; the message names the field and the reason."""


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def byte_size(where: str, text: str) -> int:
    """A resource quantity in bytes (``64Mi``, ``1.5Gi``, ``500M``, ``1048576``)."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise PlanError(f"{where}: {text!r} is not a byte quantity (e.g. 64Mi, 1Gi)")
    return int(float(match.group(1)) * _UNITS.get(match.group(2) or "", 1))


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False
    tmpfs_bytes: int | None = None
    """Mount a tmpfs of this size at ``target`` instead of binding ``source`` (a node's shm fault)."""


@dataclass(frozen=True)
class ContainerPlan:
    """Everything :mod:`.launch` needs to start one container (serialised to JSON for it)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    hostname: str
    hosts_file: str
    mounts: list[Mount] = field(default_factory=list)
    cgroup: str | None = None
    cpu_cgroup: str | None = None
    """A cgroup v1 cpu group to join as well (CPU quota of a node's cpu fault), when v2 has no cpu."""
    in_image: bool = False
    """``argv`` runs the pod's image itself (``podman run``, :mod:`.incontainer`): the launcher only
    joins the cgroups and ``exec``s it; no namespaces or mounts of its own."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "argv": self.argv,
            "env": self.env,
            "cwd": self.cwd,
            "hostname": self.hostname,
            "hosts_file": self.hosts_file,
            "mounts": [
                {
                    "source": m.source,
                    "target": m.target,
                    "read_only": m.read_only,
                    "tmpfs_bytes": m.tmpfs_bytes,
                }
                for m in self.mounts
            ],
            "cgroup": self.cgroup,
            "cpu_cgroup": self.cpu_cgroup,
            "in_image": self.in_image,
        }


def field_value(pod: Mapping[str, Any], path: str, pod_ip: str, host_ip: str) -> str:
    """The value of a downward-API ``fieldRef.fieldPath``."""
    meta, spec = pod.get("metadata", {}), pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path])
    m = _LABEL_REF.match(path)
    if m:
        return str(meta.get(m.group(1), {}).get(m.group(2), ""))
    raise PlanError(f"env fieldRef.fieldPath {path!r} is not supported by the local pod runner")


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    pod_ip: str,
    host_ip: str,
    base: Mapping[str, str],
) -> dict[str, str]:
    """``base`` overlaid with the container's ``env``, each value expanded over the ones before it."""
    if container.get("envFrom"):
        raise PlanError(
            f"container {container.get('name')}: envFrom is not supported by the local pod runner"
        )
    env = dict(base)
    for item in container.get("env", []) or []:
        name = item["name"]
        if "valueFrom" in item:
            source = item["valueFrom"] or {}
            if "fieldRef" in source:
                env[name] = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip, host_ip)
                continue
            kind = next(iter(source), "valueFrom")
            optional = bool((source.get(kind) or {}).get("optional"))
            if optional:
                continue
            raise PlanError(
                f"container {container.get('name')}: env {name}: valueFrom.{kind} is not supported "
                "by the local pod runner"
            )
        env[name] = expand(str(item.get("value", "")), env)
    return env


def container_argv(
    container: Mapping[str, Any], env: Mapping[str, str], *, pod_ip: str, programs: Mapping[str, str]
) -> list[str]:
    """``command`` + ``args`` expanded; local program for known image commands; loopback -> pod IP."""
    command = list(container.get("command") or [])
    if not command:
        raise PlanError(
            f"container {container.get('name')}: command is required: the local pod runner does not "
            "pull images, so it cannot use an image's entrypoint"
        )
    argv = [expand(str(a), env) for a in [*command, *(container.get("args") or [])]]
    argv[0] = programs.get(argv[0], argv[0])
    out = []
    for arg in argv:
        for alias in LOOPBACK_ALIASES:
            arg = arg.replace(alias, pod_ip)
        out.append(arg)
    return out


def hostname(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec", {})
    return str(spec.get("hostname") or pod["metadata"]["name"])[:63]


def mounts_for(
    container: Mapping[str, Any],
    volume_dirs: Mapping[str, str | None],
    read_only: Collection[str] = (),
) -> list[Mount]:
    """The container's ``volumeMounts`` as bind mounts (volumes mapped to ``None`` are left out; those in
    ``read_only`` are mounted read-only whatever the mount says)."""
    mounts = []
    for vm in container.get("volumeMounts", []) or []:
        name = vm["name"]
        if name not in volume_dirs:
            raise PlanError(f"container {container.get('name')}: volumeMount {name!r} names no volume")
        source = volume_dirs[name]
        if source is None:
            continue
        if vm.get("subPath"):
            source = f"{source.rstrip('/')}/{vm['subPath']}"
        mounts.append(
            Mount(source, str(vm["mountPath"]), bool(vm.get("readOnly", False)) or name in read_only)
        )
    return mounts


def container_plan(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    pod_ip: str,
    host_ip: str,
    base_env: Mapping[str, str],
    programs: Mapping[str, str],
    volume_dirs: Mapping[str, str | None],
    hosts_file: str,
    cgroup: str | None = None,
    read_only: Collection[str] = (),
) -> ContainerPlan:
    host = hostname(pod)
    env = container_env(pod, container, pod_ip=pod_ip, host_ip=host_ip, base={**base_env, "HOSTNAME": host})
    return ContainerPlan(
        name=str(container["name"]),
        argv=container_argv(container, env, pod_ip=pod_ip, programs=programs),
        env=env,
        cwd=container.get("workingDir") or None,
        hostname=host,
        hosts_file=hosts_file,
        mounts=mounts_for(container, volume_dirs, read_only),
        cgroup=cgroup,
    )


def check_pod(pod: Mapping[str, Any]) -> None:
    """Reject pod features the runner does not implement (one clear reason)."""
    spec = pod.get("spec", {})
    for i, item in enumerate(spec.get("initContainers") or []):
        policy = item.get("restartPolicy")
        if policy not in (None, "Always"):
            raise PlanError(f"spec.initContainers[{i}].restartPolicy: {policy!r}: only Always (a sidecar) "
                            "or unset")  # fmt: skip
    if not spec.get("containers"):
        raise PlanError("spec.containers: no container to run")
