"""The Argo CD health check (deploy/argocd/health.lua) run in a real Lua 5.1 VM, the way Argo CD runs it.

Argo CD (gopher-lua, Lua 5.1) opens only the safe libraries, sets the live object as the global `obj`,
runs the script and reads `status` and `message` from the table the script returns. The harness below
does the same with lupa's Lua 5.1 runtime and removes the libraries Argo CD does not open, so a script
that reached for `os` or `require` would fail here too.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from llm_operator.api.models import PHASES
from llm_operator.policy.admission import QUEUED
from llm_operator.policy.admission import condition as admission_condition
from llm_operator.policy.refusals import Refusal, refusal_condition
from llm_operator.policy.status import conditions
from lupa import lua51

ROOT = Path(__file__).resolve().parents[2]
ARGOCD = ROOT / "deploy" / "argocd"
LUA = (ARGOCD / "health.lua").read_text()
CM_KEY = "resource.customizations.health.elasticllm.dev_LLMTrainingJob"
ARGO_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown"}
# What the script must not use. Argo CD v3.6 opens base, table, package and a safe os only: no string or
# math library (a real Argo CD showed it: tests/integration/test_argocd.py).
NOT_IN_ARGO_SANDBOX = ("os", "io", "require", "package", "debug", "dofile", "loadfile", "module", "string",
                       "math")  # fmt: skip


def _to_lua(runtime: Any, value: Any) -> Any:
    """JSON-like Python data -> Lua values, as Argo CD converts the unstructured object (null -> nil)."""
    if isinstance(value, dict):
        return runtime.table_from({k: _to_lua(runtime, v) for k, v in value.items() if v is not None})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, v) for v in value])
    return value


def assess(obj: dict[str, Any]) -> tuple[str, str]:
    runtime = lua51.LuaRuntime(unpack_returned_tuples=False, register_eval=False)
    g = runtime.globals()
    for name in NOT_IN_ARGO_SANDBOX:
        g[name] = None
    g["obj"] = _to_lua(runtime, obj)
    hs = runtime.execute(LUA)
    assert hs is not None, "the script must return the hs table"
    status, message = hs["status"], hs["message"]
    assert status in ARGO_STATUSES, f"not an Argo CD health status: {status!r}"
    assert isinstance(message, str) and message, "every outcome carries a message"
    return status, message


def job(*, status: dict[str, Any] | None = None, generation: int = 1, **spec: Any) -> dict[str, Any]:
    base_spec: dict[str, Any] = {"minReplicas": 2, "maxReplicas": 4, "image": "trainer:1"}
    base_spec.update(spec)
    obj: dict[str, Any] = {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": "llama", "namespace": "ml", "generation": generation},
        "spec": base_spec,
    }
    if status is not None:
        obj["status"] = {"observedGeneration": generation, **status}
    return obj


def ready(phase: str, n: int, **extra: Any) -> dict[str, Any]:
    return {"phase": phase, "replicas": n, "readyReplicas": n, "targetReplicas": n, **extra}


DEGRADED_TRUE = [
    {"type": "Ready", "status": "False"},
    {"type": "Degraded", "status": "True", "reason": "NodeLost", "message": "node ip-10-0-1-7 lost"},
]

PROGRESS = {"step": 120, "totalSteps": 1000, "goodput": 0.9712, "eta": "1h3m"}
ADMITTED_FALSE = {
    "type": "Admitted",
    "status": "False",
    "reason": "Pending",
    "message": "ClusterQueue gpu is out of nvidia.com/gpu",
}
REFUSED = {
    "type": "WorkersRefused",
    "status": "True",
    "reason": "AdmissionRefused",
    "message": "the API server refused worker(s) llama-worker-0: violates PodSecurity",
}

CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # (case id, object, expected status, substring of the message)
    ("new job without status", job(), "Progressing", "Waiting for the operator"),
    ("status without phase", job(status={"replicas": 0}), "Progressing", "Waiting for the operator"),
    ("pending", job(status={"phase": "Pending", "readyReplicas": 0}), "Progressing", "Pending: 0/4"),
    (
        "running at default size (replicas unset -> maxReplicas)",
        job(status=ready("Running", 4)),
        "Healthy",
        "4/4 workers ready",
    ),
    (
        "running below default size",
        job(status={"phase": "Running", "readyReplicas": 3, "targetReplicas": 3}),
        "Degraded",
        "3/4 workers ready (target 3)",
    ),
    ("running at explicit size", job(replicas=3, status=ready("Running", 3)), "Healthy", "3/3"),
    (
        "runtime supplies maxReplicas: desired size from the status",
        job(
            maxReplicas=None,
            runtimeRef={"name": "p5"},
            status={"phase": "Running", "readyReplicas": 3, "targetReplicas": 3, "desiredReplicas": 4},
        ),
        "Degraded",
        "3/4 workers ready",
    ),
    (
        "running above explicit size (scale-down in flight)",
        job(replicas=2, status=ready("Running", 3)),
        "Healthy",
        "3/2",
    ),
    (
        "running below explicit size",
        job(replicas=3, status={"phase": "Running", "readyReplicas": 2, "targetReplicas": 3}),
        "Degraded",
        "below the desired size: 2/3",
    ),
    (
        "below size carries the Degraded condition message",
        job(status={"phase": "Running", "readyReplicas": 2, "conditions": DEGRADED_TRUE}),
        "Degraded",
        "node ip-10-0-1-7 lost",
    ),
    (
        "at size but Degraded condition true",
        job(status=ready("Running", 4, conditions=DEGRADED_TRUE)),
        "Degraded",
        "node ip-10-0-1-7 lost",
    ),
    (
        "Degraded condition false is fine",
        job(status=ready("Running", 4, conditions=[{"type": "Degraded", "status": "False"}])),
        "Healthy",
        "Running",
    ),
    (
        "no readyReplicas field counts as zero",
        job(replicas=2, status={"phase": "Running"}),
        "Degraded",
        "0/2",
    ),
    (
        "scaling",
        job(status={"phase": "Scaling", "readyReplicas": 3, "targetReplicas": 4}),
        "Progressing",
        "Scaling: 3/4",
    ),
    (
        "restarting shows the restart count",
        job(status={"phase": "Restarting", "readyReplicas": 0, "targetReplicas": 4, "restarts": 2}),
        "Progressing",
        "restart 2",
    ),
    (
        "restarting with a Degraded condition is still progressing",
        job(status={"phase": "Restarting", "readyReplicas": 1, "conditions": DEGRADED_TRUE}),
        "Progressing",
        "Restarting",
    ),
    ("succeeded", job(status={"phase": "Succeeded", "readyReplicas": 0}), "Healthy", "Training finished"),
    (
        "succeeded with its condition message",
        job(
            status={
                "phase": "Succeeded",
                "conditions": [{"type": "Complete", "status": "True", "message": "done at step 9000"}],
            }
        ),
        "Healthy",
        "done at step 9000",
    ),
    ("queued for Kueue", job(status={"phase": "Queued"}), "Suspended", "Queued: waiting for Kueue"),
    (
        "queued with Kueue's words",
        job(status={"phase": "Queued", "conditions": [ADMITTED_FALSE]}),
        "Suspended",
        "Queued: ClusterQueue gpu is out of nvidia.com/gpu",
    ),
    (
        "workers refused while pending",
        job(status={"phase": "Pending", "readyReplicas": 0, "conditions": [REFUSED]}),
        "Degraded",
        "Pending: the API server refused worker(s) llama-worker-0",
    ),
    (
        "workers refused while running",
        job(status=ready("Running", 4, conditions=[REFUSED])),
        "Degraded",
        "Running: the API server refused",
    ),
    (
        "refusal over",
        job(status=ready("Running", 4, conditions=[{**REFUSED, "status": "False"}])),
        "Healthy",
        "4/4 workers ready",
    ),
    ("failed", job(status={"phase": "Failed"}), "Degraded", "Training failed"),
    (
        "failed with its condition message",
        job(
            status={
                "phase": "Failed",
                "conditions": [{"type": "Failed", "status": "True", "message": "maxRestarts (20) exceeded"}],
            }
        ),
        "Degraded",
        "maxRestarts (20) exceeded",
    ),
    ("suspended phase", job(suspend=True, status={"phase": "Suspended"}), "Suspended", "Suspended"),
    (
        "suspend requested, workers still running",
        job(suspend=True, status=ready("Running", 4)),
        "Suspended",
        "Suspending",
    ),
    ("suspend requested before any status", job(suspend=True), "Suspended", "Suspending"),
    ("suspend false is ignored", job(suspend=False, status=ready("Running", 4)), "Healthy", "4/4"),
    (
        "suspended job that already failed stays failed",
        job(suspend=True, status={"phase": "Failed"}),
        "Degraded",
        "failed",
    ),
    (
        "status of an older generation",
        {
            **job(generation=3, status=ready("Running", 4)),
            "status": {**ready("Running", 4), "observedGeneration": 2},
        },
        "Progressing",
        "latest spec",
    ),
    ("unknown phase", job(status={"phase": "Exploding"}), "Unknown", "Exploding"),
    (
        "running shows training progress",
        job(status=ready("Running", 4, progress=PROGRESS)),
        "Healthy",
        "Running: 4/4 workers ready; step 120/1000, goodput 97%, ETA 1h3m",
    ),
    (
        "restarting shows progress after the restart count",
        job(status={"phase": "Restarting", "restarts": 2, "progress": PROGRESS}),
        "Progressing",
        "restart 2; step 120/1000, goodput 97%",
    ),
    (
        "progress without total, goodput or ETA (a program serving only its step)",
        job(status=ready("Running", 4, progress={"step": 7})),
        "Healthy",
        "workers ready; step 7",
    ),
    (
        "succeeded keeps the final progress",
        job(status={"phase": "Succeeded", "progress": {**PROGRESS, "step": 1000, "eta": None}}),
        "Healthy",
        "Training finished; step 1000/1000, goodput 97%",
    ),
    (
        "numbers arriving as floats (JSON) still format as counts",
        job(replicas=4.0, status={"phase": "Running", "readyReplicas": 4.0, "targetReplicas": 4.0}),
        "Healthy",
        "4/4 workers ready",
    ),
]


@pytest.mark.parametrize(("obj", "expected", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_health(obj: dict[str, Any], expected: str, fragment: str) -> None:
    status, message = assess(obj)
    assert (status, fragment in message) == (expected, True), f"got {status}: {message!r}"


def test_every_phase_the_operator_writes_has_a_case_and_a_defined_status() -> None:
    phases = {c[1].get("status", {}).get("phase") for c in CASES}
    assert set(PHASES) <= phases, f"phases without a case: {sorted(set(PHASES) - phases)}"
    for phase in PHASES:
        status, message = assess(job(status={"phase": phase, "readyReplicas": 0}))
        assert status != "Unknown", f"{phase}: {message}"


@pytest.mark.parametrize(
    ("phase", "expected"), [("Succeeded", "Healthy"), ("Failed", "Degraded")], ids=["Succeeded", "Failed"]
)
def test_a_finished_job_shows_the_message_of_the_condition_the_operator_writes(
    phase: str, expected: str
) -> None:
    """The conditions come from the operator's own builder, so a renamed condition fails here."""
    written = conditions(phase, 0, 4, "", "the words of the operator", generation=1)
    assert assess(job(status={"phase": phase, "conditions": written})) == (
        expected,
        "the words of the operator",
    )


