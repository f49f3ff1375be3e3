"""The phantom-failure guard's rule: a node leaving Ready without the dead-node mark is the bed's fault."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from llm_testbed.localcluster import marks
from llm_testbed.localcluster.kubectl import Kubectl
from llm_testbed.localcluster.nodewatch import NodeGuard, phantom


def _node(ready: str | None, *, dead: bool = False, name: str = "gpu-node-0") -> dict[str, Any]:
    conds = [] if ready is None else [
        {"type": "Ready", "status": ready, "reason": "NodeStatusUnknown",
         "message": "Kubelet stopped posting node status."}
    ]  # fmt: skip
    labels = {marks.NODE_NOT_READY_LABEL: "true"} if dead else {}
    return {"metadata": {"name": name, "labels": labels}, "status": {"conditions": conds}}


def test_only_an_unmarked_ready_node_leaving_ready_is_a_phantom() -> None:
    found = phantom("True", _node("Unknown"), 1.0)
    assert found is not None and found.node == "gpu-node-0" and found.status == "Unknown"
    assert "no test failed it" in found.describe()
    assert phantom("True", _node("Unknown", dead=True), 1.0) is None  # a test killed it
    assert phantom(None, _node("Unknown"), 1.0) is None  # first sight (or just created)
    assert phantom("Unknown", _node("Unknown"), 1.0) is None  # no transition
    assert phantom("Unknown", _node("True"), 1.0) is None  # coming back
    assert phantom("True", _node(None), 1.0) is None


def test_guard_follows_a_stream_of_events() -> None:
    guard = NodeGuard(Kubectl(Path("kubectl")))
    events = [
        {"type": "ADDED", "object": _node("True")},
        {"type": "ADDED", "object": _node("True", name="cpu-node-0")},
        {"type": "MODIFIED", "object": _node("Unknown", dead=True)},  # chaos
        {"type": "MODIFIED", "object": _node("True")},  # revived
        {"type": "MODIFIED", "object": _node("Unknown", name="cpu-node-0")},  # nobody asked
        {"type": "DELETED", "object": _node("Unknown", name="cpu-node-0")},
        {"type": "ADDED", "object": _node("Unknown", name="cpu-node-0")},  # re-created: not Ready yet
    ]
    text = "".join(json.dumps(e, indent=2) + "\n" for e in events)
    guard._read(io.BytesIO(text.encode()))
    assert [p.node for p in guard.take()] == ["cpu-node-0"]
    assert guard.take() == []
