"""`llmjob demo` (`make demo`): the product in two minutes on a local control plane.

By default the pods really train (``llm_testbed.demo_training``). ``--fake-nodes`` runs this module's
operator-only story: a local cluster of fake p5.48xlarge nodes whose pods run nothing, an elastic job
(min 2, max 4) that runs at 4, one node NotReady, the operator replacing the lost worker and shrinking to
what fits, the node restored, the job growing back, and a timeline with the reaction time of each step.
The two stories share only ``llm_testbed.demo_common``; ``llm_testbed.cli`` picks one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import yaml
from llm_operator import labels

from llm_testbed.demo_common import Timeline, start_operator, stop_operator
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.localcluster.kubectl import Kubectl
from llm_testbed.localcluster.waiting import poll

CLUSTER = "llmjob-demo"  # the fake-node story's cluster (pods run nothing)
JOB = "llama-demo"
NAMESPACE = "default"
STEP_TIMEOUT = 90.0


def demo_job(grace: int) -> dict[str, Any]:
    """The demo's job: 2..4 fake p5.48xlarge workers, fast timeouts so the story fits in a minute."""
    return {
        "apiVersion": "elasticllm.dev/v1alpha1",
        "kind": "LLMTrainingJob",
        "metadata": {"name": JOB, "namespace": NAMESPACE},
        "spec": {
            "minReplicas": 2,
            "maxReplicas": 4,
            "image": "ghcr.io/elasticllm/llm-trainer:0.1.0",
            "args": ["--model", "1b", "--checkpoint-every", "100"],
            "gpusPerNode": 8,
            "efaPerNode": 32,
            "checkpointDir": "/fsx/checkpoints/demo",
            "fsx": {"claimName": "fsx-claim", "mountPath": "/fsx"},
            "failurePolicy": {
                "nodeFailureGraceSeconds": grace,
                "pendingTimeoutSeconds": 10,
                "resizeCooldownSeconds": 5,
            },
            "scheduling": {"instanceTypes": ["p5.48xlarge"]},
        },
    }


def _status(kube: Kubectl) -> dict[str, Any]:
    obj = kube.get("llmtrainingjob", JOB, NAMESPACE) or {}
    status: dict[str, Any] = obj.get("status") or {}
    return status


def _workers(kube: Kubectl) -> list[dict[str, Any]]:
    return kube.items("pods", labels=f"{labels.JOB_NAME}={JOB},{labels.ROLE}=worker", namespace=NAMESPACE)


def _running_at(kube: Kubectl, size: int) -> bool:
    s = _status(kube)
    return s.get("phase") == "Running" and s.get("readyReplicas") == size and s.get("targetReplicas") == size


def _fsx_volume() -> list[dict[str, Any]]:
    """A static FSx for Lustre PV and the claim bound to it (no CSI driver runs here; kwok needs none)."""
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "fsx-demo"},
        "spec": {
            "capacity": {"storage": "1200Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "csi": {"driver": "fsx.csi.aws.com", "volumeHandle": "fs-0123456789abcdef0"},
            "claimRef": {"namespace": NAMESPACE, "name": "fsx-claim"},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "fsx-claim", "namespace": NAMESPACE},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": "fsx-demo",
            "resources": {"requests": {"storage": "1200Gi"}},
        },
    }
    return [pv, pvc]


def run(args: argparse.Namespace) -> int:
    """Run the fake-node story; returns the exit code."""
    cluster = LocalCluster(CLUSTER)
    print(f">> 1/6 local control plane `{CLUSTER}` with {args.nodes} fake p5.48xlarge nodes", flush=True)
    cluster.up(gpu_nodes=args.nodes, cpu_nodes=1)
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    kube = cluster.kube
    log = cluster.logs_dir / "demo-operator.log"
    print(f">> 2/6 operator (log: {log})", flush=True)
    operator = start_operator(log)
    try:
        return _story(cluster, kube, args)
    except Exception as exc:
        print(
            f"demo failed: {exc}\n--- operator log (tail) ---\n{log.read_text(errors='replace')[-3000:]}",
            file=sys.stderr,
        )
        return 1
    finally:
        stop_operator(operator)
        if args.keep:
            print(
                f">> kept: export KUBECONFIG={cluster.kubeconfig}"
                f"; `llmjob cluster down --name {CLUSTER}` removes it"
            )
        else:
            print(">> tearing down the demo cluster (use --keep to keep it)", flush=True)
            cluster.down()


