"""The RBAC and alert tables of docs/operations.md, read from the chart as ``helm template`` renders it.

RBAC: the rules of every Role and ClusterRole bound to the operator's ServiceAccount, rendered cluster-wide
and namespaced, with the defaults and with each option that adds rules; a rule nobody wrote a reason for in
:data:`WHY` is an error, so a new grant cannot reach the table, or the chart, unexplained. Alerts: every
alert of the rendered PrometheusRule with its values key, thresholds (values.yaml), severity, ``for``, the
scrape it needs (from the metrics its expression reads) and its description.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llm_testbed.localcluster.tools import ensure

RELEASE = "elastic-llm-operator"
NAMESPACE = "elastic-llm-operator"
OPTIONS: dict[str, dict[str, Any]] = {
    "": {},
    "`rbac.podGroups: true`": {"rbac": {"podGroups": True}},
    "`nodeHealth.markNodes: true`": {"nodeHealth": {"markNodes": True}},
    "Kueue on (`kueue.enabled`)": {"kueue": {"enabled": "true"}},
}
"""Values that add rules, by how the table names them ("": the defaults)."""
NAMESPACED: dict[str, Any] = {"watch": {"allNamespaces": False, "namespaces": ["team-a"]}}
VERB_ORDER = ("get", "list", "watch", "create", "patch", "update", "delete")
WHY: dict[tuple[str, str, str], str] = {
    ("elasticllm.dev", "llmtrainingjobs", ""): "follow every job (one list + watch stream; get to re-read "
    "one); patch: kopf keeps its finalizer and handler progress in the job's metadata",
    ("elasticllm.dev", "llmtrainingjobs/status", ""): "the operator writes status once per reconcile pass, "
    "through the status subresource",
    ("elasticllm.dev", "llmtrainingruntimes", ""): "read a job's namespaced runtime (`spec.runtimeRef`); "
    "runtimes belong to their authors: no write",
    (
        "elasticllm.dev",
        "clusterllmtrainingruntimes",
        "",
    ): "read a job's cluster runtime; cluster-scoped, so a ClusterRole also in namespaced mode",
    (
        "",
        "pods",
        "",
    ): "observe the workers it owns (an index of pods by job); create a worker per node, delete "
    "failed, superseded or surplus ones. Workers are replaced, never edited: no update or patch",
    ("", "services", ""): "the headless `<job>-workers` Service and the rendezvous Service `<job>-rdzv`",
    ("apps", "deployments", ""): "the one-replica etcd rendezvous server `<job>-rdzv` of jobs without an "
    "external endpoint",
    ("networking.k8s.io", "networkpolicies", ""): "the NetworkPolicy `<job>-rdzv` that fences the managed "
    "rendezvous server; garbage-collected through its owner reference",
    ("", "events", ""): "Events on jobs (create; patch bumps the count of a repeated Event); list: the "
    "`FailedScheduling` Events of Pending workers (capacity, Karpenter's reasons), one read per namespace "
    "every 5 s at most",
    ("events.k8s.io", "events", ""): "Events on jobs through the events.k8s.io API (kopf's client)",
    ("", "nodes", ""): "notice lost, cordoned or returning nodes and the capacity left for workers",
    ("", "nodes", "`nodeHealth.markNodes: true`"): "label and taint a node a worker or a platform condition "
    "found unhealthy",
    (
        "kopf.dev",
        "clusterkopfpeerings",
        "",
    ): "keep-alives between the operator replicas; no create: the chart makes the object",
    ("kopf.dev", "kopfpeerings", ""): "the same per watched namespace",
    ("scheduling.x-k8s.io", "podgroups", "`rbac.podGroups: true`"): "the PodGroup of jobs with "
    "`spec.scheduling.gangScheduling` (scheduler-plugins coscheduling); garbage-collected through its owner",
    ("kueue.x-k8s.io", "workloads", "Kueue on (`kueue.enabled`)"): "the Workload of a job labelled "
    "`kueue.x-k8s.io/queue-name` (docs/kueue.md): create it, follow its admission, patch its podSets",
    ("kueue.x-k8s.io", "workloads/status", "Kueue on (`kueue.enabled`)"): "hand an evicted Workload back to "
    "Kueue's queue; mark a finished one Finished, so Kueue releases its quota",
    ("kueue.x-k8s.io", "resourceflavors", "Kueue on (`kueue.enabled`)"): "the node labels and tolerations "
    "of the flavor a Workload was admitted to",
    ("scheduling.k8s.io", "priorityclasses", "Kueue on (`kueue.enabled`)"): "the priority a Workload carries "
    "(the job's `priorityClassName`)",
}
"""(API group, resource, option) -> why the operator holds those verbs."""


def render(values: Mapping[str, Any], chart: Path, api_versions: Sequence[str] = ()) -> list[dict[str, Any]]:
    """``helm template`` of ``chart`` with ``values``, as objects (the pinned helm; a throwaway home)."""
    helm = ensure(["helm"])["helm"]
    with tempfile.TemporaryDirectory(prefix="doctables-") as home:
        values_file = Path(home) / "values.yaml"
        values_file.write_text(yaml.safe_dump(dict(values)))
        argv = [str(helm), "template", RELEASE, str(chart), "-n", NAMESPACE, "-f", str(values_file)]
        for api in api_versions:
            argv += ["--api-versions", api]
        env = {
            **os.environ,
            **{f"HELM_{k}_HOME": str(Path(home) / k.lower()) for k in ("CONFIG", "CACHE", "DATA")},
        }
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed ({done.returncode}): {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


Grants = dict[tuple[str, str], tuple[str, frozenset[str]]]


def operator_grants(objects: Iterable[dict[str, Any]]) -> Grants:
    """(group, resource) -> (kind of role, verbs) of the roles bound to the operator's ServiceAccount."""
    objects = list(objects)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    bound = {
        (b["roleRef"]["kind"], b["roleRef"]["name"])
        for b in objects
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding") and subject in b.get("subjects", [])
    }
    out: dict[tuple[str, str], tuple[str, set[str]]] = {}
    for role in objects:
        if (role["kind"], role["metadata"].get("name")) not in bound:
            continue
        for rule in role.get("rules", []):
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out.setdefault((group, resource), (role["kind"], set()))[1].update(rule["verbs"])
    return {key: (kind, frozenset(verbs)) for key, (kind, verbs) in out.items()}


