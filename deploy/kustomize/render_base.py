"""Generate the kustomize base and the overlays' RBAC from the Helm chart, so no object is written twice.

The chart is the source. This script runs `helm template` twice (cluster-wide, and namespaced for the
example namespace) and splits what comes out:
  base/generated.yaml                      CRDs, ServiceAccount, Deployment, metrics Service, PDB
  overlays/cluster-wide/generated.yaml     ClusterRole(+Binding) and ClusterKopfPeering
  overlays/namespaced/generated.yaml       the nodes ClusterRole(+Binding), Role(+Binding) and KopfPeering
                                           in each watched namespace
The watch scope flag (--all-namespaces / --namespace X) is removed from the base Deployment; each overlay
adds its own with a patch. Helm's own labels are replaced by `app.kubernetes.io/managed-by: kustomize`.
Run it after changing the chart or the CRDs:  python deploy/kustomize/render_base.py
tests/chart/test_kustomize.py fails when the committed files differ from what it writes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHART = ROOT / "charts" / "elastic-llm-operator"
RELEASE = "elastic-llm-operator"
NAMESPACE = "elastic-llm-operator"
# The namespaced overlay's example: the namespace the example jobs in deploy/examples/ use.
EXAMPLE_NAMESPACES = ("ml-training",)
RBAC_KINDS = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ClusterKopfPeering", "KopfPeering"}
SCOPE_FLAGS = {"--all-namespaces"}
HEADER = (
    "# Generated from charts/elastic-llm-operator by deploy/kustomize/render_base.py: do not edit.\n"
    "# Change the chart (or the CRDs) and run the script again.\n"
)


def _helm_binary() -> str:
    explicit = os.environ.get("HELM")
    if explicit:
        return explicit
    found = shutil.which("helm")
    if found:
        return found
    from llm_testbed.localcluster.tools import ensure  # the pinned, locally built helm

    return str(ensure(["helm"])["helm"])


def helm_template(helm: str, values: Iterable[str]) -> list[dict[str, Any]]:
    argv = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    for value in values:
        argv += ["--set", value]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _relabel(obj: dict[str, Any]) -> dict[str, Any]:
    labels = obj.get("metadata", {}).get("labels")
    if labels is not None:
        labels.pop("helm.sh/chart", None)
        if labels.get("app.kubernetes.io/managed-by") == "Helm":
            labels["app.kubernetes.io/managed-by"] = "kustomize"
    return obj


def _without_scope_flags(deployment: dict[str, Any]) -> dict[str, Any]:
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        args: list[str] = container.get("args", [])
        container["args"] = [a for a in args if a not in SCOPE_FLAGS]
    return deployment


def _dump(objects: list[dict[str, Any]]) -> str:
    body = "---\n".join(yaml.safe_dump(o, sort_keys=False, width=120) for o in objects)
    return HEADER + "---\n" + body


def render(helm: str) -> dict[str, str]:
    """Path relative to deploy/kustomize -> content, for every generated file."""
    cluster_wide = [_relabel(o) for o in helm_template(helm, ["watch.allNamespaces=true"])]
    ns_values = [
        "watch.allNamespaces=false",
        "watch.namespaces={" + ",".join(EXAMPLE_NAMESPACES) + "}",
    ]
    namespaced = [_relabel(o) for o in helm_template(helm, ns_values)]
    base = [
        _without_scope_flags(o) if o["kind"] == "Deployment" else o
        for o in cluster_wide
        if o["kind"] not in RBAC_KINDS
    ]
    return {
        "base/generated.yaml": _dump(base),
        "overlays/cluster-wide/generated.yaml": _dump([o for o in cluster_wide if o["kind"] in RBAC_KINDS]),
        "overlays/namespaced/generated.yaml": _dump([o for o in namespaced if o["kind"] in RBAC_KINDS]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--helm", help="helm binary (default: $HELM, PATH, or the pinned local build)")
    args = parser.parse_args(argv)
    helm = args.helm or _helm_binary()
    for relative, content in render(helm).items():
        target = HERE / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
