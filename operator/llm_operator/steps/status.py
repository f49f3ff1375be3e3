"""Step: the phase, the Phase* Event and the status record written once after the pass."""

from __future__ import annotations

from typing import Any

from llm_operator import labels
from llm_operator.builders import rendezvous
from llm_operator.observe import format_time
from llm_operator.policy.status import (
    CAPACITY,
    PhaseInput,
    capacity_condition,
    conditions,
    decide_phase,
    merge_conditions,
)
from llm_operator.steps.state import TERMINAL, PassState


def status(s: PassState) -> None:
    """Decide the phase from what the steps did and write ``out.status`` (counters, times, conditions)."""
    job, old, out = s.job, s.job.status, s.out
    active = s.active
    ready = sum(1 for p, h in active if p.ready and h.state == "healthy")
    leaving = {d.pod.uid for d in out.delete}
    n_active = sum(1 for p, _ in active if p.uid not in leaving) + len(out.create)
    phase = decide_phase(
        PhaseInput(
            suspended=job.spec.suspend or s.gated,
            terminal_phase=s.terminal_phase,
            started=old.startTime is not None,
            ready=ready,
            active=n_active,
            target=s.target,
            spares=s.spares,
            demand=s.demand,
            desired=s.desired,
            replacing=s.replacing,
            previous_phase=old.phase,
        )
    )
    if s.gated and phase == "Suspended" and not job.spec.suspend:
        phase = "Queued"  # Kueue holds it: stopped like a suspended job, but waiting for quota
    start = old.startTime or (format_time(s.now) if phase == "Running" else None)
    reason, message = s.reason, s.message
    out.starting = old.startTime is None and s.restarts == 0
    if phase != old.phase:
        level = "Warning" if phase == "Failed" else "Normal"
        detail = f": {message}" if message and phase in TERMINAL else ""
        if not (out.starting and phase == "Running"):  # the first start: status.startTime says when
            out.events.append((level, f"Phase{phase}", f"{old.phase} -> {phase}{detail}"))
        if phase in ("Running", "Pending", "Scaling") and not s.replacing and out.resize is None:
            reason, message = phase, ""
    running = sum(
        1 for p, h in active if h.state == "healthy" and p.phase == "Running" and p.uid not in leaving
    )
    size_note = out.resize[2] if out.resize else (old.reason if s.target < s.desired else "")
    waiting = min(s.demand, sum(1 for p, h in active if h.state == "pending" and p.uid not in leaving))
    record: dict[str, Any] = {
        "phase": phase,
        "replicas": n_active,  # after the pass: its deletions terminating, its creations there
        "readyReplicas": ready,
        "targetReplicas": s.target,
        "desiredReplicas": s.desired,
        "spareReplicas": s.spares,
        "runningSpares": max(0, running - s.target) if s.spares else 0,
        "members": s.members if s.members is not None else old.members,
        "waitingForCapacity": waiting if phase not in TERMINAL else 0,
        "restarts": s.restarts,
        "processRestarts": s.process_restarts,
        "healthFailures": s.health_failures,
        "unhealthyNodes": s.unhealthy_nodes,
        "rulesFired": s.rules_fired,
        "lastRuleFired": s.last_rule_fired,
        "workerRules": s.worker_rules,
        "selector": labels.selector_string(job.metadata.name),
        "observedGeneration": job.metadata.generation,
        "reason": reason,
        "message": message,
        "startTime": start,
        "completionTime": s.completion if phase in TERMINAL else None,
        "lastResizeTime": format_time(s.last_resize) if s.last_resize else None,
        "belowMinSince": format_time(s.below_min_since) if s.below_min_since else None,
        "rendezvousEndpoint": rendezvous.endpoint(job),
    }
    if s.topology is not None or old.topology is not None:  # None clears it once the spec drops topology
        record["topology"] = s.topology
    conds = conditions(phase, s.target, s.desired, size_note, message, job.metadata.generation)
    conds.append(capacity_condition(waiting, s.target, s.desired, job.metadata.generation))
    if waiting and s.had_condition(CAPACITY) != "True":
        out.events.append(("Normal", "WaitingForCapacity", conds[-1]["message"]))
    conds += s.extra_conditions
    record["conditions"] = merge_conditions([c.model_dump() for c in old.conditions], conds, s.now)
    out.status = record
