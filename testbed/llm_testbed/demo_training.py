"""`llmjob demo` (`make demo`): real training through a node loss, on one machine.

A local cluster whose pods run as processes (the pod runner) with 3 fake p5.48xlarge nodes; the operator
started as users start it; the shipped CPU smoke job (tiny model, etcd-v3 rendezvous pod, shared volume) at
min 2 / max 3 with recovery in process (``--recovery restart``: torchrun and checkpoints). It trains at
world size 3, one node is lost (NotReady: its processes die at once), the survivors go on at 2 in the same
processes (restart: resume from the newest checkpoint), the node returns and the job grows back to 3. The
closing lines say what the failure cost, from the trainer's own step log (``llm_elastic.accounting``).
With ``--containers`` the trainer image is built (``make images``, cached) and every worker runs in a
container of it (the pod runner's container mode, its own cluster ``llmjob-demo-containers``). With
``--kubelet`` the nodes are real kubelets (``llmjob-demo-kubelet``, the kubelet tier): each pulls the image
from the tier's registry, and the node is lost for real (``chaos delete-node``: kubelet, containerd and
containers killed at once) and a new node of the same name joins (``add-node``, its pull included).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import yaml
from llm_operator import labels

from llm_testbed import training
from llm_testbed.demo_common import Timeline, start_operator, stop_operator
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.localcluster.kubectl import Kubectl

CLUSTER = "llmjob-demo-train"
CONTAINERS_CLUSTER = "llmjob-demo-containers"  # a cluster keeps its runner's mode: one of its own
KUBELET_CLUSTER = "llmjob-demo-kubelet"
JOB = "llama-demo"
NAMESPACE = "demo"
PV = "demo-shared"
STEP_TIMEOUT = 240.0
PULL_TIMEOUT = 600.0  # kubelet nodes pulling the 5.6 GiB trainer image at once


class Progress:
    """Waits on the trainer's step log, printing a line every few steps so the run is visible."""

    def __init__(self, cluster: LocalCluster, timeline: Timeline, timeout: float = STEP_TIMEOUT) -> None:
        self.volume = cluster.volume_dir(PV)
        self.timeline = timeline
        self.timeout = timeout
        self.printed = 0

    def records(self) -> list[dict[str, Any]]:
        return training.records(self.volume)

    def wait(self, what: str, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.timeout
        while True:
            records = self.records()
            for r in records:
                if r["step"] > self.printed and (r["step"] % 10 == 0 or r["step"] == 1):
                    print(
                        f"           step {r['step']:4d}  loss {r['loss']:.3f}  world size {r['world_size']}"
                    )
                    self.printed = r["step"]
            if done(records):
                return records
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {self.timeout:.0f}s waiting for {what}")
            time.sleep(0.5)

    def steps_at(self, what: str, world: int, count: int, after: float) -> dict[str, Any]:
        """Wait for ``count`` steps at ``world`` after wall time ``after``; return the first of them."""
        records = self.wait(
            what, lambda rs: sum(r["world_size"] == world and r["time"] > after for r in rs) >= count
        )
        first = next(r for r in records if r["world_size"] == world and r["time"] > after)
        return first


def _worker(kube: Kubectl, index: int) -> dict[str, Any] | None:
    name = f"{JOB}-worker-{index}"
    pods = kube.items("pods", labels=f"{labels.JOB_NAME}={JOB}", namespace=NAMESPACE)
    return next((p for p in pods if p["metadata"]["name"] == name), None)


def run(args: argparse.Namespace) -> int:
    """Run the story; returns the exit code."""
    containers = bool(getattr(args, "containers", False))
    kubelet = bool(getattr(args, "kubelet", False))
    name = KUBELET_CLUSTER if kubelet else CONTAINERS_CLUSTER if containers else CLUSTER
    if containers or kubelet:
        from llm_testbed.images import build

        print(">> 0/6 the trainer image (make images: built once, then cached)", flush=True)
        args.trainer_image = build.ensure(["trainer"])["trainer"]
    cluster = LocalCluster(name)
    where = f"containers of {args.trainer_image}" if containers else "processes"
    if kubelet:
        print(f">> 1/6 local cluster `{name}`: 3 p5.48xlarge-shaped kubelet nodes (kubelet + containerd)")
        cluster.up(gpu_nodes=3, cpu_nodes=1, kubelet=True)
        from llm_testbed.kubeletnodes import workload

        try:
            workload.publish_trainer(cluster.kubelet_tier, args.trainer_image, 3)
        except Exception:
            cluster.down()  # it would hold the machine's kubelet tier
            raise
    else:
        print(
            f">> 1/6 local cluster `{name}`: 3 fake p5.48xlarge nodes whose pods run as {where}", flush=True
        )
        cluster.up(gpu_nodes=3, cpu_nodes=1, run_pods=True, containers=containers)
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    log = cluster.logs_dir / "demo-operator.log"
    print(f">> 2/6 operator: llmjob operator --all-namespaces (log: {log})", flush=True)
    operator = start_operator(log)
    try:
        return _story(cluster, args)
    except Exception as exc:
        print(f"demo failed: {exc}\n--- operator log (tail) ---\n{log.read_text(errors='replace')[-3000:]}",
              file=sys.stderr)  # fmt: skip
        logs = f"kubectl logs -n {NAMESPACE} <pod>" if kubelet else cluster.podrunner_dir / "logs"
        print(f"pod logs: {logs}", file=sys.stderr)
        return 1
    finally:
        stop_operator(operator)
        if args.keep:
            print(f">> kept: export KUBECONFIG={cluster.kubeconfig}; `llmjob cluster down --name {name}`")
        else:
            print(">> tearing down the demo cluster (use --keep to keep it)", flush=True)
            cluster.kubectl("delete", "llmtrainingjob", JOB, "-n", NAMESPACE, "--wait=true", check=False)
            cluster.down()


def _story(cluster: LocalCluster, args: argparse.Namespace) -> int:
    kube = cluster.kube
    volume = cluster.volume_dir(PV)
    print(f">> 3/6 shared volume (one host folder, like FSx): token shards in {volume}", flush=True)
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    cluster.kubectl("delete", "llmtrainingjob", JOB, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
    cluster.kubectl("delete", "pvc", training.CLAIM, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
    cluster.kubectl("delete", "pv", PV, "--ignore-not-found", "--wait=true")
    for sub in (training.CHECKPOINT_SUBDIR, training.DATA_SUBDIR):
        _remove_tree(volume / sub)
    training.prepare_data(volume)
    kube.apply(training.shared_volume(PV, NAMESPACE))
    image = getattr(args, "trainer_image", None)
    kubelet = cluster.runs_kubelets
    if kubelet and image:
        from llm_testbed.kubeletnodes import workload

        training.share_with_group(volume, workload.image_group(image))  # no fsGroup on a hostPath volume

    tl = Timeline()
    progress = Progress(cluster, tl, PULL_TIMEOUT if kubelet else STEP_TIMEOUT)
    recovery = getattr(args, "recovery", "inProcess")
    job = training.training_job(
        JOB, NAMESPACE, minimum=2, maximum=3, steps=100000, checkpoint_every=10, recovery=recovery
    )
    print(
        f">> 4/6 apply LLMTrainingJob {JOB}: tiny Llama, min 2, max 3, etcd-v3, recovery {recovery}, "
        "checkpoint every 10 steps"
    )
    if image:
        from llm_testbed.images.podman import Podman

        user = str(Podman.of_cache().inspect(image)["Config"].get("User") or "0")
        job = training.in_image(job, image, int(user.split(":")[0]))
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    tl.mark("job applied")
    first = progress.steps_at("the first steps at world size 3", 3, 1, 0.0)
    tl.mark("training at world size 3", f"step 1 loss {first['loss']:.3f}")
    progress.steps_at("20 steps at world size 3", 3, 20, 0.0)

    victim = _worker(kube, 1)
    if victim is None:
        raise RuntimeError(f"{JOB}-worker-1 not found")
    node = victim["spec"]["nodeName"]
    how_lost = "deleted: kubelet, containerd and" if kubelet else "lost (NotReady):"
    print(f">> 5/6 node {node} is {how_lost} {JOB}-worker-1's processes die with it", flush=True)
    before = progress.records()[-1]
    t_lost = tl.mark(f"node {node} lost", f"last step {before['step']}")  # before: delete-node blocks
    if kubelet:
        chaos.delete_node(node, kube=kube)
    else:
        chaos.node_not_ready(node, kube=kube, wait=False)
    resumed = progress.steps_at("the survivors to resume at world size 2", 2, 1, before["time"])
    if recovery == "inProcess":
        same = set(resumed.get("pids") or []) <= set(before.get("pids") or [])
        pids = "PIDs in their containers" if getattr(args, "containers", False) else "PIDs"
        how = f"same processes ({pids} {sorted(resumed.get('pids') or [])})" if same else "new processes"
        tl.mark("survivors went on at world size 2", f"{time.monotonic() - t_lost:.1f}s; {how}")
    else:
        tl.mark(
            "survivors resumed at world size 2",
            f"{time.monotonic() - t_lost:.1f}s; resumed from checkpoint step {resumed['resumed_from']}",
        )
    progress.steps_at("10 steps at world size 2", 2, 10, before["time"])
    if kubelet:
        chaos.add_node(node, kind="gpu", kube=kube)  # a new instance: it pulls the image again
    else:
        chaos.node_ready(node, kube=kube)
    back = progress.records()[-1]
    t_back = tl.mark(f"node {node} {'added' if kubelet else 'Ready again'}")
    grown = progress.steps_at("the replacement to join at world size 3", 3, 1, back["time"])
    tl.mark("replacement joined: world size 3", f"{time.monotonic() - t_back:.1f}s after the node returned")
    progress.steps_at("10 steps at world size 3", 3, 10, grown["time"] - 0.001)

    from llm_elastic.accounting import audit

    result = audit(progress.records(), training.sample_order(volume))
    print("\n>> 6/6 timeline\n")
    print(tl.table())
    print("\n$ kubectl get llmjob -n demo")
    print(cluster.kubectl("get", "llmjob", JOB, "-n", NAMESPACE).stdout)
    print("what the failures cost (from metrics.jsonl): " + result.summary())
    for i in result.interruptions:
        print(
            f"  world {i.world_before} -> {i.world_after}: paused {i.paused_s:.1f}s,"
            f" {i.replayed} step(s) replayed (last step {i.last_step}, resumed from {i.resumed_from})"
        )
    for problem in result.problems:
        print(f"  PROBLEM: {problem}")
    return 0 if result.ok else 1


def _remove_tree(path: Any) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
