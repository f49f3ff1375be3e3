"""Table-driven tests of the pure policies: exits, health signals, capacity, size, phase."""

from __future__ import annotations

import pytest
from llm_operator.policy.capacity import free_slots
from llm_operator.policy.exits import classify_exit
from llm_operator.policy.health import assess
from llm_operator.policy.resize import SizeInput, decide_size
from llm_operator.policy.status import PhaseInput, decide_phase, degraded_condition, merge_conditions

from .jobs import job
from .views import NOW, node, pod


@pytest.mark.parametrize(
    ("code", "reason", "listed", "expected"),
    [
        (0, "", [], "success"),
        (1, "", [], "retry"),
        (137, "", [], "retry"),
        (3, "", [3], "fatal"),
        (3, "Evicted", [3], "retry"),
        (None, "", [1], "retry"),
        (0, "", [0], "success"),
    ],
)
def test_classify_exit(code: int | None, reason: str, listed: list[int], expected: str) -> None:
    assert classify_exit(code, reason, listed) == expected


UNREACH = ("node.kubernetes.io/unreachable", "NoExecute", NOW - 40)
HEALTH_TABLE = [
    # (case, pod kwargs, node or "missing", grace, expected state, signal, force)
    ("healthy", {}, node("node-0"), 30, "healthy", "", False),
    ("unscheduled", {"node": "", "phase": "Pending", "ready": False}, None, 30, "pending", "", False),
    ("node deleted", {}, "missing", 30, "lost", "NodeDeleted", True),
    (
        "not ready past grace",
        {},
        node("node-0", ready=False, not_ready_since=NOW - 31),
        30,
        "lost",
        "NodeNotReady",
        True,
    ),
    (
        "not ready within grace",
        {},
        node("node-0", ready=False, not_ready_since=NOW - 5),
        30,
        "healthy",
        "",
        False,
    ),
    (
        "not ready grace 0",
        {},
        node("node-0", ready=False, not_ready_since=NOW),
        0,
        "lost",
        "NodeNotReady",
        True,
    ),
    ("unreachable taint only", {}, node("node-0", taints=(UNREACH,)), 30, "lost", "NodeNotReady", True),
    (
        "karpenter disrupted",
        {},
        node("node-0", taints=(("karpenter.sh/disrupted", "NoSchedule", NOW),)),
        30,
        "lost",
        "NodeTerminating",
        False,
    ),
    (
        "spot interruption",
        {},
        node("node-0", taints=(("aws-node-termination-handler/spot-itn", "NoSchedule", NOW),)),
        30,
        "lost",
        "NodeTerminating",
        False,
    ),
    ("cordoned", {}, node("node-0", unschedulable=True), 30, "lost", "NodeCordoned", False),
    (
        "failed retryable",
        {"phase": "Failed", "exit_code": 1, "ready": False},
        node("node-0"),
        30,
        "lost",
        "PodFailed",
        False,
    ),
    (
        "failed fatal",
        {"phase": "Failed", "exit_code": 42, "ready": False},
        node("node-0"),
        30,
        "fatal",
        "PodFailed",
        False,
    ),
    (
        "evicted",
        {"phase": "Failed", "reason": "Evicted", "ready": False},
        node("node-0"),
        30,
        "lost",
        "PodEvicted",
        False,
    ),
    ("succeeded", {"phase": "Succeeded", "exit_code": 0}, node("node-0"), 30, "succeeded", "", False),
    ("terminating on healthy node", {"deleting": True}, node("node-0"), 30, "terminating", "", False),
    (
        "terminating on dead node",
        {"deleting": True},
        node("node-0", ready=False, not_ready_since=NOW - 1),
        30,
        "terminating",
        "",
        True,
    ),
    ("terminating on deleted node", {"deleting": True}, "missing", 30, "terminating", "", True),
]


