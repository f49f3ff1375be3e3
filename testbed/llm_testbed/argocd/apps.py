"""Applications as the test bed reads them: sync status, health, the health of one resource.

Everything here is what Argo CD itself wrote into the Application's status (``status.sync``,
``status.health``, ``status.resources``), read through the API server: the same fields ``argocd app get``
shows, with no Argo CD API server in between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_testbed.argocd.manifests import NAMESPACE
from llm_testbed.localcluster.kubectl import Kubectl

REFRESH = "argocd.argoproj.io/refresh"


@dataclass(frozen=True)
class AppState:
    """One reading of an Application's status."""

    sync: str  # Synced | OutOfSync | Unknown | "" (not compared yet)
    health: str  # Healthy | Progressing | Degraded | Suspended | Missing | Unknown | ""
    revision: str  # the git commit it compared against
    operation: str  # the phase of the last sync operation (Succeeded, Running, Failed...) or ""
    message: str  # the last sync operation's message, or the first condition's
    reconciled: str = ""  # status.reconciledAt: when the controller last compared it with git

    @property
    def synced_healthy(self) -> bool:
        return self.sync == "Synced" and self.health == "Healthy"


def get(kube: Kubectl, name: str) -> dict[str, Any] | None:
    return kube.get("applications.argoproj.io", name, NAMESPACE)


def state(app: dict[str, Any] | None) -> AppState:
    """The state of an Application object (pure; an absent one reads as all empty)."""
    status = (app or {}).get("status") or {}
    sync = status.get("sync") or {}
    operation = status.get("operationState") or {}
    conditions = status.get("conditions") or []
    message = operation.get("message") or (conditions[0].get("message", "") if conditions else "")
    return AppState(
        sync=str(sync.get("status", "")),
        health=str((status.get("health") or {}).get("status", "")),
        revision=str(sync.get("revision", "")),
        operation=str(operation.get("phase", "")),
        message=str(message),
        reconciled=str(status.get("reconciledAt", "")),
    )


def resource(app: dict[str, Any] | None, kind: str, name: str) -> dict[str, Any]:
    """The entry of ``status.resources`` for one managed object ({} when Argo CD lists none)."""
    for entry in ((app or {}).get("status") or {}).get("resources") or []:
        if entry.get("kind") == kind and entry.get("name") == name:
            found: dict[str, Any] = entry
            return found
    return {}


def resource_health(app: dict[str, Any] | None, kind: str, name: str) -> tuple[str, str]:
    """(status, message) of the health Argo CD computed for one managed object; ("", "") when none."""
    health = resource(app, kind, name).get("health") or {}
    return str(health.get("status", "")), str(health.get("message", ""))


def refresh(kube: Kubectl, name: str) -> None:
    """Ask the controller to compare the Application with git again now (what `argocd app get --refresh`
    does): after a commit, rather than waiting for the reconciliation period."""
    kube.run(
        "annotate", "applications.argoproj.io", name, "-n", NAMESPACE, f"{REFRESH}=normal", "--overwrite"
    )
