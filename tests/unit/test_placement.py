"""Which nodes new workers must avoid."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator.builders.worker import worker_pod
from llm_operator.labels import AVOIDED_NODES
from llm_operator.observe import format_time, pod_view
from llm_operator.policy.placement import node_signal, nodes_to_avoid, stale_avoidance
from llm_operator.reconcile import plan

from .jobs import job
from .views import NOW, node, pod


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, None),
        ({"taints": (("karpenter.sh/disruption", "NoSchedule", NOW),)}, "NodeTerminating"),
        ({"taints": (("aws-node-termination-handler/spot-itn", "NoSchedule", None),)}, "NodeTerminating"),
        ({"unschedulable": True}, "NodeCordoned"),
        ({"ready": False, "not_ready_since": NOW - 1}, "NodeNotReady"),
        ({"ready": False, "not_ready_since": None}, "NodeNotReady"),
        ({"taints": (("node.kubernetes.io/unreachable", "NoExecute", NOW),)}, "NodeNotReady"),
        ({"taints": (("nvidia.com/gpu", "NoSchedule", None),)}, None),
    ],
)
def test_node_signal(kw: dict[str, Any], expected: str | None) -> None:
    assert node_signal(node("n", **kw)) == expected


def test_nodes_to_avoid_sorted_with_deleted_names() -> None:
    nodes = [
        node("b", unschedulable=True),
        node("a"),
        node("c", ready=False, not_ready_since=NOW),
    ]
    assert nodes_to_avoid(nodes, ["z", ""]) == ("b", "c", "z")
    assert nodes_to_avoid([node("a")]) == ()


# -------------------------------------------------------------------- avoidance ends with its reason
def test_stale_avoidance_names_only_existing_usable_nodes() -> None:
    waiting = pod(1, phase="Pending", ready=False, node="", avoided=("gone", "node-0", "node-1"))
    nodes = {"node-0": node("node-0"), "node-1": node("node-1", unschedulable=True)}
    assert stale_avoidance(waiting, nodes_to_avoid(nodes.values()), nodes) == ("node-0",)
    # still bad, or gone: nothing to renew
    assert stale_avoidance(waiting, ("node-0", "node-1"), nodes) == ()
    assert stale_avoidance(waiting, (), {}) == ()


@pytest.mark.parametrize(
    "kw",
    [
        {"node": "node-2", "phase": "Pending"},  # bound: the term no longer matters
        {"node": "", "phase": "Pending", "deleting": True},
        {"node": "node-2", "phase": "Running"},
        {"node": "", "phase": "Pending", "avoided": ()},
    ],
)
def test_stale_avoidance_only_for_unbound_waiting_pods(kw: dict[str, Any]) -> None:
    args: dict[str, Any] = {"ready": False, "avoided": ("node-0",), **kw}
    nodes = {"node-0": node("node-0")}
    assert stale_avoidance(pod(1, **args), (), nodes) == ()


def test_worker_pod_records_its_avoided_nodes() -> None:
    body = worker_pod(job(), 1, 0, ["node-b", "node-a", "node-b"])
    assert body["metadata"]["annotations"][AVOIDED_NODES] == "node-a,node-b"
    view = pod_view(body)
    assert view is not None and view.avoided == ("node-a", "node-b")
    assert AVOIDED_NODES not in worker_pod(job(), 1, 0)["metadata"]["annotations"]


def _status(**kw: Any) -> dict[str, Any]:
    return {"phase": "Restarting", "targetReplicas": 2, "desiredReplicas": 2, "restarts": 1,
            "startTime": format_time(NOW - 900), **kw}  # fmt: skip


def test_blip_node_back_recreates_the_pending_replacement_without_the_term() -> None:
    """min 2 / max 2 on exactly two nodes; node-1 blipped NotReady, its worker was replaced with a term
    against it, and node-1 is Ready again: the replacement is re-created (no restart), never stranded."""
    spec: dict[str, Any] = {
        "minReplicas": 2,
        "maxReplicas": 2,
        "failurePolicy": {"pendingTimeoutSeconds": 60},
    }
    waiting = pod(1, phase="Pending", ready=False, node="", created=NOW - 600, avoided=("node-1",),
                  unschedulable=True)  # fmt: skip
    pods = [pod(0), waiting]
    nodes = {"node-0": node("node-0"), "node-1": node("node-1")}
    p = plan(job(status=_status(), **spec), pods, nodes, pods, NOW)
    assert [(d.pod.name, d.reason) for d in p.delete] == [("llama-worker-1", "AvoidedNodeUsable")]
    assert p.status["restarts"] == 1 and p.status["targetReplicas"] == 2, "no restart, no shrink"
    assert p.resize is None
    assert any(reason == "AvoidedNodeUsable" for _, reason, _ in p.events)
    # the next pass, the pod gone: index 1 is made again, avoiding nothing
    p2 = plan(job(status=_status(), **spec), [pod(0)], nodes, [pod(0)], NOW + 1)
    assert p2.create == [1] and p2.avoid_nodes == ()


def test_node_still_lost_keeps_the_replacement_waiting() -> None:
    spec: dict[str, Any] = {"minReplicas": 2, "maxReplicas": 2}
    waiting = pod(1, phase="Pending", ready=False, node="", created=NOW - 5, avoided=("node-1",))
    pods = [pod(0), waiting]
    nodes = {"node-0": node("node-0"), "node-1": node("node-1", ready=False, not_ready_since=NOW - 9)}
    p = plan(job(status=_status(), **spec), pods, nodes, pods, NOW)
    assert p.delete == [] and p.avoid_nodes == ("node-1",)


def test_with_karpenter_only_nodes_nothing_else_repels_are_required_terms() -> None:
    from llm_operator.policy.placement import needs_term

    tainted = node("t", taints=(("karpenter.sh/disrupted", "NoSchedule", None),))
    assert not needs_term(tainted) and not needs_term(None) and not needs_term(node("c", unschedulable=True))
    assert needs_term(node("sick", failing=(("AcceleratedHardwareReady", None),)))
    assert not needs_term(node("lost", ready=False, not_ready_since=NOW, taints=()))
    body = worker_pod(job(), 1, 0, ["t", "sick"], None, hard=["sick"])
    affinity = body["spec"]["affinity"]["nodeAffinity"]
    required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all(f["values"] == ["sick"] for t in required for f in t.get("matchFields", []))
    preferred = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [p["preference"]["matchFields"][0]["values"] for p in preferred] == [["t"]]
    everything = worker_pod(job(), 1, 0, ["t", "sick"])["spec"]["affinity"]["nodeAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in everything, (
        "without Karpenter: all required"
    )


def test_karpenter_required_terms_leave_out_the_nodes_the_operator_marks() -> None:
    from llm_operator.policy.placement import required_avoidance

    assert required_avoidance(("a", "sick"), ("sick",), marking=True) == ("a",)
    assert required_avoidance(("a", "sick"), ("sick",), marking=False) == ("a", "sick")
