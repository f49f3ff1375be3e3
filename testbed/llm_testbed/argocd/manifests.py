"""The objects Argo CD core needs in a local cluster, and the Applications the test bed creates (pure).

Argo CD "core" is the application controller and the repo server alone: no API server, UI or Dex. They
read their settings from ConfigMaps and Secrets in their own namespace (``NAMESPACE``): argocd-cm carries
the project's LLMTrainingJob health check, taken from the generated patch that users apply
(deploy/argocd/argocd-cm-health-patch.yaml), so the test bed runs exactly what the docs tell users to run.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import yaml

from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.paths import repo_root

NAMESPACE = "argocd"
API = "argoproj.io/v1alpha1"
CLUSTER_NAME = "local"
PROJECT = "default"
RECONCILIATION = "15s"
"""argocd-cm ``timeout.reconciliation``: how often the controller looks at git again (upstream: 120s).
The test bed also asks for a refresh after each commit (:func:`llm_testbed.argocd.apps.refresh`)."""


class ArgoCDError(LocalClusterError):
    """Argo CD could not be set up, started or read; the message says what failed."""


def health_patch_path() -> Path:
    return repo_root() / "deploy" / "argocd" / "argocd-cm-health-patch.yaml"


def health_settings(patch: Path | None = None) -> dict[str, str]:
    """The argocd-cm keys of the project's health check (from the patch users apply)."""
    path = patch or health_patch_path()
    doc = yaml.safe_load(path.read_text())
    data = (doc or {}).get("data")
    if not isinstance(data, dict) or not data:
        raise ArgoCDError(f"{path}: no data: run deploy/argocd/render_health_config.py")
    return {str(k): str(v) for k, v in data.items()}


def settings_objects(health: dict[str, str]) -> list[dict[str, Any]]:
    """argocd-cm (the health check, a short reconciliation period), argocd-secret and the default
    AppProject, which the API server would create in a full install."""
    meta = {"namespace": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "argocd"}}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "argocd-cm", **meta},
            # Argo CD runs outside the cluster: no in-cluster config, the cluster comes from a cluster Secret.
            "data": {"timeout.reconciliation": RECONCILIATION, "cluster.inClusterEnabled": "false", **health},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "argocd-secret", **meta},
            "type": "Opaque",
        },
        {
            "apiVersion": API,
            "kind": "AppProject",
            "metadata": {"name": PROJECT, "namespace": NAMESPACE},
            "spec": {
                "sourceRepos": ["*"],
                "destinations": [{"server": "*", "namespace": "*"}],
                "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
            },
        },
    ]


def cluster_secret(kubeconfig: Path) -> dict[str, Any]:
    """The destination cluster as Argo CD registers one (a Secret labelled ``secret-type: cluster``): the
    API server and the client certificate of ``kubeconfig`` (kwokctl's admin: files, not inline data).

    Argo CD's in-cluster destination (``https://kubernetes.default.svc``) needs the controller to run in a
    pod (a service account token, ``KUBERNETES_SERVICE_HOST``); here it is a process of this machine."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]

    def data(inline: str, file: str, of: dict[str, Any]) -> str:
        if of.get(inline):
            return str(of[inline])
        if not of.get(file):
            raise ArgoCDError(f"{kubeconfig}: neither {inline} nor {file}: cannot register the cluster")
        return base64.b64encode(Path(of[file]).read_bytes()).decode()

    tls = {
        "caData": data("certificate-authority-data", "certificate-authority", cluster),
        "certData": data("client-certificate-data", "client-certificate", user),
        "keyData": data("client-key-data", "client-key", user),
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"cluster-{CLUSTER_NAME}",
            "namespace": NAMESPACE,
            "labels": {"argocd.argoproj.io/secret-type": "cluster"},
        },
        "stringData": {
            "name": CLUSTER_NAME,
            "server": str(cluster["server"]),
            "config": json.dumps({"tlsClientConfig": tls}),
        },
    }


def application(
    name: str,
    repo_url: str,
    path: str,
    namespace: str,
    *,
    helm_values: dict[str, Any] | None = None,
    prune: bool = False,
    sync_options: tuple[str, ...] = ("CreateNamespace=true", "ServerSideApply=true"),
    ignore_differences: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An Application that syncs ``path`` of the git repository into ``namespace``, automatically (self-heal
    on; ``prune`` as asked). With ``helm_values`` the folder is a Helm chart rendered with those values."""
    source: dict[str, Any] = {"repoURL": repo_url, "targetRevision": "HEAD", "path": path}
    if helm_values is not None:
        source["helm"] = {"releaseName": name, "valuesObject": helm_values}
    spec: dict[str, Any] = {
        "project": PROJECT,
        "source": source,
        "destination": {"name": CLUSTER_NAME, "namespace": namespace},
        "syncPolicy": {
            "automated": {"prune": prune, "selfHeal": True},
            "syncOptions": list(sync_options),
        },
    }
    if ignore_differences:
        spec["ignoreDifferences"] = ignore_differences
    return {"apiVersion": API, "kind": "Application", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec}  # fmt: skip
