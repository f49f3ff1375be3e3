"""A job's runtime (spec.runtimeRef): read once, kept as a copy, its merged spec checked; problems are a
status record and one Warning Event each."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from llm_operator.runtime_resolution import (
    RUNTIME_CONDITION,
    RuntimeProblem,
    RuntimeResolver,
    unresolved_status,
)

from .fake_kube import FakeKube, record_events

RUNTIME = {
    "metadata": {"name": "cpu", "namespace": "team-a", "resourceVersion": "7"},
    "spec": {"image": "trainer:rt", "gpusPerNode": 0, "maxReplicas": 3, "failurePolicy": {"maxRestarts": 7}},
}
LOG = logging.getLogger("test")


def body(generation: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": "short", "namespace": "team-a", "uid": "u", "generation": generation},
        "spec": {"runtimeRef": {"name": "cpu"}, "minReplicas": 1, "replicas": 2, **spec},
    }


def resolver(*runtimes: dict[str, Any]) -> tuple[RuntimeResolver, FakeKube]:
    kube = FakeKube({("LLMTrainingRuntime", r["metadata"]["name"]): r for r in runtimes})
    return RuntimeResolver(kube, "team-a", "short"), kube  # type: ignore[arg-type]


def test_a_job_without_runtime_ref_needs_no_runtime() -> None:
    runtime, kube = resolver()
    plain = {"metadata": {"generation": 1}, "spec": {"image": "x", "minReplicas": 1, "maxReplicas": 2}}
    assert runtime.runnable(plain)
    assert asyncio.run(runtime.resolve(plain, {})) is None
    assert runtime.copy is None and runtime.version() is None and kube.calls == []


def test_the_runtime_is_read_once_copied_and_merged_under_the_job() -> None:
    runtime, kube = resolver(RUNTIME)
    assert not runtime.runnable(body())
    assert asyncio.run(runtime.resolve(body(), {})) is None
    assert runtime.copy == {"kind": "LLMTrainingRuntime", "name": "cpu", "resourceVersion": "7",
                            "spec": RUNTIME["spec"]}  # fmt: skip
    assert runtime.runnable(body()) and runtime.version() == (1, "LLMTrainingRuntime", "cpu", "7")
    job = runtime.job(body(), {})
    assert (job.spec.image, job.spec.maxReplicas, job.spec.failurePolicy.maxRestarts) == ("trainer:rt", 3, 7)
    assert asyncio.run(runtime.resolve(body(2), {})) is None  # a new generation is checked, not read again
    assert len(kube.called("get_runtime")) == 1 and runtime.version() == (2, "LLMTrainingRuntime", "cpu", "7")


def test_an_operator_restart_uses_the_copy_in_the_status() -> None:
    runtime, kube = resolver()  # the runtime was deleted meanwhile
    copy = {"kind": "LLMTrainingRuntime", "name": "cpu", "resourceVersion": "7", "spec": RUNTIME["spec"]}
    assert asyncio.run(runtime.resolve(body(), {"runtime": copy})) is None
    assert runtime.copy == copy and kube.calls == []


def test_a_missing_runtime_and_an_invalid_merged_spec_are_problems() -> None:
    runtime, _ = resolver()
    problem = asyncio.run(runtime.resolve(body(), {}))
    assert problem == RuntimeProblem(
        "RuntimeNotFound",
        "spec.runtimeRef: LLMTrainingRuntime cpu not found in namespace team-a; no workers until it exists",
    )
    runtime, _ = resolver(RUNTIME)
    problem = asyncio.run(runtime.resolve(body(minReplicas=5), {}))
    assert problem is not None and problem.reason == "InvalidSpec" and "minReplicas" in problem.message
    assert runtime.copy is None and not runtime.runnable(body())


def test_the_problem_record_keeps_the_phase_and_replaces_only_its_condition() -> None:
    old = {"phase": "Running", "conditions": [
        {"type": "Running", "status": "True", "reason": "Running", "message": "", "observedGeneration": 1},
        {"type": RUNTIME_CONDITION, "status": "True", "reason": "Resolved", "message": ""},
    ]}  # fmt: skip
    record = unresolved_status(old, 2, RuntimeProblem("InvalidSpec", "x" * 40000), 1000.0)
    assert record["phase"] == "Running" and record["reason"] == "InvalidSpec"
    assert len(record["message"]) == 32768 and record["observedGeneration"] == 2
    types = [c["type"] for c in record["conditions"]]
    assert types == ["Running", RUNTIME_CONDITION]
    assert record["conditions"][1]["status"] == "False"
    assert unresolved_status({}, 1, RuntimeProblem("RuntimeNotFound", "m"), 0.0)["phase"] == "Pending"


def test_one_warning_event_per_new_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    events = record_events(monkeypatch)
    runtime, _ = resolver()
    missing = RuntimeProblem("RuntimeNotFound", "gone")
    runtime.report(missing, {}, LOG)  # type: ignore[arg-type]
    runtime.report(missing, {}, LOG)  # type: ignore[arg-type]
    runtime.report(RuntimeProblem("InvalidSpec", "bad"), {}, LOG)  # type: ignore[arg-type]
    assert events == [("Warning", "RuntimeNotFound", "gone"), ("Warning", "InvalidSpec", "bad")]