@pytest.mark.parametrize(
    ("case", "pkw", "nd", "grace", "state", "signal", "force"), HEALTH_TABLE, ids=[r[0] for r in HEALTH_TABLE]
)
def test_assess(case: str, pkw: dict, nd: object, grace: int, state: str, signal: str, force: bool) -> None:
    the_node = None if nd in ("missing", None) else nd
    h = assess(pod(0, **pkw), the_node, NOW, grace, [42])  # type: ignore[arg-type]
    assert (h.state, h.signal, h.force) == (state, signal, force)


def test_grace_sets_recheck_time() -> None:
    h = assess(pod(0), node("node-0", ready=False, not_ready_since=NOW - 5), NOW, 30, [])
    assert h.recheck_at == NOW + 25


def test_free_slots() -> None:
    j = job(scheduling={"instanceTypes": ["p5.48xlarge"]})
    nodes = [
        node("a"),  # hosts our worker
        node("b"),  # free
        node("c", ready=False, not_ready_since=NOW),  # not ready
        node("d", unschedulable=True),  # cordoned
        node("e", labels=(("node.kubernetes.io/instance-type", "m5.large"),)),  # wrong type
        node("f", allocatable_gpus=0, taints=()),  # no GPUs
        node("g", taints=(("dedicated", "NoSchedule", None),)),  # untolerated taint
        node("h"),  # full with another job's worker
    ]
    mine = [pod(0, node="a")]
    other = [pod(0, name="other-worker-0", node="h", uid="x")]
    assert free_slots(j, nodes, mine + other, mine) == 1


SIZE_TABLE = [
    # case, kwargs, expected target, reason
    ("first pass", dict(current=None), 4, "Initial"),
    ("steady", dict(), 4, ""),
    ("user scaled down", dict(desired=3, last_desired=4), 3, "UserScaled"),
    ("user scaled up", dict(current=3, desired=4, last_desired=3), 4, "UserScaled"),
    ("shrink stuck pending", dict(stuck_pending=2), 2, "Shrunk"),
    ("never below min", dict(stuck_pending=3), 2, "Shrunk"),
    ("at min stays", dict(current=2, stuck_pending=1), 2, ""),
    ("grow when room", dict(current=2, free_slots=1, last_resize=1000.0), 3, "Grown"),
    ("grow capped at desired", dict(current=2, free_slots=5, last_resize=1000.0), 4, "Grown"),
    ("cooldown blocks grow", dict(current=2, free_slots=2, last_resize=1990.0), 2, ""),
    ("no room no grow", dict(current=2, free_slots=0), 2, ""),
    ("a waiting worker got a node", dict(current=2, running_extra=1, last_resize=1990.0), 3, "Grown"),
    ("waiting workers, capped", dict(current=3, running_extra=2, last_resize=1990.0), 4, "Grown"),
    ("running extra at desired", dict(running_extra=1), 4, ""),
]


@pytest.mark.parametrize(("case", "kw", "target", "reason"), SIZE_TABLE, ids=[r[0] for r in SIZE_TABLE])
def test_decide_size(case: str, kw: dict, target: int, reason: str) -> None:
    base = dict(
        desired=4,
        minimum=2,
        current=4,
        last_desired=4,
        stuck_pending=0,
        free_slots=0,
        now=2000.0,
        last_resize=None,
        cooldown=30,
    )
    base.update(kw)
    d = decide_size(SizeInput(**base))  # type: ignore[arg-type]
    assert (d.target, d.reason) == (target, reason)


def test_cooldown_recheck() -> None:
    d = decide_size(SizeInput(4, 2, 2, 4, 0, 2, 2000.0, 1990.0, 30))
    assert d.recheck_at == 2020.0


PHASE_TABLE = [
    ("terminal sticks", dict(terminal_phase="Failed"), "Failed"),
    ("suspended", dict(suspended=True), "Suspended"),
    ("all ready", dict(), "Running"),
    ("not started", dict(started=False, ready=0), "Pending"),
    ("replacing", dict(ready=3, replacing=True), "Restarting"),
    ("still restarting", dict(ready=3, previous_phase="Restarting"), "Restarting"),
    ("growing", dict(ready=3, active=4), "Scaling"),
    ("shrunk, asking for capacity", dict(ready=3, active=4, target=3, demand=1), "Running"),
]


