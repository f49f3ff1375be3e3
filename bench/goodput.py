"""Goodput under failures, the headline figure: the share of wall time spent on training steps that were kept.

The CPU smoke job (tiny Llama, shared volume) trains on the local cluster with the real operator for a fixed
wall time per variant while a node fails on a schedule (one loss every ``--every`` seconds; the node comes
back ``--back-after`` seconds later). Variants, one after the other in one run, on the same cluster:
``restart`` (torchrun, checkpoints every 10 steps), ``inProcess`` (the runtime library, survivors keep
their processes) and ``spare`` (in process with ``spareReplicas: 1``). Printed per variant: goodput from the
job's status (what ``kubectl get llmjob`` shows, computed by the operator from the workers' metrics) and from
the trainer's own step log (``llm_operator.policy.goodput.step_log_goodput``, the same definition), the
losses, and the steps replayed.

    python bench/goodput.py --minutes 5 --every 60 --back-after 20 [--variants restart,inProcess,spare]
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from e2e_recovery import wait
from llm_elastic import audit
from llm_operator import labels
from llm_operator.observe import parse_time
from llm_operator.policy.goodput import step_log_goodput
from llm_testbed import training
from llm_testbed.demo_common import start_operator, stop_operator
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster

NS = "goodput"
JOB = "goodput"
PV = "goodput-shared"


def job_for(variant: str, step_seconds: float) -> dict[str, Any]:
    budget = {"maxRestarts": 1000}
    if variant == "spare":
        job = training.spare_job(JOB, NS, replicas=2, spares=1, steps=10**6, failure_policy=budget)
    else:
        job = training.training_job(
            JOB, NS, minimum=1, maximum=2, steps=10**6, failure_policy=budget, recovery=variant
        )
    args: list[str] = job["spec"]["args"]
    args += ["--min-step-seconds", str(step_seconds)]
    return job


def training_members(cluster: LocalCluster, volume: Path) -> list[str]:
    """Pods that train now (from the newest step record; every worker pod when the log has no members)."""
    records = training.records(volume)
    members = (records[-1].get("members") or []) if records else []
    if members:
        return sorted({str(m).rsplit(".", 1)[0] for m in members})
    selector = f"{labels.JOB_NAME}={JOB},{labels.ROLE}={labels.ROLE_WORKER}"
    pods = cluster.kube.items("pods", "--selector", selector, namespace=NS)
    return sorted(p["metadata"]["name"] for p in pods)


def lost_time(records: list[dict[str, Any]], losses: list[float]) -> dict[str, float]:
    """Where the wall time outside kept steps went, in seconds, from the step log: each gap between two
    steps' first runs less the later step's own time. ``loss``: a gap with a node loss in it (the step in
    flight dropped, detection, the re-form at the smaller size); ``grow``: a gap before the first step at a
    larger world size (the joiner or spare taken in); ``between steps``: every other gap (the loop's own
    time per step: data, reporting, checkpoints)."""
    seen: set[int] = set()
    first: list[dict[str, Any]] = []
    for r in sorted(records, key=lambda r: float(r["time"])):
        if int(r["step"]) not in seen:
            seen.add(int(r["step"]))
            first.append(r)
    out = {"loss": 0.0, "grow": 0.0, "between steps": 0.0}
    for before, r in itertools.pairwise(first):
        start = float(r["time"]) - float(r.get("step_time", 0.0))
        gap = max(0.0, start - float(before["time"]))
        if any(float(before["time"]) <= t < float(r["time"]) for t in losses):
            out["loss"] += gap
        elif int(r.get("world_size", 0)) > int(before.get("world_size", 0)):
            out["grow"] += gap
        else:
            out["between steps"] += gap
    return out


def run_variant(cluster: LocalCluster, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    kube, volume = cluster.kube, cluster.volume_dir(PV)
    cluster.kubectl("delete", "llmtrainingjob", JOB, "-n", NS, "--ignore-not-found", "--wait=true")
    wait("the previous job's pods to be gone", lambda: not kube.items("pods", namespace=NS) or None)
    subprocess.run(["rm", "-rf", str(volume / training.CHECKPOINT_SUBDIR)], check=True)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job_for(variant, args.step_seconds)))
    wait("the first step at full size", lambda: any(r["world_size"] == 2 for r in training.records(volume)))
    status = kube.get("llmtrainingjob", JOB, NS) or {}
    start = parse_time((status.get("status") or {}).get("startTime")) or time.time()
    end = time.time() + args.minutes * 60
    losses: list[float] = []
    next_loss = time.time() + args.every
    print(f"\n{variant}: training for {args.minutes} min, a node lost every {args.every:g}s", flush=True)
    while time.time() < end:
        if time.time() >= next_loss:
            victim = training_members(cluster, volume)[-1]
            pods = kube.items("pods", "--selector", f"{labels.JOB_NAME}={JOB}", namespace=NS)
            node = next((p["spec"].get("nodeName") for p in pods if p["metadata"]["name"] == victim), None)
            if node:
                losses.append(chaos.node_not_ready(node, kube=kube, wait=False))
                lost_at = time.time()
                print(f"  {lost_at - start:6.0f}s: node {node} lost ({victim})", flush=True)
                back = lost_at + args.back_after
                while time.time() < min(back, end):
                    time.sleep(0.5)
                chaos.node_ready(node, kube=kube, wait=False)
            next_loss += args.every
        time.sleep(0.5)
    # Status goodput as of now: wait for the operator's next progress update after the end.
    ended = time.time()

    def updated() -> dict[str, Any] | None:
        s = (kube.get("llmtrainingjob", JOB, NS) or {}).get("status") or {}
        p = s.get("progress") or {}
        when = parse_time(p.get("updateTime"))
        return p if p.get("goodput") is not None and when is not None and when >= ended else None

    progress = wait("status.progress after the run", updated, timeout=2 * args.progress_seconds + 30)
    upto = parse_time(progress.get("updateTime")) or ended
    records = training.records(volume)
    log = step_log_goodput(records, start, upto, up_to_step=int(progress["highWaterStep"]))
    # The same definition from the first step on: what the failures cost, without the one-time start-up
    # (pods scheduled, imports, the first rendezvous), which a few minutes' run would otherwise inflate.
    first = min(float(r["time"]) - float(r.get("step_time", 0.0)) for r in records)
    training_only = step_log_goodput(records, first, upto)
    result = audit(records, training.sample_order(volume))
    cluster.kubectl("delete", "llmtrainingjob", JOB, "-n", NS, "--wait=true", check=False)
    return {
        "variant": variant,
        "losses": len(losses),
        "lost": lost_time([r for r in records if float(r["time"]) <= upto], losses),
        "status": float(progress["goodput"]),
        "log": log.goodput,
        "training": training_only.goodput,
        "startup_s": first - start,
        "replayed": result.replayed,
        "wall_s": upto - start,
        "ok": result.ok,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between node losses")
    parser.add_argument("--back-after", type=float, default=20.0, help="seconds until the lost node returns")
    parser.add_argument("--step-seconds", type=float, default=0.5, help="the smoke job's step (padded)")
    parser.add_argument(
        "--progress-seconds", type=float, default=10.0, help="the operator's progress interval"
    )
    parser.add_argument("--variants", default="restart,inProcess,spare")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in ("restart", "inProcess", "spare") for v in variants):
        parser.error(f"--variants: restart, inProcess and spare, got {args.variants!r}")
    cluster = LocalCluster("llmjob-bench-goodput")
    cluster.up(gpu_nodes=3, cpu_nodes=1, run_pods=True)
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    os.environ["LLMJOB_PROGRESS_SECONDS"] = str(args.progress_seconds)
    volume = cluster.volume_dir(PV)
    operator = start_operator(cluster.logs_dir / "bench-operator.log")
    try:
        cluster.kubectl("create", "namespace", NS, check=False)
        subprocess.run(["rm", "-rf", str(volume)], check=True)
        training.prepare_data(volume)
        cluster.kube.apply(training.shared_volume(PV, NS))
        rows = [run_variant(cluster, v, args) for v in variants]
        print(
            f"\n{args.minutes:g} min per variant, a node lost every {args.every:g}s (back after "
            f"{args.back_after:g}s), step {args.step_seconds:g}s; {os.cpu_count()} CPUs, load "
            f"{os.getloadavg()[0]:.1f}"
        )
        print(
            "| recovery | node losses | goodput, job's life (status) | same, step log | start-up "
            "| goodput from the first step (step log) | steps replayed |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['variant']} | {r['losses']} | {100 * r['status']:.1f} % | {100 * r['log']:.1f} % | "
                f"{r['startup_s']:.0f} s | {100 * r['training']:.1f} % | {r['replayed']} |"
            )
        print("\nWall time outside kept steps, from the first step (seconds; points of that wall time):")
        for r in rows:
            wall = r["wall_s"] - r["startup_s"]
            parts = ", ".join(f"{k} {v:.1f} s ({100 * v / wall:.2f})" for k, v in r["lost"].items())
            print(f"  {r['variant']}: {parts}")
        return 0 if all(r["ok"] for r in rows) else 1
    finally:
        stop_operator(operator)
        if not args.keep:
            cluster.down()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
