"""Kubeflow Trainer TrainJob (trainer.kubeflow.org/v1alpha1) with its ClusterTrainingRuntime or
TrainingRuntime from the same file.

Kubeflow's order is kept: the TrainJob's trainer fields > podTemplateOverrides[n] > ... > [0] > the
runtime's pod template. The result is one pod template, converted like any source's.
"""

from __future__ import annotations

import copy
from typing import Any

from llm_operator.convert import common
from llm_operator.convert.pod import convert_pod
from llm_operator.convert.source import ConvertError, Node, Report

API_GROUP = "trainer.kubeflow.org"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "TrainJob"
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
NODE_JOBS = ("node", "trainer-node")
"""Names of the runtime's replicated job that runs the trainer (Kubeflow's built-in runtimes)."""
ANCESTOR_LABEL = f"{API_GROUP}/trainjob-ancestor-step"
TRAINER = "node"
"""The training container's name in Kubeflow's runtimes."""


def _by_name(items: list[Any], more: list[Any]) -> list[Any]:
    named = {i.get("name"): i for i in more if isinstance(i, dict)}
    out = [named.pop(i.get("name"), i) if isinstance(i, dict) else i for i in items]
    return out + list(named.values())


def _override_container(
    containers: list[dict[str, Any]], change: dict[str, Any], path: str, report: Report
) -> None:
    for container in containers:
        if container.get("name") == change.get("name"):
            if change.get("env"):
                container["env"] = _by_name(container.get("env") or [], change["env"])
            if change.get("volumeMounts"):
                container["volumeMounts"] = _by_name(
                    container.get("volumeMounts") or [], change["volumeMounts"]
                )
            return
    report.warn(f"{path} ({change.get('name')})", "names no container of the runtime's pod; dropped")


def _override(pod: dict[str, Any], override: Node) -> None:
    """One podTemplateOverrides item applied to the pod template (in place)."""
    meta = override.child("metadata")
    for key in ("labels", "annotations"):
        value = meta.take_map(key)
        if value:
            pod.setdefault("metadata", {}).setdefault(key, {}).update(value)
    meta.done()
    spec_node = override.child("spec") if override.has("spec") else override  # podSpecOverrides: flat
    spec = pod.setdefault("spec", {})
    for key in ("serviceAccountName", "affinity"):
        value = spec_node.take(key)
        if value is not None:
            spec[key] = value
    selector = spec_node.take_map("nodeSelector")
    if selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **selector}
    spec["tolerations"] = [*(spec.get("tolerations") or []), *spec_node.take_list("tolerations")]
    for key in ("volumes", "imagePullSecrets"):
        spec[key] = _by_name(spec.get(key) or [], spec_node.take_list(key))
    for key in ("containers", "initContainers"):
        for i, change in enumerate(spec_node.take_list(key)):
            if not isinstance(change, dict):
                raise ConvertError([f"{spec_node.at(key)}[{i}]: must be a mapping"])
            _override_container(
                spec.setdefault(key, []), change, f"{spec_node.at(key)}[{i}]", override.report
            )
    if spec_node is not override:
        spec_node.done()
    override.done()


def _find_runtime(ref: Node, documents: list[Any]) -> tuple[str, str, dict[str, Any] | None]:
    name = ref.take_str("name")
    if not name:
        raise ConvertError([f"{ref.at('name')}: required"])
    kind = ref.take_str("kind") or "ClusterTrainingRuntime"
    ref.ignore("apiGroup")
    ref.done()
    for doc in documents:
        if (
            isinstance(doc, dict)
            and doc.get("kind") == kind
            and (doc.get("metadata") or {}).get("name") == name
        ):
            return kind, name, doc
    return kind, name, None