def _verbs(verbs: Iterable[str]) -> str:
    return ", ".join(sorted(verbs, key=lambda v: (VERB_ORDER.index(v) if v in VERB_ORDER else 99, v)))


@dataclass(frozen=True)
class Row:
    group: str
    resource: str
    verbs: frozenset[str]
    option: str
    cluster_wide: str
    namespaced: str


def rbac_rows(chart: Path) -> list[Row]:
    """One row per (group, resource, option that adds verbs), in the chart's order."""
    modes = {
        (mode, option): operator_grants(render({**base, **values}, chart))
        for mode, base in (("cluster", {}), ("namespaced", NAMESPACED))
        for option, values in OPTIONS.items()
    }
    rows: list[Row] = []
    keys = list(dict.fromkeys(k for grants in modes.values() for k in grants))
    for key in keys:
        before: frozenset[str] = frozenset()
        for option in OPTIONS:
            cluster, namespaced = modes[("cluster", option)].get(key), modes[("namespaced", option)].get(key)
            verbs = (cluster or namespaced or ("", frozenset()))[1]
            added = verbs - before
            if not added:
                continue
            before = verbs
            where = {"Role": "Role in each watched namespace", "ClusterRole": "ClusterRole `<release>-nodes`"}
            rows.append(
                Row(
                    key[0],
                    key[1],
                    added,
                    option,
                    "ClusterRole" if cluster else "not granted",
                    where[namespaced[0]] if namespaced else "not granted",
                )
            )
    return rows


