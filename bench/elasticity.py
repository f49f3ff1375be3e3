"""Benchmark: operator reaction time to node failures, and reconcile throughput.

Runs on a local control plane (`llmjob cluster`), with the operator as a subprocess:

1. reaction: N node failures of each kind on a 4-worker job (grace 0). Times are taken from one
   watch connection in this process: the moment the node event that carries the signal arrives
   (Ready=False, or the termination taint) -> the moment the replacement pod's ADDED event arrives.
2. throughput: J jobs x W workers created at once; time until every pod exists and every job is
   Running, and the operator's peak RSS.

    .venv/bin/python bench/elasticity.py --failures 20 --jobs 100 --workers 8
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml
from kubernetes_asyncio import client, config, watch
from llm_operator import labels
from llm_testbed.localcluster import chaos, nodes, tools
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.localcluster.kubectl import Kubectl
from llm_testbed.localcluster.waiting import poll

NS = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Recorder:
    """A background watch on nodes and pods; stores the arrival time of the events we wait for."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        await config.load_kube_config(config_file=os.environ["KUBECONFIG"])
        async with client.ApiClient() as api:
            self.api = api
            core = client.CoreV1Api(api)
            await asyncio.gather(
                self._watch(core.list_node, "node"), self._watch(core.list_namespaced_pod, "pod", NS)
            )

    async def _watch(self, fn: Any, kind: str, *args: str) -> None:
        while not self.stop.is_set():
            w = watch.Watch()
            try:
                async for ev in w.stream(fn, *args, timeout_seconds=30, _request_timeout=40):
                    obj: dict[str, Any] = self.api.sanitize_for_serialization(ev["object"])
                    with self.lock:
                        self.events.append((time.monotonic(), f"{kind}:{ev['type']}", obj))
                    if self.stop.is_set():
                        break
            except Exception:  # reconnect on any watch error
                await asyncio.sleep(0.05)

    def created_pods(self, after: float, prefix: str) -> dict[str, float]:
        """Worker pod name -> arrival of its first ADDED event, for pods of jobs named prefix*."""
        out: dict[str, float] = {}
        with self.lock:
            for at, kind, obj in self.events:
                name = obj["metadata"]["name"]
                if at >= after and kind == "pod:ADDED" and name.startswith(prefix) and "-worker-" in name:
                    out.setdefault(name, at)
        return out

    def first(self, after: float, pred: Any, timeout: float = 60.0) -> float:
        def find() -> float | None:
            with self.lock:
                for at, kind, obj in self.events:
                    if at >= after and pred(kind, obj):
                        return at
            return None

        return poll(find, timeout=timeout, what="a watched event")


def job_doc(name: str, replicas: int, workers: int, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "minReplicas": min(2, workers),
        "maxReplicas": workers,
        "replicas": replicas,
        "image": "ghcr.io/elasticllm/llm-trainer:bench",
        "failurePolicy": {"nodeFailureGraceSeconds": 0, "maxRestarts": 1000, "resizeCooldownSeconds": 0},
    }
    body.update(spec)
    return {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": body,
    }


def start_operator(log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "llm_operator.cli", "operator", "--standalone", "--namespace", NS]
    argv += ["--metrics-port", "0", "--liveness-port", "0", "--log-level", "warning"]
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=dict(os.environ))


def status(kube: Kubectl, name: str) -> dict[str, Any]:
    obj = kube.get("llmtrainingjob", name, NS) or {}
    out: dict[str, Any] = obj.get("status") or {}
    return out


def workers(kube: Kubectl, name: str) -> list[dict[str, Any]]:
    return kube.items("pods", "--selector", f"{labels.JOB_NAME}={name}", namespace=NS)


def reaction_trials(kube: Kubectl, rec: Recorder, kind: str, count: int) -> list[float]:
    """Fail one worker's node `count` times; return signal -> replacement ADDED latencies."""
    out: list[float] = []
    for i in range(count):
        poll(
            lambda: (
                status(kube, "react").get("phase") == "Running"
                and status(kube, "react").get("readyReplicas") == 4
            ),
            timeout=60,
            what="job Running at 4",
        )
        pods = [p for p in workers(kube, "react") if not p["metadata"].get("deletionTimestamp")]
        victim = pods[i % len(pods)]
        node, uid = victim["spec"]["nodeName"], victim["metadata"]["uid"]
        before = time.monotonic()
        if kind == "notready":
            chaos.node_not_ready(node, kube=kube, wait=False)

            def signal(k: str, o: dict[str, Any], node: str = node) -> bool:
                return (
                    k.startswith("node")
                    and o["metadata"]["name"] == node
                    and any(
                        c["type"] == "Ready" and c["status"] != "True"
                        for c in o.get("status", {}).get("conditions", [])
                    )
                )
        else:
            chaos.taint_for_termination(node, "karpenter", kube=kube)

            def signal(k: str, o: dict[str, Any], node: str = node) -> bool:
                return (
                    k.startswith("node")
                    and o["metadata"]["name"] == node
                    and any(
                        t["key"] == "karpenter.sh/disrupted" for t in (o.get("spec", {}).get("taints") or [])
                    )
                )

        t_signal = rec.first(before, signal)
        known = {p["metadata"]["uid"] for p in pods}

        def is_replacement(k: str, o: dict[str, Any], known: set[str] = known) -> bool:
            meta = o["metadata"]
            return (
                k == "pod:ADDED"
                and meta["labels"].get(labels.JOB_NAME) == "react"
                and meta["uid"] not in known
            )

        t_new = rec.first(t_signal, is_replacement)

        out.append(t_new - t_signal)
        print(
            f"  {kind} #{i + 1}: {node} ({uid[:8]}) replaced in {1000 * (t_new - t_signal):.0f} ms",
            flush=True,
        )
        if kind == "notready":
            chaos.node_ready(node, kube=kube)
        else:
            chaos.clear_termination(node, "karpenter", kube=kube)
    return out


