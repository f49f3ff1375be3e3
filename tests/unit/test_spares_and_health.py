"""Spares (spec.spareReplicas) and node health (exit code 78): sizing, env contract, status record."""

from __future__ import annotations

import json
from typing import Any

import pytest
from llm_operator.builders.worker import worker_pod
from llm_operator.builders.workload import requested_count, workload
from llm_operator.observe import format_time, pod_view
from llm_operator.policy.admission import Admission
from llm_operator.policy.health import NODE_UNHEALTHY, STRAGGLER, assess
from llm_operator.policy.nodehealth import UNHEALTHY_LIMIT, parse_failure, record
from llm_operator.policy.resize import SizeInput, decide_size
from llm_operator.policy.status import PhaseInput, decide_phase
from llm_operator.reconcile import plan
from llm_operator.settings import Settings

from .jobs import job
from .views import NOW, node, pod

LIVE = {"failurePolicy": {"recovery": "inProcess"}}
NODES = {f"node-{i}": node(f"node-{i}") for i in range(6)}


def running(**kw: Any) -> dict[str, Any]:
    base = {
        "phase": "Running",
        "targetReplicas": 4,
        "desiredReplicas": 4,
        "spareReplicas": 1,
        "startTime": format_time(NOW - 500),
    }
    base.update(kw)
    return base


# -- sizing --------------------------------------------------------------------------------------------

AT_MIN = dict(current=2, desired=2, last_desired=2)
SIZE_TABLE = [
    # case, kwargs, (target, spares, reason)
    ("first pass runs the spares too", dict(current=None, spares_current=None), (4, 2, "Initial")),
    ("steady", dict(), (4, 2, "")),
    ("one stuck: a spare goes", dict(stuck_pending=1), (4, 1, "Shrunk")),
    ("two stuck: both spares go", dict(stuck_pending=2), (4, 0, "Shrunk")),
    ("three stuck: spares, then a worker", dict(stuck_pending=3), (3, 0, "Shrunk")),
    ("never below min, spares never count", dict(stuck_pending=9), (2, 0, "Shrunk")),
    ("at min, spare stuck: spare goes", dict(AT_MIN, stuck_pending=1), (2, 1, "Shrunk")),
    ("grow: workers before spares", dict(current=2, spares_current=0, free_slots=1), (3, 0, "Grown")),
    ("grow: room left goes to spares", dict(current=3, spares_current=0, free_slots=2), (4, 1, "Grown")),
    ("grow spares only", dict(spares_current=0, free_slots=5), (4, 2, "Grown")),
    ("cooldown holds spares back", dict(spares_current=0, free_slots=2, last_resize=1990.0), (4, 0, "")),
    ("spares lowered: at once", dict(spares_desired=1), (4, 1, "UserScaled")),
    ("user scale resets spares", dict(desired=3, last_desired=4, spares_current=0), (3, 2, "UserScaled")),
    ("none, stuck at min", dict(AT_MIN, spares_desired=0, spares_current=0, stuck_pending=1), (2, 0, "")),
]  # fmt: skip


@pytest.mark.parametrize(("case", "kw", "expected"), SIZE_TABLE, ids=[r[0] for r in SIZE_TABLE])
def test_decide_size_with_spares(case: str, kw: dict[str, Any], expected: tuple[int, int, str]) -> None:
    base: dict[str, Any] = dict(
        desired=4, minimum=2, current=4, last_desired=4, stuck_pending=0, free_slots=0,
        now=2000.0, last_resize=None, cooldown=30, spares_desired=2, spares_current=2,
    )  # fmt: skip
    base.update(kw)
    d = decide_size(SizeInput(**base))
    assert (d.target, d.spares, d.reason) == expected


PHASE_TABLE = [
    ("all ready, spare ready", dict(ready=5, active=5), "Running"),
    ("spare still pending", dict(ready=4, active=5), "Running"),
    ("spare not created yet", dict(ready=4, active=4), "Scaling"),
    ("a worker short", dict(ready=3, active=5), "Scaling"),
]


