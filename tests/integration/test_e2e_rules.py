"""Monitoring rules (issue 40) end to end: pods run for real (the local pod runner), the supervisor in each
worker reads the program's output and acts, the operator turns the firings into Events and status.

One story, in process (recovery inProcess, one process per pod), with a plain script as the program:

1. The ClusterLLMTrainingRuntime the job names brings ``steps-flowing`` (a step line at least every 3 s,
   restartWorker): the script prints step lines, then hangs; it is restarted in its pod within
   expectedRecurringSeconds plus a few seconds.
2. The job's own ``throughput`` rule (tokens/s below 100 three times, replaceNode): the restarted script
   reports a low throughput; the worker exits 78, the node is recorded and avoided, the pod replaced.
3. The job's ``started`` rule (first step line within 8 s, failJob): the replacement never prints; the job
   fails with reason RuleFired.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_testbed.localcluster.cluster import LocalCluster
from support.live_events import events
from support.wait import wait_for

from .conftest import PeeredOperatorProcess
from .kube_helpers import wait_events

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

API = "elasticllm.dev/v1alpha1"
JOB = "rules"
RECURRING = 3
SCRIPT = """
import os, sys, time
run = int(os.environ.get("LLMJOB_PROCESS_RESTARTS", "0"))
if int(os.environ.get("LLMJOB_ATTEMPT", "0")) > 0:
    time.sleep(600)  # the replacement never starts training: the start cut-off fails the job
for step in range(4):
    print(f"step {step} loss 2.5 at {time.time():.3f}", flush=True)
    time.sleep(0.2)
if run == 0:
    time.sleep(600)  # hung: the recurring rule restarts the program
for step in range(4, 8):
    print(f"step {step} loss 2.4 tokens/s 10", flush=True)
    time.sleep(0.2)