@pytest.mark.parametrize(("case", "kw", "phase"), PHASE_TABLE, ids=[r[0] for r in PHASE_TABLE])
def test_decide_phase(case: str, kw: dict, phase: str) -> None:
    base = dict(
        suspended=False,
        terminal_phase=None,
        started=True,
        ready=4,
        active=4,
        target=4,
        desired=4,
        replacing=False,
        previous_phase="Running",
    )
    base.update(kw)
    assert decide_phase(PhaseInput(**base)) == phase  # type: ignore[arg-type]


DEGRADED_TABLE = [
    # (case, phase, target, desired, existing, status, reason, message)
    ("whole", "Running", 4, 4, None, "False", "AtDesiredSize", "running at 4 of desired 4 workers"),
    ("shrunk", "Running", 2, 4, None, "True", "InsufficientCapacity", "running at 2 of desired 4 workers"),
    ("first start", "Pending", 2, 2, None, "False", "AtDesiredSize", "starting 2 of desired 2 workers"),
    ("every worker refused", "Pending", 2, 2, 0, "True", "WorkersMissing", "0 of desired 2 workers exist"),
    ("one refused", "Running", 4, 4, 3, "True", "WorkersMissing", "3 of desired 4 workers exist"),
    ("refused while shrunk", "Running", 2, 4, 1, "True", "WorkersMissing", "1 of desired 4 workers exist"),
    ("all that were aimed at exist", "Running", 2, 4, 2, "True", "InsufficientCapacity", "running at 2"),
    ("queued for Kueue", "Queued", 0, 4, None, "False", "InsufficientCapacity", "running at 0"),
    ("suspended", "Suspended", 0, 4, 0, "False", "InsufficientCapacity", "running at 0"),
    ("suspended, refused", "Suspended", 4, 4, 0, "False", "WorkersMissing", "0 of desired 4"),
    ("finished", "Succeeded", 0, 4, None, "False", "InsufficientCapacity", "running at 0"),
]


@pytest.mark.parametrize(
    ("case", "phase", "target", "desired", "existing", "status", "reason", "message"),
    DEGRADED_TABLE,
    ids=[r[0] for r in DEGRADED_TABLE],
)
def test_degraded_counts_the_workers_that_exist(
    case: str,
    phase: str,
    target: int,
    desired: int,
    existing: int | None,
    status: str,
    reason: str,
    message: str,
) -> None:
    """Degraded never says a job runs at a size that no worker backs (issue 58: refused workers)."""
    cond = degraded_condition(phase, target, desired, "", 1, existing=existing)
    assert (cond["type"], cond["status"], cond["reason"]) == ("Degraded", status, reason)
    assert cond["message"].startswith(message), cond["message"]


def test_condition_transition_time_kept_when_unchanged() -> None:
    old = [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    same = merge_conditions(old, [{"type": "Ready", "status": "True"}], NOW)
    flipped = merge_conditions(old, [{"type": "Ready", "status": "False"}], NOW)
    assert same[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert flipped[0]["lastTransitionTime"] != "2026-01-01T00:00:00Z"


def test_a_node_condition_from_the_platform_loses_the_worker_at_once_and_names_the_condition() -> None:
    bad = node("n", failing=(("AcceleratedHardwareReady", NOW - 3),))
    h = assess(pod(0, node="n"), bad, NOW, 30, ())
    assert (h.state, h.signal, h.force, h.since) == ("lost", "NodeCondition", True, NOW - 3)
    assert "AcceleratedHardwareReady" in h.detail
    # A termination taint comes first in the one ordered list of node rules.
    both = node("n", failing=(("KernelReady", NOW),), taints=(("karpenter.sh/disrupted", "NoSchedule", NOW),))
    assert assess(pod(0, node="n"), both, NOW, 30, ()).signal == "NodeTerminating"
