"""Write the argocd-cm snippets that carry deploy/argocd/health.lua.

health.lua is the only copy of the health check. This script embeds it, unchanged, in
  - argocd-cm-health-patch.yaml: a merge patch for the argocd-cm ConfigMap
    (`kubectl -n argocd patch configmap argocd-cm --type merge --patch-file ...`, or a kustomize patch);
  - argo-cd-helm-values.yaml: the same key under `configs.cm` for the argo-cd Helm chart.
Run it after editing health.lua: `python deploy/argocd/render_health_config.py`.
tests/unit/test_argocd_health.py fails when the committed snippets differ from what it writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LUA = HERE / "health.lua"
CM_KEY = "resource.customizations.health.elasticllm.dev_LLMTrainingJob"
HEADER = "# Generated from deploy/argocd/health.lua by deploy/argocd/render_health_config.py: do not edit.\n"


def _block(text: str, indent: int) -> str:
    """The Lua as a YAML literal block at the given indent (blank lines stay empty)."""
    pad = " " * indent
    return "".join(pad + line if line.strip() else "\n" for line in text.splitlines(keepends=True))


def render(lua: str) -> dict[str, str]:
    """File name -> content of every generated snippet."""
    if not lua.endswith("\n"):
        lua += "\n"
    patch = (
        HEADER
        + "# Apply: kubectl -n argocd patch configmap argocd-cm --type merge"
        + " --patch-file deploy/argocd/argocd-cm-health-patch.yaml\n"
        + "apiVersion: v1\n"
        + "kind: ConfigMap\n"
        + "metadata:\n"
        + "  name: argocd-cm\n"
        + "  namespace: argocd\n"
        + "data:\n"
        + f"  {CM_KEY}: |\n"
        + _block(lua, 4)
    )
    helm_values = (
        HEADER
        + "# Merge into the values of the argo-cd Helm chart:"
        + " helm upgrade argocd argo/argo-cd -f <this file>.\n"
        + "configs:\n"
        + "  cm:\n"
        + f"    {CM_KEY}: |\n"
        + _block(lua, 6)
    )
    return {"argocd-cm-health-patch.yaml": patch, "argo-cd-helm-values.yaml": helm_values}


def main() -> int:
    for name, content in render(LUA.read_text()).items():
        (HERE / name).write_text(content)
        print(f"wrote {HERE / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
