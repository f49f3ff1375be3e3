"""Real Argo CD in the test bed: the "core" install (application controller and repo server, no UI).

``llmjob cluster up --argocd`` (or :func:`start` on a running cluster) installs Argo CD's CRDs (copied
from the pinned module by the tool build), the ``argocd`` namespace with argocd-cm (the project's
LLMTrainingJob health check from deploy/argocd) and the default AppProject (:mod:`.manifests`), and
starts Redis, the repo server and the application controller as local processes (:mod:`.daemon`).
Applications sync from a local git repository (:mod:`.gitrepo`, a ``file://`` URL); :mod:`.apps` creates
them and reads their status. docs/development.md, "Argo CD in the test bed", has the whole picture.
"""

from __future__ import annotations

from pathlib import Path

from llm_testbed.argocd import daemon
from llm_testbed.argocd.gitrepo import GitRepo
from llm_testbed.argocd.manifests import (
    NAMESPACE,
    ArgoCDError,
    application,
    cluster_secret,
    health_settings,
    settings_objects,
)
from llm_testbed.localcluster import tools
from llm_testbed.localcluster.kubectl import Kubectl
from llm_testbed.localcluster.waiting import poll

CRDS = ("applications.argoproj.io", "applicationsets.argoproj.io", "appprojects.argoproj.io")

__all__ = ["NAMESPACE", "ArgoCDError", "GitRepo", "application", "enabled", "repo_dir", "start", "stop"]


def install(kube: Kubectl) -> None:
    """Argo CD's CRDs, its namespace and settings (idempotent: a resumed cluster keeps what it has)."""
    crds = tools.files_dir(daemon.TOOL, "crds")
    kube.run("apply", "--server-side", "--force-conflicts", "--field-manager=llmjob", "-f", str(crds))
    for name in CRDS:
        poll(lambda n=name: _established(kube, n), timeout=60, what=f"CRD {name} Established")  # type: ignore[misc]
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    assert kube.kubeconfig is not None
    kube.apply([*settings_objects(health_settings()), cluster_secret(kube.kubeconfig)])


def _established(kube: Kubectl, name: str) -> bool:
    conditions = ((kube.get("crd", name) or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def start(kube: Kubectl, cluster_dir: Path) -> dict[str, int]:
    """Install what Argo CD needs and start its processes; their PIDs."""
    install(kube)
    assert kube.kubeconfig is not None
    return daemon.start(kube.kubeconfig, daemon.state_dir(cluster_dir))


def stop(cluster_dir: Path) -> bool:
    return daemon.stop(daemon.state_dir(cluster_dir))


def enabled(cluster_dir: Path) -> bool:
    """The cluster was started with Argo CD (its folder is there)."""
    return daemon.state_dir(cluster_dir).is_dir()


def repo_dir(cluster_dir: Path) -> Path:
    """The local git repository that ``cluster up --argocd`` creates for a newcomer's Applications."""
    return daemon.state_dir(cluster_dir) / "git"
