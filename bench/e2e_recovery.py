"""End-to-end recovery with the real operator and real training on the local cluster (pod runner).

A job of min 1 / max 2 workers (tiny model, one worker per fake p5 node) trains; each round makes the node of
worker-1 NotReady (its processes die at once), waits for the survivor's first step at world size 1, brings
the node back, and waits for the first step at world size 2 again. Printed per round and as p50/p99:

- lost → resumed: node lost → first step completed after it (detection, operator, torchrun re-rendezvous,
  process restart, checkpoint load);
- replacement → full size: replacement pod created → first step at world size 2;
- steps replayed per loss (from the trainer's own step log, ``llm_elastic.accounting``).

The variants run one after the other in one invocation, on the same cluster (side by side):
``restart`` (the trainer under torchrun, checkpoints), ``inProcess`` (the trainer on the runtime library:
survivors keep their processes, the operator evicts the lost worker's members, the replacement takes the
state from the survivor), ``plain`` (examples/plain-pytorch/train.py, a user's own script on the same
runtime, in process) and ``spare`` (the trainer in process with ``spareReplicas: 1``: a warm spare is
promoted at the next step boundary). A third fake node holds the spare; the others leave it idle.
A fourth figure per variant: node lost -> first step at full size again.

    python bench/e2e_recovery.py --rounds 10 [--recovery restart,inProcess,plain,spare] [--keep]
    python bench/e2e_recovery.py --rounds 10 --recovery inProcess,spare --baseline 5db3d00   # side by side
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from llm_elastic import audit
from llm_operator import labels
from llm_testbed import benchcmp, training
from llm_testbed.demo_common import start_operator, stop_operator
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster

NS = "bench"
JOB = "bench"
PV = "bench-shared"
TIMEOUT = 300.0


def wait(what: str, fn: Any, timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Figures:
    """One recovery mode's measurements."""

    mode: str
    lost_s: list[float] = field(default_factory=list)
    full_s: list[float] = field(default_factory=list)
    join_s: list[float] = field(default_factory=list)
    start_s: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    replayed: list[int] = field(default_factory=list)
    summary: str = ""
    ok: bool = False


