"""`llmjob operator` started as the README and the chart start it (kopf peering, no --standalone).

Before the fix, an operator without its peering object paused every watch and idled for ever, silently.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_testbed.localcluster import paths

from tests.support.wait import wait_for

from .conftest import PeeredOperatorProcess
from .kube_helpers import apply, job_manifest, running_workers

pytestmark = pytest.mark.cluster
TIMEOUT = 60
PEERING = "elastic-llm-operator"
Factory = Callable[..., PeeredOperatorProcess]


def _reconciles(cluster: Any, namespace: str, name: str, op: PeeredOperatorProcess) -> None:
    """A job applied now gets its pods."""
    assert apply(cluster, job_manifest(name, namespace, replicas=2)).returncode == 0
    wait_for(
        lambda: len(running_workers(cluster, namespace, name)) == 2 or (op.proc and op.proc.poll()),
        TIMEOUT,
        f"2 running workers of {name}",
    )
    assert op.proc is not None and op.proc.poll() is None, op.full_log()[-3000:]


def _ready(op: PeeredOperatorProcess, state: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        code, body = op.probe("/readyz")
        return (
            body
            if body.get("state") == state and code == (200 if state in ("active", "standby") else 503)
            else None
        )

    found: dict[str, Any] = wait_for(check, TIMEOUT, f"/readyz says {state}")
    return found


def _peering(cluster: Any, namespace: str | None) -> dict[str, Any] | None:
    if namespace is None:
        return cluster.kube.get("clusterkopfpeering", PEERING)
    return cluster.kube.get("kopfpeering", PEERING, namespace)


@pytest.fixture
def no_cluster_peering(cluster: Any) -> Iterator[None]:
    """No ClusterKopfPeering before the test, none left after it."""
    cluster.kubectl("delete", "clusterkopfpeering", PEERING, "--ignore-not-found", "--wait=true")
    yield
    cluster.kubectl("delete", "clusterkopfpeering", PEERING, "--ignore-not-found", "--wait=true", check=False)


def test_readme_command_creates_the_missing_peering_object_and_reconciles(
    cluster: Any, namespace: str, peered_operator: Factory, no_cluster_peering: None
) -> None:
    op = peered_operator(["--all-namespaces"])
    op.start()
    wait_for(lambda: _peering(cluster, None), TIMEOUT, "the ClusterKopfPeering, created by the operator")
    body = _ready(op, "active")
    peers = (_peering(cluster, None) or {}).get("status") or {}
    assert body["identity"] in peers, "kopf keeps its keep-alive in the object the operator created"
    _reconciles(cluster, namespace, "readme", op)
    assert "was missing: created it" in op.full_log()


def test_existing_peering_object_is_used(cluster: Any, namespace: str, peered_operator: Factory) -> None:
    made = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": PEERING, "namespace": namespace},
    }
    assert apply(cluster, made).returncode == 0
    uid = (_peering(cluster, namespace) or {})["metadata"]["uid"]
    op = peered_operator(["--namespace", namespace])
    op.start()
    _ready(op, "active")
    _reconciles(cluster, namespace, "peered", op)
    assert (_peering(cluster, namespace) or {})["metadata"]["uid"] == uid, "the existing object is kept"
    assert "peering through KopfPeering" in op.full_log()


def _token_kubeconfig(cluster: Any, namespace: str, account: str, path: Path) -> Path:
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


def test_missing_peering_without_permission_to_create_exits_with_what_to_create(
    cluster: Any, namespace: str, peered_operator: Factory, tmp_path: Path
) -> None:
    """The chart's RBAC grants no create on peerings: the operator says what to create and exits 3."""
    account = "no-create"
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": account, "namespace": namespace},
        "rules": [
            {
                "apiGroups": ["elasticllm.dev"],
                "resources": ["llmtrainingjobs"],
                "verbs": ["get", "list", "watch"],
            },
            {
                "apiGroups": ["kopf.dev"],
                "resources": ["kopfpeerings"],
                "verbs": ["get", "list", "watch", "patch"],
            },
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": account, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    assert apply(cluster, role).returncode == 0 and apply(cluster, binding).returncode == 0
    kubeconfig = _token_kubeconfig(cluster, namespace, account, tmp_path / "kubeconfig.yaml")
    op = peered_operator(["--namespace", namespace], env={"KUBECONFIG": str(kubeconfig)})
    op.start()
    assert op.proc is not None
    code = op.proc.wait(timeout=TIMEOUT)
    log = op.full_log()
    assert code == 3, log[-3000:]
    assert f"KopfPeering '{PEERING}' in namespace '{namespace}' does not exist" in log, log[-3000:]
    assert f"kubectl apply -n {namespace} -f -" in log and "kind: KopfPeering" in log
    assert "Traceback" not in log
    assert _peering(cluster, namespace) is None


def test_started_while_the_peering_crd_is_being_established(
    cluster: Any, namespace: str, peered_operator: Factory
) -> None:
    """The CRD comes after the operator: it waits (with progress lines), then peers and reconciles."""
    crd = "kopfpeerings.kopf.dev"
    crd_file = paths.crds_dir() / "kopf.dev_peerings.yaml"
    (namespaced_crd,) = [d for d in yaml.safe_load_all(crd_file.read_text()) if d["metadata"]["name"] == crd]
    try:
        cluster.kubectl("delete", "crd", crd, "--wait=true")
        wait_for(
            lambda: (
                crd
                not in cluster.kubectl("api-resources", "--api-group=kopf.dev", "-o", "name").stdout.split()
            ),
            TIMEOUT,
            "kopfpeerings gone from discovery",
        )
        op = peered_operator(["--namespace", namespace])
        op.start()
        wait_for(
            lambda: f"waiting for the CRD {crd} to be served" in op.full_log(), TIMEOUT, "a progress line"
        )
        code, body = op.probe("/readyz")
        assert code == 503 and body["state"] == "starting"
        assert op.probe("/healthz")[0] == 200, "alive while it waits"
        # Re-create the CRD; the operator must cope with it still being established.
        assert apply(cluster, namespaced_crd).returncode == 0
        _ready(op, "active")
        _reconciles(cluster, namespace, "late-crd", op)
    finally:
        apply(cluster, namespaced_crd)
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s", check=False)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def test_readiness_says_not_serving_while_paused(
    cluster: Any, namespace: str, peered_operator: Factory
) -> None:
    """Same priority as a live peer: kopf pauses both and nobody serves; a higher one makes this a standby."""
    op = peered_operator(["--namespace", namespace], extra=["--priority", "100"])
    op.start()
    _ready(op, "active")

    def peer(priority: int | None) -> None:
        entry = None if priority is None else {"priority": priority, "lifetime": 60, "lastseen": _now()}
        patch = json.dumps({"status": {"other-operator": entry}})
        cluster.kubectl("patch", "kopfpeering", PEERING, "-n", namespace, "--type=merge", "-p", patch)

    peer(100)
    body = _ready(op, "conflict")
    assert "share priority 100" in body["detail"]
    wait_for(lambda: "operator NOT serving (conflict)" in op.full_log(), TIMEOUT, "a warning in the log")
    wait_for(lambda: "Pausing all operators" in op.full_log(), TIMEOUT, "kopf paused too")
    peer(200)
    body = _ready(op, "standby")
    assert "other-operator" in body["detail"]
    peer(None)
    _ready(op, "active")
    _reconciles(cluster, namespace, "resumed", op)
