"""Pod status documents written by the runner (pure): what a kubelet reports for real processes."""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerState:
    """What the runner knows of one container (mutable: the runner updates it as the process lives)."""

    name: str
    image: str
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None  # set once the process has exited
    restart_count: int = 0
    waiting_reason: str | None = None  # e.g. ContainerCreating, CreateContainerError, CrashLoopBackOff
    waiting_message: str = ""
    pid: int | None = None
    ready: bool = False
    message: str = ""  # the termination message of the last exit (terminationMessagePath, or log tail)
    init: bool = False  # one of spec.initContainers
    sidecar: bool = False  # an init container with restartPolicy: Always (a native sidecar)

    @property
    def running(self) -> bool:
        return self.started_at is not None and self.exit_code is None and self.waiting_reason is None


def exit_code_of(returncode: int) -> int:
    """A process's exit status as Kubernetes reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def terminated_reason(code: int) -> str:
    if code == 0:
        return "Completed"
    return "Error"


def container_status(c: ContainerState) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": c.name,
        "image": c.image,
        "imageID": f"podrunner://{c.image}",
        "restartCount": c.restart_count,
        "ready": (c.ready and c.running) or (c.init and not c.sidecar and c.exit_code == 0),
        "started": c.running,
    }
    if c.pid is not None:
        out["containerID"] = f"podrunner://{c.pid}"
    if c.waiting_reason is not None:
        state: dict[str, Any] = {"waiting": {"reason": c.waiting_reason}}
        if c.waiting_message:
            state["waiting"]["message"] = c.waiting_message
        if c.exit_code is not None:
            out["lastState"] = {"terminated": _terminated(c)}
        out["state"] = state
    elif c.exit_code is not None:
        out["state"] = {"terminated": _terminated(c)}
    elif c.started_at is not None:
        out["state"] = {"running": {"startedAt": c.started_at}}
    else:
        out["state"] = {"waiting": {"reason": "ContainerCreating"}}
    return out


def _terminated(c: ContainerState) -> dict[str, Any]:
    assert c.exit_code is not None
    term: dict[str, Any] = {
        "exitCode": c.exit_code,
        "reason": terminated_reason(c.exit_code),
        "startedAt": c.started_at,
        "finishedAt": c.finished_at,
    }
    if c.exit_code > 128 and c.exit_code - 128 < signal.NSIG:
        term["signal"] = c.exit_code - 128
    if c.message:
        term["message"] = c.message
    return term


def pod_phase(
    restart_policy: str, containers: Sequence[ContainerState], inits: Sequence[ContainerState] = ()
) -> str:
    """Pending until every container started once; Succeeded/Failed when all are done for good (the main
    containers decide: sidecars never do). A regular init container failed for good: Failed."""
    if init_failed(restart_policy, inits):
        return "Failed"
    if any(c.started_at is None and c.exit_code is None for c in containers):
        return "Pending"
    if any(c.running or c.waiting_reason == "CrashLoopBackOff" for c in containers):
        return "Running"
    if all(c.exit_code is not None for c in containers):
        if all(c.exit_code == 0 for c in containers):
            return "Succeeded"
        return "Failed" if restart_policy == "Never" else "Running"
    return "Running"


def should_restart(restart_policy: str, exit_code: int) -> bool:
    return restart_policy == "Always" or (restart_policy == "OnFailure" and exit_code != 0)


def init_failed(policy: str, inits: Sequence[ContainerState]) -> bool:
    """A regular init container failed for good: the pod is Failed, its main containers never start."""
    return policy == "Never" and any(not c.sidecar and c.exit_code not in (None, 0) for c in inits)


def initialized(inits: Sequence[ContainerState]) -> bool:
    """Every regular init container completed and every sidecar started once (condition Initialized)."""
    return all(
        (c.started_at is not None or c.exit_code is not None) if c.sidecar else c.exit_code == 0
        for c in inits
    )


def all_ready(containers: Sequence[ContainerState], inits: Sequence[ContainerState] = ()) -> bool:
    """Condition Ready: every main container and every sidecar running and ready."""
    return all(c.ready and c.running for c in [*containers, *(i for i in inits if i.sidecar)])


def _condition(kind: str, ok: bool, at: str, reason: str | None = None) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": at}
    if reason and not ok:
        cond["reason"] = reason
    return cond


def pod_status(
    pod: Mapping[str, Any],
    containers: Sequence[ContainerState],
    *,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    at: str,
    inits: Sequence[ContainerState] = (),
) -> dict[str, Any]:
    """The whole ``status`` of a pod the runner runs (written with a merge patch)."""
    policy = pod.get("spec", {}).get("restartPolicy", "Always")
    phase = pod_phase(policy, containers, inits)
    ready = all_ready(containers, inits)
    done = phase in ("Succeeded", "Failed")
    reason = "PodCompleted" if done else "ContainersNotReady"
    init_done = initialized(inits)
    conditions = [
        _condition("PodScheduled", True, at),
        _condition(
            "Initialized", init_done or done, at, "PodCompleted" if done else "ContainersNotInitialized"
        ),
        _condition("ContainersReady", ready, at, reason),
        _condition("Ready", ready, at, reason),
    ]
    for gate in pod.get("spec", {}).get("readinessGates", []) or []:
        conditions.append(_condition(gate["conditionType"], True, at))
    out: dict[str, Any] = {
        "phase": phase,
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}] if host_ip else [],
        "startTime": start_time,
        "conditions": conditions,
        "containerStatuses": [container_status(c) for c in containers],
    }
    if inits:
        out["initContainerStatuses"] = [container_status(c) for c in inits]
    return out