def run_mode(cluster: LocalCluster, mode: str, rounds: int, backend: str) -> Figures:
    """A fresh job in ``mode`` (restart or inProcess); ``rounds`` node losses and grow-backs."""
    kube, volume = cluster.kube, cluster.volume_dir(PV)
    cluster.kubectl("delete", "llmtrainingjob", JOB, "-n", NS, "--ignore-not-found", "--wait=true")
    # The previous mode's workers write a last record when they stop: wait for them before clearing.
    wait("the previous job's pods to be gone", lambda: not kube.items("pods", namespace=NS) or None)
    subprocess.run(["rm", "-rf", str(volume / training.CHECKPOINT_SUBDIR)], check=True)
    budget = {"maxRestarts": 1000}  # each round is ~3 restarts: loss, shrink, grow-back
    if mode == "plain":
        job = training.plain_script_job(JOB, NS, volume, minimum=1, maximum=2, steps=10**6, step_seconds=0.05)
        job["spec"]["failurePolicy"].update(budget)
    elif mode == "spare":
        job = training.spare_job(JOB, NS, replicas=2, spares=1, steps=10**6, failure_policy=budget)
    else:
        job = training.training_job(
            JOB, NS, minimum=1, maximum=2, steps=10**6, backend=backend, failure_policy=budget, recovery=mode
        )
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    out = Figures(mode)

    def steps_after(world: int, after: float, count: int = 1) -> dict[str, Any] | None:
        hits = [r for r in training.records(volume) if r["world_size"] == world and r["time"] > after]
        return hits[0] if len(hits) >= count else None

    wait("12 steps at world size 2", lambda: steps_after(2, 0.0, 12))
    header = (
        f"{'round':>5}  {'lost -> resumed':>15}  {'replacement -> full size':>24}  {'started -> full':>17}"
    )
    print(f"\n{mode}\n{header}", flush=True)
    for rnd in range(1, rounds + 1):
        victim_name = _victim(mode, training.records(volume))

        def scheduled_victim(name: str = victim_name) -> dict[str, Any] | None:
            pods = kube.items("pods", "--selector", f"{labels.JOB_NAME}={JOB}", namespace=NS)
            found = [p for p in pods if p["metadata"]["name"] == name]
            return found[0] if found and found[0]["spec"].get("nodeName") else None

        victim = wait(f"{victim_name} on a node", scheduled_victim)
        node, old_uid = victim["spec"]["nodeName"], victim["metadata"]["uid"]
        at_loss = _generation(training.records(volume)[-1])
        standby_before = _standby(cluster, NS, victim_name)
        t_lost = chaos.node_not_ready(node, kube=kube, wait=False)  # the moment its pods were stopped

        def after(
            world: int | None, t: float = t_lost, g: tuple[Any, Any] = at_loss
        ) -> dict[str, Any] | None:
            """The first step of a later generation (or restart) after the loss, at ``world`` if given: a
            step the survivors finish in the old generation right after the loss does not count."""
            return next(
                (
                    r
                    for r in training.records(volume)
                    if r["time"] > t and _generation(r) != g and (world is None or r["world_size"] == world)
                ),
                None,
            )

        first = wait("the survivors' first step", lambda: after(None))
        out.lost_s.append(first["time"] - t_lost)
        chaos.node_ready(node, kube=kube)

        def replacement(uid: str = old_uid, name: str = victim_name) -> dict[str, Any] | None:
            found = kube.items("pods", "--selector", f"{labels.JOB_NAME}={JOB}", namespace=NS)
            return next(
                (p for p in found if p["metadata"]["name"] == name and p["metadata"]["uid"] != uid),
                None,
            )

        wait("a replacement pod", replacement)
        if mode == "spare":  # full size at once; the replacement becomes the next spare
            out.full_s.append(wait("full size", lambda: after(2))["time"] - t_lost)
            wait(
                "the replacement registered as a spare",
                lambda n=victim_name, b=standby_before: _standby(cluster, NS, n) > b,
            )
            print(f"{rnd:5d}  {out.lost_s[-1]:14.1f}s  {'(spare promoted)':>24}", flush=True)
            wait("3 steps at full size", lambda t=first["time"]: steps_after(2, t, 3))
            continue
        # The first replacement may never run: made while the node was down, it avoids that node, and once
        # the node is usable again the operator re-creates it without that term (docs/elasticity.md, "When
        # an avoided node is used again"). Measured: the pod that really joined.
        full = wait("the first step at full size", lambda: after(2))
        out.full_s.append(full["time"] - t_lost)
        pod = wait("the replacement pod", replacement)
        created = _epoch(pod["metadata"]["creationTimestamp"])
        out.join_s.append(full["time"] - created)
        started = _container_started(kube, pod["metadata"]["uid"])
        out.start_s.append(full["time"] - started)
        print(
            f"{rnd:5d}  {out.lost_s[-1]:14.1f}s  {out.join_s[-1]:23.1f}s  {out.start_s[-1]:16.1f}s",
            flush=True,
        )
        wait("3 steps at full size", lambda t=full["time"]: steps_after(2, t - 0.001, 3))

    order = training.plain_script_order() if mode == "plain" else training.sample_order(volume)
    result = audit(training.records(volume), order)
    out.replayed = result.replayed_per_loss  # the summary's total reads the same interruptions
    out.summary, out.ok, out.problems = result.summary(), result.ok, result.problems
    cluster.kubectl("delete", "llmtrainingjob", JOB, "-n", NS, "--wait=true", check=False)
    return out


def _generation(record: dict[str, Any]) -> tuple[Any, Any]:
    """What changes at every recovery: the generation (in process) or the restart count (torchrun)."""
    return record.get("generation"), record.get("restart")


def _victim(mode: str, records: list[dict[str, Any]]) -> str:
    """The pod to lose: worker-1; with a spare, the second training member (a spare trains nothing)."""
    if mode != "spare":
        return f"{JOB}-worker-1"
    members = records[-1].get("members") or []
    pods = sorted({str(m).rsplit(".", 1)[0] for m in members})
    return pods[-1]


