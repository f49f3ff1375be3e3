"""The operator reconciles a job holding exactly the chart's RBAC: a real ServiceAccount token only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import Helm
from llm_testbed.localcluster import chaos
from support.wait import wait_for

from tests.integration.kube_helpers import apply, job_manifest, running_workers, status, workers

pytestmark = pytest.mark.cluster
TIMEOUT = 60
IDENTITY_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "KopfPeering")


def _token_kubeconfig(cluster: Any, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (TokenRequest), on the same apiserver."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    server = admin["clusters"][0]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [server],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": account, "context": {"cluster": server["name"], "user": account}}],
                "current-context": account,
            }
        )
    )
    return path


def _settled_at(cluster: Any, namespace: str, size: int) -> bool:
    s = status(cluster, namespace, "rbac")
    return s.get("phase") == "Running" and s.get("targetReplicas") == size and s.get("readyReplicas") == size


def test_operator_reconciles_with_only_the_charts_rbac(
    cluster: Any, namespace: str, helm: Helm, tmp_path: Path
) -> None:
    account = "llmop-rbac"
    values = {
        "replicaCount": 1,
        "fullnameOverride": f"rbac-{namespace}"[:50],
        "watch": {"allNamespaces": False, "namespaces": [namespace]},
        "serviceAccount": {"name": account},
        "peering": {"name": "llmop-rbac"},
    }
    identity = [o for o in helm.template(values, namespace=namespace) if o["kind"] in IDENTITY_KINDS]
    assert {o["kind"] for o in identity} == set(IDENTITY_KINDS)
    cluster.kube.apply(identity)
    cluster_scoped = [o for o in identity if o["kind"].startswith("Cluster")]
    kubeconfig = _token_kubeconfig(cluster, namespace, account, tmp_path / "sa-kubeconfig.yaml")
    denied = cluster.kubectl("--kubeconfig", str(kubeconfig), "get", "secrets", "-n", namespace, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), "the token must not read secrets"

    log = tmp_path / "operator.log"
    argv = [sys.executable, "-m", "llm_operator.cli", "operator", "--namespace", namespace]
    argv += ["--peering", "llmop-rbac", "--metrics-port", "0", "--liveness-port", "0"]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    proc = subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        assert apply(cluster, job_manifest("rbac", namespace, replicas=2, maxReplicas=3)).returncode == 0
        wait_for(
            lambda: status(cluster, namespace, "rbac").get("phase") == "Running",
            TIMEOUT,
            "Running with chart RBAC",
        )
        assert cluster.kube.get("deployment", "rbac-rdzv", namespace) is not None
        assert cluster.kube.get("service", "rbac-workers", namespace) is not None
        cluster.kubectl("scale", "llmjob/rbac", "-n", namespace, "--replicas=3")
        wait_for(lambda: len(running_workers(cluster, namespace, "rbac")) == 3, TIMEOUT, "scaled to 3")
        wait_for(lambda: _settled_at(cluster, namespace, 3), TIMEOUT, "Running at 3 after the scale")
        before = status(cluster, namespace, "rbac")["restarts"]
        victim = running_workers(cluster, namespace, "rbac")[0]
        chaos.fail_pod(namespace, victim["metadata"]["name"], 1, kube=cluster.kube, wait=False)
        wait_for(
            lambda: (
                victim["metadata"]["uid"]
                not in {p["metadata"]["uid"] for p in workers(cluster, namespace, "rbac")}
                and status(cluster, namespace, "rbac").get("restarts") == before + 1
            ),
            TIMEOUT,
            "failed worker deleted and replaced",
        )
        events = cluster.kubectl("get", "events", "-n", namespace, "-o", "jsonpath={.items[*].reason}").stdout
        assert "CreatedWorkers" in events, "events are posted with the chart's RBAC"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for obj in cluster_scoped:
            cluster.kubectl(
                "delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found", check=False
            )
    text = log.read_text(errors="replace")
    assert "Forbidden" not in text and " 403" not in text, text[-3000:]
