"""A worker the API server refuses is reported on the job at once, never left silently short.

The local apiserver runs the real PodSecurity admission: a namespace enforcing "baseline" refuses the
worker of an EFA job (the operator adds ``IPC_LOCK``). The job gets condition ``WorkersRefused`` and one
Warning Event, both quoting the API server; once the namespace allows the workers, the next pass creates
them and the condition turns False.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.wait import wait_for

from .kube_helpers import apply, events, job_manifest, status, workers

pytestmark = pytest.mark.cluster
TIMEOUT = 60
JOB = "efa"


def _refused(cluster: Any, namespace: str) -> dict[str, Any] | None:
    conds = status(cluster, namespace, JOB).get("conditions") or []
    return next((c for c in conds if c["type"] == "WorkersRefused"), None)


def _events(cluster: Any, namespace: str) -> list[str]:
    return [f"{e['type']} {e['message']}" for e in events(cluster, namespace, "AdmissionRefused")]


def test_pod_security_refusal_is_reported_on_the_job(cluster: Any, namespace: str, operator: Any) -> None:
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline")
    doc = job_manifest(JOB, namespace, minReplicas=1, maxReplicas=2, efaPerNode=32)
    assert apply(cluster, doc).returncode == 0

    cond = wait_for(
        lambda: (c := _refused(cluster, namespace)) and c["status"] == "True" and c, TIMEOUT, "WorkersRefused"
    )
    assert cond["reason"] == "AdmissionRefused", cond
    message = cond["message"]
    assert f"{JOB}-worker-0" in message and 'violates PodSecurity "baseline' in message, message
    assert "IPC_LOCK" in message, message
    (event,) = wait_for(lambda: _events(cluster, namespace), TIMEOUT, "the AdmissionRefused Event")
    assert event.startswith("Warning ") and "IPC_LOCK" in event, event
    assert workers(cluster, namespace, JOB) == [], "a refused worker does not exist"
    assert status(cluster, namespace, JOB).get("phase") != "Running"

    # The platform team allows the level EFA needs (docs/install.md, "Pod Security"): the workers come.
    cluster.kubectl(
        "label", "namespace", namespace, "--overwrite", "pod-security.kubernetes.io/enforce=privileged"
    )
    cluster.kubectl("annotate", "llmjob", JOB, "-n", namespace, "test/wake=1")  # any job event wakes it
    cleared = wait_for(
        lambda: (c := _refused(cluster, namespace)) and c["status"] == "False" and c,
        TIMEOUT,
        "refusal cleared",
    )
    assert cleared["reason"] == "Created", cleared
    assert len(workers(cluster, namespace, JOB)) == 2
    assert len(_events(cluster, namespace)) == 1, "one Event per refusal, not one per pass"
