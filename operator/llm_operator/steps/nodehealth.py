"""Steps: workers that exited 78 (a failed node health check, or a straggler) and the Straggler condition.

A health failure is about the node, not the training program: the node goes into the job's bounded
record (status.unhealthyNodes, so it survives an operator restart), new workers avoid it, a Warning Event
``NodeUnhealthy`` names node and reason, and the worker is replaced (``steps.failures.replace_lost``;
a pre-flight failure there costs no restart, docs/decisions.md H3).
"""

from __future__ import annotations

from llm_operator.observe import format_time
from llm_operator.policy.health import HEALTH_SIGNALS
from llm_operator.policy.nodehealth import STRAGGLER, parse_failure, record, unhealthy_names
from llm_operator.policy.status import condition
from llm_operator.steps.state import PassState

CONDITION = "Straggler"


def record_unhealthy(s: PassState) -> None:
    """Record every node a worker found unhealthy this pass; every recorded node is avoided."""
    for pod, h in s.lost:
        if h.signal not in HEALTH_SIGNALS or not pod.node:
            continue
        failure = parse_failure(pod.message)
        entry = {
            "node": pod.node,
            "check": failure.check,
            "reason": failure.reason,
            "pod": pod.name,
            "time": format_time(pod.finished or s.now),
        }
        s.unhealthy_nodes = record(s.unhealthy_nodes, entry)
        s.out.unhealthy.append((pod.node, failure.check))
        s.out.events.append(
            ("Warning", "NodeUnhealthy", f"node {pod.node}: {failure.reason} (worker {pod.name} exited 78)")
        )
    if s.unhealthy_nodes:
        s.out.avoid_nodes = tuple(sorted({*s.out.avoid_nodes, *unhealthy_names(s.unhealthy_nodes)}))


def straggler_condition(s: PassState) -> None:
    """Straggler=True while a straggler's replacement is on its way; False once the job runs at its full
    size again. Absent until the first straggler."""
    found = [node for node, check in s.out.unhealthy if check == STRAGGLER]
    before = next((c for c in s.job.status.conditions if c.type == CONDITION), None)
    generation = s.job.metadata.generation
    if found:
        message = f"straggler on node {', '.join(found)}: replacing its worker"
        s.extra_conditions.append(condition(CONDITION, True, "StragglerFound", message, generation))
        return
    if before is None:
        return
    active = s.active
    settled = (
        not s.out.create
        and not s.out.delete
        and len(active) >= s.target + s.spares
        and all(h.state == "healthy" and p.phase == "Running" for p, h in active)
    )
    if before.status == "True" and (settled or not s.live):
        s.extra_conditions.append(
            condition(CONDITION, False, "Replaced", "the straggler's worker was replaced", generation)
        )
    else:
        s.extra_conditions.append(
            condition(CONDITION, before.status == "True", before.reason, before.message, generation)
        )
