"""policy.refusals: the condition and Event of workers the API server refused (table-driven)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from llm_operator.control.apply import Applied, with_refusals
from llm_operator.policy.refusals import CONDITION, Refusal, refusal_condition, refusal_event, refusal_message

PSS = 'pods "j-worker-0" is forbidden: violates PodSecurity "baseline:latest": non-default capabilities'
REFUSED = [Refusal("j-worker-0", 403, PSS)]


def _cond(status: str, message: str = "m") -> dict[str, Any]:
    return {"type": CONDITION, "status": status, "reason": "R", "message": message}


def test_message_is_the_status_message_else_the_body() -> None:
    assert refusal_message(403, json.dumps({"kind": "Status", "message": PSS})) == PSS
    assert refusal_message(400, "not json") == "not json"
    assert refusal_message(422, "") == "HTTP 422"


@pytest.mark.parametrize(
    ("previous", "refused", "created", "expected"),
    [
        ([], REFUSED, 0, ("True", "AdmissionRefused")),
        ([], [], 2, None),  # never refused: no condition at all
        ([_cond("True")], [], 0, ("True", "R")),  # nothing created: nothing new is known
        ([_cond("True")], [], 1, ("False", "Created")),
        ([_cond("False")], [], 0, ("False", "R")),
        ([_cond("False")], REFUSED, 1, ("True", "AdmissionRefused")),
    ],
)
def test_condition(
    previous: list[dict[str, Any]], refused: list[Refusal], created: int, expected: tuple[str, str] | None
) -> None:
    cond = refusal_condition(previous, refused, created, generation=3)
    if expected is None:
        assert cond is None
        return
    assert cond is not None and (cond["status"], cond["reason"]) == expected
    if refused:
        assert cond["message"] == f"the API server refused worker(s) j-worker-0: {PSS}"


def test_event_once_per_new_refusal() -> None:
    cond = refusal_condition([], REFUSED, 0, 1)
    assert refusal_event([], cond) == ("Warning", "AdmissionRefused", cond["message"] if cond else "")
    assert cond is not None and refusal_event([cond], cond) is None  # the same refusal again: no Event
    assert refusal_event([_cond("True", "other")], cond) is not None  # a different refusal: one more
    assert refusal_event([], refusal_condition([_cond("True")], [], 1, 1)) is None


def test_refused_workers_are_not_counted_as_replicas() -> None:
    status = with_refusals({"replicas": 4}, {}, Applied(0.0, ["j-worker-1"], REFUSED), generation=1)
    assert status["replicas"] == 3 and status["conditions"][-1]["type"] == CONDITION


def test_refused_workers_make_the_job_degraded_by_what_exists() -> None:
    """Every worker refused (Pod Security baseline, an EFA job): no worker exists, so Degraded says so, in
    the place the plan's Degraded held, instead of 'running at 2 of desired 2'."""
    planned = {
        "phase": "Pending",
        "replicas": 2,
        "targetReplicas": 2,
        "desiredReplicas": 2,
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "Pending", "message": ""},
            {"type": "Degraded", "status": "False", "reason": "AtDesiredSize", "message": "starting 2 of 2"},
        ],
    }
    refused = [*REFUSED, Refusal("j-worker-1", 403, PSS)]
    status = with_refusals(planned, {}, Applied(0.0, [], refused), generation=1)
    types = [c["type"] for c in status["conditions"]]
    assert types == ["Ready", "Degraded", CONDITION] and status["replicas"] == 0
    degraded = status["conditions"][1]
    assert (degraded["status"], degraded["reason"]) == ("True", "WorkersMissing")
    assert degraded["message"].startswith("0 of desired 2 workers exist: the API server refused worker(s)")
    created = with_refusals(
        planned, {"conditions": status["conditions"]}, Applied(1.0, ["j-worker-0"], []), 1
    )
    assert [c["status"] for c in created["conditions"]] == ["False", "False", "False"], "the plan's again"
