"""Node faults the pod runner makes real for the pods it starts on a marked node (``llmjob chaos fault``).

Pure: which fault a node carries (its annotations, ``localcluster/marks.py``) and how a container's
mounts change. Each fault is real for the processes in the pod, not a hint in their environment:

- ``readonly-volumes``: every PersistentVolumeClaim volume is bind-mounted read-only in the container's
  mount namespace: writes fail with EROFS (a broken FSx client, a full or read-only file system).
- ``shm``: the memory-backed emptyDir (the worker's /dev/shm) is a tmpfs of that size in the container's
  mount namespace: statvfs shows the size, writes beyond it fail with ENOSPC.
- ``cpu``: the container's processes run in a CPU cgroup with a quota of that many cores (cgroup v2
  ``cpu.max`` where the controller is available, else v1 ``cpu.cfs_quota_us``); applied to the running
  containers of the node as well, when the mark changes (a node that slows down mid-run).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from llm_testbed.localcluster import marks
from llm_testbed.podrunner.plan import Mount, PlanError, byte_size

CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class NodeFaults:
    """What is wrong with a node's pods (nothing by default)."""

    readonly_volumes: bool = False
    cpu_cores: float | None = None
    shm_bytes: int | None = None

    @property
    def any(self) -> bool:
        return self.readonly_volumes or self.cpu_cores is not None or self.shm_bytes is not None


def node_faults(node: Mapping[str, Any] | None) -> NodeFaults:
    """The faults a node's annotations ask for; unparsable values are errors (the pod cannot start)."""
    notes = ((node or {}).get("metadata") or {}).get("annotations") or {}
    cpu: float | None = None
    if notes.get(marks.NODE_FAULT_CPU):
        try:
            cpu = float(notes[marks.NODE_FAULT_CPU])
        except ValueError:
            raise PlanError(f"{marks.NODE_FAULT_CPU}: not a number of cores") from None
        if cpu <= 0:
            raise PlanError(f"{marks.NODE_FAULT_CPU}: must be > 0 cores")
    shm = notes.get(marks.NODE_FAULT_SHM)
    return NodeFaults(
        readonly_volumes=str(notes.get(marks.NODE_FAULT_READONLY, "")).lower() == "true",
        cpu_cores=cpu,
        shm_bytes=byte_size(marks.NODE_FAULT_SHM, shm) if shm else None,
    )


def _volume_kinds(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    """mountPath -> "pvc" | "memory" | "other" for the container's volume mounts."""
    kinds: dict[str, str] = {}
    for vol in pod.get("spec", {}).get("volumes", []) or []:
        if "persistentVolumeClaim" in vol:
            kinds[vol["name"]] = "pvc"
        elif (vol.get("emptyDir") or {}).get("medium") == "Memory":
            kinds[vol["name"]] = "memory"
        else:
            kinds[vol["name"]] = "other"
    return {
        str(vm["mountPath"]): kinds.get(vm["name"], "other") for vm in container.get("volumeMounts") or []
    }


def apply_faults(
    pod: Mapping[str, Any], container: Mapping[str, Any], mounts: list[Mount], faults: NodeFaults
) -> list[Mount]:
    """The container's mounts with the node's volume faults applied."""
    kinds = _volume_kinds(pod, container)
    out = []
    for m in mounts:
        kind = kinds.get(m.target, "other")
        if faults.readonly_volumes and kind == "pvc":
            m = replace(m, read_only=True)
        if faults.shm_bytes is not None and kind == "memory":
            m = replace(m, tmpfs_bytes=faults.shm_bytes)
        out.append(m)
    return out


def cpu_quota_us(cores: float | None) -> int:
    """cfs quota per CPU_PERIOD_US for ``cores`` (-1: no limit); at least 1 ms."""
    if cores is None:
        return -1
    return max(1000, int(cores * CPU_PERIOD_US))


def cpu_max(cores: float | None) -> str:
    """The cgroup v2 ``cpu.max`` line for ``cores`` (``max``: no limit)."""
    quota = cpu_quota_us(cores)
    return f"{'max' if quota < 0 else quota} {CPU_PERIOD_US}"


TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096  # what the kubelet keeps of the file
LOG_TAIL_LINES = 80  # FallbackToLogsOnError: the kubelet's tail of the log


def termination_message(written: str, policy: str, exit_code: int, log_tail: str) -> str:
    """What the kubelet reports as the container's termination message: the file's content; with
    FallbackToLogsOnError and an empty file after a failure, the log's last lines."""
    text = written[:TERMINATION_MESSAGE_LIMIT]
    if not text.strip() and policy == "FallbackToLogsOnError" and exit_code != 0:
        lines = log_tail.splitlines()[-LOG_TAIL_LINES:]
        text = "\n".join(lines)[-2048:]
    return text
