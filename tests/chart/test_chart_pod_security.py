"""The chart's own pods meet Pod Security "restricted", for every value set the chart tests use.

The rules are those of the Kubernetes Pod Security Standards (baseline and restricted, as enforced by the
PodSecurity admission): checked here on every pod spec the chart renders, without a cluster. The cluster
tier installs the chart into namespaces that enforce "restricted" (test_chart_cluster.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from chart_helpers import VALUE_SET_NAMES, Helm, value_sets

# Restricted allows only these volume types (Pod Security Standards, "Volume Types").
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(kind/name, pod spec)`` of every object that makes pods."""
    for obj in objects:
        kind, spec = obj["kind"], obj.get("spec", {})
        where = f"{kind}/{obj['metadata']['name']}"
        if kind == "Pod":
            yield where, spec
        elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            yield where, spec["template"]["spec"]
        elif kind == "CronJob":
            yield where, spec["jobTemplate"]["spec"]["template"]["spec"]


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What in a pod spec the "restricted" profile refuses (baseline's rules included); empty if none."""
    found: list[str] = []
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            found.append(f"{host}: true")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']} of type {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod_ctx = spec.get("securityContext", {})
    for sysctl in pod_ctx.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']}")
    containers = [
        *spec.get("initContainers", []),
        *spec.get("containers", []),
        *spec.get("ephemeralContainers", []),
    ]
    for c in containers:
        ctx = c.get("securityContext", {})
        name = c["name"]
        if ctx.get("privileged"):
            found.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot is not true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile {seccomp!r}")
        caps = ctx.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            found.append(f"{name}: capabilities do not drop ALL")
        extra = set(caps.get("add", [])) - {"NET_BIND_SERVICE"}
        if extra:
            found.append(f"{name}: adds capabilities {sorted(extra)}")
        if ctx.get("procMount", "Default") != "Default":
            found.append(f"{name}: procMount {ctx['procMount']}")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                found.append(f"{name}: hostPort {port['hostPort']}")
    return found


@pytest.mark.parametrize("name", VALUE_SET_NAMES)
def test_every_pod_the_chart_renders_meets_restricted(helm: Helm, name: str) -> None:
    objects = helm.template(value_sets()[name])
    specs = list(pod_specs(objects))
    assert specs, "the chart renders no pod-making object"
    problems = {where: restricted_violations(spec) for where, spec in specs}
    assert not any(problems.values()), f"value set {name}: {problems}"


@pytest.fixture(scope="module")
def default_pod(helm: Helm) -> dict[str, Any]:
    (spec,) = [spec for _, spec in pod_specs(helm.template({}))]
    return spec


def _weaken(spec: dict[str, Any], what: str) -> None:
    pod, ctx = spec["securityContext"], spec["containers"][0]["securityContext"]
    if what == "hostPath":
        spec.setdefault("volumes", []).append({"name": "host", "hostPath": {"path": "/"}})
    elif what == "hostNetwork":
        spec["hostNetwork"] = True
    elif what == "allowPrivilegeEscalation":
        ctx["allowPrivilegeEscalation"] = True
    elif what == "IPC_LOCK":
        ctx["capabilities"]["add"] = ["IPC_LOCK"]
    elif what == "runAsNonRoot":
        pod.pop("runAsNonRoot", None)
        ctx.pop("runAsNonRoot", None)
    elif what == "seccompProfile":
        pod.pop("seccompProfile", None)
        ctx.pop("seccompProfile", None)


@pytest.mark.parametrize(
    "what",
    ["hostPath", "hostNetwork", "allowPrivilegeEscalation", "IPC_LOCK", "runAsNonRoot", "seccompProfile"],
)
def test_the_check_refuses_what_restricted_refuses(default_pod: dict[str, Any], what: str) -> None:
    assert restricted_violations(default_pod) == []
    weakened = copy.deepcopy(default_pod)
    _weaken(weakened, what)
    assert restricted_violations(weakened), f"the check let {what} through"