@pytest.mark.parametrize(("case", "kw", "phase"), PHASE_TABLE, ids=[r[0] for r in PHASE_TABLE])
def test_phase_with_spares(case: str, kw: dict[str, Any], phase: str) -> None:
    base: dict[str, Any] = dict(
        suspended=False, terminal_phase=None, started=True, target=4, desired=4, replacing=False,
        previous_phase="Running", spares=1,
    )  # fmt: skip
    base.update(kw)
    assert decide_phase(PhaseInput(**base)) == phase


def test_first_pass_creates_workers_and_spares_on_distinct_indices() -> None:
    p = plan(job(spareReplicas=2, **LIVE), [], NODES, [], NOW)
    assert p.create == [0, 1, 2, 3, 4, 5]
    assert (p.status["targetReplicas"], p.status["spareReplicas"]) == (4, 2)


def test_spares_ignored_without_in_process() -> None:
    p = plan(job(spareReplicas=2), [], NODES, [], NOW)
    assert p.create == [0, 1, 2, 3] and p.status["spareReplicas"] == 0


def test_running_spares_counted_and_stuck_spare_given_up_first_without_restart() -> None:
    pods = [pod(i) for i in range(4)]
    pods.append(pod(4, phase="Pending", ready=False, node="", unschedulable=True, created=NOW - 400))
    p = plan(job(spareReplicas=1, **LIVE, status=running()), pods, NODES, pods, NOW)
    assert p.delete == [], "the stuck spare stays Pending, asking for capacity"
    assert p.status["waitingForCapacity"] == 1
    assert p.status["spareReplicas"] == 0 and p.status["targetReplicas"] == 4
    assert p.status["restarts"] == 0, "spares are no members: dropping one is no restart"
    assert ("Normal", "Shrunk", "spares 1 -> 0") in p.events
    five = [pod(i) for i in range(5)]
    steady = plan(job(spareReplicas=1, **LIVE, status=running()), five, NODES, five, NOW)
    assert steady.status["runningSpares"] == 1 and steady.status["phase"] == "Running"
    assert not steady.create and not steady.delete


def test_lost_worker_replaced_on_a_free_index_and_spares_never_count_toward_min() -> None:
    pods = [pod(i) for i in range(5)]
    pods[1] = pod(1, phase="Failed", exit_code=1)
    p = plan(job(spareReplicas=1, **LIVE, status=running()), pods, NODES, pods, NOW)
    assert [d.pod.index for d in p.delete] == [1] and p.status["restarts"] == 1
    again = plan(
        job(spareReplicas=1, **LIVE, status=p.status), [pods[i] for i in (0, 2, 3, 4)], NODES, [], NOW
    )
    assert again.create == [1]


def test_workload_counts_spares_and_partial_admission_runs_workers_first() -> None:
    labelled = job(spareReplicas=2, **LIVE)
    labelled.metadata.labels["kueue.x-k8s.io/queue-name"] = "team"
    assert requested_count(labelled) == 6
    podset = workload(labelled, requested_count(labelled))["spec"]["podSets"][0]
    assert (podset["count"], podset["minCount"]) == (6, 2)
    for admitted, expected in ((6, (4, 2)), (5, (4, 1)), (3, (3, 0))):
        verdict = Admission("Admitted", admitted, 6, ("p5",), "Admitted", "")
        p = plan(labelled, [], NODES, [], NOW, admission=verdict)
        assert (p.status["targetReplicas"], p.status["spareReplicas"]) == expected, admitted


# -- the env contract ------------------------------------------------------------------------------------


def _env(pod_body: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod_body["spec"]["containers"][0]["env"]}


def test_live_target_members_and_health_check_env() -> None:
    j = job(spareReplicas=1, replicas=3, nprocPerNode=2, healthCheck={"minSharedMemory": "8Gi"}, **LIVE)
    body = worker_pod(j, 4, 0)
    env = _env(body)
    assert env["LLMJOB_LIVE_TARGET_MEMBERS"] == "6"
    assert json.loads(env["LLMJOB_HEALTH_CHECK"]) == {
        "enabled": True,
        "checkpointWriteMaxSeconds": 2.0,
        "minSharedMemory": "8Gi",
        "intervalSeconds": 300,
        "stragglerFactor": 1.5,
        "stragglerWindowSteps": 20,
        "command": [],
        "gpu": True,
    }
    assert " " not in env["LLMJOB_HEALTH_CHECK"], "compact JSON"
    container = body["spec"]["containers"][0]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    restart_mode = _env(worker_pod(job(), 0, 0))
    assert json.loads(restart_mode["LLMJOB_HEALTH_CHECK"])["minSharedMemory"] == ""
    assert "LLMJOB_LIVE_TARGET_MEMBERS" not in restart_mode


