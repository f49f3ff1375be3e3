"""Kubeflow PyTorchJob (kubeflow.org/v1), with or without ``elasticPolicy``."""

from __future__ import annotations

from typing import Any

from llm_operator.convert import common
from llm_operator.convert.pod import convert_pod
from llm_operator.convert.source import ConvertError, Node, Report

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER = "pytorch"
RDZV_BACKENDS = {"c10d": "c10d", "etcd-v3": "etcd-v3", "etcd": "etcd-v3", "etcd-v2": "etcd-v3"}


def _replicas(specs: Node) -> tuple[dict[str, int], dict[str, Any]]:
    counts: dict[str, int] = {}
    templates: dict[str, Any] = {}
    for role in ("Master", "Worker"):
        if not specs.has(role):
            continue
        replica = specs.child(role)
        counts[role] = replica.take_int("replicas") or 1
        templates[role] = replica.take("template")
        replica.drop(
            "restartPolicy", "the operator replaces failed workers itself (spec.failurePolicy); dropped"
        )
        replica.done()
    specs.done()
    if not templates:
        raise ConvertError([f"{specs.path}: needs a Worker (or Master) replica spec"])
    return counts, templates


def _elastic(policy: Node, spec: dict[str, Any]) -> None:
    for source, target in (("minReplicas", "minReplicas"), ("maxReplicas", "maxReplicas")):
        value = policy.take_int(source)
        if value is not None:
            spec[target] = value
    rdzv: dict[str, Any] = {}
    backend = policy.take_str("rdzvBackend")
    if backend is not None:
        if backend not in RDZV_BACKENDS:
            raise ConvertError([f"{policy.at('rdzvBackend')}: must be one of {', '.join(RDZV_BACKENDS)}"])
        rdzv["backend"] = RDZV_BACKENDS[backend]
        if RDZV_BACKENDS[backend] != backend:
            policy.report.warn(
                policy.at("rdzvBackend"), f"{backend}: now etcd-v3 (the operator's etcd v3 plugin)"
            )
    host, port = policy.take_str("rdzvHost"), policy.take_int("rdzvPort")
    if host:
        rdzv["endpoint"] = f"{host}:{port or 2379}"
    elif port is not None:
        policy.report.warn(policy.at("rdzvPort"), "the operator runs the rendezvous server; dropped")
    policy.drop("rdzvId", "the operator uses the job's UID; dropped")
    conf = {}
    for i, item in enumerate(policy.take_list("rdzvConf")):
        if not isinstance(item, dict) or "key" not in item:
            raise ConvertError([f"{policy.at('rdzvConf')}[{i}]: must be a mapping with key and value"])
        conf[str(item["key"])] = item.get("value")
    rdzv.update(common.rdzv_conf(conf, policy.at("rdzvConf"), policy))
    if rdzv:
        spec["rendezvous"] = rdzv
    nproc = policy.take_int("nProcPerNode")
    if nproc is not None:
        spec["nprocPerNode"] = nproc
    restarts = policy.take_int("maxRestarts")
    if restarts is not None:
        spec["failurePolicy"] = {"maxRestarts": restarts}
    policy.drop("standalone", "the operator always runs a rendezvous across nodes; dropped")
    policy.drop("metrics", "no autoscaling on metrics: resize with kubectl scale; dropped")
    policy.done()


def _run_policy(policy: Node, spec: dict[str, Any]) -> None:
    ttl = policy.take_int("ttlSecondsAfterFinished")
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    suspend = policy.take("suspend")
    if suspend is not None:
        spec["suspend"] = bool(suspend)
    scheduling = policy.child("schedulingPolicy")
    priority = scheduling.take_str("priorityClass")
    if priority:
        spec["scheduling"] = {"priorityClassName": priority}
    scheduling.done()
    policy.done()


def convert(doc: dict[str, Any], report: Report) -> dict[str, Any]:
    meta, source = common.open_document(doc, report)
    counts, templates = _replicas(source.child("pytorchReplicaSpecs"))
    role = "Worker" if "Worker" in templates else "Master"
    path = f"spec.pytorchReplicaSpecs.{role}.template"
    spec = convert_pod(templates[role], path, CONTAINER, report)
    if role == "Worker" and "Master" in templates and templates["Master"] != templates["Worker"]:
        report.warn(
            "spec.pytorchReplicaSpecs.Master.template",
            "differs from the Worker's; every worker of an LLMTrainingJob runs the Worker's; dropped",
        )
    total = sum(counts.values())
    spec.update(minReplicas=total, maxReplicas=total)
    nproc = source.take("nprocPerNode")
    if nproc is not None:
        if str(nproc).isdigit():
            spec["nprocPerNode"] = int(str(nproc))
        elif str(nproc) not in ("auto", "gpu"):
            report.warn("spec.nprocPerNode", f"{nproc}: no equivalent (one process per GPU); dropped")
    elastic: dict[str, Any] = {}
    if source.has("elasticPolicy"):
        _elastic(source.child("elasticPolicy"), elastic)
        spec["replicas"] = total
    spec = common.merge(spec, elastic)
    run: dict[str, Any] = {}
    _run_policy(source.child("runPolicy"), run)
    spec = common.merge(spec, run)
    source.done()
    if "replicas" in spec and not spec["minReplicas"] <= spec["replicas"] <= spec["maxReplicas"]:
        spec["replicas"] = min(max(spec["replicas"], spec["minReplicas"]), spec["maxReplicas"])
    common.require_image(spec, f"{path}.spec.containers")
    return common.job(meta, spec)
