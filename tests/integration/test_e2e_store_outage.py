"""The job's rendezvous store is not a single point of failure, end to end, in both recovery modes.

The node of the job's managed etcd pod is lost mid-run. Its processes die at once; the operator's
Deployment brings up a fresh, empty etcd behind the same Service on another node. Training goes on the
whole time: the same worker processes keep stepping at full size (in process: the members register again
with the fresh store; restart mode: torchrun's agents ride out the outage), no step is replayed, and no
restart is counted.
"""

from __future__ import annotations

import time

import pytest
from llm_operator import labels
from llm_testbed import training
from llm_testbed.localcluster import chaos
from support.wait import wait_for

from .e2e_support import JOB, Training

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.timeout(600)]


def rendezvous_pods(train: Training) -> list[dict[str, object]]:
    selector = f"{labels.JOB_NAME}={JOB},{labels.ROLE}={labels.ROLE_RENDEZVOUS}"
    return train.cluster.kube.items("pods", labels=selector, namespace=train.ns)


@pytest.mark.parametrize("recovery", ["inProcess", "restart"])
def test_training_goes_on_when_the_rendezvous_node_is_lost(train: Training, recovery: str) -> None:
    train.apply(training.training_job(JOB, train.ns, minimum=1, maximum=2, steps=100000, recovery=recovery))
    before = train.wait_steps("5 steps at world size 2", world=2, count=5)
    (old,) = [p for p in rendezvous_pods(train) if p["status"]["phase"] == "Running"]  # type: ignore[index]
    node = old["spec"]["nodeName"]  # type: ignore[index]
    restart = before[-1]["restart"]
    lost_at = time.time()
    chaos.node_not_ready(node, kube=train.cluster.kube, wait=False)

    def fresh_store() -> bool:
        return any(
            p["metadata"]["uid"] != old["metadata"]["uid"] and p["status"].get("phase") == "Running"  # type: ignore[index]
            for p in rendezvous_pods(train)
        )

    wait_for(fresh_store, 180, "a fresh etcd pod behind the same Service", interval=0.5)
    back_at = time.time()
    train.wait_steps("10 steps at world size 2 with the fresh store", world=2, count=10, after=back_at)
    after = [r for r in train.records() if r["time"] > lost_at]
    assert {r["world_size"] for r in after} == {2}, train.diagnostics()
    assert {r["restart"] for r in after} == {restart}, "no restart for the store's outage"
    if recovery == "inProcess":
        assert {tuple(sorted(r["pids"])) for r in after if r.get("pids")} == {
            tuple(sorted(before[-1]["pids"]))
        }
    result = train.audit()
    assert all(i.replayed == 0 for i in result.interruptions), result.interruptions
    chaos.node_ready(node, kube=train.cluster.kube)
    print(f"{recovery}: fresh store after {back_at - lost_at:.1f}s; {result.summary()}")