def _standby(cluster: LocalCluster, namespace: str, pod: str) -> int:
    """How many standby events the pod name's log holds (it keeps every pod of that name, so a new spare
    is one more than before)."""
    from llm_testbed.localcluster.errors import LocalClusterError

    try:
        log = cluster.pod_log(namespace, pod)
    except LocalClusterError:  # the replacement pod is not there yet
        return 0
    return log.read_text(errors="replace").count('"event": "standby"') if log.is_file() else 0


def _row(label: str, values: list[float]) -> str:
    if not values:
        return f"| {label} | 0 | - | - |"
    return f"| {label} | {len(values)} | {statistics.median(values):.1f} s | {pct(values, 0.99):.1f} s |"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--backend", default="etcd-v3", choices=["etcd-v3", "c10d"])
    parser.add_argument(
        "--recovery",
        default="restart,inProcess,plain,spare",
        help="comma-separated variants, run one after the other on the same cluster (default: all four)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the cluster")
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="run commit REF's bench first, then the working tree's, and compare them (20 %% guard)",
    )
    args = parser.parse_args()
    if args.baseline:
        own = [
            a
            for a in sys.argv[1:]
            if a != "--baseline" and a != args.baseline and a != f"--baseline={args.baseline}"
        ]
        return benchcmp.side_by_side(
            Path(__file__).resolve().parents[1], args.baseline, "bench/e2e_recovery.py", own
        )
    modes = [m for m in args.recovery.split(",") if m]
    variants = ("restart", "inProcess", "plain", "spare")
    if not modes or any(m not in variants for m in modes):
        parser.error(f"--recovery: variants are {', '.join(variants)}, got {args.recovery!r}")
    if set(modes) - {"restart"} and args.backend != "etcd-v3":
        parser.error("--recovery inProcess, plain and spare need --backend etcd-v3")

    cluster = LocalCluster("llmjob-bench-e2e")
    cluster.up(gpu_nodes=3 if "spare" in modes else 2, cpu_nodes=1, run_pods=True)
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    volume = cluster.volume_dir(PV)
    operator = start_operator(cluster.logs_dir / "bench-operator.log")
    try:
        cluster.kubectl("create", "namespace", NS, check=False)
        cluster.kubectl("delete", "llmtrainingjob", JOB, "-n", NS, "--ignore-not-found", "--wait=true")
        cluster.kubectl("delete", "pvc", training.CLAIM, "-n", NS, "--ignore-not-found", "--wait=true")
        cluster.kubectl("delete", "pv", PV, "--ignore-not-found", "--wait=true")
        subprocess.run(["rm", "-rf", str(volume)], check=True)
        training.prepare_data(volume)
        cluster.kube.apply(training.shared_volume(PV, NS))
        figures = [run_mode(cluster, mode, args.rounds, args.backend) for mode in modes]
        print(f"\nbackend {args.backend}, {args.rounds} losses per mode, {os.cpu_count()} CPUs, one run")
        print("| event | n | p50 | p99 (max) |\n|---|---|---|---|")
        for f in figures:
            print(_row(f"{f.mode}: node lost -> first step after resume", f.lost_s))
            print(_row(f"{f.mode}: node lost -> first step at full size again", f.full_s))
            print(_row(f"{f.mode}: joining pod created -> first step at full size", f.join_s))
            print(_row(f"{f.mode}: joining pod's process started -> first step at full size", f.start_s))
        for f in figures:
            print(
                f"{f.mode}: steps replayed per loss mean {statistics.mean(f.replayed or [0]):.1f},"
                f" max {max(f.replayed or [0])}; sample accounting: {f.summary}"
            )
            for problem in f.problems:
                print(f"  {f.mode}: {problem}")
        return 0 if all(f.ok for f in figures) else 1
    finally:
        stop_operator(operator)
        if not args.keep:
            cluster.down()


def _container_started(kube: Any, uid: str) -> float:
    """When the pod's container started running (1 s resolution), waiting for the status to show it."""

    def started() -> float | None:
        pods = kube.items("pods", "--selector", f"{labels.JOB_NAME}={JOB}", namespace=NS)
        for pod in pods:
            if pod["metadata"]["uid"] != uid:
                continue
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                stamp = ((status.get("state") or {}).get("running") or {}).get("startedAt")
                if stamp:
                    return _epoch(stamp)
        return None

    value: float = wait("the replacement's container start time", started)
    return value


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