# -- exit code 78 ----------------------------------------------------------------------------------------

PARSE_TABLE = [
    ("preflight checkpoint-write: 3.1 s > 2.0 s", "checkpoint-write", True),
    ("pre-flight shared-memory: /dev/shm has 1 MiB free, needs 8 GiB", "shared-memory", True),
    ("periodic gpu-matmul: 120 TFLOP/s < 600", "gpu", False),
    ("straggler: step 2.4 s > 1.5 x median 1.1 s", "straggler", False),
    ("command: exited 3", "command", False),
    ("preflight nccl-allreduce: timed out", "nccl", True),
    ("something odd happened", "other", False),
    ("", "other", False),
]


@pytest.mark.parametrize(
    ("message", "check", "preflight"), PARSE_TABLE, ids=[r[1] + str(r[2]) for r in PARSE_TABLE]
)
def test_parse_failure(message: str, check: str, preflight: bool) -> None:
    failure = parse_failure(message + "\nsecond line ignored")
    assert (failure.check, failure.preflight) == (check, preflight)
    assert "\n" not in failure.reason and failure.reason


def test_exit_78_is_a_health_failure_even_if_listed_non_retryable() -> None:
    sick = pod(0, phase="Failed", exit_code=78, message="preflight efa: no devices", finished=NOW - 1)
    assert assess(sick, node("node-0"), NOW, 30, [78]).signal == NODE_UNHEALTHY
    slow = pod(0, phase="Failed", exit_code=78, message="straggler: slow")
    assert assess(slow, node("node-0"), NOW, 30, []).signal == STRAGGLER
    assert assess(pod(0, phase="Failed", exit_code=77), node("node-0"), NOW, 30, [77]).state == "fatal"


def test_pod_view_reads_the_termination_message() -> None:
    body = {
        "metadata": {"name": "llama-worker-0", "labels": {"elasticllm.dev/replica-index": "0"}},
        "spec": {"nodeName": "node-0"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {
                            "exitCode": 78,
                            "message": "preflight checkpoint-write: read-only file system",
                            "finishedAt": "2026-01-01T00:00:00Z",
                        }
                    }
                }
            ],
        },
    }
    view = pod_view(body)
    assert view is not None and view.exit_code == 78 and view.message.startswith("preflight")
    assert view.finished is not None


def test_record_is_bounded_newest_kept_and_one_entry_per_node() -> None:
    entries: list[dict[str, Any]] = []
    for i in range(UNHEALTHY_LIMIT + 5):
        entries = record(entries, {"node": f"n{i}", "check": "gpu"})
    entries = record(entries, {"node": "n10", "check": "efa"})
    assert len(entries) == UNHEALTHY_LIMIT
    assert entries[-1] == {"node": "n10", "check": "efa"}
    assert [e["node"] for e in entries].count("n10") == 1
    assert entries[0]["node"] == "n5"


def _sick(index: int, message: str) -> Any:
    return pod(index, phase="Failed", exit_code=78, message=message, finished=NOW - 2)


