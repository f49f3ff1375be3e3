"""The loss rule end to end (issue 40): pods run for real, the reference trainer in process on two workers,
``spec.monitoring.rules`` with ``loss: nonFinite``: ``skipStep``, and ``rollback`` after 2 breaks in a row.

The trainer's test-only fault makes the loss of ONE worker (replica 1) NaN at steps 4, 7 and 8. Every member
drops steps 4 and 7 in the same commit, and at step 8 every member loads the snapshot of step 6. Training
goes on in the same processes with every other loss finite, the sample accounting stays exact, and the
operator reports the firings (Event ``RuleFired``, status.rulesFired, status.lastRuleFired).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from llm_testbed import training
from support.wait import wait_for

from .e2e_support import JOB, Training

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.timeout(600)]

NAN_STEPS = (4, 7, 8)
"""1-based, as the fault's variable, the step log and the rule-fired line count steps."""
SNAPSHOT_EVERY = 3
FIRED = [("nan", "skipStep", 4), ("nan", "skipStep", 7), ("nan-again", "rollback", 8)]


def _lines(t: Training, pod: str, event: str) -> list[dict[str, Any]]:
    """The JSON event lines named ``event`` that a worker printed."""
    path = t.cluster.pod_log(t.ns, pod)
    text = path.read_text(errors="replace") if path.is_file() else ""
    out = []
    for line in text.splitlines():
        start = line.find("{")
        if start < 0 or f'"{event}"' not in line:
            continue
        try:
            found = json.loads(line[start:])
        except ValueError:
            continue
        if found.get("event") == event:
            out.append(found)
    return out


def test_a_nan_loss_on_one_member_is_dropped_by_every_member_and_training_goes_on(train: Training) -> None:
    t = train
    job = training.training_job(JOB, t.ns, minimum=2, maximum=2, steps=100000, recovery="inProcess")
    spec = job["spec"]
    spec["args"] += ["--snapshot-every", str(SNAPSHOT_EVERY)]
    spec["env"] += [
        {"name": "LLM_TRAINER_FAULT_NAN_AT_STEPS", "value": ",".join(map(str, NAN_STEPS))},
        {"name": "LLM_TRAINER_FAULT_NAN_REPLICA", "value": "1"},
    ]
    rules = [
        {"name": "nan", "loss": "nonFinite", "action": "skipStep"},
        {"name": "nan-again", "loss": "nonFinite", "action": "rollback", "after": 2},
    ]
    spec["monitoring"] = {"rules": rules}
    t.apply(job)

    def past_the_rollback() -> list[dict[str, Any]] | None:
        records = t.records()
        replayed = [r for r in records if r["step"] == NAN_STEPS[-1] and not r.get("skipped")]
        return records if replayed and records[-1]["step"] >= NAN_STEPS[-1] + 2 else None

    records = wait_for(past_the_rollback, 300, "training past the rollback")
    skipped = [r["step"] for r in records if r.get("skipped")]
    assert skipped == list(NAN_STEPS), [(r["step"], r.get("loss")) for r in records]
    applied = [r for r in records if not r.get("skipped")]
    assert all(r.get("loss") is not None and math.isfinite(r["loss"]) for r in applied), applied
    assert [r["world_size"] for r in records] == [2] * len(records)
    assert len({tuple(sorted(r["pids"])) for r in records}) == 1, "the same two processes train throughout"

    # Every member dropped the same steps and rolled back at the same one: each printed its own lines.
    for index in (0, 1):
        pod = t.worker_on(index)["metadata"]["name"]
        fired = wait_for(lambda p=pod: len(_lines(t, p, "rule-fired")) >= 3 or None, 30, f"{pod}'s firings")
        assert fired and [(f["rule"], f["action"], f["step"]) for f in _lines(t, pod, "rule-fired")] == FIRED
        rolled = [(e["step"], e["to"]) for e in _lines(t, pod, "rolled-back")]
        assert rolled == [(NAN_STEPS[-1], 6)], rolled

    def reported() -> dict[str, Any] | None:
        s = t.status()
        return s if s.get("rulesFired") == len(FIRED) else None

    status = wait_for(reported, 60, "the operator to report the three firings")
    assert (status["lastRuleFired"]["rule"], status["lastRuleFired"]["action"]) == ("nan-again", "rollback")
    assert status.get("restarts", 0) == 0 and status.get("processRestarts", 0) == 0
    t.audit()
