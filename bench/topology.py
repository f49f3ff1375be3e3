"""Benchmark: where a lost worker's replacement lands, by spec.scheduling.topology, and how fast it runs.

A local control plane (`llmjob cluster`) with 9 fake p5 nodes in 3 layer-3 blocks of 3
(`topology.k8s.aws/network-node-layer-3`, llm_testbed.localcluster.nodes), the real kube-scheduler, the
operator as a subprocess. A 2-worker job runs in one block, so the survivors' block keeps one free node
and 6 more are free elsewhere. Each loss marks a worker's node NotReady (grace 0), waits for the
replacement to be Running, records its block against the survivor's, and revives the node. Done for
a job without topology (where the scheduler alone puts it), then with mode preferred and required.

    .venv/bin/python bench/topology.py --losses 20

Time to Running: from just before the node is marked NotReady to the first poll (every 50 ms, one
kubectl call each) that sees the replacement Running and Ready.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import yaml
from elasticity import (  # bench/ is on sys.path when a bench script runs
    bench_cluster,
    job_doc,
    percentile,
    start_operator,
)
from llm_operator import labels
from llm_testbed.localcluster import chaos, nodes
from llm_testbed.localcluster.kubectl import Kubectl
from llm_testbed.localcluster.waiting import poll

NS = "bench"
JOB = "topo"
POLL_S = 0.05


def live(kube: Kubectl) -> list[dict[str, Any]]:
    pods = kube.items("pods", "--selector", f"{labels.JOB_NAME}={JOB},{labels.ROLE}=worker", namespace=NS)
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def running_at(kube: Kubectl, size: int) -> list[dict[str, Any]] | None:
    status = (kube.get("llmtrainingjob", JOB, NS) or {}).get("status") or {}
    pods = [p for p in live(kube) if ready(p)]
    return pods if status.get("phase") == "Running" and len(pods) == size else None


def trials(kube: Kubectl, mode: str, losses: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"gpusPerNode": 8, "scheduling": {"instanceTypes": ["p5.48xlarge"]}}
    if mode != "none":
        spec["scheduling"]["topology"] = {"key": nodes.BLOCK_LABEL, "mode": mode}
    doc = job_doc(JOB, 2, 2, minReplicas=1, rendezvous={"endpoint": "etcd.bench:2379"}, **spec)
    kube.run("apply", "-f", "-", input=yaml.safe_dump(doc))
    same, times = 0, []
    for i in range(losses):
        pods = poll(lambda: running_at(kube, 2), timeout=120, what="job Running at 2")
        victim, survivor = pods[i % 2], pods[(i + 1) % 2]
        lost, kept = victim["spec"]["nodeName"], survivor["spec"]["nodeName"]
        known = {p["metadata"]["uid"] for p in pods}
        start = time.monotonic()
        chaos.node_not_ready(lost, kube=kube, wait=False)

        def replacement(known: set[str] = known) -> dict[str, Any] | None:
            return next((p for p in live(kube) if p["metadata"]["uid"] not in known and ready(p)), None)

        new = poll(replacement, timeout=120, what="replacement Running", interval=POLL_S)
        took = time.monotonic() - start
        node = new["spec"]["nodeName"]
        in_block = nodes.block_of(node) == nodes.block_of(kept)
        same += in_block
        times.append(took)
        print(
            f"  {mode} #{i + 1}: lost {lost} ({nodes.block_of(lost)}), survivor in {nodes.block_of(kept)},"
            f" replacement on {node} ({nodes.block_of(node)}{', same block' if in_block else ''})"
            f" Running in {1000 * took:.0f} ms",
            flush=True,
        )
        chaos.node_ready(lost, kube=kube)
    kube.run("delete", "llmtrainingjob", JOB, "-n", NS, "--wait=true")
    poll(lambda: not live(kube), timeout=120, what="workers gone")
    return {
        "losses": losses,
        "same_block": same,
        "p50_ms": round(1000 * statistics.median(times)),
        "p90_ms": round(1000 * percentile(times, 0.9)),
        "max_ms": round(1000 * max(times)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--losses", type=int, default=20)
    parser.add_argument("--modes", default="none,preferred,required")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    cluster = bench_cluster("llmjob-bench-topology", gpu_nodes=9)
    kube = cluster.kube
    op = start_operator(cluster.logs_dir / "bench-operator.log")
    results: dict[str, Any] = {}
    try:
        for mode in args.modes.split(","):
            print(f"{mode}: {args.losses} losses of a 2-worker job (3 blocks of 3 nodes)", flush=True)
            results[mode] = trials(kube, mode, args.losses)
    finally:
        op.terminate()
        op.wait(timeout=30)
        if not args.keep:
            cluster.down()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