def _story(cluster: LocalCluster, kube: Kubectl, args: argparse.Namespace) -> int:
    kube.run("delete", "llmtrainingjob", JOB, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
    kube.apply(_fsx_volume())
    poll(
        lambda: (kube.get("pvc", "fsx-claim", NAMESPACE) or {}).get("status", {}).get("phase") == "Bound",
        timeout=STEP_TIMEOUT,
        what="the FSx claim to bind",
    )
    tl = Timeline()
    print(f">> 3/6 apply LLMTrainingJob {JOB} (min 2, max 4, grace {args.grace}s)", flush=True)
    kube.run("apply", "-f", "-", input=yaml.safe_dump(demo_job(args.grace)))
    tl.mark("job applied")
    poll(lambda: len(_workers(kube)) == 4, timeout=STEP_TIMEOUT, what="4 worker pods")
    tl.mark("4 worker pods created")
    poll(lambda: _running_at(kube, 4), timeout=STEP_TIMEOUT, what="job Running at 4")
    t_running = tl.mark("job Running at 4/4")

    victim = next(p for p in _workers(kube) if p["metadata"]["name"].endswith("-worker-1"))
    node, old_uid = victim["spec"]["nodeName"], victim["metadata"]["uid"]
    print(f">> 4/6 node {node} (hosting {victim['metadata']['name']}) goes NotReady", flush=True)
    chaos.node_not_ready(node, kube=kube, wait=False)
    t_fail = tl.mark(f"node {node} NotReady")

    def replaced() -> bool:
        return any(
            p["metadata"]["name"] == victim["metadata"]["name"] and p["metadata"]["uid"] != old_uid
            for p in _workers(kube)
        ) or old_uid not in {p["metadata"]["uid"] for p in _workers(kube)}

    poll(replaced, timeout=STEP_TIMEOUT, what="the lost worker to be force-deleted and replaced")
    tl.mark(
        "lost worker force-deleted, replacement created", f"{time.monotonic() - t_fail:.1f}s after NotReady"
    )
    poll(lambda: _running_at(kube, 3), timeout=STEP_TIMEOUT, what="job Running at 3 (no spare node)")
    tl.mark(
        "replacement unschedulable: shrunk, Running at 3/4 (it stays Pending, asking for capacity)",
        f"{time.monotonic() - t_fail:.1f}s after NotReady (pendingTimeoutSeconds 10)",
    )
    print(f">> 5/6 node {node} comes back", flush=True)
    chaos.node_ready(node, kube=kube)
    t_back = tl.mark(f"node {node} Ready again")
    poll(lambda: _running_at(kube, 4), timeout=STEP_TIMEOUT, what="job grown back to 4")
    tl.mark("grown back, Running at 4/4", f"{time.monotonic() - t_back:.1f}s after the node returned")
    status = _status(kube)
    print("\n>> 6/6 timeline\n")
    print(tl.table())
    print(
        f"\nrestarts (membership changes): {status.get('restarts')};"
        f" total {time.monotonic() - t_running:.1f}s"
    )
    print("\n$ kubectl get llmjob -o wide")
    print(kube.run("get", "llmjob", JOB, "-n", NAMESPACE, "-o", "wide").stdout)
    events = kube.run(
        "get",
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        f"involvedObject.name={JOB}",
        "--sort-by=.lastTimestamp",
        "-o",
        "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message",
    )
    print("$ kubectl get events (the job's)\n" + events.stdout)
    return 0