def _runtime_pod(doc: dict[str, Any], where: str, report: Report) -> tuple[Any, dict[str, Any], str]:
    """(the node job's pod template, what the runtime's mlPolicy gives, its path)."""
    root = Node(doc, where, report)
    root.ignore("apiVersion", "kind", "metadata", "status")
    spec = root.child("spec")
    root.done()
    given: dict[str, Any] = {}
    policy = spec.child("mlPolicy")
    nodes = policy.take_int("numNodes")
    if nodes is not None:
        given["numNodes"] = nodes
    torch = policy.child("torch")
    nproc = torch.take("numProcPerNode")
    if nproc is not None:
        given["numProcPerNode"] = nproc
    torch.done()
    policy.done()
    template = spec.child("template")
    jobset = template.child("spec")
    template.done()
    jobs = jobset.take_list("replicatedJobs")
    jobset.done()
    spec.done()
    index = _node_job(jobs, f"{jobset.path}.replicatedJobs")
    out: Any = None
    for i, item in enumerate(jobs):
        path = f"{jobset.path}.replicatedJobs[{i}]"
        if i != index:
            report.warn(f"{path} ({item.get('name')})", "a step other than the trainer's; dropped")
            continue
        replicated = Node(item, path, report)
        replicated.ignore("name", "replicas")
        job_template = replicated.child("template")
        job_template.ignore("metadata")
        job_spec = job_template.child("spec")
        out = job_spec.take("template")
        job_spec.done()
        job_template.done()
        replicated.done()
    return out, given, f"{jobset.path}.replicatedJobs[{index}].template.spec.template"


def _node_job(jobs: list[Any], path: str) -> int:
    for i, item in enumerate(jobs):
        if isinstance(item, dict) and item.get("name") in NODE_JOBS:
            return i
    for i, item in enumerate(jobs):
        labels = ((item.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(ANCESTOR_LABEL) == "trainer":
            return i
    if len(jobs) == 1:
        return 0
    raise ConvertError([f"{path}: no replicated job named {' or '.join(NODE_JOBS)} (the trainer's)"])


def _trainer(trainer: Node, pod: dict[str, Any], container: str) -> dict[str, Any]:
    """The TrainJob's trainer fields over the training container; returns numNodes/numProcPerNode."""
    spec = pod.setdefault("spec", {})
    containers = spec.setdefault("containers", [])
    target = next((c for c in containers if c.get("name") == container), None)
    if target is None:
        target = {"name": container}
        containers.insert(0, target)
    for key in ("image", "command", "args"):
        value = trainer.take(key)
        if value is not None:
            target[key] = value
    env = trainer.take_list("env")
    if env:
        target["env"] = _by_name(target.get("env") or [], env)
    resources = trainer.take_map("resourcesPerNode")
    if resources:
        target["resources"] = resources
    given = {}
    for key in ("numNodes", "numProcPerNode"):
        value = trainer.take(key)
        if value is not None:
            given[key] = value
    trainer.done()
    return given


def convert(doc: dict[str, Any], report: Report, documents: list[Any]) -> dict[str, Any]:
    meta, source = common.open_document(doc, report)
    kind, name, runtime = _find_runtime(source.child("runtimeRef"), documents)
    given: dict[str, Any] = {}
    if runtime is not None:
        template, given, path = _runtime_pod(runtime, f"{kind} {name}: spec", report)
        pod = copy.deepcopy(template) if isinstance(template, dict) else {}
    else:
        pod, path = {}, "spec.trainer"
        report.warn(
            "spec.runtimeRef",
            f"{kind} {name} is not in the file: only the TrainJob's own fields are converted (give the"
            " runtime in the same file to carry its pod template over)",
        )
    pod_spec = pod.get("spec") or {}
    names = [str(c.get("name")) for c in pod_spec.get("containers") or [] if isinstance(c, dict)]
    container = TRAINER if TRAINER in names or not names else names[0]
    overrides_key = "podTemplateOverrides" if source.has("podTemplateOverrides") else "podSpecOverrides"
    for i, item in enumerate(source.take_list(overrides_key)):
        item_node = Node(item, f"spec.{overrides_key}[{i}]", report)
        targets = [t.get("name") for t in item_node.take_list("targetJobs") if isinstance(t, dict)]
        if targets and not set(targets) & set(NODE_JOBS):
            item_node.report.warn(
                item_node.path, f"targets {', '.join(map(str, targets))}, not the trainer; dropped"
            )
            continue
        _override(pod, item_node)
    given.update(_trainer(source.child("trainer"), pod, container))
    spec = convert_pod(pod, path, container, report)
    nodes = given.get("numNodes", 1)
    spec.update(minReplicas=int(nodes), maxReplicas=int(nodes))
    nproc = given.get("numProcPerNode")
    if nproc is not None and str(nproc).isdigit():
        spec["nprocPerNode"] = int(str(nproc))
    elif nproc is not None and str(nproc) not in ("auto", "gpu"):
        report.warn("spec.trainer.numProcPerNode", f"{nproc}: no equivalent (one process per GPU); dropped")
    suspend = source.take("suspend")
    if suspend is not None:
        spec["suspend"] = bool(suspend)
    source.done()
    common.require_image(spec, "spec.trainer.image")
    return common.job(meta, spec)