def throughput(
    kube: Kubectl, rec: Recorder, jobs: int, per_job: int, operator: psutil.Process
) -> dict[str, float]:
    """Create the jobs at once; pod creation times come from the watch, not from polling the apiserver."""
    peak = [operator.memory_info().rss]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(psutil.Error):
                peak.append(operator.memory_info().rss)
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    docs = [
        job_doc(f"tp-{i}", per_job, per_job, gpusPerNode=0, rendezvous={"endpoint": "etcd.bench:2379"})
        for i in range(jobs)
    ]
    start = time.monotonic()
    # Submit like a busy platform would: 8 clients at once (one kubectl alone takes ~0.4 s per object here).
    chunks = [docs[i::8] for i in range(8)]

    def submit(chunk: list[dict[str, Any]]) -> None:
        kube.run("create", "-f", "-", input=yaml.safe_dump_all(chunk), timeout=300)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(submit, chunks))
    t_apply = time.monotonic() - start
    poll(lambda: len(rec.created_pods(start, "tp-")) >= jobs * per_job, timeout=600, what="all worker pods")
    created = rec.created_pods(start, "tp-").values()

    def all_running() -> bool:
        items = kube.json("get", "llmtrainingjobs", "-n", NS, timeout=120)["items"]
        running = [j for j in items if (j.get("status") or {}).get("phase") == "Running"]
        return len(running) >= jobs

    poll(all_running, timeout=600, what="all jobs Running", interval=1.0)
    t_running = time.monotonic() - start
    done.set()
    return {
        "apply_s": t_apply,
        "first_pod_s": min(created) - start,
        "all_pods_s": max(created) - start,
        "all_running_s": t_running,
        "operator_peak_rss_mb": max(peak) / 2**20,
    }


def big_cpu_nodes(count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        m = nodes.node_manifest(f"bench-node-{i}", "cpu", "us-east-1a")
        for key in ("capacity", "allocatable"):
            m["status"][key]["pods"] = "1000"
            m["status"][key]["cpu"] = "1000"
        out.append(m)
    return out


def bench_cluster(name: str, gpu_nodes: int = 6) -> LocalCluster:
    """Print the machine and versions, start the local cluster ``name`` (``gpu_nodes`` fake p5 nodes, 1
    CPU node), point KUBECONFIG at it and create the benchmark namespace."""
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} cores,"
        f" {psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}"
    )
    print(f"versions: kubernetes {tools.KUBE_VERSION}, etcd {tools.ETCD_VERSION}, kwok {tools.KWOK_VERSION}")
    cluster = LocalCluster(name)
    cluster.up(gpu_nodes=gpu_nodes, cpu_nodes=1)
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    cluster.kube.run("create", "namespace", NS, check=False)
    return cluster


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--failures", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    cluster = bench_cluster("llmjob-bench")
    kube = cluster.kube
    log = cluster.logs_dir / "bench-operator.log"
    op = start_operator(log)
    rec = Recorder()
    rec.start()
    results: dict[str, Any] = {}
    try:
        kube.run(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(
                job_doc("react", 4, 4, gpusPerNode=8, rendezvous={"endpoint": "etcd.bench:2379"})
            ),
        )
        for kind in ("notready", "termination") if args.failures else ():
            print(f"reaction to {kind} (grace 0), {args.failures} failures:", flush=True)
            lat = reaction_trials(kube, rec, kind, args.failures)
            results[kind] = {
                "n": len(lat),
                "p50_ms": 1000 * statistics.median(lat),
                "p99_ms": 1000 * percentile(lat, 0.99),
                "max_ms": 1000 * max(lat),
            }
        kube.run("delete", "llmtrainingjob", "react", "-n", NS, "--wait=true")
        cluster.add_nodes(big_cpu_nodes(2))
        print(f"throughput: {args.jobs} jobs x {args.workers} workers", flush=True)
        figures = throughput(kube, rec, args.jobs, args.workers, psutil.Process(op.pid))
        results["throughput"] = {"jobs": args.jobs, "workers": args.workers, **figures}
    finally:
        rec.stop.set()
        op.terminate()
        op.wait(timeout=30)
        if not args.keep:
            cluster.down()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
