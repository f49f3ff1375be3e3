"""The pure part of the pod runner's node faults: marks read from a node, mounts changed, CPU quotas."""

from __future__ import annotations

from typing import Any

import pytest
from llm_operator.api.validate import validate
from llm_testbed import training
from llm_testbed.localcluster import marks
from llm_testbed.podrunner.faults import (
    NodeFaults,
    apply_faults,
    cpu_max,
    cpu_quota_us,
    node_faults,
    termination_message,
)
from llm_testbed.podrunner.plan import Mount, PlanError, byte_size

POD: dict[str, Any] = {
    "spec": {
        "volumes": [
            {"name": "fsx", "persistentVolumeClaim": {"claimName": "c"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "scratch", "emptyDir": {}},
        ]
    }
}
CONTAINER: dict[str, Any] = {
    "volumeMounts": [
        {"name": "fsx", "mountPath": "/fsx"},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
}
MOUNTS = [Mount("/v/pv", "/fsx"), Mount("/shm/u/dshm", "/dev/shm"), Mount("/p/scratch", "/scratch")]


def _node(**notes: str) -> dict[str, Any]:
    return {"metadata": {"name": "n", "annotations": notes}}


FAULT_TABLE = [
    ("no marks", {}, NodeFaults()),
    ("read-only", {marks.NODE_FAULT_READONLY: "true"}, NodeFaults(readonly_volumes=True)),
    ("read-only off", {marks.NODE_FAULT_READONLY: "false"}, NodeFaults()),
    ("cpu", {marks.NODE_FAULT_CPU: "0.25"}, NodeFaults(cpu_cores=0.25)),
    ("shm", {marks.NODE_FAULT_SHM: "2Mi"}, NodeFaults(shm_bytes=2 << 20)),
]


@pytest.mark.parametrize(("case", "notes", "expected"), FAULT_TABLE, ids=[r[0] for r in FAULT_TABLE])
def test_node_faults(case: str, notes: dict[str, str], expected: NodeFaults) -> None:
    assert node_faults(_node(**notes)) == expected


@pytest.mark.parametrize("notes", [{marks.NODE_FAULT_CPU: "fast"}, {marks.NODE_FAULT_CPU: "0"},
                                   {marks.NODE_FAULT_SHM: "lots"}])  # fmt: skip
def test_bad_marks_are_errors(notes: dict[str, str]) -> None:
    with pytest.raises(PlanError):
        node_faults(_node(**notes))


def test_apply_faults_touches_only_the_volumes_of_the_fault() -> None:
    assert apply_faults(POD, CONTAINER, MOUNTS, NodeFaults()) == MOUNTS
    ro = apply_faults(POD, CONTAINER, MOUNTS, NodeFaults(readonly_volumes=True))
    assert [m.read_only for m in ro] == [True, False, False]
    shm = apply_faults(POD, CONTAINER, MOUNTS, NodeFaults(shm_bytes=1024))
    assert [m.tmpfs_bytes for m in shm] == [None, 1024, None]


def test_cpu_quota_and_sizes() -> None:
    assert (cpu_quota_us(None), cpu_quota_us(0.1), cpu_quota_us(0.001)) == (-1, 10000, 1000)
    assert (cpu_max(None), cpu_max(2)) == ("max 100000", "200000 100000")
    assert (byte_size("s", "1Mi"), byte_size("s", "512k"), byte_size("s", "7")) == (1 << 20, 512000, 7)


def test_termination_message_file_first_then_log_tail_on_error() -> None:
    assert termination_message("preflight efa: none\n", "FallbackToLogsOnError", 78, "log") == (
        "preflight efa: none\n"
    )
    tail = "\n".join(f"line {i}" for i in range(200))
    fallback = termination_message("", "FallbackToLogsOnError", 1, tail)
    assert fallback.endswith("line 199") and "line 100" not in fallback
    assert termination_message("", "File", 1, tail) == ""
    assert termination_message("", "FallbackToLogsOnError", 0, tail) == ""


def test_spare_job_helper_is_a_valid_in_process_job() -> None:
    job = training.spare_job("spares", "ns", replicas=1, spares=1, health_check={"intervalSeconds": 5})
    result = validate(job)
    assert not result.problems, result.problems
    assert result.job is not None and result.job.spare_replicas == 1
