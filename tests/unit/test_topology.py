"""Topology-aware placement (spec.scheduling.topology): policy, steps, pod terms, Kueue's podSet."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator import metrics
from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders.desired import desired_objects
from llm_operator.builders.worker import worker_pod
from llm_operator.builders.workload import TOPOLOGY_ANNOTATIONS, place, workload
from llm_operator.labels import TOPOLOGY_DOMAIN
from llm_operator.observe import format_time
from llm_operator.policy.admission import read
from llm_operator.policy.topology import (
    Placement,
    assigned_domains,
    best_domain,
    home,
    occupancy,
)
from llm_operator.policy.topology import (
    place as place_policy,
)
from llm_operator.reconcile import plan
from llm_operator.settings import Settings
from pydantic import ValidationError

from .jobs import job, manifest
from .views import NOW, node, pod

KEY = "topology.k8s.aws/network-node-layer-3"
BLOCKS = {"n0": "b1", "n1": "b1", "n2": "b1", "n3": "b2", "n4": "b2"}


def _nodes(**kw: Any) -> dict[str, Any]:
    out = {}
    for name, block in BLOCKS.items():
        labels = (("node.kubernetes.io/instance-type", "p5.48xlarge"), (KEY, block))
        out[name] = node(name, labels=labels, **kw.get(name, {}))
    return out


def _job(mode: str = "preferred", status: dict[str, Any] | None = None, **spec: Any) -> LLMTrainingJob:
    spec.setdefault("scheduling", {"topology": {"key": KEY, "mode": mode}})
    return job(status=status, **spec)


def _running(size: int, **kw: Any) -> dict[str, Any]:
    return {
        "phase": "Running",
        "targetReplicas": size,
        "desiredReplicas": size,
        "startTime": format_time(NOW - 900),
        **kw,
    }


# ---------------------------------------------------------------------------------------- policy tables
@pytest.mark.parametrize(
    ("bound", "expected"),
    [
        ([], {}),
        (["n0", "n1", "n3"], {"b1": 2, "b2": 1}),
        (["n3", "n0"], {"b1": 1, "b2": 1}),  # ties ordered by name
        (["", "n0", "gone"], {"b1": 1}),  # unbound and unknown nodes do not count
    ],
)
def test_occupancy(bound: list[str], expected: dict[str, int]) -> None:
    workers = [pod(i, node=n) for i, n in enumerate(bound)]
    got = occupancy(workers, _nodes(), KEY)
    assert got == expected and list(got) == list(expected)


@pytest.mark.parametrize(
    ("occupied", "expected"),
    [({}, ""), ({"b2": 1}, "b2"), ({"b1": 2, "b2": 1}, "b1"), ({"b2": 1, "b1": 1}, "b1")],
)
def test_home_is_where_most_workers_are(occupied: dict[str, int], expected: str) -> None:
    assert home(occupied) == expected


@pytest.mark.parametrize(
    ("free", "allowed", "expected"),
    [
        ({}, (), ""),
        ({"b1": 0, "b2": 0}, (), ""),
        ({"b1": 1, "b2": 2}, (), "b2"),
        ({"b1": 2, "b2": 2}, (), "b1"),
        ({"b1": 1, "b2": 2}, ("b1",), "b1"),
    ],
)
def test_best_domain(free: dict[str, int], allowed: tuple[str, ...], expected: str) -> None:
    assert best_domain(free, allowed) == expected


@pytest.mark.parametrize(
    ("occupied", "free", "allowed", "expected"),
    [
        ({"b1": 2}, {"b2": 5}, (), Placement(KEY, "required", home="b1")),
        ({}, {"b1": 1, "b2": 2}, (), Placement(KEY, "required", target="b2")),
        ({}, {}, (), Placement(KEY, "required")),
        # Kueue reserved b2 only: survivors elsewhere are no home, the first placement targets b2
        ({"b1": 2}, {"b1": 1, "b2": 1}, ("b2",), Placement(KEY, "required", target="b2", allowed=("b2",))),
    ],
)
def test_place(
    occupied: dict[str, int], free: dict[str, int], allowed: tuple[str, ...], expected: Placement
) -> None:
    assert place_policy(KEY, "required", occupied, free, allowed) == expected


@pytest.mark.parametrize(
    ("assignment", "expected"),
    [
        (None, ()),
        ({"levels": ["other"], "slices": []}, ()),
        (
            {
                "levels": ["topology.k8s.aws/network-node-layer-2", KEY],
                "slices": [
                    {
                        "domainCount": 1,
                        "valuesPerLevel": [{"universal": "l2"}, {"universal": "b1"}],
                        "podCounts": {"universal": 2},
                    }
                ],
            },
            ("b1",),
        ),
        (
            {
                "levels": [KEY],
                "slices": [
                    {
                        "domainCount": 2,
                        "valuesPerLevel": [{"individual": {"prefix": "nn-", "roots": ["b2", "b1"]}}],
                        "podCounts": {"individual": [1, 1]},
                    }
                ],
            },
            ("nn-b1", "nn-b2"),
        ),
    ],
)
def test_assigned_domains(assignment: dict[str, Any] | None, expected: tuple[str, ...]) -> None:
    assert assigned_domains(assignment, KEY) == expected


# ------------------------------------------------------------------------------------------ pod terms
def test_worker_pod_for_the_first_placement_uses_pod_affinity() -> None:
    spec = worker_pod(_job("required"), 0, 0, (), Placement(KEY, "required", target="b2"))["spec"]
    term = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == [
        {
            "topologyKey": KEY,
            "labelSelector": {
                "matchLabels": {"elasticllm.dev/job-name": "llama", "elasticllm.dev/role": "worker"}
            },
        }
    ]
    preferred = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [
        {"weight": 50, "preference": {"matchExpressions": [{"key": KEY, "operator": "In", "values": ["b2"]}]}}
    ]
    soft = worker_pod(_job(), 0, 0, (), Placement(KEY, "preferred"))["spec"]["affinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in soft["podAffinity"]
    assert soft["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 100


def test_worker_pod_in_the_survivors_domain() -> None:
    body = worker_pod(_job("required"), 1, 2, ["n2"], Placement(KEY, "required", home="b1"))
    terms = body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    assert {"key": KEY, "operator": "In", "values": ["b1"]} in term["matchExpressions"]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]
    assert body["metadata"]["annotations"][TOPOLOGY_DOMAIN] == "b1"
    assert "podAffinity" not in body["spec"]["affinity"]
    soft = worker_pod(_job(), 1, 2, (), Placement(KEY, "preferred", home="b1"))["spec"]["affinity"]
    preferred = soft["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [
        {
            "weight": 100,
            "preference": {"matchExpressions": [{"key": KEY, "operator": "In", "values": ["b1"]}]},
        }
    ]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in soft["nodeAffinity"]


def test_kueue_assigned_domains_are_required_in_both_modes() -> None:
    spec = worker_pod(_job(), 0, 0, (), Placement(KEY, "preferred", allowed=("b2", "b1")))["spec"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [{"key": KEY, "operator": "In", "values": ["b1", "b2"]}]


def test_no_topology_no_terms() -> None:
    affinity = worker_pod(job(), 0, 0)["spec"]["affinity"]
    assert "podAffinity" not in affinity and "nodeAffinity" not in affinity


# ------------------------------------------------------------------------------------- reconcile passes
def test_first_workers_find_one_domain_together() -> None:
    nodes = _nodes(n3={"allocatable_gpus": 0})  # b1 has 3 free nodes, b2 one
    p = plan(_job("required"), [], nodes, [], NOW)
    assert p.create == [0, 1, 2, 3]
    assert p.placement == Placement(KEY, "required", target="b1")


def test_replacement_goes_to_the_survivors_domain() -> None:
    """The lost worker (on n3, in b2) was deleted last pass; its index is made again in b1."""
    pods = [pod(0, node="n0"), pod(1, node="n1")]
    p = plan(_job("preferred", status=_running(3), maxReplicas=3), pods, _nodes(), pods, NOW)
    assert p.create == [2]
    assert p.placement == Placement(KEY, "preferred", home="b1")
    assert p.status["topology"] == {
        "key": KEY,
        "domain": "b1",
        "domains": [{"name": "b1", "workers": 2}],
        "spread": False,
    }


def test_spread_is_reported_once_with_a_warning() -> None:
    pods = [pod(0, node="n0"), pod(1, node="n1"), pod(2, node="n3")]
    p = plan(_job("preferred", status=_running(3), maxReplicas=3), pods, _nodes(), pods, NOW)
    assert p.status["topology"]["spread"] is True
    assert p.status["topology"]["domains"] == [{"name": "b1", "workers": 2}, {"name": "b2", "workers": 1}]
    warnings = [(level, reason) for level, reason, _ in p.events if reason == "TopologySpread"]
    assert warnings == [("Warning", "TopologySpread")]
    again = plan(
        _job("preferred", status=_running(3, topology=p.status["topology"]), maxReplicas=3),
        pods,
        _nodes(),
        pods,
        NOW + 1,
    )
    assert not any(reason == "TopologySpread" for _, reason, _ in again.events)


@pytest.mark.parametrize(("mode", "grows"), [("required", False), ("preferred", True)])
def test_growth_counts_room_in_the_domain_when_required(mode: str, grows: bool) -> None:
    """Shrunk to 2 in b1 (full: n2 has another job's worker); b2 has free nodes."""
    status = _running(2, desiredReplicas=3, lastResizeTime=format_time(NOW - 600))
    mine = [pod(0, node="n0"), pod(1, node="n1")]
    other = pod(9, name="other-worker-0", uid="o9", node="n2")
    p = plan(_job(mode, status=status, maxReplicas=3), mine, _nodes(), [*mine, other], NOW)
    assert (p.status["targetReplicas"] == 3) is grows
    if grows:
        assert p.placement is not None and p.placement.home == "b1"


def test_required_waiting_worker_shrinks_after_the_pending_timeout() -> None:
    """The fallback of mode required: the worker waits in the full domain, then the job shrinks."""
    spec: dict[str, Any] = {"maxReplicas": 3, "failurePolicy": {"pendingTimeoutSeconds": 60}}
    waiting = pod(2, node="", phase="Pending", ready=False, unschedulable=True, created=NOW - 61)
    pods = [pod(0, node="n0"), pod(1, node="n1"), waiting]
    p = plan(_job("required", status=_running(3), **spec), pods, _nodes(), pods, NOW)
    assert p.status["targetReplicas"] == 2 and p.resize == (3, 2, "Shrunk")


# ---------------------------------------------------------------------------------------------- Kueue
def test_workload_podset_asks_for_the_level() -> None:
    queued = manifest(scheduling={"topology": {"key": KEY, "mode": "required"}})
    queued["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    body = workload(LLMTrainingJob.model_validate(queued), 4)
    (podset,) = body["spec"]["podSets"]
    assert podset["topologyRequest"] == {"required": KEY}
    assert "podAffinity" not in podset["template"]["spec"].get("affinity", {})
    pod_body = place(worker_pod(job(), 0, 0), {}, [], ("required", KEY))
    assert pod_body["metadata"]["annotations"][TOPOLOGY_ANNOTATIONS["required"]] == KEY


def test_admission_reads_the_topology_assignment() -> None:
    assignment = {
        "levels": [KEY],
        "slices": [
            {"domainCount": 1, "valuesPerLevel": [{"universal": "b2"}], "podCounts": {"universal": 2}}
        ],
    }
    body = {
        "spec": {"podSets": [{"name": "workers", "count": 2}]},
        "status": {
            "conditions": [
                {"type": "Admitted", "status": "True"},
                {"type": "QuotaReserved", "status": "True"},
            ],
            "admission": {
                "podSetAssignments": [
                    {
                        "name": "workers",
                        "count": 2,
                        "flavors": {"nvidia.com/gpu": "f"},
                        "topologyAssignment": assignment,
                    }
                ]
            },
        },
    }
    verdict = read(body)
    assert verdict.admitted and verdict.topology == assignment
    p = plan(_job("preferred"), [], _nodes(), [], NOW, admission=verdict)
    assert p.create == [0, 1] and p.placement == Placement(KEY, "preferred", target="b2", allowed=("b2",))


# ------------------------------------------------------------------------------------------------ API
@pytest.mark.parametrize(
    ("topology", "error"),
    [
        ({"key": KEY}, None),
        ({"key": KEY, "mode": "sometimes"}, "mode"),
        ({"key": "not a label"}, "key"),
        ({"mode": "required"}, "key"),
    ],
)
def test_topology_fields(topology: dict[str, Any], error: str | None) -> None:
    if error is None:
        assert job(scheduling={"topology": topology}).spec.scheduling.topology is not None
        return
    with pytest.raises(ValidationError, match=error):
        job(scheduling={"topology": topology})


def test_render_shows_the_first_placement() -> None:
    pods = [o for o in desired_objects(_job("required"), Settings()) if o["kind"] == "Pod"]
    assert len(pods) == 4
    assert all(
        p["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] for p in pods
    )


def test_status_topology_cleared_when_the_spec_drops_it() -> None:
    pods = [pod(0, node="n0"), pod(1, node="n1")]
    before = _running(2, topology={"key": KEY, "domain": "b1", "domains": [], "spread": False})
    p = plan(job(status=before, maxReplicas=2), pods, _nodes(), pods, NOW)
    assert "topology" in p.status and p.status["topology"] is None
    assert "topology" not in plan(job(status=_running(2), maxReplicas=2), pods, _nodes(), pods, NOW).status


def test_spread_jobs_gauge() -> None:
    """Counted per job, relative to what other tests of this process left in the (global) gauge."""
    base = metrics.TOPOLOGY_SPREAD._value.get()
    metrics.observe_topology("ml-gauge", "a", True)
    metrics.observe_topology("ml-gauge", "b", True)
    metrics.observe_topology("ml-gauge", "a", False)
    assert metrics.TOPOLOGY_SPREAD._value.get() == base + 1
    metrics.forget_job("ml-gauge", "b")
    assert metrics.TOPOLOGY_SPREAD._value.get() == base
