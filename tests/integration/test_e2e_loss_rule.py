"""The loss rule end to end (issue 40): pods run for real, the reference trainer in process on two workers,
``spec.monitoring.rules`` with ``loss: nonFinite`` and ``skipStep``. The trainer's test-only fault makes the
loss of ONE worker (replica 1) NaN at one step; every member drops that step in the same commit, training goes
on in the same processes with every later loss finite, the sample accounting stays exact, and the operator
reports the firing (Event ``RuleFired``, status.rulesFired, status.lastRuleFired).
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

NAN_STEP = 4
"""1-based, as the fault's variable, the step log and the rule-fired line count steps."""


def _fired_lines(t: Training, pod: str) -> list[dict[str, Any]]:
    """The ``rule-fired`` JSON lines a worker printed."""
    path = t.cluster.pod_log(t.ns, pod)
    text = path.read_text(errors="replace") if path.is_file() else ""
    out = []
    for line in text.splitlines():
        start = line.find("{")
        if start < 0 or '"rule-fired"' not in line:
            continue
        try:
            out.append(json.loads(line[start:]))
        except ValueError:
            continue
    return out


def test_a_nan_loss_on_one_member_is_dropped_by_every_member_and_training_goes_on(train: Training) -> None:
    t = train
    job = training.training_job(JOB, t.ns, minimum=2, maximum=2, steps=100000, recovery="inProcess")
    spec = job["spec"]
    spec["env"] += [
        {"name": "LLM_TRAINER_FAULT_NAN_AT_STEPS", "value": str(NAN_STEP)},
        {"name": "LLM_TRAINER_FAULT_NAN_REPLICA", "value": "1"},
    ]
    spec["monitoring"] = {"rules": [{"name": "nan", "loss": "nonFinite", "action": "skipStep"}]}
    t.apply(job)

    records = t.wait_steps("steps well past the broken one at world size 2", world=2, count=NAN_STEP + 4)
    skipped = [r for r in records if r.get("skipped")]
    assert [r["step"] for r in skipped] == [NAN_STEP], [(r["step"], r.get("loss")) for r in records]
    later = [r for r in records if r["step"] > NAN_STEP]
    assert later and all(r.get("loss") is not None and math.isfinite(r["loss"]) for r in later), later
    assert len({tuple(sorted(r["pids"])) for r in records}) == 1, "the same two processes train throughout"

    # Every member dropped the same step: each worker printed its own rule-fired line for it.
    for index in (0, 1):
        pod = t.worker_on(index)["metadata"]["name"]
        fired = wait_for(lambda p=pod: _fired_lines(t, p), 30, f"the rule-fired line of {pod}")
        assert [(f["rule"], f["action"], f["step"]) for f in fired] == [("nan", "skipStep", NAN_STEP)]

    def reported() -> dict[str, Any] | None:
        s = t.status()
        return s if (s.get("lastRuleFired") or {}).get("rule") == "nan" else None

    status = wait_for(reported, 60, "the operator to report the firing")
    assert status["rulesFired"] == 1 and status["lastRuleFired"]["action"] == "skipStep"
    assert status.get("restarts", 0) == 0 and status.get("processRestarts", 0) == 0
    t.audit()