def test_queued_and_refused_read_the_conditions_the_operator_writes() -> None:
    queued = admission_condition(QUEUED, generation=1)
    assert assess(job(status={"phase": "Queued", "conditions": [queued]})) == (
        "Suspended",
        f"Queued: {QUEUED.message}",
    )
    refused = refusal_condition([], [Refusal("llama-worker-0", 403, "forbidden")], 0, generation=1)
    assert refused is not None
    status, message = assess(job(status={"phase": "Pending", "conditions": [refused]}))
    assert (status, message) == ("Degraded", f"Pending: {refused['message']}")


def test_sandbox_really_blocks_os() -> None:
    """The harness would catch a script that used a library Argo CD does not open."""
    runtime = lua51.LuaRuntime(register_eval=False)
    for name in NOT_IN_ARGO_SANDBOX:
        runtime.globals()[name] = None
    with pytest.raises(lua51.LuaError):
        runtime.execute("return os.time()")


def _load_renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_health_config", ARGOCD / "render_health_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_generated_argocd_cm_snippets_are_current() -> None:
    rendered: dict[str, str] = _load_renderer().render(LUA)
    assert rendered, "the renderer produced nothing"
    for name, content in rendered.items():
        committed = (ARGOCD / name).read_text()
        assert committed == content, (
            f"deploy/argocd/{name} is stale: run `python deploy/argocd/render_health_config.py`"
        )


def test_snippets_carry_the_lua_unchanged() -> None:
    patch = yaml.safe_load((ARGOCD / "argocd-cm-health-patch.yaml").read_text())
    assert (patch["kind"], patch["metadata"]["name"]) == ("ConfigMap", "argocd-cm")
    assert patch["data"][CM_KEY] == LUA
    values = yaml.safe_load((ARGOCD / "argo-cd-helm-values.yaml").read_text())
    assert values["configs"]["cm"][CM_KEY] == LUA


def test_kustomize_component_points_at_the_lua_file() -> None:
    component = yaml.safe_load((ARGOCD / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    (generator,) = component["configMapGenerator"]
    assert (generator["name"], generator["behavior"]) == ("argocd-cm", "merge")
    assert generator["files"] == [f"{CM_KEY}=health.lua"]
