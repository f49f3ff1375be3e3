"""Elastic on an autoscaled cluster (issue 39), against real Karpenter (its kwok provider) and workers that
really train (the pod runner), as on EKS where GPU nodes come only for Pending pods.

1. An empty cluster and a job min 2 / max 4: Karpenter launches 4 nodes and the job trains at 4.
2. A node deleted as EC2 would: Karpenter launches a replacement and the job is back at 4 (timed, the
   operator's share apart from Karpenter's).
3. A NodePool limit of 3 nodes: the job trains at 3 past its pending timeout, asking for the 4th; the limit
   raised, the job is back at 4 with no user action.
4. A node gets ``AcceleratedHardwareReady=False``: its worker is replaced within seconds, the operator marks
   the node (a taint Karpenter understands) and Karpenter launches a node for the replacement; when the
   condition clears the mark goes and the node takes a worker again.
5. Consolidation (WhenEmptyOrUnderutilized, after 1 s) never removes a node that runs a training worker.
6. The example NodePools of deploy/examples/karpenter/ are ones real Karpenter's CRD accepts (a server-side
   dry run; their EC2NodeClasses belong to the AWS provider, which the test bed does not run).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import labels
from llm_testbed import training
from llm_testbed.karpenter import GPU_POOL, control
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from support.wait import wait_for

from .conftest import _training
from .e2e_support import JOB, Training

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.tools("karpenter"),
    pytest.mark.timeout(900),
]

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "karpenter"
FULL_TIMEOUT = 300.0
"""Karpenter's launch, the node's start, four interpreters importing torch on a loaded 2-core box."""


@pytest.fixture
def karpenter_train(
    karpenter_cluster: LocalCluster, karpenter_namespace: str, tmp_path: Path
) -> Iterator[Training]:
    """``train`` on the Karpenter cluster: no GPU node until a Pending worker asks for one."""
    env = {"LLMJOB_KARPENTER": "true", "LLMJOB_MARK_UNHEALTHY_NODES": "true"}  # as docs/platform.md advises
    yield from _training(karpenter_cluster, karpenter_namespace, tmp_path, env)


def _job(t: Training, **policy: Any) -> dict[str, Any]:
    return training.training_job(
        JOB, t.ns, minimum=2, maximum=4, steps=100000, recovery="inProcess", failure_policy=policy
    )


def _at(t: Training, size: int) -> dict[str, Any] | None:
    """The status once the job runs ``size`` workers that all train (the live generation holds them)."""
    s = t.status()
    whole = s.get("phase") == "Running" and s.get("readyReplicas") == size == s.get("members")
    return s if whole and s.get("targetReplicas") == size else None


def _worker_nodes(t: Training) -> set[str]:
    return {n for p in t.workers() if (n := p["spec"].get("nodeName"))}


def test_karpenter_brings_the_nodes_a_job_asks_for_and_a_lost_one_back(karpenter_train: Training) -> None:
    t = karpenter_train
    kube = t.cluster.kube
    control.set_consolidation(kube, GPU_POOL, "WhenEmptyOrUnderutilized", "1s")
    assert not control.managed_nodes(kube, GPU_POOL), "the cluster starts without GPU nodes"
    t.apply(_job(t, pendingTimeoutSeconds=600))

    # 1. Four Pending workers: Karpenter launches four p5 nodes and the job trains at 4.
    wait_for(lambda: _at(t, 4), FULL_TIMEOUT, "the job training at 4 on nodes Karpenter launched")
    t.wait_steps("steps at world size 4", world=4, count=3)
    hosts = _worker_nodes(t)
    assert len(hosts) == 4 and hosts <= {n["metadata"]["name"] for n in control.managed_nodes(kube, GPU_POOL)}
    for pod in t.workers():
        assert pod["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"

    # 2. A node goes away as EC2 takes it: the operator replaces the worker, Karpenter brings a node.
    victim = t.worker_on(1)
    node = victim["spec"]["nodeName"]
    lost_at = time.time()
    began = time.monotonic()
    chaos.delete_node(node, kube=kube, wait=False)
    seen: dict[str, float] = {}

    def back_at_four() -> dict[str, Any] | None:
        pod = next((p for p in t.workers() if p["metadata"]["name"] == victim["metadata"]["name"]), None)
        fresh = pod is not None and pod["metadata"]["uid"] != victim["metadata"]["uid"]
        if fresh and "replacement created" not in seen:
            seen["replacement created"] = time.monotonic() - began
        if fresh and pod is not None and pod["spec"].get("nodeName") and "replacement bound" not in seen:
            seen["replacement bound"] = time.monotonic() - began
        return _at(t, 4) if fresh else None

    wait_for(back_at_four, FULL_TIMEOUT, "the job back at 4 on a node Karpenter launched for the replacement")
    seen["back at 4 (members)"] = time.monotonic() - began
    t.wait_steps("steps at world size 4 after the loss", world=4, count=2, after=lost_at)
    seen["a step at world 4"] = time.monotonic() - began
    print("\nloss -> full size with Karpenter: " + ", ".join(f"{k} +{v:.1f}s" for k, v in seen.items()))

    # 5. Consolidation ran all along (after 1 s): no node that runs a worker went away but the one we took.
    remaining = {n["metadata"]["name"] for n in control.managed_nodes(kube, GPU_POOL)}
    assert hosts - {node} <= remaining, f"a node running a worker was removed: {sorted(hosts - remaining)}"
    result = t.audit()
    print(result.summary())

    # 6. The shipped NodePool examples pass real Karpenter's validation (schema and CEL rules).
    pools = [
        d
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if d and d["kind"] == "NodePool"
    ]
    assert len(pools) == 2, "deploy/examples/karpenter holds a GPU and a CPU NodePool"
    out = t.cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(pools)
    ).stdout
    assert out.count("(server dry run)") == len(pools), out


def test_a_nodepool_limit_holds_the_job_at_3_until_it_is_raised(karpenter_train: Training) -> None:
    t = karpenter_train
    kube = t.cluster.kube
    control.set_node_limit(kube, GPU_POOL, 3)
    t.apply(_job(t, pendingTimeoutSeconds=20, resizeCooldownSeconds=5))

    # 3. Three nodes only: the job shrinks to 3 past its pending timeout, and keeps the 4th worker Pending.
    def at_three_asking() -> dict[str, Any] | None:
        s = _at(t, 3)
        return s if s is not None and s.get("waitingForCapacity") == 1 else None

    st = wait_for(at_three_asking, FULL_TIMEOUT, "the job training at 3 with one worker waiting for capacity")
    assert next(c for c in st["conditions"] if c["type"] == "WaitingForCapacity")["status"] == "True"
    unschedulable = next((c for c in st["conditions"] if c["type"] == "Unschedulable"), None)
    assert unschedulable is None or unschedulable["status"] == "False", "a limit is capacity to wait for"
    assert len(control.managed_nodes(kube, GPU_POOL)) == 3
    t.wait_steps("steps at world size 3", world=3, count=3)

    raised = time.monotonic()
    control.set_node_limit(kube, GPU_POOL, 4)
    st = wait_for(lambda: _at(t, 4), FULL_TIMEOUT, "the job back at 4 once the limit allows a 4th node")
    print(f"\nlimit raised -> training at 4: {time.monotonic() - raised:.1f}s")
    assert st.get("waitingForCapacity") == 0
    t.audit()


SICK = "AcceleratedHardwareReady"


def _mark(t: Training, node: str) -> str | None:
    """The operator's mark on the node (its taint's value), or None."""
    body = t.cluster.kube.get("node", node) or {}
    taints = (body.get("spec") or {}).get("taints") or []
    return next((x.get("value") for x in taints if x.get("key") == labels.UNHEALTHY_NODE), None)


def test_a_node_the_platform_reports_unhealthy_is_left_then_used_again(karpenter_train: Training) -> None:
    t = karpenter_train
    kube = t.cluster.kube
    control.set_node_limit(kube, GPU_POOL, 5)
    control.set_consolidation(kube, GPU_POOL, "WhenEmpty", "Never")  # the sick node stays to come back
    t.apply(_job(t, pendingTimeoutSeconds=600))
    wait_for(lambda: _at(t, 4), FULL_TIMEOUT, "the job training at 4 on nodes Karpenter launched")

    # 4. The platform reports the GPU of one node broken: its worker is replaced at once, the node marked.
    victim = t.worker_on(1)
    sick = victim["spec"]["nodeName"]
    began = time.monotonic()
    chaos.set_node_condition(sick, SICK, "False", kube=kube)

    seen: dict[str, float] = {}

    def replacement() -> dict[str, Any] | None:
        pod = next((p for p in t.workers() if p["metadata"]["name"] == victim["metadata"]["name"]), None)
        if pod is None or pod["metadata"]["uid"] != victim["metadata"]["uid"]:
            seen.setdefault("worker deleted", time.monotonic() - began)
            return pod
        if pod["metadata"].get("deletionTimestamp"):
            seen.setdefault("worker deleted", time.monotonic() - began)
        return None

    fresh = wait_for(replacement, 90, f"the worker on {sick} replaced")
    seen["replacement created"] = time.monotonic() - began
    assert wait_for(lambda: _mark(t, sick), 30, f"the operator's mark on {sick}") == SICK
    required = (fresh["spec"]["affinity"]["nodeAffinity"] or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = (required or {}).get("nodeSelectorTerms") or []
    assert not any(term.get("matchFields") for term in terms), "Karpenter launches nothing for matchFields"

    # Karpenter launches a fifth node for the replacement; the sick one is left alone.
    wait_for(lambda: _at(t, 4), FULL_TIMEOUT, "the job back at 4 on a node Karpenter launched")
    seen["back at 4 (new node)"] = time.monotonic() - began
    hosts = _worker_nodes(t)
    assert sick not in hosts, f"a worker went back to {sick} while {SICK}=False"
    launched = t.worker_on(1)["spec"]["nodeName"]
    print(f"\n{SICK}=False -> " + ", ".join(f"{k} +{v:.1f}s" for k, v in seen.items()))

    # The condition clears: the operator's mark goes, and the node takes a worker again. With the limit at 4
    # and the launched node deleted, the sick node is the only place left.
    chaos.set_node_condition(sick, SICK, "True", kube=kube)
    wait_for(lambda: _mark(t, sick) is None, 30, f"the operator's mark off {sick}")
    control.set_node_limit(kube, GPU_POOL, 4)
    chaos.delete_node(launched, kube=kube, wait=False)
    wait_for(
        lambda: _at(t, 4) if sick in _worker_nodes(t) else None, FULL_TIMEOUT, f"a worker on {sick} again"
    )
    t.audit()
