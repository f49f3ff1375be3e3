"""Is a worker healthy, lost (and why), failed or done? Ordered rules, first match wins."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from llm_operator.observe import (
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    TERMINATION_TAINTS,
    NodeView,
    PodView,
)
from llm_operator.policy.exits import HEALTH_EXIT_CODE, classify_exit
from llm_operator.policy.nodehealth import parse_failure
from llm_operator.policy.rules import RULE_EXIT_CODE, parse_firing

State = Literal["healthy", "pending", "lost", "fatal", "succeeded", "terminating"]

# Signals (the `signal` label of llmjob_failures_detected_total, and event reasons).
NODE_DELETED = "NodeDeleted"
NODE_NOT_READY = "NodeNotReady"
NODE_TERMINATING = "NodeTerminating"
NODE_CORDONED = "NodeCordoned"
POD_FAILED = "PodFailed"
POD_EVICTED = "PodEvicted"
NODE_CONDITION = "NodeCondition"
"""The platform reports the node unhealthy through a node condition (the EKS node monitoring agent's
AcceleratedHardwareReady=False, say; the operator's nodeHealth.conditions)."""
NODE_UNHEALTHY = "NodeUnhealthy"
"""The worker exited 78: a health check failed on its node (llm_elastic's node health checks)."""
STRAGGLER = "Straggler"
"""The worker exited 78 as a straggler (its steps were slower than the job's median by stragglerFactor)."""
HEALTH_SIGNALS = (NODE_UNHEALTHY, STRAGGLER)
RULE_FIRED = "RuleFired"
"""The worker exited 79: a monitoring rule ended it (restartJob, failJob, restartWorker past its restarts)."""
SIGNALS = (
    NODE_DELETED,
    NODE_NOT_READY,
    NODE_TERMINATING,
    NODE_CORDONED,
    POD_FAILED,
    POD_EVICTED,
    NODE_CONDITION,
    *HEALTH_SIGNALS,
    RULE_FIRED,
)
"""Every signal a lost worker can carry (``Health.signal``)."""


@dataclass(frozen=True)
class Health:
    """The verdict on one worker pod."""

    state: State
    signal: str = ""
    since: float | None = None
    """When the signal became observable (epoch seconds), for reaction-time metrics."""
    force: bool = False
    """Delete with grace 0: the kubelet cannot act (node gone or unreachable)."""
    recheck_at: float | None = None
    """A grace period is running out at this time: look again then."""
    detail: str = ""
    """What the signal saw, for the Event (the node condition, say)."""


def node_rule(node: NodeView) -> tuple[str, float | None, str] | None:
    """The one ordered list of node rules, first match wins: (signal, since, detail) of why a node must not
    hold workers, or None. ``assess`` applies it to a worker's node (NotReady after its grace period);
    ``placement`` keeps new workers off every node it matches."""
    for key in TERMINATION_TAINTS:
        taint = node.taint(key)
        if taint is not None:
            return NODE_TERMINATING, taint[2], key
    if node.unschedulable:
        cordon = node.taint("node.kubernetes.io/unschedulable")
        return NODE_CORDONED, cordon[2] if cordon else None, ""
    if node.failing:
        _, since = node.failing[0]
        return NODE_CONDITION, since, ", ".join(f"{t} reported unhealthy" for t, _ in node.failing)
    since_lost = node_lost_since(node)
    if since_lost is not None:
        return NODE_NOT_READY, since_lost, ""
    return None


def node_lost_since(node: NodeView) -> float | None:
    """Since when the node has been NotReady/unreachable (condition or taint), or None when healthy."""
    times = [t[2] for t in node.taints if t[0] in (TAINT_UNREACHABLE, TAINT_NOT_READY) and t[2] is not None]
    if not node.ready and node.not_ready_since is not None:
        times.append(node.not_ready_since)
    flagged = not node.ready or any(t[0] in (TAINT_UNREACHABLE, TAINT_NOT_READY) for t in node.taints)
    if not flagged:
        return None
    return min(times) if times else 0.0


def assess(
    pod: PodView, node: NodeView | None, now: float, grace: int, non_retryable: Iterable[int]
) -> Health:
    """Classify one worker pod. ``node`` is None when its node no longer exists."""
    on_node = bool(pod.node)
    if pod.deleting:
        gone = on_node and (node is None or node_lost_since(node) is not None)
        return Health("terminating", force=gone)
    if pod.phase == "Succeeded":
        return Health("succeeded")
    if pod.phase == "Failed":
        if pod.exit_code == HEALTH_EXIT_CODE and pod.reason != "Evicted":  # before nonRetryableExitCodes
            signal = STRAGGLER if parse_failure(pod.message).straggler else NODE_UNHEALTHY
            return Health("lost", signal, since=pod.finished)
        firing = parse_firing(pod.message) if pod.exit_code == RULE_EXIT_CODE else None
        if firing is not None:  # before nonRetryableExitCodes: the rule says what to do
            return Health("fatal" if firing.action == "failJob" else "lost", RULE_FIRED, since=pod.finished)
        verdict = classify_exit(pod.exit_code, pod.reason, non_retryable)
        if verdict == "success":
            return Health("succeeded")
        if verdict == "fatal":
            return Health("fatal", POD_FAILED)
        return Health("lost", POD_EVICTED if pod.reason == "Evicted" else POD_FAILED)
    if not on_node:
        return Health("pending")
    if node is None:
        return Health("lost", NODE_DELETED, force=True)
    rule = node_rule(node)
    if rule is None:
        return Health("healthy")
    signal, since, detail = rule
    if signal == NODE_CONDITION:  # broken hardware: nothing to wait for (its members are evicted first)
        return Health("lost", signal, since=since, detail=detail, force=True)
    if signal != NODE_NOT_READY:
        return Health("lost", signal, since=since, detail=detail)
    due = (since or 0.0) + grace
    if now >= due:
        return Health("lost", NODE_NOT_READY, since=since or None, force=True)
    return Health("healthy", recheck_at=due)
