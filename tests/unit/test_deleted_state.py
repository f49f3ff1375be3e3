"""What a pod deletion's answer says is left (``Kube.delete_pod``): the name is free only with no object."""

from __future__ import annotations

import json
from typing import Any

import pytest
from llm_operator.kube import deleted_state


@pytest.mark.parametrize(
    ("answer", "left"),
    [
        ({"kind": "Pod", "metadata": {"name": "w"}}, "gone"),
        ({"kind": "Pod", "metadata": {"deletionTimestamp": "t", "deletionGracePeriodSeconds": 0}}, "gone"),
        (
            {"kind": "Pod", "metadata": {"deletionTimestamp": "t", "deletionGracePeriodSeconds": 30}},
            "terminating",
        ),
        ({"kind": "Pod", "metadata": {"finalizers": ["example.com/keep"]}}, "terminating"),
        ({"kind": "Status", "status": "Success"}, "gone"),
        ({"kind": "Status", "status": "Failure"}, "terminating"),
        ("not json", "terminating"),
    ],
)
def test_deleted_state(answer: Any, left: str) -> None:
    body = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
    assert deleted_state(body) == left
