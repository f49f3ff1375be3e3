"""The shipped kwok Stages: well-formed, in step with marks.py, and never two matching one object.

kwokctl drops its built-in Stages once the config has any, so these are the whole lifecycle. The
selectors are evaluated here with a tiny interpreter of the few query forms they use, over every
combination of the states that matter, to show that at most one Stage applies at any time and that the
important cases land where the design says.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
import yaml
from llm_testbed.localcluster import kwokconfig, marks, tools

STAGES = kwokconfig.stages()
_CONDITION = re.compile(r'^\.status\.conditions\.\[\] \| select\( \.type == "(\w+)" \) \| \.status$')
_MAP_KEY = re.compile(r'^\.metadata\.(labels|annotations)\["([^"]+)"\]$')


def _query(obj: dict[str, Any], key: str) -> list[Any]:
    """Values of ``key`` in ``obj`` (kwok's semantics: no value -> empty list)."""
    if m := _CONDITION.match(key):
        conds = obj.get("status", {}).get("conditions", [])
        return [c["status"] for c in conds if c["type"] == m.group(1)]
    if m := _MAP_KEY.match(key):
        value = obj["metadata"].get(m.group(1), {}).get(m.group(2))
        return [] if value is None else [value]
    if key == ".metadata.ownerReferences.[].kind":
        return [ref["kind"] for ref in obj["metadata"].get("ownerReferences", [])]
    if key in (".metadata.deletionTimestamp", ".status.phase"):
        section, field = key[1:].split(".")
        value = obj.get(section, {}).get(field)
        return [] if value is None else [value]
    raise AssertionError(f"the test interpreter does not know the query {key!r}: teach it")


def _matches(stage: dict[str, Any], obj: dict[str, Any]) -> bool:
    for expr in stage["spec"]["selector"]["matchExpressions"]:
        values, op = _query(obj, expr["key"]), expr["operator"]
        wanted = expr.get("values", [])
        ok = {
            "In": any(v in wanted for v in values),
            "NotIn": not any(v in wanted for v in values),
            "Exists": bool(values),
            "DoesNotExist": not values,
        }[op]
        if not ok:
            return False
    return True


def _matching(kind: str, obj: dict[str, Any]) -> list[str]:
    return [
        s["metadata"]["name"] for s in STAGES if s["spec"]["resourceRef"]["kind"] == kind and _matches(s, obj)
    ]


def _pod(phase: str, *, deleting: bool = False, ready: str | None = None, exit_code: str | None = None,
         job: bool = False, node_lost: bool = False) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": "p", "annotations": {}}
    if node_lost:
        meta["labels"] = {marks.POD_ON_DEAD_NODE_LABEL: "true"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if exit_code is not None:
        meta["annotations"][marks.POD_EXIT_CODE_ANNOTATION] = exit_code
    if job:
        meta["ownerReferences"] = [{"kind": "Job", "name": "j"}]
    conds = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": meta, "status": {"phase": phase, "conditions": conds}}


def _node(*, ready: str | None = None, running: bool = True, dead: bool = False) -> dict[str, Any]:
    conds = [] if ready is None else [{"type": "Ready", "status": ready}]
    status: dict[str, Any] = {"conditions": conds}
    if running:
        status["phase"] = "Running"
    labels = {marks.NODE_NOT_READY_LABEL: "true"} if dead else {}
    return {"metadata": {"name": "n", "labels": labels}, "status": status}


def test_stages_are_well_formed_and_uniquely_named() -> None:
    names = [s["metadata"]["name"] for s in STAGES]
    assert len(names) == len(set(names))
    assert {s["kind"] for s in STAGES} == {"Stage"}
    assert {s["apiVersion"] for s in STAGES} == {"kwok.x-k8s.io/v1alpha1"}
    assert {s["spec"]["resourceRef"]["kind"] for s in STAGES} == {"Node", "Pod"}
    for stage in STAGES:
        assert stage["spec"]["selector"]["matchExpressions"], stage["metadata"]["name"]
        nxt = stage["spec"]["next"]
        assert nxt.get("delete") or nxt.get("statusTemplate"), stage["metadata"]["name"]


def test_stage_file_uses_the_keys_of_marks_py() -> None:
    assert f'annotations["{marks.POD_EXIT_CODE_ANNOTATION}"]' in kwokconfig.stages_text()


@pytest.mark.parametrize(
    ("phase", "deleting", "ready", "exit_code", "job"),
    list(
        itertools.product(
            ["Pending", "Running", "Succeeded", "Failed"],
            [False, True],
            [None, "True", "False"],
            [None, "3"],
            [False, True],
        )
    ),
)  # fmt: skip
def test_at_most_one_pod_stage_matches(
    phase: str, deleting: bool, ready: str | None, exit_code: str | None, job: bool
) -> None:
    pod = _pod(phase, deleting=deleting, ready=ready, exit_code=exit_code, job=job)
    assert len(_matching("Pod", pod)) <= 1, _matching("Pod", pod)


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (_pod("Pending"), ["llmjob-pod-start"]),
        (_pod("Running", ready="True"), []),  # steady state: nothing to do
        (_pod("Running", ready="True", exit_code="3"), ["llmjob-pod-exit"]),
        (_pod("Running", ready="False", exit_code="0"), ["llmjob-pod-exit"]),
        (_pod("Running", ready="True", job=True), ["llmjob-pod-job-complete"]),
        (_pod("Running", ready="True", exit_code="0", job=True), ["llmjob-pod-exit"]),
        (_pod("Running", ready="False"), ["llmjob-pod-ready-again"]),  # its node came back
        (_pod("Running", ready="False", job=True), ["llmjob-pod-ready-again"]),
        (_pod("Running", ready="True", deleting=True), ["llmjob-pod-delete"]),
        (_pod("Running", ready="False", deleting=True), ["llmjob-pod-delete"]),  # deletion waited
        (_pod("Pending", deleting=True), ["llmjob-pod-delete"]),
        (_pod("Failed", ready="False", exit_code="3"), []),
        (_pod("Succeeded", ready="False", job=True), []),
    ],
)
def test_pod_lifecycle_lands_in_the_intended_stage(pod: dict[str, Any], expected: list[str]) -> None:
    assert _matching("Pod", pod) == expected


