"""Benchmark: HA failover. Two peered operator replicas (`llmjob operator --peering`, as the chart runs
them); the active one is SIGKILLed at the moment a worker's node fails. Measured: node signal -> the
replacement pod's ADDED event, which only the standby can create (it must first see the dead replica's
peering entry expire). Beside it, in the same run: the same node loss with the active replica alive.

    .venv/bin/python bench/ha_failover.py --rounds 5            # the default peering lifetime
    .venv/bin/python bench/ha_failover.py --rounds 5 --lifetime 60   # kopf's own default
    .venv/bin/python bench/ha_failover.py --rounds 10 --alive-rounds 3   # issue 56's goal: p99 < 5 s
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from elasticity import (  # bench/ is on sys.path
    NS,
    Recorder,
    bench_cluster,
    job_doc,
    percentile,
    status,
    workers,
)
from llm_operator import labels
from llm_operator.settings import DEFAULT_PEERING_LIFETIME_S
from llm_testbed.local_etcd import free_port
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.kubectl import Kubectl
from llm_testbed.localcluster.waiting import poll

JOB = "react"
PEERING = "bench-ha"


class Replica:
    """One `llmjob operator` replica with its /readyz port and log."""

    def __init__(self, log_dir: Path, serial: int, lifetime: int) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "llm_operator.cli", "operator", "--namespace", NS, "--peering", PEERING]
        argv += ["--metrics-port", "0", "--liveness-port", str(self.port), "--log-level", "warning"]
        env = {**os.environ, "LLMJOB_PEERING_LIFETIME": str(lifetime)}
        log = (log_dir / f"bench-ha-operator-{serial}.log").open("wb")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def state(self) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as rsp:
                return str(json.loads(rsp.read()).get("state", ""))
        except urllib.error.HTTPError as exc:
            return str(json.loads(exc.read() or b"{}").get("state", ""))
        except OSError:
            return ""

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


def running_at_four(kube: Kubectl) -> bool:
    st = status(kube, JOB)
    return st.get("phase") == "Running" and st.get("readyReplicas") == 4


def node_failed(node: str) -> Any:
    def signal_seen(kind: str, obj: dict[str, Any]) -> bool:
        conditions = obj.get("status", {}).get("conditions", [])
        return (
            kind.startswith("node")
            and obj["metadata"]["name"] == node
            and any(c["type"] == "Ready" and c["status"] != "True" for c in conditions)
        )

    return signal_seen


def one_loss(kube: Kubectl, rec: Recorder, replicas: list[Replica], kill_active: bool) -> float:
    """Fail a worker's node (and SIGKILL the active replica with it); seconds to the replacement."""
    poll(lambda: running_at_four(kube), timeout=120, what="job Running at 4")
    active = poll(
        lambda: next((r for r in replicas if r.state() == "active"), None),
        timeout=120,
        what="an active replica",
    )
    pods = [p for p in workers(kube, JOB) if not p["metadata"].get("deletionTimestamp")]
    victim = pods[0]
    node = victim["spec"]["nodeName"]
    known = {p["metadata"]["uid"] for p in pods}
    before = time.monotonic()
    if kill_active:
        active.kill()
        replicas.remove(active)
    chaos.node_not_ready(node, kube=kube, wait=False)
    t_signal = rec.first(before, node_failed(node))

    def is_replacement(kind: str, obj: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        return kind == "pod:ADDED" and meta["labels"].get(labels.JOB_NAME) == JOB and meta["uid"] not in known

    t_new = rec.first(t_signal, is_replacement, timeout=180)
    chaos.node_ready(node, kube=kube)
    return t_new - t_signal


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_s": round(statistics.median(values), 2),
        "p90_s": round(percentile(values, 0.9), 2),
        "p99_s": round(percentile(values, 0.99), 2),
        "max_s": round(max(values), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="losses with the active replica killed (5)")
    parser.add_argument("--alive-rounds", type=int, default=None, help="losses with it alive (--rounds)")
    parser.add_argument(
        "--lifetime", type=int, default=DEFAULT_PEERING_LIFETIME_S, help="LLMJOB_PEERING_LIFETIME"
    )
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    cluster = bench_cluster("llmjob-bench-ha")
    kube = cluster.kube
    serial = 0

    def replica() -> Replica:
        nonlocal serial
        serial += 1
        return Replica(cluster.logs_dir, serial, args.lifetime)

    replicas = [replica(), replica()]
    rec = Recorder()
    rec.start()
    results: dict[str, Any] = {"peering_lifetime_s": args.lifetime}
    try:
        doc = job_doc(JOB, 4, 4, gpusPerNode=8, rendezvous={"endpoint": "etcd.bench:2379"})
        kube.run("apply", "-f", "-", input=yaml.safe_dump(doc))
        for kill_active in (False, True):
            what = "active replica SIGKILLed with the node" if kill_active else "active replica alive"
            rounds = args.rounds if kill_active or args.alive_rounds is None else args.alive_rounds
            print(f"node NotReady, {what}: {rounds} losses", flush=True)
            times = []
            for i in range(rounds):
                seconds = one_loss(kube, rec, replicas, kill_active)
                times.append(seconds)
                print(f"  #{i + 1}: replacement created {seconds:.2f} s after the node signal", flush=True)
                if kill_active:  # back to two replicas, the new one standing by
                    replicas.append(replica())
                    poll(lambda: sorted(r.state() for r in replicas) == ["active", "standby"], timeout=120,
                         what="one active and one standby replica")  # fmt: skip
            results["failover" if kill_active else "alive"] = summary(times)
    finally:
        rec.stop.set()
        for r in replicas:
            r.proc.terminate()
            r.proc.wait(timeout=30)
        if not args.keep:
            cluster.down()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