time.sleep(600)
"""


def _runtime(name: str) -> dict[str, Any]:
    rule = {
        "name": "steps-flowing",
        "logPattern": r"step (\d+) loss",
        "expectedStartCutOffSeconds": 120,
        "expectedRecurringSeconds": RECURRING,
        "action": "restartWorker",
    }
    return {
        "apiVersion": API,
        "kind": "ClusterLLMTrainingRuntime",
        "metadata": {"name": name},
        "spec": {"monitoring": {"rules": [rule]}, "failurePolicy": {"recovery": "inProcess"}},
    }


def _job(namespace: str, runtime: str) -> dict[str, Any]:
    rules = [
        {
            "name": "throughput",
            "logPattern": r"tokens/s (\d+(\.\d+)?)",
            "metricThreshold": 100,
            "operator": "lt",
            "dataPoints": 3,
            "action": "replaceNode",
        },
        {
            "name": "started",
            "logPattern": r"step \d+ loss",
            "expectedStartCutOffSeconds": 8,
            "action": "failJob",
        },
    ]
    return {
        "apiVersion": API,
        "kind": "LLMTrainingJob",
        "metadata": {"name": JOB, "namespace": namespace},
        "spec": {
            "runtimeRef": {"kind": "ClusterLLMTrainingRuntime", "name": runtime},
            "minReplicas": 1,
            "maxReplicas": 1,
            "image": "local/plain-script",
            "command": ["python", "-c", SCRIPT],
            "gpusPerNode": 8,
            "nprocPerNode": 1,
            "resources": {"cpu": "1", "memory": "1Gi"},
            "terminationGracePeriodSeconds": 5,
            "failurePolicy": {"maxRestarts": 5, "nodeFailureGraceSeconds": 0},
            "monitoring": {"rules": rules},
        },
    }


def _apply(cluster: LocalCluster, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))


def _status(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    return dict((cluster.kube.get("llmtrainingjob", JOB, namespace) or {}).get("status") or {})


def test_log_rules_restart_a_hung_program_replace_a_slow_node_and_fail_a_silent_start(
    process_cluster: LocalCluster, process_namespace: str, tmp_path: Path
) -> None:
    cluster, ns = process_cluster, process_namespace
    runtime = f"rules-{ns}"[:63]
    _apply(cluster, ns, _runtime(runtime))
    operator = PeeredOperatorProcess(ns, tmp_path, ["--namespace", ns], [], {})
    operator.start()
    try:
        _apply(cluster, ns, _job(ns, runtime))
        pod = f"{JOB}-worker-0"

        def log_events() -> list[dict[str, Any]]:
            path = cluster.pod_log(ns, pod, "trainer")
            return events(path.read_text(errors="replace")) if path.is_file() else []

        def fired(rule: str) -> list[dict[str, Any]] | None:
            return [
                e for e in log_events() if e.get("event") == "rule-fired" and e.get("rule") == rule
            ] or None

        # 1. hung after its step lines: restarted in the pod (the runtime's rule).
        (hang,) = wait_for(lambda: fired("steps-flowing"), 120, "steps-flowing fired", interval=0.5)
        text = cluster.pod_log(ns, pod, "trainer").read_text(errors="replace")
        last_step = max(
            float(line.rsplit(" at ", 1)[1]) for line in text.splitlines() if line.startswith("step 3 ")
        )
        restarted = next(e for e in log_events() if e.get("event") == "process-restarted")
        assert restarted["rule"] == "steps-flowing" and hang["action"] == "restartWorker"
        to_action = restarted["time"] - last_step
        assert RECURRING <= to_action <= RECURRING + 3, to_action
        # 2. the restarted program is slow: the worker is replaced and its node avoided.
        node = str(cluster.kube.get("pod", pod, ns)["spec"]["nodeName"])

        def replaced() -> dict[str, Any] | None:
            s = _status(cluster, ns)
            return s if any(n.get("node") == node for n in s.get("unhealthyNodes") or []) else None

        s = wait_for(replaced, 120, f"{node} recorded unhealthy by the throughput rule", interval=0.5)
        entry = next(n for n in s["unhealthyNodes"] if n["node"] == node)
        assert entry["check"] == "rule" and entry["reason"].startswith("rule-fired: throughput replaceNode")
        # 3. the replacement never prints: the start cut-off fails the job.
        final = wait_for(
            lambda: (lambda st: st if st.get("phase") == "Failed" else None)(_status(cluster, ns)),
            120,
            "the job failed by the started rule",
            interval=0.5,
        )
        assert final["reason"] == "RuleFired" and final["rulesFired"] == 2, final
        last = final["lastRuleFired"]
        assert (last["rule"], last["action"]) == ("started", "failJob"), last
        throughput = wait_events(cluster, ns, "RuleFired", lambda e: "rule throughput fired" in e["message"])
        assert any("replaceNode" in e["message"] for e in throughput), throughput
        wait_events(
            cluster,
            ns,
            "RuleFired",
            lambda e: "rule started fired" in e["message"] and "failJob" in e["message"],
        )
        replacement = cluster.kube.get("pod", pod, ns)
        assert replacement is not None and replacement["spec"].get("nodeName") != node
        print(f"rules: last step line -> restart {to_action:.2f}s (expectedRecurringSeconds {RECURRING})")
    finally:
        operator.stop()
        cluster.kubectl("delete", "llmtrainingjob", "--all", "-n", ns, "--wait=false", check=False)
        cluster.kubectl("delete", "clusterllmtrainingruntime", runtime, "--wait=false", check=False)


BAD_RULES: list[tuple[dict[str, Any], str]] = [
    (
        {"name": "a", "logPattern": "step (?=1)", "action": "event"},
        'spec.monitoring.rules[0].logPattern: Invalid value: "string": error parsing regexp: invalid or'
        " unsupported Perl syntax: `(?=`",
    ),
    (
        {
            "name": "a",
            "logPattern": r"tokens/s (?:\d+)",
            "metricThreshold": 1,
            "operator": "lt",
            "action": "event",
        },
        "metricThreshold needs a capture group",
    ),
    (
        {"name": "a", "logPattern": "x", "action": "reboot"},
        'spec.monitoring.rules[0].action: Unsupported value: "reboot"',
    ),
    (
        {"name": "a", "logPattern": r"x (\d)", "metricThreshold": 1, "operator": "eq", "action": "event"},
        'spec.monitoring.rules[0].operator: Unsupported value: "eq"',
    ),
    (
        {"name": "a", "logPattern": "x", "action": "skipStep"},
        "rules[a].action: skipStep is not an action of a log rule",
    ),
    (
        {"name": "a", "loss": "nonFinite", "action": "skipStep"},
        "a loss rule needs spec.failurePolicy.recovery inProcess",
    ),
]


def test_the_apiserver_refuses_bad_rules_with_the_field_named(
    process_cluster: LocalCluster, process_namespace: str
) -> None:
    for rule, expected in BAD_RULES:
        doc = _job(process_namespace, "unused")
        del doc["spec"]["runtimeRef"]
        doc["spec"]["monitoring"] = {"rules": [rule]}
        done = process_cluster.kubectl(
            "apply",
            "--dry-run=server",
            "-n",
            process_namespace,
            "-f",
            "-",
            input=yaml.safe_dump(doc),
            check=False,
        )
        assert done.returncode != 0 and expected in done.stderr, (rule, done.stderr)


RESTART_SCRIPT = """
import os, time
run = int(os.environ.get("LLMJOB_PROCESS_RESTARTS", "0"))
for step in range(3):
    print(f"step {step} loss 2.5 run {run} at {time.time():.3f}", flush=True)
    time.sleep(0.2)
