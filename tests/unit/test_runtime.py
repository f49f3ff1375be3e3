"""Runtimes: the merge rules (table-driven), where each field came from, and validation of merged specs."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from llm_operator.api.runtime import JOB, annotate, merge, ref_of
from llm_operator.api.validate import validate, validate_runtime

from .jobs import manifest

RT = "ClusterLLMTrainingRuntime p5"
TOL_A = {"key": "a", "operator": "Exists", "effect": "NoSchedule"}
TOL_A_JOB = {"key": "a", "operator": "Equal", "value": "v", "effect": "NoSchedule"}
TOL_A_EXEC = {"key": "a", "operator": "Exists", "effect": "NoExecute"}
TOL_B = {"key": "b", "operator": "Exists", "effect": "NoSchedule"}


def env(**values: str) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


# (case, runtime spec, job spec, expected merged spec)
MERGES: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("job scalar wins", {"gpusPerNode": 8}, {"gpusPerNode": 0}, {"gpusPerNode": 0}),
    (
        "runtime fills what the job leaves out",
        {"image": "rt:1"},
        {"maxReplicas": 4},
        {"image": "rt:1", "maxReplicas": 4},
    ),
    ("null in the job counts as unset", {"image": "rt:1"}, {"image": None}, {"image": "rt:1"}),
    (
        "false and zero are values",
        {"suspend": True, "efaPerNode": 32},
        {"suspend": False, "efaPerNode": 0},
        {"suspend": False, "efaPerNode": 0},
    ),
    (
        "objects merge field by field",
        {"failurePolicy": {"maxRestarts": 50, "nodeFailureGraceSeconds": 30}},
        {"failurePolicy": {"maxRestarts": 5}},
        {"failurePolicy": {"maxRestarts": 5, "nodeFailureGraceSeconds": 30}},
    ),
    (
        "fsx mount moved, claim kept",
        {"fsx": {"claimName": "fsx-claim", "mountPath": "/fsx"}},
        {"fsx": {"mountPath": "/data"}},
        {"fsx": {"claimName": "fsx-claim", "mountPath": "/data"}},
    ),
    (
        "nodeSelector merges by key",
        {"scheduling": {"nodeSelector": {"pool": "gpu"}, "instanceTypes": ["p5.48xlarge"]}},
        {"scheduling": {"nodeSelector": {"team": "a"}}},
        {"scheduling": {"nodeSelector": {"pool": "gpu", "team": "a"}, "instanceTypes": ["p5.48xlarge"]}},
    ),
    (
        "env merges by name, job last",
        {"env": env(A="1", B="2", C="3")},
        {"env": env(B="20", D="4")},
        {"env": env(A="1", C="3", B="20", D="4")},
    ),
    (
        "an env item is replaced whole",
        {"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]},
        {"env": env(A="x")},
        {"env": env(A="x")},
    ),
    ("env only in the runtime", {"env": env(A="1")}, {}, {"env": env(A="1")}),
    ("an empty job env keeps the runtime's", {"env": env(A="1")}, {"env": []}, {"env": env(A="1")}),
    (
        "tolerations merge by key and effect, job last",
        {"scheduling": {"tolerations": [TOL_A, TOL_B, TOL_A_EXEC]}},
        {"scheduling": {"tolerations": [TOL_A_JOB]}},
        {"scheduling": {"tolerations": [TOL_B, TOL_A_EXEC, TOL_A_JOB]}},
    ),
    ("args are replaced whole", {"args": ["--x", "1"]}, {"args": ["--y"]}, {"args": ["--y"]}),
    ("command is replaced whole", {"command": ["python", "-m", "a"]}, {"command": ["b"]}, {"command": ["b"]}),
    (
        "instance types are replaced whole",
        {"scheduling": {"instanceTypes": ["p5.48xlarge", "p5e.48xlarge"]}},
        {"scheduling": {"instanceTypes": ["p4d.24xlarge"]}},
        {"scheduling": {"instanceTypes": ["p4d.24xlarge"]}},
    ),
    (
        "affinity is replaced whole",
        {"scheduling": {"affinity": {"nodeAffinity": {"x": 1}}}},
        {"scheduling": {"affinity": {"podAntiAffinity": {"y": 2}}}},
        {"scheduling": {"affinity": {"podAntiAffinity": {"y": 2}}}},
    ),
    (
        "exit codes are replaced whole",
        {"failurePolicy": {"nonRetryableExitCodes": [2, 3]}},
        {"failurePolicy": {"nonRetryableExitCodes": [4]}},
        {"failurePolicy": {"nonRetryableExitCodes": [4]}},
    ),
    (
        "an empty runtime changes nothing",
        {},
        {"minReplicas": 1, "image": "j"},
        {"minReplicas": 1, "image": "j"},
    ),
    (
        "runtimeRef stays",
        {"image": "rt"},
        {"runtimeRef": {"kind": "ClusterLLMTrainingRuntime", "name": "p5"}},
        {"image": "rt", "runtimeRef": {"kind": "ClusterLLMTrainingRuntime", "name": "p5"}},
    ),
]


@pytest.mark.parametrize(("case", "runtime", "job", "expected"), MERGES, ids=[m[0] for m in MERGES])
def test_merge_rules(
    case: str, runtime: dict[str, Any], job: dict[str, Any], expected: dict[str, Any]
) -> None:
    before = (copy.deepcopy(runtime), copy.deepcopy(job))
    merged = merge(runtime, job, RT)
    assert merged.spec == expected, case
    assert (runtime, job) == before, "merge must not change its inputs"


def test_origins_name_the_source_of_each_field() -> None:
    merged = merge(
        {"image": "rt", "env": env(A="1", B="2"), "fsx": {"claimName": "c", "mountPath": "/fsx"}},
        {"maxReplicas": 4, "env": env(B="3"), "fsx": {"mountPath": "/data"}},
        RT,
    )
    assert merged.origin("spec.image") == RT
    assert merged.origin("spec.maxReplicas") == JOB
    assert merged.origin("spec.env[0]") == RT and merged.origin("spec.env[1].value") == JOB
    assert merged.origin("spec.fsx.claimName") == RT and merged.origin("spec.fsx.mountPath") == JOB
    assert merged.origin("spec.fsx") == f"{JOB} and {RT}"
    assert merged.origin("spec.minReplicas") is None
    line = annotate("spec.maxReplicas", "spec.maxReplicas must be >= spec.image", merged)
    assert line.endswith(f"(spec.maxReplicas from {JOB}; spec.image from {RT})")


def test_ref_defaults_to_the_namespaced_kind() -> None:
    assert ref_of({"runtimeRef": {"name": "p5"}}) == ("LLMTrainingRuntime", "p5")
    assert ref_of({"runtimeRef": {"kind": "ClusterLLMTrainingRuntime", "name": "p5"}}) == (
        "ClusterLLMTrainingRuntime",
        "p5",
    )
    assert ref_of({"image": "x"}) is None


def runtime(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "ClusterLLMTrainingRuntime",
        "metadata": {"name": "p5"},
        "spec": spec,
    }


def short_job(**spec: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"minReplicas": None, "maxReplicas": None, "image": None, **spec}
    doc = manifest(**fields)
    doc["spec"]["runtimeRef"] = {"kind": "ClusterLLMTrainingRuntime", "name": "p5"}
    return doc


P5 = {"image": "trainer:rt", "minReplicas": 2, "maxReplicas": 8, "gpusPerNode": 8, "efaPerNode": 32}


def test_short_job_is_valid_with_its_runtime() -> None:
    result = validate(
        short_job(maxReplicas=4, env=env(NCCL_DEBUG="INFO")), runtime(**P5, env=env(NCCL_DEBUG="WARN"))
    )
    assert result.problems == [] and result.job is not None
    spec = result.job.spec
    assert (spec.image, spec.minReplicas, spec.maxReplicas, spec.efaPerNode) == ("trainer:rt", 2, 4, 32)
    assert [(e.name, e.value) for e in spec.env] == [("NCCL_DEBUG", "INFO")]
    assert spec.failurePolicy.maxRestarts == 20, "API defaults fill what neither sets"


# (case, runtime spec, job spec fields, expected line)
MERGED_PROBLEMS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    (
        "min from the job above max from the runtime",
        P5,
        {"minReplicas": 10},
        f"spec.minReplicas (10) must be <= spec.maxReplicas (8) (spec.minReplicas from {JOB};"
        f" spec.maxReplicas from {RT})",
    ),
    (
        "required field set by neither",
        {"minReplicas": 1, "maxReplicas": 2},
        {},
        f"spec.image: required field is missing (spec.image set by neither {JOB} nor {RT})",
    ),
    (
        "reserved env from the runtime",
        {**P5, "env": env(RANK="0")},
        {},
        f"(spec.env[0].name from {RT})",
    ),
    (
        "nproc from the job above the runtime's GPUs",
        P5,
        {"nprocPerNode": 16},
        f"spec.nprocPerNode (16) must be <= spec.gpusPerNode (8): one process per GPU at most"
        f" (spec.nprocPerNode from {JOB}; spec.gpusPerNode from {RT})",
    ),
    (
        "checkpoint outside the runtime's FSx",
        {**P5, "fsx": {"claimName": "c", "mountPath": "/fsx"}},
        {"checkpointDir": "/data/ck"},
        f"(spec.checkpointDir from {JOB}; spec.fsx.mountPath from {RT})",
    ),
    (
        "wrong type in the runtime",
        {**P5, "gpusPerNode": "eight"},
        {},
        f"(spec.gpusPerNode from {RT})",
    ),
]


@pytest.mark.parametrize(
    ("case", "rt_spec", "job_spec", "expected"), MERGED_PROBLEMS, ids=[m[0] for m in MERGED_PROBLEMS]
)
def test_merged_problems_name_field_and_source(
    case: str, rt_spec: dict[str, Any], job_spec: dict[str, Any], expected: str
) -> None:
    result = validate(short_job(**job_spec), runtime(**rt_spec))
    assert result.job is None, case
    assert any(expected in p for p in result.problems), result.problems


def test_missing_runtime() -> None:
    result = validate(short_job(), None)
    assert result.problems == ["spec.runtimeRef: ClusterLLMTrainingRuntime p5 not found"]


def test_job_without_runtime_ref_unchanged_messages() -> None:
    problems = validate(manifest(minReplicas=5, maxReplicas=2)).problems
    assert problems == ["spec.minReplicas (5) must be <= spec.maxReplicas (2)"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"runtimeRef": {"name": "x"}}, "spec.runtimeRef: unknown field"),
        ({"gpusPerNode": -1}, "spec.gpusPerNode"),
        ({"gpusPerNode": 4, "nprocPerNode": 16}, "spec.nprocPerNode (16) must be <= spec.gpusPerNode (4)"),
        ({"nprocPerNode": 16}, "spec.nprocPerNode (16) must be <= spec.gpusPerNode (8)"),
        ({"env": env(PET_NNODES="1")}, "spec.env PET_NNODES is reserved"),
        ({"minReplicas": 5, "maxReplicas": 2}, "spec.minReplicas (5) must be <= spec.maxReplicas (2)"),
        ({"replicaz": 1}, "spec.replicaz: unknown field"),
    ],
)
def test_runtime_alone_is_checked(spec: dict[str, Any], expected: str) -> None:
    problems = validate_runtime(runtime(**spec))
    assert any(expected in p for p in problems), problems


def test_valid_runtime_has_no_problems() -> None:
    assert validate_runtime(runtime(**P5, fsx={"claimName": "c"}, env=env(A="1"))) == []
    assert validate_runtime(runtime()) == []