def rbac_table(chart: Path, rbac: list[Row] | None = None) -> str:
    """The Markdown table of :func:`rbac_rows` (given, or rendered from ``chart``)."""
    rows = [
        "| API group | resource | verbs | when | cluster-wide mode | namespaced mode | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rbac if rbac is not None else rbac_rows(chart):
        why = WHY.get((row.group, row.resource, row.option))
        if why is None:
            raise KeyError(
                f"the chart grants the operator {_verbs(row.verbs)} on {row.group or 'core'}/{row.resource}"
                f" ({row.option or 'by default'}), and doctables.chart.WHY does not say why: add it there"
            )
        rows.append(
            f"| `{row.group or 'core'}` | `{row.resource}` | {_verbs(row.verbs)} | {row.option or 'always'} |"
            f" {row.cluster_wide} | {row.namespaced} | {why} |"
        )
    return "\n".join(rows) + "\n"


OPERATOR_SCRAPE = "operator ServiceMonitor (or `operatorSelector`)"
TRAINER_SCRAPE = "trainer PodMonitor"
MONITOR_APIS = ("monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor")
ALERT_VALUES: dict[str, Any] = {
    "prometheusRule": {"enabled": True},
    "metrics": {"serviceMonitor": {"enabled": True}, "trainerPodMonitor": {"enabled": True}},
}
"""Every alert on, with the scrapes they need."""


def needs(expr: str) -> set[str]:
    """The scrapes an alert expression reads from: the worker's ``llm_trainer_*`` series come from the
    trainer PodMonitor, the operator's ``llmjob_*`` series and its ``up`` from the operator's scrape."""
    out = set()
    if "llm_trainer_" in expr:
        out.add(TRAINER_SCRAPE)
    if re.search(r"\bllmjob_|\bup\{", expr):
        out.add(OPERATOR_SCRAPE)
    return out


def alert_key(alert: str, keys: Iterable[str]) -> str:
    """The ``prometheusRule.alerts`` key of an alert: ``LLMJob`` + the key with its first letter raised."""
    for key in keys:
        if alert == "LLMJob" + key[0].upper() + key[1:]:
            return key
    raise KeyError(f"alert {alert}: no prometheusRule.alerts key names it (LLMJob<Key>)")


def rendered_alerts(chart: Path) -> list[dict[str, Any]]:
    """Every rule of the PrometheusRule with every alert on."""
    objects = render(ALERT_VALUES, chart, MONITOR_APIS)
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    return [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]


def _plain(text: str) -> str:
    """A description without Prometheus templating: ``{{ $value }}`` reads N, ``{{ $labels.x }}`` <x>."""
    text = re.sub(r"\{\{\s*\$value[^}]*\}\}", "N", text)
    text = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", r"<\1>", text)
    return text.replace("|", "\\|")


def alerts_table(chart: Path) -> str:
    defaults = yaml.safe_load((chart / "values.yaml").read_text())["prometheusRule"]["alerts"]
    rows = [
        "| alert | `prometheusRule.alerts.` | thresholds | for | severity | needs | its description |",
        "|---|---|---|---|---|---|---|",
    ]
    for rule in rendered_alerts(chart):
        key = alert_key(rule["alert"], defaults)
        settings = defaults[key]
        thresholds = ", ".join(
            f"`{k}: {v}`" for k, v in settings.items() if k not in ("enabled", "severity", "for")
        )
        scrapes = " and ".join(sorted(needs(rule["expr"]))) or "nothing scraped"
        rows.append(
            f"| `{rule['alert']}` | `{key}` | {thresholds or '-'} | {rule.get('for', '0s')} |"
            f" {rule['labels']['severity']} | {scrapes} | {_plain(rule['annotations']['description'])} |"
        )
    return "\n".join(rows) + "\n"
