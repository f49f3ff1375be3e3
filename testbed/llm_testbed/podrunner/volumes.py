"""Where each pod volume lives on this machine (pure: paths only; the runner creates them).

- ``persistentVolumeClaim`` bound to a PV: ``<state>/volumes/pv/<pv-name>``, shared by every pod that
  mounts the claim (an FSx claim behaves like FSx: one file system seen from every node).
- ``emptyDir``: ``<state>/pods/<uid>/volumes/<name>``; with ``medium: Memory`` a folder under
  ``/dev/shm`` (RAM), so a pod's ``/dev/shm`` mount is private to it and still memory-backed.
- ``hostPath``: the path itself.
- ``configMap``, ``secret``, ``downwardAPI``, ``projected`` (service-account tokens included):
  ``<state>/pods/<uid>/volumes/<name>``, filled by :mod:`.apivolumes`, mounted read-only.
- Others (CSI, ephemeral, image volumes...): not provided; their mounts are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from llm_testbed.podrunner.plan import PlanError
from llm_testbed.podrunner.projected import API_VOLUME_KINDS


class VolumeNotReady(PlanError):
    """A claim is not bound yet: the pod waits (ContainerCreating), like on a real node."""


def pv_dir(state_dir: PurePath, pv_name: str) -> PurePath:
    """The one host folder of a bound PersistentVolume, shared by every pod that mounts its claim."""
    return state_dir / "volumes" / "pv" / pv_name


def pod_dir(state_dir: PurePath, uid: str) -> PurePath:
    return state_dir / "pods" / uid


def volume_dirs(
    pod: Mapping[str, Any],
    *,
    state_dir: PurePath,
    shm_dir: PurePath,
    claim_volumes: Mapping[str, str | None],
) -> dict[str, str | None]:
    """Volume name -> host directory (``None``: not provided). ``claim_volumes``: claim -> PV name."""
    uid = pod["metadata"]["uid"]
    out: dict[str, str | None] = {}
    for vol in pod.get("spec", {}).get("volumes", []) or []:
        name = vol["name"]
        if "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]["claimName"]
            pv = claim_volumes.get(claim)
            if not pv:
                raise VolumeNotReady(f"volume {name}: PersistentVolumeClaim {claim} is not bound to a volume")
            out[name] = str(pv_dir(state_dir, pv))
        elif "emptyDir" in vol:
            medium = (vol["emptyDir"] or {}).get("medium", "")
            root = shm_dir / uid if medium == "Memory" else pod_dir(state_dir, uid) / "volumes"
            out[name] = str(root / name)
        elif "hostPath" in vol:
            out[name] = str(vol["hostPath"]["path"])
        elif any(kind in vol for kind in API_VOLUME_KINDS):
            out[name] = str(pod_dir(state_dir, uid) / "volumes" / name)
        else:
            out[name] = None
    return out


def claims(pod: Mapping[str, Any]) -> list[str]:
    """Names of the PersistentVolumeClaims the pod mounts."""
    return [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod.get("spec", {}).get("volumes", []) or []
        if "persistentVolumeClaim" in v
    ]


def read_only(pod: Mapping[str, Any]) -> set[str]:
    """Volumes a kubelet always mounts read-only (their files come from the API)."""
    vols = pod.get("spec", {}).get("volumes", []) or []
    return {v["name"] for v in vols if any(kind in v for kind in API_VOLUME_KINDS)}
