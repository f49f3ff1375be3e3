"""The built images in the local cluster, as pods: the pod runner's container mode (podman + runc).

Never skipped: the images come from `make images` (content-cached per machine: a second call builds
nothing); without podman, or when the build fails, these tests fail with the builder's reason.

- The operator image runs as the chart runs it (non-root, read-only root file system, every capability
  dropped, the chart's arguments and probes, the ServiceAccount token the API server projects into the
  pod): it reconciles a job whose worker runs in a container of the trainer image, and replaces the worker
  when its node is lost.
- The in-process example trains through a lost node with every worker in a container of the trainer
  image: the survivor's container goes on (same container, no restart), the lost node's container is
  killed at once, the replacement gets the state from the survivor, 0 steps replayed, every sample once.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import labels
from llm_testbed import training
from llm_testbed.localcluster import chaos
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.localcluster.tools import ensure
from support import pod_containers
from support.images import make_images
from support.live_events import events
from support.wait import wait_for

from .e2e_support import JOB, Training

pytestmark = [pytest.mark.cluster, pytest.mark.images, pytest.mark.timeout(3600)]

CHART = Path(__file__).resolve().parents[2] / "charts" / "elastic-llm-operator"
RELEASE = "ctr"
START_TIMEOUT = 240.0  # a container's start on a loaded 2-core machine, the operator's start-up checks


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    refs, _ = make_images()
    assert set(refs) == {"operator", "trainer"}, refs
    return refs


def _helm(cluster: LocalCluster, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    env.update({f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CONFIG", "CACHE", "DATA")})
    proc = subprocess.run([str(ensure(["helm"])["helm"]), *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, f"helm {' '.join(args[:2])} failed:\n{proc.stderr}"
    return proc


@pytest.fixture
def chart_operator(
    images: dict[str, str], container_cluster: LocalCluster, container_namespace: str, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """The chart installed in the test's namespace, its operator from the built image; its pod."""
    c, ns = container_cluster, container_namespace
    repository, tag = images["operator"].rsplit(":", 1)
    values = {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}, "replicaCount": 1,
              "watch": {"allNamespaces": False, "namespaces": [ns]}, "logLevel": "debug"}  # fmt: skip
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    _helm(c, tmp_path, "install", RELEASE, str(CHART), "--namespace", ns, "-f", str(tmp_path / "values.yaml"))
    selector = f"app.kubernetes.io/instance={RELEASE}"

    def ready() -> dict[str, Any] | None:
        pods = c.kube.items("pods", labels=selector, namespace=ns)
        ok = [
            p for p in pods if any(s.get("ready") for s in p.get("status", {}).get("containerStatuses") or [])
        ]
        return ok[0] if ok else None

    try:
        yield wait_for(ready, START_TIMEOUT, "the chart's operator pod to be Ready (its /readyz probe)")
    finally:
        _helm(c, tmp_path, "uninstall", RELEASE, "--namespace", ns, "--wait", "--timeout", "120s")


def _worker(c: LocalCluster, ns: str) -> dict[str, Any] | None:
    pods = c.kube.items("pods", labels=f"{labels.JOB_NAME}={JOB}", namespace=ns)
    return next((p for p in pods if p["metadata"]["name"] == f"{JOB}-worker-0"), None)


