"""Helpers shared by the chart, kustomize and manifest tests (fixtures are in conftest.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "elastic-llm-operator"
RELEASE = "ship"
FULLNAME = f"{RELEASE}-elastic-llm-operator"
MONITORING_APIS = ("monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor")


def value_sets(watched: Sequence[str] = ("team-a", "team-b")) -> dict[str, dict[str, Any]]:
    """The defaults and three other configurations every chart test runs against."""
    return {
        "defaults": {},
        "namespaced": {
            "replicaCount": 1,
            "watch": {"allNamespaces": False, "namespaces": list(watched)},
            "logLevel": "debug",
        },
        "monitoring": {
            "metrics": {
                "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
                "trainerPodMonitor": {"enabled": True, "interval": "15s"},
            },
            "grafanaDashboard": {"enabled": True},
        },
        "customized": {
            "fullnameOverride": "llmop",
            "replicaCount": 3,
            "image": {
                "repository": "123456789012.dkr.ecr.us-west-2.amazonaws.com/llm-operator",
                "digest": "sha256:" + "ab" * 32,
            },
            "serviceAccount": {
                "name": "llm-operator-sa",
                "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/llmop"},
            },
            "peering": {"name": "llmop-peering"},
            "rendezvous": {"image": "registry.example.com/etcd:v3.6.16"},
            "defaultNodeSelector": {"node.kubernetes.io/purpose": "system"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
            "podDisruptionBudget": {"enabled": False},
            "metrics": {"service": {"enabled": False}},
            "extraEnv": [{"name": "LLMJOB_DEBUG", "value": "1"}],
            "logLevel": "warning",
        },
    }


VALUE_SET_NAMES = tuple(value_sets())


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


class Helm:
    """The pinned helm binary with its own config/cache folders, optionally pointed at a cluster."""

    def __init__(self, binary: Path, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.env = {
            **os.environ,
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        if kubeconfig is not None:
            self.env["KUBECONFIG"] = str(kubeconfig)
        self.home = home

    def run(self, *args: str, check: bool = True, timeout: float = 180) -> Result:
        proc = subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def values_file(self, values: Mapping[str, Any]) -> Path:
        text = yaml.safe_dump(dict(values), sort_keys=False)
        path = self.home / f"values-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
        path.write_text(text)
        return path

    def template_args(
        self,
        values: Mapping[str, Any],
        *,
        namespace: str = "llm-system",
        api_versions: Sequence[str] = (),
        include_crds: bool = False,
    ) -> list[str]:
        values_path = str(self.values_file(values))
        args = ["template", RELEASE, str(CHART), "--namespace", namespace, "-f", values_path]
        for api in api_versions:
            args += ["--api-versions", api]
        if include_crds:
            args.append("--include-crds")
        return args

    def template(
        self,
        values: Mapping[str, Any],
        *,
        namespace: str = "llm-system",
        api_versions: Sequence[str] = (),
        include_crds: bool = False,
    ) -> list[dict[str, Any]]:
        out = self.run(
            *self.template_args(
                values, namespace=namespace, api_versions=api_versions, include_crds=include_crds
            )
        ).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def kubectl(binary: Path, *args: str, input: str | None = None, check: bool = True) -> Result:
    proc = subprocess.run(
        [str(binary), *args], input=input, capture_output=True, text=True, timeout=180, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return Result(proc.returncode, proc.stdout, proc.stderr)


def yaml_docs(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            yield doc
