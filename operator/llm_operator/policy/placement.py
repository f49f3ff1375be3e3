"""Where new workers must not go: nodes the operator judged lost, terminating, cordoned or reported
unhealthy by a node condition (``health.node_rule``, the one ordered list of node rules).

The operator reacts to a taint, a cordon or NotReady within a fraction of a second, often before the
scheduler's cache has seen it; a replacement created then could land on the very node being drained. So
every pod created while such nodes stay bad excludes them by name (see ``builders.worker.worker_pod``).

The avoidance lasts only as long as its reason: a pod's affinity cannot change, so a worker still
Pending with a term against a node that is usable again (Ready, untainted, uncordoned, not recorded
unhealthy) is re-created without it (:func:`stale_avoidance`). A node that blips NotReady and returns,
and is the only one that fits, therefore never strands the job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llm_operator import labels
from llm_operator.observe import (
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    TAINT_UNSCHEDULABLE,
    TERMINATION_TAINTS,
    NodeView,
    PodView,
)
from llm_operator.policy.health import node_lost_since, node_rule

REPELLING_TAINTS = frozenset(
    {TAINT_NOT_READY, TAINT_UNREACHABLE, TAINT_UNSCHEDULABLE, labels.UNHEALTHY_NODE, *TERMINATION_TAINTS}
)
"""Taints (NoSchedule or NoExecute) that keep a worker off a node with no term of ours: the node lifecycle
controller's, a drain's, Karpenter's and AWS Node Termination Handler's, and the operator's own mark."""


def node_signal(node: NodeView) -> str | None:
    """Why no new worker should be placed on this node, or None. NotReady counts whatever the grace
    period: the grace only delays replacing the pods already there."""
    rule = node_rule(node)
    return rule[0] if rule is not None else None


def nodes_to_avoid(nodes: Iterable[NodeView], deleted: Iterable[str] = ()) -> tuple[str, ...]:
    """Sorted names of every bad node, plus ``deleted`` (nodes a worker was on that no longer exist,
    which the scheduler's cache may still hold)."""
    bad = {n.name for n in nodes if node_signal(n) is not None}
    bad.update(name for name in deleted if name)
    return tuple(sorted(bad))


def needs_term(node: NodeView | None) -> bool:
    """Whether only a term of ours keeps new workers off an avoided node: it exists, is Ready, is not
    cordoned and carries no repelling taint (a node condition from the platform, a failed health check
    unmarked). A NotReady node gets the node lifecycle controller's taints within its monitor period, and
    starts no pod meanwhile."""
    if node is None or node.unschedulable or node_lost_since(node) is not None:
        return False
    return not any(
        key in REPELLING_TAINTS and effect in ("NoSchedule", "NoExecute") for key, effect, _ in node.taints
    )


def required_avoidance(hard: Iterable[str], failing: Iterable[str], marking: bool) -> tuple[str, ...]:
    """The avoided nodes that get a required term where Karpenter serves the cluster: ``hard``
    (``needs_term``) less, with node marking on, the nodes failing a platform condition. The operator
    taints those itself before it wakes any job (``handlers.node_changed``), and Karpenter launches
    nothing for a pod with a required ``matchFields`` term: without the taint a worker that the bad node
    displaced would wait for the condition to clear instead of for a new node."""
    skip = set(failing) if marking else set()
    return tuple(n for n in hard if n not in skip)


def stale_avoidance(pod: PodView, avoid_now: Iterable[str], nodes: Mapping[str, NodeView]) -> tuple[str, ...]:
    """Nodes ``pod`` was made to avoid that exist and are no longer avoided: non-empty means the pod,
    still waiting for a node, should be re-created without those terms. A node that is gone stays out
    of it (re-creating would change nothing), and so does a pod already bound or being deleted."""
    if pod.node or pod.deleting or pod.phase != "Pending":
        return ()
    bad = set(avoid_now)
    return tuple(name for name in pod.avoided if name in nodes and name not in bad)
