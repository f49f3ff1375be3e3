"""Pieces every child object shares: owner reference, labels, metadata."""

from __future__ import annotations

from typing import Any

from llm_operator import labels
from llm_operator.api.models import LLMTrainingJob

# `llmjob render` has no apiserver, so no UID: children then carry this placeholder.
RENDER_UID = "00000000-0000-0000-0000-000000000000"


def job_uid(job: LLMTrainingJob) -> str:
    """The job's UID, or the render placeholder."""
    return job.metadata.uid or RENDER_UID


def owner_reference(job: LLMTrainingJob) -> dict[str, Any]:
    """Controller owner reference: deleting the job garbage-collects the child."""
    return {
        "apiVersion": job.apiVersion,
        "kind": job.kind,
        "name": job.metadata.name,
        "uid": job_uid(job),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_labels(job: LLMTrainingJob, role: str) -> dict[str, str]:
    """Labels of every child: job, role, managed-by, and the job's Kueue labels passed through."""
    out = {
        labels.JOB_NAME: job.metadata.name,
        labels.ROLE: role,
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
    }
    for key in labels.PASSTHROUGH_LABELS:
        if key in job.metadata.labels:
            out[key] = job.metadata.labels[key]
    return out


def child_metadata(
    job: LLMTrainingJob, name: str, role: str, extra_labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """metadata of a child object in the job's namespace."""
    return {
        "name": name,
        "namespace": job.metadata.namespace,
        "labels": {**child_labels(job, role), **(extra_labels or {})},
        "ownerReferences": [owner_reference(job)],
    }


RESTRICTED_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
