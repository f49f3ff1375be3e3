"""What Kueue decided for a job's Workload: queued, admitted (how many workers, which flavor), evicted.

Pure: reads a Workload body (kueue.x-k8s.io/v1beta2) and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from llm_operator.builders.workload import PODSET
from llm_operator.policy.status import condition as status_condition

State = Literal["Queued", "Admitted", "Evicted", "Finished"]
PREEMPTED = "Preempted"


@dataclass(frozen=True)
class Admission:
    """Kueue's decision as the operator acts on it."""

    state: State
    count: int = 0
    """Workers admitted (between minCount and count); 0 unless Admitted or Evicted."""
    requested: int = 0
    """The podSet's count: the size asked for."""
    flavors: tuple[str, ...] = ()
    """ResourceFlavors assigned to the workers' podSet."""
    reason: str = ""
    message: str = ""
    cleared: bool = False
    """Evicted and the admission already released (waiting to be admitted again)."""
    conditions: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    topology: dict[str, Any] | None = field(default=None, compare=False)
    """The workers' podSet ``topologyAssignment`` (Kueue TAS), None without one."""

    @property
    def admitted(self) -> bool:
        """Workers may run."""
        return self.state == "Admitted"

    @property
    def preempted(self) -> bool:
        return self.reason == PREEMPTED


QUEUED = Admission("Queued", reason="Queued", message="waiting for Kueue to create the Workload")


def _condition(conditions: list[dict[str, Any]], ctype: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == ctype), None)


def _true(cond: dict[str, Any] | None) -> bool:
    return cond is not None and cond.get("status") == "True"


def read(workload: dict[str, Any] | None) -> Admission:
    """Ordered rules, first match wins: Finished, Evicted, Admitted, else Queued."""
    if workload is None:
        return QUEUED
    status = workload.get("status") or {}
    conditions = list(status.get("conditions") or [])
    podsets = (workload.get("spec") or {}).get("podSets") or []
    podset = next((p for p in podsets if p.get("name") == PODSET), podsets[0] if podsets else {})
    requested = int(podset.get("count") or 0)
    admission = status.get("admission") or {}
    assignments = admission.get("podSetAssignments") or []
    assigned = next(
        (a for a in assignments if a.get("name") == PODSET), assignments[0] if assignments else None
    )
    count = 0
    flavors: tuple[str, ...] = ()
    topology: dict[str, Any] | None = None
    if assigned is not None:
        topology = assigned.get("topologyAssignment") or None
        count = int(assigned["count"]) if assigned.get("count") is not None else requested
        flavors = tuple(sorted(set((assigned.get("flavors") or {}).values())))

    def verdict(state: State, admitted: int, reason: str, message: str, cleared: bool = False) -> Admission:
        return Admission(
            state, admitted, requested, flavors, reason, message, cleared, tuple(conditions), topology
        )

    finished = _condition(conditions, "Finished")
    if finished is not None and _true(finished):
        return verdict("Finished", 0, finished.get("reason", "Finished"), finished.get("message", ""))
    evicted = _condition(conditions, "Evicted")
    reserved = _true(_condition(conditions, "QuotaReserved"))
    if evicted is not None and _true(evicted):
        return verdict(
            "Evicted",
            count if reserved else 0,
            evicted.get("reason", "Evicted"),
            evicted.get("message", ""),
            cleared=not reserved and not admission,
        )
    if _true(_condition(conditions, "Admitted")) and assigned is not None:
        note = f"admitted {count} of {requested} workers" + (
            " (partial admission)" if count < requested else ""
        )
        return verdict("Admitted", count, "Admitted", note)
    pending = _condition(conditions, "QuotaReserved")
    requeued = _condition(conditions, "Requeued")
    message = (pending or {}).get("message", "") or "waiting for quota"
    if requeued is not None and requeued.get("reason") == PREEMPTED:
        return verdict("Queued", 0, "Requeued", f"preempted earlier, queued again: {message}")
    return verdict("Queued", 0, "Queued", message)


def flavor_placement(flavor: dict[str, Any] | None) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """A ResourceFlavor's node labels and tolerations (what the admitted workers must carry)."""
    spec = (flavor or {}).get("spec") or {}
    selector = {str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()}
    return selector, [dict(t) for t in spec.get("tolerations") or []]


def condition(admission: Admission, generation: int) -> dict[str, Any]:
    """The job's ``Admitted`` condition (Kueue's verdict in the job's own status)."""
    reason = admission.reason if admission.state != "Admitted" else "Admitted"
    if admission.state == "Evicted":
        reason = PREEMPTED if admission.preempted else "Evicted"
    return status_condition("Admitted", admission.admitted, reason, admission.message, generation)
