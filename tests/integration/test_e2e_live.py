"""Recovery in process, end to end: the operator (as users start it) makes the pods of a job with
``failurePolicy.recovery: inProcess``, the pod runner runs them, and the live driver trains on the
operator-managed etcd.

When a node is lost the operator force-deletes its worker and first removes that worker's members from
the job's etcd, so the survivor re-forms at once; the survivor keeps its pod *and its process* (same PID in
the step log), loses no completed step, and the replacement worker receives the state from the survivor
(its ``formed`` event names a peer as the source, never the checkpoint). The sample accounting proves
every step trained exactly its own samples, nothing replayed.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_elastic.accounting import audit
from llm_elastic.checkpoint import latest_checkpoint
from llm_elastic.metrics import read_records
from llm_testbed import training
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from support.live_events import events
from support.wait import wait_for

from .conftest import PeeredOperatorProcess
from .e2e_support import JOB, SMOKE_STEPS, Training

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.timeout(600)]


def test_lost_node_survivor_keeps_its_process_and_the_replacement_gets_state_from_it(train: Training) -> None:
    train.apply(
        training.training_job(JOB, train.ns, minimum=1, maximum=2, steps=100000, recovery="inProcess")
    )
    first = train.wait_steps("5 steps at world size 2", world=2, count=5)
    pids_before = set(first[-1]["pids"])
    assert len(pids_before) == 2, first[-1]
    survivor, victim = train.worker_on(0), train.worker_on(1)
    node = victim["spec"]["nodeName"]
    kube = train.cluster.kube

    lost_at = time.time()
    chaos.node_not_ready(node, kube=kube, wait=False)
    alone = train.wait_steps("the survivor to go on at world size 1", world=1, count=3, after=lost_at)
    resumed_after = alone[0]["time"] - lost_at
    assert train.worker_on(0)["metadata"]["uid"] == survivor["metadata"]["uid"], "the survivor's pod stays"
    survivor_pids = {pid for r in alone for pid in (r["pids"] or [])}
    assert survivor_pids and survivor_pids < pids_before, "the survivor's training process is the same one"
    assert "LiveMembersEvicted" in train.operator.logs(), train.diagnostics()

    chaos.node_ready(node, kube=kube)
    back_at = time.time()
    both = train.wait_steps("the replacement to join at world size 2", world=2, count=3, after=back_at)
    assert survivor_pids < set(both[-1]["pids"]), "the survivor still trains, beside a new process"
    (new_pid,) = set(both[-1]["pids"]) - survivor_pids
    replacement = next(p for p in train.workers() if p["metadata"]["name"] == f"{JOB}-worker-1")
    assert replacement["metadata"]["uid"] != victim["metadata"]["uid"]
    # The pod's log holds every worker-1 so far: the replacement's lines are those of its process.
    formed = events(train.cluster.pod_log(train.ns, f"{JOB}-worker-1").read_text(errors="replace"))
    joined = [e for e in formed if e.get("event") == "formed" and e["pid"] == new_pid]
    assert joined, train.diagnostics()
    assert joined[0]["step"] > 0 and isinstance(joined[0]["source"], int), joined[0]
    assert joined[0]["source"] != joined[0]["rank"], "the state came from the survivor, not a checkpoint"

    result = train.audit()
    sizes = [(i.world_before, i.world_after) for i in result.interruptions]
    assert (2, 1) in sizes and (1, 2) in sizes, sizes
    assert all(i.replayed == 0 for i in result.interruptions), result.interruptions
    assert {r.get("restart") for r in train.records()} == {0}, "no fallback to a checkpoint"
    print(f"lost node -> first step of the survivor: {resumed_after:.2f} s; {result.summary()}")


def test_a_users_own_script_survives_a_lost_node_in_process(train: Training) -> None:
    """deploy/examples/plain-pytorch-inprocess.yaml: a plain PyTorch script (its own model, data, loop and
    optimizer, written against llm_elastic's public API only) loses a node; the survivor keeps its process,
    the replacement gets the state from it, and every step trained exactly its own samples."""
    train.apply(
        training.plain_script_job(
            JOB, train.ns, train.volume, minimum=1, maximum=2, steps=100000, step_seconds=0.05
        )
    )
    first = train.wait_steps("5 steps at world size 2", world=2, count=5)
    pids_before = set(first[-1]["pids"])
    node = train.worker_on(1)["spec"]["nodeName"]
    lost_at = time.time()
    chaos.node_not_ready(node, kube=train.cluster.kube, wait=False)
    alone = train.wait_steps("the survivor to go on at world size 1", world=1, count=3, after=lost_at)
    survivor_pids = {pid for r in alone for pid in (r["pids"] or [])}
    assert survivor_pids and survivor_pids < pids_before, "the survivor's process is the same one"
    chaos.node_ready(node, kube=train.cluster.kube)
    back_at = time.time()
    both = train.wait_steps("the replacement to join at world size 2", world=2, count=3, after=back_at)
    (new_pid,) = set(both[-1]["pids"]) - survivor_pids
    formed = events(train.cluster.pod_log(train.ns, f"{JOB}-worker-1").read_text(errors="replace"))
    joined = [e for e in formed if e.get("event") == "formed" and e["pid"] == new_pid]
    assert joined and isinstance(joined[0]["source"], int) and joined[0]["source"] != joined[0]["rank"]
    result = audit(train.records(), training.plain_script_order())
    assert result.ok, f"{result.problems}\n{train.diagnostics()}"
    assert all(i.replayed == 0 for i in result.interruptions), result.interruptions
    print(f"user script: lost node -> survivor's step {alone[0]['time'] - lost_at:.2f} s; {result.summary()}")


def test_shipped_inprocess_example_trains_to_success(
    process_cluster: LocalCluster, process_namespace: str, tmp_path: Path
) -> None:
    """deploy/examples/smoke-cpu-inprocess.yaml with the smoke volume, as a user applies them: trains to
    the end and the job Succeeds (2 replicas and 60 steps instead of 4 and 200, to fit a 2-core CI)."""
    c, ns = process_cluster, process_namespace
    operator = PeeredOperatorProcess(ns, tmp_path, ["--namespace", ns], [], {})
    volume = c.volume_dir("smoke-shared")
    shutil.rmtree(volume, ignore_errors=True)
    training.prepare_data(volume)
    operator.start()
    job = training.example_job(training.LIVE_EXAMPLE)
    name = job["metadata"]["name"]
    try:
        c.kubectl("apply", "-n", ns, "-f", str(Path("deploy/examples/smoke-volume/volume.yaml").resolve()))
        job["spec"]["replicas"] = 2
        args = job["spec"]["args"]
        args[args.index("--steps") + 1] = str(SMOKE_STEPS)
        c.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(job))

        def finished() -> dict[str, Any] | None:
            s = (c.kube.get("llmtrainingjob", name, ns) or {}).get("status") or {}
            return s if s.get("phase") in ("Succeeded", "Failed") else None

        status = wait_for(finished, 540, "the in-process smoke job to finish", interval=1.0)
        assert status["phase"] == "Succeeded", f"{status}\n{operator.logs()[-3000:]}"
        checkpoints = volume / "checkpoints" / "smoke-inprocess"
        records = read_records(checkpoints / "metrics.jsonl")
        result = audit(records, training.sample_order(volume))
        assert result.ok, result.problems
        # minReplicas 1: the first worker may train alone until the second joins.
        assert result.steps == SMOKE_STEPS and {r["world_size"] for r in records} <= {1, 2}
        assert records[-1]["loss"] < records[0]["loss"], "the model learns"
        saved = latest_checkpoint(checkpoints)
        assert saved is not None and saved.step == SMOKE_STEPS, "the checkpoints the fallback needs"
    finally:
        c.kubectl("delete", "llmtrainingjob", name, "-n", ns, "--wait=true", "--timeout=60s", check=False)
        operator.stop()
        c.kubectl("delete", "pvc", "smoke-shared", "-n", ns, "--wait=false", check=False)
        c.kubectl("delete", "pv", "smoke-shared", "--wait=false", check=False)
        shutil.rmtree(volume, ignore_errors=True)