@pytest.mark.parametrize(
    ("phase", "deleting", "ready", "exit_code"),
    list(itertools.product(["Pending", "Running"], [False, True], [None, "True", "False"], [None, "3"])),
)
def test_no_pod_stage_touches_a_pod_whose_node_is_dead(
    phase: str, deleting: bool, ready: str | None, exit_code: str | None
) -> None:
    """Not ready again, no deletion finished, no exit: the pod waits for its node like on a real cluster."""
    pod = _pod(phase, deleting=deleting, ready=ready, exit_code=exit_code, node_lost=True)
    assert _matching("Pod", pod) == []


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (_node(ready=None, running=False), ["llmjob-node-ready"]),  # just created
        (_node(ready="True"), ["llmjob-node-heartbeat"]),
        (_node(ready="Unknown"), ["llmjob-node-ready"]),  # dead-node mark removed: recovers
        (_node(ready="False"), ["llmjob-node-ready"]),
        (_node(ready="Unknown", dead=True), []),  # a dead node stays dead, whatever kwok replays
        (_node(ready="True", dead=True), []),  # no heartbeat either
    ],
)
def test_node_lifecycle_lands_in_the_intended_stage(node: dict[str, Any], expected: list[str]) -> None:
    assert _matching("Node", node) == expected


def test_kwok_manages_every_node_and_no_stage_touches_a_dead_one() -> None:
    """kwok's management is never switched per node (that races its lease queue: docs/decisions.md,
    "Dead fake nodes"); a dead node is one whose Lease chaos holds, and every node Stage excludes the
    dead-node mark."""
    config = kwokconfig.kwokctl_configuration(kwokconfig.KwokctlSettings())
    assert not [p for p in config["componentsPatches"] if p["name"] == "kwok-controller"]
    for stage in STAGES:
        if stage["spec"]["resourceRef"]["kind"] == "Node":
            exprs = stage["spec"]["selector"]["matchExpressions"]
            dead = {"key": f'.metadata.labels["{marks.NODE_NOT_READY_LABEL}"]', "operator": "DoesNotExist"}
            assert dead in exprs, stage["metadata"]["name"]


def test_kwokctl_config_is_lean_and_pinned() -> None:
    docs = list(
        yaml.safe_load_all(
            kwokconfig.render(
                kwokconfig.KwokctlSettings(ports={"kubeApiserverPort": 6443, "etcdPort": 23790})
            )
        )
    )
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "KwokctlConfiguration"
    assert "KwokConfiguration" not in kinds, "a partial KwokConfiguration zeroes kwok's other defaults"
    assert kinds.count("Stage") == len(STAGES)
    options = docs[0]["options"]
    assert options["runtime"] == "binary"
    assert options["kubeVersion"] == tools.KUBE_VERSION
    assert (options["kubeApiserverPort"], options["etcdPort"]) == (6443, 23790)
    assert options["heartbeatFactor"] == 1
    assert options["bindAddress"] == "127.0.0.1"
    controllers = docs[0]["componentsPatches"][0]["extraArgs"][0]
    assert controllers["key"] == "controllers"
    disabled = {c[1:] for c in controllers["value"].split(",") if c.startswith("-")}
    assert "node-lifecycle-controller" not in disabled
    assert "garbage-collector-controller" not in disabled
    assert all(name.endswith("-controller") for name in disabled), "canonical names only"
