"""Kueue integration on pure data: the Workload builder, the admission reader, plan() gated by admission."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator.api.models import LLMTrainingJob
from llm_operator.builders.worker import worker_pod
from llm_operator.builders.workload import place, pod_template, workload, workload_name
from llm_operator.control.kueue_sync import finished, released
from llm_operator.observe import format_time
from llm_operator.policy.admission import QUEUED, Admission, condition, flavor_placement, read
from llm_operator.reconcile import plan

from .jobs import manifest
from .views import NOW, node, pod

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def kjob(status: dict[str, Any] | None = None, **spec: Any) -> LLMTrainingJob:
    data = manifest(**spec)
    data["metadata"]["labels"] = {QUEUE_LABEL: "gpu-queue"}
    if status is not None:
        data["status"] = status
    return LLMTrainingJob.model_validate(data)


def cond(ctype: str, status: str = "True", reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason or ctype, "message": message}


def wl(
    count: int = 4, conditions: list[dict[str, Any]] | None = None, admitted: int | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "llama-uid1234", "namespace": "ml", "generation": 1, "resourceVersion": "7"},
        "spec": {"podSets": [{"name": "workers", "count": count, "minCount": 2}]},
        "status": {"conditions": conditions or []},
    }
    if admitted is not None:
        assignment: dict[str, Any] = {
            "name": "workers",
            "flavors": {"nvidia.com/gpu": "p5"},
            "count": admitted,
        }
        body["status"]["admission"] = {"clusterQueue": "cq", "podSetAssignments": [assignment]}
    return body


# -- builder ----------------------------------------------------------------------------------------


def test_workload_has_one_podset_count_min_and_requests() -> None:
    j = kjob(efaPerNode=32, resources={"cpu": "180", "memory": "1800Gi"})
    w = workload(j, 4)
    assert w["apiVersion"] == "kueue.x-k8s.io/v1beta2" and w["kind"] == "Workload"
    assert w["metadata"]["name"] == workload_name(j) == "llama-uid1234"
    assert w["metadata"]["ownerReferences"][0]["uid"] == "uid-1234"
    assert w["spec"]["queueName"] == "gpu-queue"
    (podset,) = w["spec"]["podSets"]
    assert (podset["name"], podset["count"], podset["minCount"]) == ("workers", 4, 2)
    requests = podset["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {
        "cpu": "180",
        "memory": "1800Gi",
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "32",
    }
    assert "priorityClassRef" not in w["spec"]


@pytest.mark.parametrize(
    ("minimum", "count", "expected"),
    [(2, 4, 2), (4, 4, None), (3, 2, None)],  # minCount only when below count (Kueue rejects min == count)
)
def test_min_count_only_when_partial_admission_possible(
    minimum: int, count: int, expected: int | None
) -> None:
    w = workload(kjob(minReplicas=minimum, maxReplicas=4), count)
    assert w["spec"]["podSets"][0].get("minCount") == expected


def test_priority_class_passed_through_with_its_value() -> None:
    w = workload(kjob(scheduling={"priorityClassName": "high"}), 4, priority=1000)
    ref = {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "high"}
    assert w["spec"]["priorityClassRef"] == ref and w["spec"]["priority"] == 1000
    assert w["spec"]["podSets"][0]["template"]["spec"]["priorityClassName"] == "high"


def test_template_keeps_placement_not_env_or_volumes() -> None:
    spec = pod_template(kjob(scheduling={"instanceTypes": ["p5.48xlarge"], "nodeSelector": {"a": "b"}}))[
        "spec"
    ]
    assert spec["nodeSelector"] == {"a": "b"} and spec["tolerations"] and spec["affinity"]["nodeAffinity"]
    assert "env" not in spec["containers"][0] and "volumes" not in spec


def test_workload_needs_the_queue_label() -> None:
    plain = LLMTrainingJob.model_validate(manifest())
    with pytest.raises(ValueError, match="queue-name"):
        workload(plain, 4)


def test_place_adds_flavor_and_drops_queue_label() -> None:
    j = kjob()
    pod_body = worker_pod(j, 0, 0)
    assert pod_body["metadata"]["labels"][QUEUE_LABEL] == "gpu-queue"
    toleration = {"key": "reserved", "operator": "Exists", "effect": "NoSchedule"}
    placed = place(pod_body, {"pool": "p5"}, [toleration])
    assert placed["spec"]["nodeSelector"]["pool"] == "p5" and toleration in placed["spec"]["tolerations"]
    assert QUEUE_LABEL not in placed["metadata"]["labels"]
    assert pod_body["metadata"]["labels"][QUEUE_LABEL] == "gpu-queue", "input not modified"


# -- admission reader -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "state", "count", "reason"),
    [
        (None, "Queued", 0, "Queued"),
        (
            wl(conditions=[cond("QuotaReserved", "False", "Pending", "insufficient quota")]),
            "Queued",
            0,
            "Queued",
        ),
        (wl(conditions=[cond("QuotaReserved"), cond("Admitted")], admitted=4), "Admitted", 4, "Admitted"),
        (wl(conditions=[cond("QuotaReserved"), cond("Admitted")], admitted=3), "Admitted", 3, "Admitted"),
        (
            wl(
                conditions=[cond("QuotaReserved"), cond("Admitted"), cond("Evicted", reason="Preempted")],
                admitted=4,
            ),
            "Evicted",
            4,
            "Preempted",
        ),
        (
            wl(conditions=[cond("QuotaReserved", "False"), cond("Requeued", reason="Preempted")]),
            "Queued",
            0,
            "Requeued",
        ),
        (wl(conditions=[cond("Finished", reason="Succeeded")], admitted=4), "Finished", 0, "Succeeded"),
    ],
)
def test_read(body: dict[str, Any] | None, state: str, count: int, reason: str) -> None:
    verdict = read(body)
    assert (verdict.state, verdict.count, verdict.reason) == (state, count, reason)


def test_partial_admission_is_said_in_the_condition() -> None:
    verdict = read(wl(conditions=[cond("QuotaReserved"), cond("Admitted")], admitted=3))
    c = condition(verdict, 5)
    assert c["status"] == "True" and c["message"] == "admitted 3 of 4 workers (partial admission)"
    assert verdict.flavors == ("p5",)


def test_evicted_and_released_is_cleared() -> None:
    body = wl(conditions=[cond("QuotaReserved", "False"), cond("Evicted", reason="Preempted")])
    verdict = read(body)
    assert verdict.state == "Evicted" and verdict.cleared and condition(verdict, 1)["reason"] == "Preempted"


def test_flavor_placement() -> None:
    flavor = {"spec": {"nodeLabels": {"pool": "p5"}, "tolerations": [{"key": "k", "operator": "Exists"}]}}
    assert flavor_placement(flavor) == ({"pool": "p5"}, [{"key": "k", "operator": "Exists"}])
    assert flavor_placement(None) == ({}, [])


# -- status patches ---------------------------------------------------------------------------------


def test_released_clears_admission_and_requeues_preempted() -> None:
    body = wl(
        conditions=[cond("QuotaReserved"), cond("Admitted"), cond("Evicted", reason="Preempted")], admitted=4
    )
    patch = released(body, "Preempted", "preempted by high", NOW)
    assert patch["metadata"]["resourceVersion"] == "7" and patch["status"]["admission"] is None
    by_type = {c["type"]: c for c in patch["status"]["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False" and by_type["Admitted"]["status"] == "False"
    assert by_type["Requeued"]["status"] == "True" and by_type["Evicted"]["status"] == "True"
    assert by_type["QuotaReserved"]["lastTransitionTime"] == format_time(NOW)


def test_finished_marks_workload() -> None:
    patch = finished(wl(conditions=[cond("Admitted")], admitted=4), "Succeeded", "", NOW)
    by_type = {c["type"]: c for c in patch["status"]["conditions"]}
    assert by_type["Finished"]["status"] == "True" and by_type["Finished"]["reason"] == "Succeeded"
    assert "Admitted" in by_type


# -- plan() with an admission -----------------------------------------------------------------------

NODES = {f"node-{i}": node(f"node-{i}") for i in range(4)}


def test_queued_job_creates_no_workers_and_is_queued() -> None:
    p = plan(kjob(), [], NODES, [], NOW, admission=QUEUED)
    assert p.create == [] and p.status["phase"] == "Queued" and p.status["targetReplicas"] == 0
    admitted_cond = next(c for c in p.status["conditions"] if c["type"] == "Admitted")
    assert admitted_cond["status"] == "False" and admitted_cond["reason"] == "Queued"
    assert ("Normal", "Queued", QUEUED.message) in p.events


def test_admitted_partially_runs_the_admitted_count() -> None:
    verdict = Admission("Admitted", 3, 4, ("p5",), "Admitted", "admitted 3 of 4 workers (partial admission)")
    p = plan(kjob(), [], NODES, [], NOW, admission=verdict)
    assert p.create == [0, 1, 2] and p.status["targetReplicas"] == 3
    assert ("Normal", "Admitted", verdict.message) in p.events


def test_evicted_stops_workers_gracefully() -> None:
    pods = [pod(i) for i in range(4)]
    status = {
        "phase": "Running",
        "targetReplicas": 4,
        "desiredReplicas": 4,
        "startTime": format_time(NOW - 500),
    }
    verdict = Admission("Evicted", 4, 4, ("p5",), "Preempted", "preempted by ml/high")
    p = plan(kjob(status=status), pods, NODES, pods, NOW, admission=verdict)
    assert sorted(d.pod.index for d in p.delete) == [0, 1, 2, 3]
    assert all(not d.force and d.reason == "Preempted" for d in p.delete)
    assert p.status["phase"] == "Queued" and p.create == []
    assert ("Warning", "Preempted", "preempted by ml/high") in p.events


def test_no_admission_means_no_change() -> None:
    j = kjob()
    assert plan(j, [], NODES, [], NOW, admission=None).create == [0, 1, 2, 3]
