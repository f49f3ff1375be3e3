"""Steps: the target size (follow the user, shrink to capacity, grow back) and scaling the worker set to
the target (training workers plus spares). A resize is a restart: ``steps.restarts.count_restart``."""

from __future__ import annotations

from collections.abc import Iterable

from llm_operator.observe import PodView
from llm_operator.policy.capacity import free_slots
from llm_operator.policy.deletion import DeletionReason
from llm_operator.policy.resize import INITIAL, SizeInput, decide_size
from llm_operator.steps.state import Deletion, PassState, Verdict


def resize(s: PassState) -> None:
    """Decide the target size and the spares; a change other than the first sizing is a resize (Event,
    cooldown). Only a change of the training size is a restart: spares are not members."""
    if not s.live:
        return
    spec, policy = s.job.spec, s.job.spec.failurePolicy
    active = s.active
    stuck = [
        p
        for p, h in active
        if h.state == "pending"
        and p.name not in s.renewing
        and s.now - p.created >= policy.pendingTimeoutSeconds
    ]
    # The workers the last shrink left Pending on purpose (asking for capacity) are not stuck again.
    asked = max(0, s.desired - s.target) + max(0, s.desired_spares - s.spares) if s.target else 0
    running = sum(1 for p, h in active if h.state == "healthy" and p.node)
    for p, h in active:
        if h.state == "pending" and p not in stuck:
            s.out.wake_at(p.created + policy.pendingTimeoutSeconds)
    decision = decide_size(
        SizeInput(
            desired=s.desired,
            minimum=spec.minReplicas,
            current=s.target or None,
            last_desired=s.job.status.desiredReplicas or None,
            stuck_pending=max(0, len(stuck) - asked),
            running_extra=max(0, running - s.target - s.spares) if s.target else 0,
            free_slots=0,
            count_free_slots=lambda: free_slots(
                s.job,
                s.nodes.values(),
                s.all_workers,
                [p for p, _ in s.verdicts],
                s.out.avoid_nodes,
                _growth_domain(s),
            ),
            now=s.now,
            last_resize=s.last_resize,
            cooldown=policy.resizeCooldownSeconds,
            spares_desired=s.desired_spares,
            spares_current=s.spares,
        )
    )
    s.out.wake_at(decision.recheck_at)
    spares_before, s.spares = s.spares, decision.spares
    s.demand = max(0, s.desired - decision.target) + max(0, s.desired_spares - decision.spares)
    if decision.target == s.target:
        if decision.spares != spares_before and decision.reason not in ("", INITIAL):
            s.out.events.append(("Normal", decision.reason, f"spares {spares_before} -> {decision.spares}"))
            s.last_resize = s.now
        return
    if decision.reason != INITIAL:
        s.out.resize = (s.target, decision.target, decision.reason)
        s.out.events.append(("Normal", decision.reason, f"target size {s.target} -> {decision.target}"))
        s.last_resize = s.now
    s.target = decision.target


def _growth_domain(s: PassState) -> tuple[str, str] | None:
    """With a required topology, the job grows only into its survivors' domain: count free nodes there
    (a node elsewhere would take a worker that waits for ever, then shrink again)."""
    topology = s.job.spec.scheduling.topology
    if topology is None or topology.mode != "required" or not s.home:
        return None
    return topology.key, s.home


def _free_indices(pods: Iterable[PodView], maximum: int) -> list[int]:
    taken = {p.index for p in pods}
    return [i for i in range(maximum) if i not in taken]


def choose_surplus(active: list[Verdict], count: int) -> list[PodView]:
    """Which active workers to remove when above target: unscheduled first, then the highest indices."""
    ordered = sorted(active, key=lambda ph: (ph[1].state != "pending", -ph[0].index))
    return [pod for pod, _ in ordered[:count]]


def scale(s: PassState) -> None:
    """Delete the surplus above target + spares, or create workers on free indices up to it."""
    if not s.live:
        return
    active = s.active
    total = s.target + s.spares + s.demand
    if len(active) > total:
        for pod in choose_surplus(active, len(active) - total):
            s.out.delete.append(Deletion(pod, False, DeletionReason.SCALED_DOWN))
    elif len(active) < total and not s.succeeded:  # a worker exited 0: the run is finishing
        # Every pod object still holds its index (names are unique): never more than
        # maxReplicas + spareReplicas.
        free = _free_indices((p for p, _ in s.verdicts), s.job.spec.maxReplicas + s.job.spare_replicas)
        s.out.create = free[: total - len(active)]
    s.out.attempt = s.restarts
