"""Init containers and native sidecars, the kubelet's rules (pure: no I/O).

``spec.initContainers`` run in order before the main containers. A regular one runs to completion; a
failure fails the pod under ``restartPolicy: Never`` and is retried (with back-off) otherwise. One with
``restartPolicy: Always`` is a native sidecar: it is started (the next one waits for that, not for its
end), restarted whenever it exits while the pod runs, stopped once the main containers are done, and
never decides the pod's phase.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_testbed.podrunner import status
from llm_testbed.podrunner.plan import PlanError
from llm_testbed.podrunner.status import ContainerState


def is_sidecar(spec: Mapping[str, Any]) -> bool:
    return spec.get("restartPolicy") == "Always"


def init_specs(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(pod.get("spec", {}).get("initContainers") or [])


def spec_of(pod: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The spec of container ``name``, main or init (names are unique across both in a pod)."""
    spec = pod.get("spec", {})
    for item in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        if item["name"] == name:
            return dict(item)
    raise PlanError(f"spec.containers: no container named {name!r}")


def init_states(pod: Mapping[str, Any]) -> list[ContainerState]:
    return [
        ContainerState(name=s["name"], image=str(s.get("image", "")), init=True, sidecar=is_sidecar(s))
        for s in init_specs(pod)
    ]


def should_restart(
    policy: str, c: ContainerState, exit_code: int, *, main_done: bool, injected: bool
) -> bool:
    """Whether the container starts again after exiting with ``exit_code``."""
    if injected:
        return False
    if c.sidecar:
        return not main_done
    if c.init:
        return exit_code != 0 and policy != "Never"
    return status.should_restart(policy, exit_code)
