"""The runtime a job runs with (spec.runtimeRef): read once, copied into status.runtime, merged under the
job's own spec (docs/decisions.md, R1-R3).

The runtime is read once per job (and again only when spec.runtimeRef names another one): the copy lives
in status.runtime, so editing or deleting the runtime never changes a job that already uses it, and an
operator restart finds the same copy. A job whose runtime is missing, or whose merged spec is invalid,
gets no pass: :func:`unresolved_status` is the status that says why, written by the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from llm_operator.api.models import API_VERSION, CLUSTER_RUNTIME_KIND, KIND, LLMTrainingJob
from llm_operator.api.runtime import describe, merge, ref_of
from llm_operator.api.validate import validate
from llm_operator.kube import Kube
from llm_operator.policy.status import MESSAGE_LIMIT, condition, set_condition

RUNTIME_CONDITION = "RuntimeResolved"


@dataclass(frozen=True)
class RuntimeProblem:
    """Why a job's runtime cannot be used: ``RuntimeNotFound`` or ``InvalidSpec``, and the details."""

    reason: str
    message: str


def unresolved_status(
    status: Mapping[str, Any], generation: int, problem: RuntimeProblem, now: float
) -> dict[str, Any]:
    """The status fields that report ``problem``: condition RuntimeResolved=False, reason and message,
    the phase kept (Pending for a new job)."""
    message = problem.message[:MESSAGE_LIMIT]
    old = list(status.get("conditions") or [])
    return {
        "phase": status.get("phase") or "Pending",
        "reason": problem.reason,
        "message": message,
        "observedGeneration": generation,
        "conditions": set_condition(
            old, condition(RUNTIME_CONDITION, False, problem.reason, message, generation), now
        ),
    }


class RuntimeResolver:
    """One job's runtime copy, the check of its merged spec, and the Events about it."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.copy: dict[str, Any] | None = None
        """The copy of the runtime this job runs with; recorded as status.runtime."""
        self.checked: tuple[Any, ...] | None = None
        """(generation, runtime kind, name, resourceVersion) whose merged spec was last found valid."""
        self.problem = ""
        """The runtime problem last reported (one Event per new problem)."""

    def version(self) -> tuple[Any, ...] | None:
        """What the merged spec depends on besides the job's generation (None: no runtime in use)."""
        return self.checked if self.copy else None

    def runnable(self, body: Mapping[str, Any]) -> bool:
        """False while the job names a runtime that is not resolved yet."""
        return ref_of(body.get("spec")) is None or self.copy is not None

    def job(self, body: Mapping[str, Any], status: Mapping[str, Any]) -> LLMTrainingJob:
        """The job as last seen with ``status`` (watches lag behind); with spec.runtimeRef, its own spec
        merged over the runtime's copy."""
        data = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
        data["status"] = status
        if self.copy is not None and ref_of(data.get("spec")) is not None:
            source = describe(self.copy["kind"], self.copy["name"])
            data["spec"] = merge(self.copy.get("spec") or {}, dict(data["spec"]), source).spec
        return LLMTrainingJob.model_validate(data)

    async def resolve(self, body: Mapping[str, Any], status: Mapping[str, Any]) -> RuntimeProblem | None:
        """Make sure a job with spec.runtimeRef has its runtime's copy and a valid merged spec; the
        problem when not (no pass then)."""
        spec = dict(body.get("spec") or {})
        ref = ref_of(spec)
        if ref is None:
            self.copy = None
            return None
        kind, name = ref
        snapshot = self.copy if self.copy is not None else status.get("runtime")
        if not isinstance(snapshot, dict) or (snapshot.get("kind"), snapshot.get("name")) != ref:
            self.copy = None
            found = await self.kube.get_runtime(kind, self.namespace, name)
            if found is None:
                where = "" if kind == CLUSTER_RUNTIME_KIND else f" in namespace {self.namespace}"
                message = (
                    f"spec.runtimeRef: {describe(kind, name)} not found{where}; no workers until it exists"
                )
                return RuntimeProblem("RuntimeNotFound", message)
            snapshot = {
                "kind": kind,
                "name": name,
                "resourceVersion": str((found.get("metadata") or {}).get("resourceVersion") or ""),
                "spec": found.get("spec") or {},
            }
        generation = (body.get("metadata") or {}).get("generation")
        checked = (generation, snapshot.get("kind"), snapshot.get("name"), snapshot.get("resourceVersion"))
        if checked != self.checked:
            manifest = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            result = validate(manifest, snapshot)
            if result.problems:
                self.copy = None
                return RuntimeProblem("InvalidSpec", "; ".join(result.problems))
            self.checked = checked
        self.copy = snapshot
        self.problem = ""
        return None

    def report(self, problem: RuntimeProblem, body: kopf.Body, logger: kopf.Logger) -> None:
        """A warning and a Warning Event, once per new problem (after its status was written)."""
        if problem.message != self.problem:
            self.problem = problem.message
            logger.warning(f"{problem.reason}: {problem.message}")
            kopf.event(body, type="Warning", reason=problem.reason, message=problem.message)