def test_the_operator_image_runs_as_the_chart_runs_it_and_replaces_a_lost_worker(
    images: dict[str, str], container_cluster: LocalCluster, container_namespace: str,
    chart_operator: dict[str, Any],
) -> None:  # fmt: skip
    c, ns, pod = container_cluster, container_namespace, chart_operator
    info = pod_containers.inspect(c, pod)
    assert info is not None and info["State"]["Running"], "the operator runs in a container"
    assert info["ImageName"] == images["operator"]
    host = info["HostConfig"]
    assert info["Config"]["User"] == "65532:65532" and host["ReadonlyRootfs"] is True
    assert not info.get("EffectiveCaps"), f"capabilities left: {info.get('EffectiveCaps')}"
    assert "no-new-privileges" in (host.get("SecurityOpt") or [])
    assert not any(e.startswith("KUBECONFIG=") for e in info["Config"]["Env"]), "in-cluster config only"
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8080/healthz", timeout=10) as rsp:
        assert rsp.status == 200, rsp.read()

    c.kube.apply(training.shared_volume(f"pv-{ns}", ns))
    job = training.training_job(JOB, ns, minimum=1, maximum=1, steps=1, recovery="inProcess")
    job["spec"].update(command=["python", "-c", "import time; time.sleep(100000)"], args=[])
    job = training.in_image(job, images["trainer"], pod_containers.image_user_id(images["trainer"]))
    c.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(job))

    def worker_running(old_uid: str = "") -> dict[str, Any] | None:
        w = _worker(c, ns)
        fresh = w is not None and w["metadata"]["uid"] != old_uid and w["status"].get("phase") == "Running"
        return w if fresh and w is not None and pod_containers.running(c, w) else None

    first = wait_for(
        worker_running, START_TIMEOUT, "the operator to create a worker that runs in a container"
    )
    assert (pod_containers.inspect(c, first) or {}).get("ImageName") == images["trainer"]
    node = first["spec"]["nodeName"]
    chaos.node_not_ready(node, kube=c.kube, wait=False)
    wait_for(lambda: not pod_containers.running(c, first), 30, "the lost node's container to be killed")
    second = wait_for(lambda: worker_running(first["metadata"]["uid"]), START_TIMEOUT,
                      "the operator to replace the lost worker on another node")  # fmt: skip
    assert second["spec"]["nodeName"] != node
    c.kubectl("delete", "llmtrainingjob", JOB, "-n", ns, "--wait=true", "--timeout=120s")
    wait_for(lambda: pod_containers.inspect(c, second) is None, 60, "the worker's container to be removed")
    c.kubectl("delete", "pv", f"pv-{ns}", "--wait=false", check=False)


def test_the_in_process_example_trains_through_a_lost_node_in_containers(
    images: dict[str, str], container_train: Training
) -> None:
    t = container_train
    job = training.training_job(JOB, t.ns, minimum=1, maximum=2, steps=100000, recovery="inProcess")
    t.apply(training.in_image(job, images["trainer"], pod_containers.image_user_id(images["trainer"])))
    t.wait_steps("5 steps at world size 2", world=2, count=5)
    for worker in t.workers():
        info = pod_containers.inspect(t.cluster, worker)
        assert info is not None and info["State"]["Running"], f"{worker['metadata']['name']} is no container"
        assert info["ImageName"] == images["trainer"]
    survivor, victim = t.worker_on(0), t.worker_on(1)
    survivor_container = (pod_containers.inspect(t.cluster, survivor) or {})["Id"]
    node = victim["spec"]["nodeName"]

    lost_at = time.time()
    chaos.node_not_ready(node, kube=t.cluster.kube, wait=False)
    wait_for(lambda: not pod_containers.running(t.cluster, victim), 30, "the lost node's container to die")
    killed_after = time.time() - lost_at
    alone = t.wait_steps("the survivor to go on at world size 1", world=1, count=3, after=lost_at)
    assert t.worker_on(0)["metadata"]["uid"] == survivor["metadata"]["uid"], "the survivor's pod stays"
    assert (pod_containers.inspect(t.cluster, survivor) or {}).get("Id") == survivor_container, (
        "the survivor's container is the same one"
    )

    chaos.node_ready(node, kube=t.cluster.kube)
    back_at = time.time()
    t.wait_steps("the replacement to join at world size 2", world=2, count=3, after=back_at)
    replacement = t.worker_on(1)
    assert replacement["metadata"]["uid"] != victim["metadata"]["uid"]
    assert (pod_containers.inspect(t.cluster, replacement) or {}).get("ImageName") == images["trainer"]
    log = t.cluster.pod_log(t.ns, f"{JOB}-worker-1").read_text(errors="replace")
    joined = [e for e in events(log) if e.get("event") == "formed" and e.get("ready_at", 0) > back_at]
    assert joined, t.diagnostics()
    assert isinstance(joined[0]["source"], int) and joined[0]["source"] != joined[0]["rank"], joined[0]

    result = t.audit()
    sizes = [(i.world_before, i.world_after) for i in result.interruptions]
    assert (2, 1) in sizes and (1, 2) in sizes, sizes
    assert all(i.replayed == 0 for i in result.interruptions), result.interruptions
    assert {r.get("restart") for r in t.records()} == {0}, "no fallback to a checkpoint"
    print(f"containers: lost node -> container killed {killed_after:.2f} s, survivor's step "
          f"{alone[0]['time'] - lost_at:.2f} s; {result.summary()}")  # fmt: skip