def test_preflight_failure_records_node_avoids_it_and_is_no_restart() -> None:
    pods = [pod(i) for i in range(4)]
    pods[2] = _sick(2, "preflight checkpoint-write: [Errno 30] Read-only file system")
    p = plan(job(status=running(spareReplicas=0)), pods, NODES, pods, NOW)
    assert [(d.pod.name, d.reason) for d in p.delete] == [("llama-worker-2", NODE_UNHEALTHY)]
    assert p.status["restarts"] == 0 and p.status["healthFailures"] == 1
    (entry,) = p.status["unhealthyNodes"]
    assert entry["node"] == "node-2" and entry["check"] == "checkpoint-write"
    assert entry["pod"] == "llama-worker-2" and "Read-only" in entry["reason"]
    assert "node-2" in p.avoid_nodes and p.unhealthy == [("node-2", "checkpoint-write")]
    assert any(e[:2] == ("Warning", "NodeUnhealthy") and "node node-2" in e[2] for e in p.events)
    # Next pass (or a restarted operator): the record alone keeps the node avoided.
    later = plan(job(status=p.status), pods[:2] + pods[3:], NODES, [], NOW + 1)
    assert later.create == [2] and "node-2" in later.avoid_nodes
    assert later.status["unhealthyNodes"] == p.status["unhealthyNodes"]


def test_failure_during_the_run_is_a_restart_and_evicts_the_live_member() -> None:
    pods = [pod(i) for i in range(4)]
    pods[1] = _sick(1, "periodic shared-memory: 1 MiB free")
    p = plan(job(status=running(spareReplicas=0), **LIVE), pods, NODES, pods, NOW)
    assert p.status["restarts"] == 1 and p.status["healthFailures"] == 0
    assert p.evict == ["llama-worker-1"]


def test_preflight_failures_beyond_max_restarts_fail_the_job() -> None:
    pods = [pod(i) for i in range(4)]
    pods[0] = _sick(0, "preflight command: exited 1")
    status = running(spareReplicas=0, healthFailures=3)
    p = plan(job(status=status, failurePolicy={"maxRestarts": 3}), pods, NODES, pods, NOW)
    assert p.status["phase"] == "Failed" and p.status["reason"] == "HealthChecksFailing"
    assert "preflight command: exited 1" in p.status["message"]


def test_free_slots_skip_unhealthy_nodes_so_the_job_does_not_grow_onto_them() -> None:
    pods = [pod(i) for i in range(3)]
    status = running(
        spareReplicas=0,
        targetReplicas=3,
        unhealthyNodes=[{"node": "node-3", "check": "gpu", "reason": "x", "pod": "p", "time": ""}],
    )
    nodes = {f"node-{i}": node(f"node-{i}") for i in range(4)}
    p = plan(job(status=status), pods, nodes, pods, NOW)
    assert p.status["targetReplicas"] == 3, "no growth onto the unhealthy node"
    assert p.create == [3] and p.avoid_nodes == ("node-3",), "the missing worker asks for capacity elsewhere"


def test_straggler_condition_true_then_false_once_replaced() -> None:
    pods = [pod(i) for i in range(5)]
    pods[3] = _sick(3, "straggler: step 3.0 s > 1.5 x median 1.0 s over 20 steps")
    j = job(spareReplicas=1, status=running(), **LIVE)
    p = plan(j, pods, NODES, pods, NOW)
    cond = next(c for c in p.status["conditions"] if c["type"] == "Straggler")
    assert cond["status"] == "True" and "node-3" in cond["message"]
    assert p.status["restarts"] == 1
    waiting = [pods[i] for i in (0, 1, 2, 4)] + [pod(3, phase="Pending", ready=False, node="")]
    mid = plan(job(spareReplicas=1, status=p.status, **LIVE), waiting, NODES, waiting, NOW + 1)
    assert next(c for c in mid.status["conditions"] if c["type"] == "Straggler")["status"] == "True"
    back = [pods[i] for i in (0, 1, 2, 4)] + [pod(3, node="node-5")]
    done = plan(job(spareReplicas=1, status=mid.status, **LIVE), back, NODES, back, NOW + 2)
    cond = next(c for c in done.status["conditions"] if c["type"] == "Straggler")
    assert (cond["status"], cond["reason"]) == ("False", "Replaced")


def test_mark_unhealthy_nodes_setting() -> None:
    assert Settings.from_env({}).mark_unhealthy_nodes is False
    assert Settings.from_env({"LLMJOB_MARK_UNHEALTHY_NODES": "True"}).mark_unhealthy_nodes is True
    with pytest.raises(ValueError, match="LLMJOB_MARK_UNHEALTHY_NODES"):
        Settings.from_env({"LLMJOB_MARK_UNHEALTHY_NODES": "maybe"})
