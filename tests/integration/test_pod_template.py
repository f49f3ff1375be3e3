"""spec.podTemplate for real: a job whose workers have a ServiceAccount (its token mounted), a ConfigMap
volume and a native sidecar trains on ``process_cluster`` (pods as processes) through a node loss.

The node-deleted story of test_e2e_training (c10d rendezvous pod; the Node object deleted, a new one of
that name returns), with the pod template: the sidecar runs beside each trainer, the trainer sees the
ConfigMap's files and a real ServiceAccount token, the survivor resumes at 1, and the replacement worker
(sidecar first, then the trainer) grows the job back to 2: the sidecar never holds anything up.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from llm_testbed import training
from llm_testbed.localcluster import chaos

from .e2e_support import JOB, Training
from .test_e2e_training import _lost_node_story

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.timeout(600)]
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
SIDECAR_SCRIPT = "import time\nwhile True:\n    print('shipping', flush=True)\n    time.sleep(5)"
POD_TEMPLATE = {
    "metadata": {"labels": {"cost-center": "research"}, "annotations": {"sidecar.istio.io/inject": "false"}},
    "spec": {
        "serviceAccountName": "trainer-s3",
        "volumes": [{"name": "settings", "configMap": {"name": "trainer-settings"}}],
        "initContainers": [
            {
                "name": "log-shipper",
                "image": "fluent/fluent-bit:3.0",
                "restartPolicy": "Always",
                "command": ["python", "-u", "-c", SIDECAR_SCRIPT],
            }
        ],
        "containers": [
            {"name": "trainer", "volumeMounts": [{"name": "settings", "mountPath": "/etc/trainer"}]}
        ],
    },
}


def _check_pod_settings(pod: dict[str, Any]) -> None:
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "trainer-s3"
    assert pod["metadata"]["labels"]["cost-center"] == "research"
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    (trainer,) = spec["containers"]
    mounts = {m["mountPath"]: m["name"] for m in trainer["volumeMounts"]}
    assert mounts["/etc/trainer"] == "settings" and mounts["/dev/shm"] == "dshm"
    assert mounts[TOKEN_PATH].startswith("kube-api-access-"), "the ServiceAccount token is mounted"
    assert [(c["name"], c["restartPolicy"]) for c in spec["initContainers"]] == [("log-shipper", "Always")]


def _check_running_worker(pod: dict[str, Any]) -> None:
    """Its sidecar runs and its trainer sees the ConfigMap file and a token (through the trainer's own
    mount namespace: /proc/PID/root)."""
    _check_pod_settings(pod)
    (sidecar,) = pod["status"]["initContainerStatuses"]
    assert "running" in sidecar["state"], sidecar
    (trainer,) = pod["status"]["containerStatuses"]
    pid = int(trainer["containerID"].removeprefix("podrunner://"))
    assert _read_in(pid, "/etc/trainer/optimizer") == "adamw"
    assert _read_in(pid, f"{TOKEN_PATH}/token").count(".") == 2, "a JWT from the TokenRequest API"
    assert _read_in(pid, f"{TOKEN_PATH}/namespace") == pod["metadata"]["namespace"]


def _read_in(pid: int, path: str) -> str:
    """A file as the process ``pid`` sees it (its mount namespace; symlinks such as /var/run -> /run are
    the machine's, resolved here since /proc/PID/root would resolve absolute ones outside it)."""
    return Path(f"/proc/{pid}/root{os.path.realpath(path)}").read_text()


def test_service_account_volume_and_sidecar_train_through_a_node_loss(train: Training) -> None:
    ns, kube = train.ns, train.cluster.kube
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "trainer-s3", "namespace": ns},
    }
    settings = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"optimizer": "adamw"},
                "metadata": {"name": "trainer-settings", "namespace": ns}}  # fmt: skip
    kube.apply([account, settings])
    job = training.training_job(JOB, ns, minimum=1, maximum=2, steps=5000, backend="c10d")
    job["spec"]["podTemplate"] = POD_TEMPLATE
    train.apply(job)
    before: dict[str, str] = {}

    def check_workers() -> None:
        for index in (0, 1):
            pod = train.worker_on(index)
            _check_running_worker(pod)
            before[pod["metadata"]["name"]] = pod["metadata"]["uid"]

    _lost_node_story(
        train,
        lambda node: chaos.delete_node(node, kube=kube, wait=False),
        lambda node: chaos.add_node(node, kube=kube),
        check_workers,
    )
    replacement = train.worker_on(1)
    assert replacement["metadata"]["uid"] != before[f"{JOB}-worker-1"], "worker-1 was replaced"
    _check_running_worker(replacement)
    log = train.cluster.pod_log(ns, f"{JOB}-worker-1", "log-shipper")
    assert "shipping" in log.read_text(), "the replacement's sidecar ran"
