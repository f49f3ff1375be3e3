"""Job manifests for unit tests."""

from __future__ import annotations

import copy
from typing import Any

from llm_operator.api.models import LLMTrainingJob

BASE: dict[str, Any] = {
    "apiVersion": "elasticllm.dev/v1alpha1",
    "kind": "LLMTrainingJob",
    "metadata": {"name": "llama", "namespace": "ml", "uid": "uid-1234", "generation": 3},
    "spec": {"minReplicas": 2, "maxReplicas": 4, "image": "trainer:1"},
}


def manifest(**spec: Any) -> dict[str, Any]:
    """BASE with spec fields overridden (None deletes a field)."""
    out = copy.deepcopy(BASE)
    for key, value in spec.items():
        if value is None:
            out["spec"].pop(key, None)
        else:
            out["spec"][key] = value
    return out


def job(status: dict[str, Any] | None = None, **spec: Any) -> LLMTrainingJob:
    data = manifest(**spec)
    if status is not None:
        data["status"] = status
    return LLMTrainingJob.model_validate(data)