time.sleep(600 if run == 0 else 0)
print("done", flush=True)
"""


def test_restart_mode_a_hung_program_is_restarted_with_its_torchrun_agent(
    process_cluster: LocalCluster, process_namespace: str, tmp_path: Path
) -> None:
    """recovery restart: the supervisor runs torchrun and restarts it (and the program) on restartWorker."""
    cluster, ns = process_cluster, process_namespace
    doc = _job(ns, "unused")
    del doc["spec"]["runtimeRef"]
    doc["spec"]["command"] = ["python", "-c", RESTART_SCRIPT]
    doc["spec"]["failurePolicy"] = {"maxRestarts": 5, "nodeFailureGraceSeconds": 0, "recovery": "restart"}
    doc["spec"]["monitoring"] = {
        "rules": [
            {
                "name": "steps-flowing",
                "logPattern": r"step (\d+) loss",
                "expectedStartCutOffSeconds": 120,
                "expectedRecurringSeconds": RECURRING,
                "action": "restartWorker",
            }
        ]
    }
    operator = PeeredOperatorProcess(ns, tmp_path, ["--namespace", ns], [], {})
    operator.start()
    try:
        _apply(cluster, ns, doc)
        pod = f"{JOB}-worker-0"
        log = cluster.pod_log(ns, pod, "trainer")

        def second_run() -> str | None:
            text = log.read_text(errors="replace") if log.is_file() else ""
            return text if "step 2 loss 2.5 run 1" in text else None

        text = wait_for(second_run, 180, "the program's second run after restartWorker", interval=0.5)
        found = events(text)
        fired = next(e for e in found if e.get("event") == "rule-fired")
        restarted = next(e for e in found if e.get("event") == "process-restarted")
        assert fired["rule"] == "steps-flowing" and restarted["rule"] == "steps-flowing"
        last_step = max(
            float(line.rsplit(" at ", 1)[1])
            for line in text.splitlines()
            if line.startswith("step 2 loss 2.5 run 0")
        )
        to_action = restarted["time"] - last_step
        assert RECURRING <= to_action <= RECURRING + 12, to_action  # + torchrun's own stop of its worker
        assert cluster.kube.get("pod", pod, ns)["status"]["phase"] == "Running"  # the same pod
        print(f"rules (restart mode): last step line -> torchrun restarted {to_action:.2f}s")
    finally:
        operator.stop()
        cluster.kubectl("delete", "llmtrainingjob", "--all", "-n", ns, "--wait=false", check=False)
