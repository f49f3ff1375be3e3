"""The upgrade path from the previous release, with a job training across it.

The previous release is the one CHANGELOG.md names (its version and commit): its chart, CRDs and operator
code come out of git history (``git archive``; a shallow clone fails with the reason). On the process-mode
cluster the chart's operator pod runs the operator code of that commit (the pod runner runs a pod's
command with this machine's Python: the old chart gets the old tree first on ``PYTHONPATH`` through its
``extraEnv``). A job trains at world size 2; then the CRDs are upgraded as docs/operations.md says
(``kubectl apply --server-side --force-conflicts``) and the chart with ``helm upgrade``, whose rolling
update starts the working tree's operator. The job trains on: the same worker pods (no restart, no
membership change), steps advance after the upgrade, and the new operator writes its status (a field
that only the new CRD and the new operator have, ``status.members``, appears; ``status.progress`` moves).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_testbed import training
from llm_testbed.localcluster.cluster import LocalCluster
from llm_testbed.localcluster.tools import ensure
from llm_testbed.release.previous import export_tree, previous_release
from support.wait import wait_for

from .e2e_support import JOB, STEP_TIMEOUT, Training

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CHART = "charts/elastic-llm-operator"
RELEASE = "upg"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"


class ChartOperator:
    """The operator the chart runs, as ``Training`` sees it (its log for the diagnostics)."""

    def __init__(self, cluster: LocalCluster, namespace: str) -> None:
        self.cluster, self.ns = cluster, namespace

    def logs(self) -> str:
        text = []
        for pod in self.cluster.kube.items("pods", labels=SELECTOR, namespace=self.ns):
            path = self.cluster.pod_log(self.ns, pod["metadata"]["name"])
            if path.is_file():
                text.append(f"--- {pod['metadata']['name']} ---\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(text)


class HelmRun:
    def __init__(self, cluster: LocalCluster, home: Path) -> None:
        self.binary = str(ensure(["helm"])["helm"])
        self.env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        self.env.update({f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CONFIG", "CACHE", "DATA")})

    def __call__(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run([self.binary, *args], capture_output=True, text=True, env=self.env,
                              timeout=300, check=False)  # fmt: skip
        assert proc.returncode == 0 or not check, f"helm {' '.join(args[:2])} failed:\n{proc.stderr[-4000:]}"
        return proc.stdout


def _values(path: Path, namespace: str, pythonpath: str | None) -> str:
    env = [{"name": "LLMJOB_PROGRESS_SECONDS", "value": "5"}]
    if pythonpath:  # the pod runner expands $(PYTHONPATH) over its own environment, as a kubelet would
        env.append({"name": "PYTHONPATH", "value": f"{pythonpath}:$(PYTHONPATH)"})
    values = {
        "replicaCount": 1,
        "watch": {"allNamespaces": False, "namespaces": [namespace]},
        "extraEnv": env,
    }
    path.write_text(yaml.safe_dump(values))
    return str(path)


@pytest.fixture
def old_tree(tmp_path: Path) -> Path:
    old = previous_release((ROOT / "CHANGELOG.md").read_text())
    return export_tree(ROOT, old.commit, [CHART, "crds", "operator"], tmp_path / f"release-{old.version}")


@pytest.fixture
def world(process_cluster: LocalCluster, process_namespace: str) -> Iterator[Training]:
    t = Training(process_cluster, process_namespace, ChartOperator(process_cluster, process_namespace))  # type: ignore[arg-type]
    t.setup_volume()
    try:
        yield t
    finally:
        t.cluster.kubectl("delete", "llmtrainingjob", "--all", "-n", t.ns, "--wait=true", "--timeout=60s",
                          check=False)  # fmt: skip
        t.cluster.kubectl("delete", "pv", t.pv, "--wait=false", check=False)
        # Whatever happened, the cluster's CRDs are the working tree's again for the tests after this one.
        t.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))


def _operator_pod(t: Training, old: bool) -> dict[str, Any] | None:
    """The Ready operator pod of the old (``PYTHONPATH`` to the old tree) or the new chart, alone."""
    pods = [p for p in t.cluster.kube.items("pods", labels=SELECTOR, namespace=t.ns)
            if not p["metadata"].get("deletionTimestamp")]  # fmt: skip
    if len(pods) != 1:
        return None
    env = {e["name"] for e in pods[0]["spec"]["containers"][0].get("env") or []}
    statuses = pods[0].get("status", {}).get("containerStatuses") or []
    ready = any(s.get("ready") for s in statuses)
    return pods[0] if ready and ("PYTHONPATH" in env) == old else None


def test_upgrade_from_the_previous_release_keeps_the_job_training(
    world: Training, old_tree: Path, tmp_path: Path
) -> None:
    t, helm = world, HelmRun(world.cluster, tmp_path / "helm")
    kubectl = t.cluster.kubectl

    # The previous release: its CRDs, its chart, its operator code.
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(old_tree / "crds"))
    old_values = _values(tmp_path / "old.yaml", t.ns, str(old_tree / "operator"))
    helm("install", RELEASE, str(old_tree / CHART), "-n", t.ns, "--skip-crds", "-f", old_values)
    try:
        _train_across_the_upgrade(t, helm, tmp_path)
    finally:  # the job while its operator runs (kopf's finalizer), then the release and its cluster objects
        kubectl("delete", "llmtrainingjob", JOB, "-n", t.ns, "--wait=true", "--timeout=60s", check=False)
        helm("uninstall", RELEASE, "-n", t.ns, "--wait", "--timeout", "120s", check=False)


def _train_across_the_upgrade(t: Training, helm: HelmRun, tmp_path: Path) -> None:
    kubectl = t.cluster.kubectl
    wait_for(lambda: _operator_pod(t, old=True), STEP_TIMEOUT, "the previous release's operator to be Ready")
    t.apply(training.training_job(JOB, t.ns, minimum=1, maximum=2, steps=100000))
    t.wait_steps("5 steps at world size 2 under the previous release", world=2, count=5)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in t.workers()}
    restarts = t.status().get("restarts")
    assert len(before) == 2 and "members" not in t.status(), t.status()

    # The upgrade, as docs/operations.md says: the CRDs first (server-side apply), then the chart.
    upgraded_at = time.time()
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    helm("upgrade", RELEASE, str(ROOT / CHART), "-n", t.ns, "-f", _values(tmp_path / "new.yaml", t.ns, None))
    wait_for(lambda: _operator_pod(t, old=False), STEP_TIMEOUT, "the new operator alone and Ready")
    serving_at = time.time()

    # Training goes on through the upgrade and after it, in the same pods, written by the new operator.
    t.wait_steps("5 steps at world size 2 after the upgrade", world=2, count=5, after=serving_at)
    step_then = (t.status().get("progress") or {}).get("step", 0)
    wait_for(
        lambda: (
            t.status().get("members") == 2 and (t.status().get("progress") or {}).get("step", 0) > step_then
        ),
        STEP_TIMEOUT,
        "the new operator to write status.members and a newer status.progress",
    )
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in t.workers()} == before, "workers restarted"
    status = t.status()
    assert status.get("restarts") == restarts and status.get("phase") == "Running", status
    steps_during = [r for r in t.records() if upgraded_at <= r["time"] <= serving_at]
    print(f"upgrade: {serving_at - upgraded_at:.1f} s until the new operator served, "
          f"{len(steps_during)} steps trained meanwhile; {t.audit().summary()}")  # fmt: skip
