"""One reconcile pass as a pure function: desired vs observed -> pods to create/delete + the new status.

``plan()`` does no I/O: the caller (``llm_operator.controller``) gathers the observed pods and nodes
from kopf's indexes, applies the plan and writes the status once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_operator import labels
from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders import rendezvous
from llm_operator.observe import NodeView, PodView, format_time, parse_time
from llm_operator.policy.admission import Admission
from llm_operator.policy.admission import condition as admission_condition
from llm_operator.policy.capacity import free_slots
from llm_operator.policy.health import Health, assess
from llm_operator.policy.resize import INITIAL, SizeInput, decide_size
from llm_operator.policy.status import PhaseInput, conditions, decide_phase, merge_conditions

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Deletion:
    """A worker pod to delete."""

    pod: PodView
    force: bool
    reason: str
    since: float | None = None


@dataclass
class Plan:
    """What one pass decided."""

    create: list[int] = field(default_factory=list)
    attempt: int = 0
    delete: list[Deletion] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message) for Kubernetes Events on the job."""
    lost: list[tuple[str, float | None]] = field(default_factory=list)
    """(signal, since) of workers found lost this pass, for metrics."""
    resize: tuple[int, int, str] | None = None
    requeue_at: float | None = None

    def wake_at(self, when: float | None) -> None:
        """Ask for another pass no later than ``when``."""
        if when is not None and (self.requeue_at is None or when < self.requeue_at):
            self.requeue_at = when


def _free_indices(pods: Iterable[PodView], maximum: int) -> list[int]:
    taken = {p.index for p in pods}
    return [i for i in range(maximum) if i not in taken]


def _choose_surplus(active: list[tuple[PodView, Health]], count: int) -> list[PodView]:
    """Which active workers to remove when above target: unscheduled first, then the highest indices."""
    ordered = sorted(active, key=lambda ph: (ph[1].state != "pending", -ph[0].index))
    return [pod for pod, _ in ordered[:count]]


