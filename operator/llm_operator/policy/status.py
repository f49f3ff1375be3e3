"""Phase and conditions from what was observed and decided this pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_operator.observe import format_time


@dataclass(frozen=True)
class PhaseInput:
    """Facts the phase depends on."""

    suspended: bool
    terminal_phase: str | None
    """Succeeded/Failed once reached (sticky), or the one reached this pass."""
    started: bool
    ready: int
    active: int
    target: int
    desired: int
    replacing: bool
    """Lost or failed workers are being replaced (a restart in progress)."""
    previous_phase: str
    spares: int = 0
    """Spare workers aimed at beside ``target``: they must exist, but a pending spare does not keep the
    job from Running."""
    demand: int = 0
    """Workers kept Pending beyond target and spares to ask for capacity: they exist, but do not keep the
    job from Running."""


def decide_phase(p: PhaseInput) -> str:
    """Ordered rules, first match wins."""
    if p.terminal_phase:
        return p.terminal_phase
    if p.suspended:
        return "Suspended"
    settled = p.target <= p.ready <= p.target + p.spares and p.active == p.target + p.spares + p.demand
    if settled and p.target > 0:
        return "Running"
    if not p.started:
        return "Pending"
    if p.replacing or (p.previous_phase == "Restarting" and not settled):
        return "Restarting"
    return "Scaling"


MESSAGE_LIMIT = 32768
"""The longest message a metav1.Condition may carry (Kueue's Workload conditions enforce it)."""


def condition(ctype: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    """One status condition, the only builder of one (``lastTransitionTime`` is added by
    :func:`merge_conditions` or :func:`set_condition`)."""
    return {
        "type": ctype,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def conditions(
    phase: str, target: int, desired: int, size_reason: str, message: str, generation: int
) -> list[dict[str, Any]]:
    """Ready, Degraded (smaller than desired), Suspended, and the terminal Complete/Failed."""
    out = [
        condition(
            "Ready",
            phase == "Running",
            phase,
            message if phase != "Running" else "all workers ready",
            generation,
        ),
        degraded_condition(phase, target, desired, size_reason, generation),
        condition(
            "Suspended",
            phase == "Suspended",
            "Suspended" if phase == "Suspended" else "NotSuspended",
            "",
            generation,
        ),
    ]
    if phase in ("Succeeded", "Failed"):
        out.append(
            condition("Complete" if phase == "Succeeded" else "Failed", True, phase, message, generation)
        )
    return out


IDLE_PHASES = ("Suspended", "Queued", "Succeeded", "Failed")
"""Phases in which a job runs no worker on purpose: never Degraded."""


def degraded_condition(
    phase: str, target: int, desired: int, size_reason: str, generation: int, existing: int | None = None
) -> dict[str, Any]:
    """Degraded: the job is smaller than desired. The plan knows the size it aims at (``target``); the API
    server may still refuse workers the plan counted (``existing``: the workers that exist after the pass,
    None when every planned worker was created), and then the job is as small as what exists."""
    idle = phase in IDLE_PHASES
    if existing is not None and existing < min(target, desired):
        return condition(
            "Degraded",
            not idle,
            "WorkersMissing",
            f"{existing} of desired {desired} workers exist" + (f": {size_reason}" if size_reason else ""),
            generation,
        )
    verb = "starting" if phase == "Pending" else "running at"
    return condition(
        "Degraded",
        not idle and target < desired,
        "AtDesiredSize" if target >= desired else "InsufficientCapacity",
        f"{verb} {target} of desired {desired} workers" + (f": {size_reason}" if size_reason else ""),
        generation,
    )


CAPACITY = "WaitingForCapacity"


def capacity_condition(waiting: int, target: int, desired: int, generation: int) -> dict[str, Any]:
    """True while workers stay Pending for capacity the cluster does not have yet (an autoscaler sees
    them and launches nodes); training goes on at the target size meanwhile."""
    if not waiting:
        return condition(CAPACITY, False, "NoneWaiting", "", generation)
    return condition(
        CAPACITY,
        True,
        "WorkersPending",
        f"{waiting} worker(s) Pending until the cluster has room for them (an autoscaler such as Karpenter"
        f" launches nodes for Pending pods); training goes on at {target} of {desired} and grows when"
        " one starts",
        generation,
    )


def set_condition(old: list[dict[str, Any]], new: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """``old`` with ``new`` in place of the condition of its type (moved last), stamped as
    :func:`merge_conditions` stamps it."""
    return [*(c for c in old if c.get("type") != new["type"]), *merge_conditions(old, [new], now)]


def merge_conditions(
    old: list[dict[str, Any]], new: list[dict[str, Any]], now: float
) -> list[dict[str, Any]]:
    """Keep lastTransitionTime when a condition's status did not change."""
    previous = {c.get("type"): c for c in old}
    merged = []
    for cond in new:
        before = previous.get(cond["type"])
        same = before is not None and before.get("status") == cond["status"]
        stamp = before.get("lastTransitionTime") if same and before is not None else None
        merged.append({**cond, "lastTransitionTime": stamp or format_time(now)})
    return merged
