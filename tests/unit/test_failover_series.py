"""A replica that stops being active drops its per-job series at once (issue 56): with the alerts' ``max``
across replicas, a stale ``ready`` would hide a job below its size, a deleted job's ``waiting`` keep an alert
firing. Read back through prometheus_client's own registry, as a scrape would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from llm_operator import metrics
from llm_operator.readiness import STATES
from prometheus_client import REGISTRY

JOB = {"namespace": "ml", "llmjob": "llama"}
SIZES = {"desired": 4, "target": 4, "ready": 3, "members": None, "waiting": 1}


def ready() -> float | None:
    return REGISTRY.get_sample_value("llmjob_job_replicas", {**JOB, "kind": "ready"})


def per_job_samples() -> list[str]:
    """Every sample of the operator's metrics that carries a job label."""
    return [
        f"{s.name}{s.labels}"
        for family in REGISTRY.collect()
        if family.name.startswith("llmjob_")
        for s in family.samples
        if s.labels.get("llmjob") == JOB["llmjob"]
    ]


@pytest.fixture
def active() -> Iterator[None]:
    metrics.observe_operator_state("active", STATES)
    yield
    metrics.observe_operator_state("active", STATES)
    metrics.forget_job(JOB["namespace"], JOB["llmjob"])


def record_a_pass() -> None:
    metrics.observe_job(JOB["namespace"], JOB["llmjob"], "Running", SIZES)
    metrics.observe_progress(JOB["namespace"], JOB["llmjob"], {"step": 9, "goodput": 0.9}, 0.0)
    metrics.observe_topology(JOB["namespace"], JOB["llmjob"], True)
    metrics.RULE_FIRED.labels(JOB["namespace"], JOB["llmjob"], "nan", "skipStep").inc()


@pytest.mark.usefixtures("active")
@pytest.mark.parametrize("paused", sorted(metrics.PAUSED_STATES))
def test_a_paused_replica_drops_its_per_job_series_until_it_is_active_again(paused: str) -> None:
    record_a_pass()
    assert ready() == 3 and REGISTRY.get_sample_value("llmjob_job_phase", {**JOB, "phase": "Running"}) == 1
    assert REGISTRY.get_sample_value("llmjob_topology_spread_jobs") == 1

    metrics.observe_operator_state(paused, STATES)
    assert per_job_samples() == [], "every per-job series gone at once"
    assert REGISTRY.get_sample_value("llmjob_jobs", {"phase": "Running"}) == 0
    assert REGISTRY.get_sample_value("llmjob_topology_spread_jobs") == 0

    metrics.observe_job(JOB["namespace"], JOB["llmjob"], "Running", SIZES)  # a pass still in flight
    assert ready() is None, "nothing recorded while paused"

    metrics.observe_operator_state("active", STATES)
    record_a_pass()
    assert ready() == 3, "the next pass brings them back"


@pytest.mark.usefixtures("active")
@pytest.mark.parametrize("state", ["starting", "unknown", "absent"])
def test_states_where_kopf_may_still_serve_keep_the_series(state: str) -> None:
    record_a_pass()
    metrics.observe_operator_state(state, STATES)
    assert ready() == 3