def plan(
    job: LLMTrainingJob,
    pods: list[PodView],
    nodes: Mapping[str, NodeView],
    all_workers: Iterable[PodView],
    now: float,
    admission: Admission | None = None,
) -> Plan:
    """Decide one pass. ``pods`` are this job's workers; ``all_workers`` every job's (for capacity).

    ``admission``: Kueue's verdict for a queued job (None: not managed by Kueue). Until admitted the job
    runs no workers (as if suspended, phase Queued); once admitted it runs at most the admitted count.
    """
    spec, old = job.spec, job.status
    policy = spec.failurePolicy
    out = Plan()
    gated = admission is not None and not admission.admitted
    stopped = spec.suspend or gated
    desired = 0 if stopped else job.desired_replicas
    if admission is not None and admission.admitted:
        desired = min(desired, admission.count)
    verdicts = [
        (p, assess(p, nodes.get(p.node), now, policy.nodeFailureGraceSeconds, policy.nonRetryableExitCodes))
        for p in pods
    ]
    for _, h in verdicts:
        out.wake_at(h.recheck_at)

    terminal_phase = old.phase if old.phase in TERMINAL else None
    reason, message = old.reason, old.message
    restarts = old.restarts
    target = old.targetReplicas
    last_resize = parse_time(old.lastResizeTime)
    below_min_since = parse_time(old.belowMinSince)
    completion = old.completionTime

    # Stuck Terminating on a dead node: force it out whatever else happens.
    for pod, h in verdicts:
        if h.state == "terminating" and h.force:
            out.delete.append(Deletion(pod, True, "ForceDeleteStuckTerminating"))

    active = [(p, h) for p, h in verdicts if h.state in ("healthy", "pending")]
    lost = [(p, h) for p, h in verdicts if h.state == "lost"]
    fatal = [p for p, h in verdicts if h.state == "fatal"]
    succeeded = [p for p, h in verdicts if h.state == "succeeded"]

    if terminal_phase is None:
        if fatal:
            pod = fatal[0]
            terminal_phase, reason = "Failed", "NonRetryableExitCode"
            message = f"worker {pod.name} exited with code {pod.exit_code}, listed in nonRetryableExitCodes"
        elif succeeded and not active and not lost:
            terminal_phase, reason, message = (
                "Succeeded",
                "WorkersSucceeded",
                f"{len(succeeded)} worker(s) exited 0",
            )

    replacing = False
    # Lost or failed workers: delete now; their indices free up and get replacements.
    if terminal_phase is None and not stopped and lost:
        if restarts + 1 > policy.maxRestarts:
            terminal_phase, reason = "Failed", "MaxRestartsExceeded"
            message = (
                f"{len(lost)} worker(s) lost after {restarts} restarts (maxRestarts {policy.maxRestarts})"
            )
        else:
            replacing = True
            for pod, h in lost:
                out.delete.append(Deletion(pod, h.force, h.signal, h.since))
                out.lost.append((h.signal, h.since))
            signals = sorted({h.signal for _, h in lost})
            reason = signals[0] if len(signals) == 1 else "WorkersLost"
            message = "replacing " + ", ".join(f"{p.name} ({h.signal})" for p, h in lost)
            out.events.append(("Warning", reason, message))

    if terminal_phase is None and not stopped:
        stuck = [
            p for p, h in active if h.state == "pending" and now - p.created >= policy.pendingTimeoutSeconds
        ]
        for p, h in active:
            if h.state == "pending" and p not in stuck:
                out.wake_at(p.created + policy.pendingTimeoutSeconds)
        decision = decide_size(
            SizeInput(
                desired=desired,
                minimum=spec.minReplicas,
                current=target or None,
                last_desired=old.desiredReplicas or None,
                stuck_pending=len(stuck),
                free_slots=free_slots(job, nodes.values(), all_workers, pods),
                now=now,
                last_resize=last_resize,
                cooldown=policy.resizeCooldownSeconds,
            )
        )
        out.wake_at(decision.recheck_at)
        if decision.target != target:
            if decision.reason != INITIAL:
                out.resize = (target, decision.target, decision.reason)
                out.events.append(("Normal", decision.reason, f"target size {target} -> {decision.target}"))
                last_resize = now
            target = decision.target
        if replacing or (out.resize is not None):
            restarts += 1
            if restarts > policy.maxRestarts:
                terminal_phase, reason = "Failed", "MaxRestartsExceeded"
                message = f"restart {restarts} exceeds maxRestarts {policy.maxRestarts}"
                out.delete = [d for d in out.delete if d.reason == "ForceDeleteStuckTerminating"]
                replacing = False

    if terminal_phase is None and not stopped:
        if len(active) > target:
            for pod in _choose_surplus(active, len(active) - target):
                out.delete.append(Deletion(pod, False, "ScaledDown"))
        elif len(active) < target and not succeeded:  # a worker exited 0: the run is finishing
            # Every pod object still holds its index (names are unique): never more than maxReplicas.
            free = _free_indices((p for p, _ in verdicts), spec.maxReplicas)
            out.create = free[: target - len(active)]
        out.attempt = restarts
        running = sum(1 for p, h in active if h.state == "healthy" and p.phase == "Running")
        if running < spec.minReplicas and (old.startTime is not None):
            below_min_since = below_min_since or now
            deadline = below_min_since + policy.belowMinTimeoutSeconds
            if now >= deadline:
                terminal_phase, reason = "Failed", "BelowMinReplicas"
                message = (
                    f"{running} worker(s) running, below minReplicas {spec.minReplicas}"
                    f" for {policy.belowMinTimeoutSeconds}s"
                )
            else:
                out.wake_at(deadline)
        else:
            below_min_since = None

    if spec.suspend and terminal_phase is None:
        out.delete += [Deletion(p, False, "Suspended") for p, h in active + lost]
        target, reason, message = 0, "Suspended", "spec.suspend is true"
    elif gated and terminal_phase is None and admission is not None:
        out.delete += [Deletion(p, False, admission.reason) for p, h in active + lost]
        target, reason, message = 0, admission.reason, admission.message

    if terminal_phase is not None:
        completion = completion or format_time(now)
        finished_delete = [Deletion(p, False, terminal_phase) for p, h in active + lost]
        ttl = spec.ttlSecondsAfterFinished
        if ttl is not None:
            due = (parse_time(completion) or now) + ttl
            if now >= due:
                finished_delete += [Deletion(p, False, "TTLExpired") for p in succeeded + fatal]
            else:
                out.wake_at(due)
        known = {d.pod.uid for d in out.delete}
        out.delete += [d for d in finished_delete if d.pod.uid not in known]
        out.create = []

    ready = sum(1 for p, h in active if p.ready and h.state == "healthy")
    leaving = {d.pod.uid for d in out.delete}
    n_active = sum(1 for p, _ in active if p.uid not in leaving) + len(out.create)
    phase = decide_phase(
        PhaseInput(
            suspended=stopped,
            terminal_phase=terminal_phase,
            started=old.startTime is not None,
            ready=ready,
            active=n_active,
            target=target,
            desired=desired,
            replacing=replacing,
            previous_phase=old.phase,
        )
    )
    if gated and phase == "Suspended" and not spec.suspend:
        phase = "Queued"
    start = old.startTime or (format_time(now) if phase == "Running" else None)
    if phase != old.phase:
        level = "Warning" if phase == "Failed" else "Normal"
        out.events.append(
            (
                level,
                f"Phase{phase}",
                f"{old.phase} -> {phase}" + (f": {message}" if message and phase in TERMINAL else ""),
            )
        )
        if phase in ("Running", "Pending", "Scaling") and not replacing and out.resize is None:
            reason, message = phase, ""
    size_note = out.resize[2] if out.resize else (old.reason if target < desired else "")
    status: dict[str, Any] = {
        "phase": phase,
        "replicas": len(active),
        "readyReplicas": ready,
        "targetReplicas": target,
        "desiredReplicas": desired,
        "restarts": restarts,
        "selector": labels.selector_string(job.metadata.name),
        "observedGeneration": job.metadata.generation,
        "reason": reason,
        "message": message,
        "startTime": start,
        "completionTime": completion if phase in TERMINAL else None,
        "lastResizeTime": format_time(last_resize) if last_resize else None,
        "belowMinSince": format_time(below_min_since) if below_min_since else None,
        "rendezvousEndpoint": rendezvous.endpoint(job),
    }
    conds = conditions(phase, target, desired, size_note, message, job.metadata.generation)
    if admission is not None:
        verdict = admission_condition(admission, job.metadata.generation)
        conds.append(verdict)
        before = next((c for c in old.conditions if c.type == verdict["type"]), None)
        if before is None or (before.status, before.reason) != (verdict["status"], verdict["reason"]):
            level = "Warning" if verdict["reason"] in ("Preempted", "Evicted") else "Normal"
            out.events.append((level, verdict["reason"], verdict["message"]))
    status["conditions"] = merge_conditions([c.model_dump() for c in old.conditions], conds, now)
    out.status = status
    return out
