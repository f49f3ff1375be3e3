"""A source's pod template (core/v1 PodTemplateSpec) as LLMTrainingJob fields and ``spec.podTemplate``.

Shared by every source kind. What the job's spec has a field for goes there (image, command, env,
resources, GPUs and EFA, /dev/shm, placement, grace period); the rest of the pod's settings go into
``spec.podTemplate`` (labels, annotations, ServiceAccount, pull secrets, volumes, init containers,
sidecars as native sidecars, mounts and envFrom of the trainer); what has neither is a warning.
"""

from __future__ import annotations

from typing import Any

from llm_operator.api.models import PodTemplateSpec
from llm_operator.api.rules import (
    OPERATOR_ANNOTATION_PREFIXES,
    OPERATOR_LABEL_PREFIXES,
    OPERATOR_LABELS,
    OPERATOR_VOLUMES,
    SHM_PATH,
    TERMINATION_MESSAGE_PATH,
    TRAINER_CONTAINER,
    reserved_env,
)
from llm_operator.builders.pod_template import POD_FIELDS as TEMPLATE_POD_FIELDS
from llm_operator.builders.worker import EFA_RESOURCE, GPU_RESOURCE
from llm_operator.convert import launcher
from llm_operator.convert.source import ConvertError, Node, Report

OPERATOR_SETS = "set by the operator from the job's spec; dropped"
POD_FIELDS = tuple(f for f in TEMPLATE_POD_FIELDS if f != "serviceAccountName")
"""The pod template's own fields a source pod carries as they are (the account is read apart: a source
may spell it ``serviceAccount``)."""
SCHEDULING_FIELDS = ("nodeSelector", "tolerations", "affinity", "priorityClassName", "schedulerName")
RESOURCES = {"cpu": "cpu", "memory": "memory", "ephemeral-storage": "ephemeralStorage"}


def _owned_key(key: str, prefixes: tuple[str, ...], names: tuple[str, ...] = ()) -> bool:
    return key.startswith(prefixes) or key in names


def _metadata(node: Node, into: dict[str, Any]) -> None:
    node.ignore("creationTimestamp")
    for key, prefixes, names in (
        ("labels", OPERATOR_LABEL_PREFIXES, OPERATOR_LABELS),
        ("annotations", OPERATOR_ANNOTATION_PREFIXES, ()),
    ):
        kept = {}
        for name, value in node.take_map(key).items():
            if _owned_key(str(name), prefixes, names):
                node.report.warn(f"{node.at(key)}.{name}", "a key the operator owns; dropped")
            else:
                kept[str(name)] = str(value)
        if kept:
            into[key] = kept
    node.done()


def _quantity(value: Any) -> int | str:
    return value if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _count(value: Any, path: str) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise ConvertError([f"{path}: must be a whole number of devices, got {value!r}"]) from None


def resources(node: Node, spec: dict[str, Any]) -> None:
    """core/v1 ResourceRequirements of the trainer (or a TrainJob's resourcesPerNode) into ``spec``."""
    limits = node.take_map("limits")
    requests = node.take_map("requests")
    res: dict[str, Any] = {}
    spec["gpusPerNode"] = 0
    for name in sorted({*limits, *requests}):
        value = limits.get(name, requests.get(name))
        where = node.at("limits" if name in limits else "requests") + f".{name}"
        if name in limits and name in requests and str(limits[name]) != str(requests[name]):
            node.report.warn(
                node.at("requests") + f".{name}",
                f"differs from the limit ({limits[name]}); the operator uses one value as request and limit",
            )
        if name == GPU_RESOURCE:
            spec["gpusPerNode"] = _count(value, where)
        elif name == EFA_RESOURCE:
            spec["efaPerNode"] = _count(value, where)
        elif name in RESOURCES:
            res[RESOURCES[name]] = _quantity(value)
        else:
            node.report.warn(where, "a resource the job cannot request; dropped")
    if res:
        spec["resources"] = res
    node.done()


def _env(items: list[Any], path: str, report: Report) -> list[dict[str, Any]]:
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not item.get("name"):
            raise ConvertError([f"{path}[{i}]: must be a mapping with a name"])
        name = str(item["name"])
        if reserved_env(name):
            report.warn(f"{path}[{i}] ({name})", OPERATOR_SETS)
            continue
        out.append({k: item[k] for k in ("name", "value", "valueFrom") if k in item})
    return out


def program(argv: list[str], path: str, spec: dict[str, Any], report: Report, assume: bool = False) -> None:
    """A source's command + args into spec.command and spec.args, without a launcher."""
    if launcher.is_shell(argv):
        spec["command"] = argv
        report.warn(
            path,
            "a shell command: kept as spec.command, which the operator runs under torchrun; make sure it"
            " does not start torchrun itself",
        )
        return
    found = launcher.split(argv, assume_launcher=assume)
    for option in found.dropped:
        report.warn(f"{path} ({found.launcher} {option})", OPERATOR_SETS)
    if found.nproc is not None:
        if found.nproc.isdigit():
            spec["nprocPerNode"] = int(found.nproc)
        elif found.nproc not in ("gpu", "auto"):
            report.warn(f"{path} (--nproc-per-node={found.nproc})", "no equivalent: one process per GPU")
    if found.argv:
        # The program stays in command (python -m module, python script.py), its arguments in args.
        cut = 3 if found.argv[:2] == ["python", "-m"] else 2 if found.argv[0] in ("python", "python3") else 1
        spec["command"], spec["args"] = found.argv[:cut], found.argv[cut:]


def _trainer(
    node: Node, spec: dict[str, Any], entry: dict[str, Any], entrypoint_launcher: bool
) -> list[dict[str, Any]]:
    """The training container; returns its volumeMounts (placed once the volumes are known).

    ``entrypoint_launcher``: the image's entrypoint is the launcher, so args alone are its options."""
    node.take("name")
    image = node.take_str("image")
    if image:
        spec["image"] = image
    policy = node.take_str("imagePullPolicy")
    if policy:
        spec["imagePullPolicy"] = policy
    argv = [str(a) for a in node.take_list("command")]
    args = [str(a) for a in node.take_list("args")]
    if argv or (args and entrypoint_launcher):
        assume = entrypoint_launcher and not argv
        program([*argv, *args], node.at("command" if argv else "args"), spec, node.report, assume)
    else:
        if args:
            spec["args"] = args
        node.report.warn(
            node.at("command"),
            "not set: the image's entrypoint cannot run under the operator's torchrun; spec.command keeps"
            " its default (python -m llm_trainer): set it to the training program",
        )
    env = _env(node.take_list("env"), node.at("env"), node.report)
    if env:
        spec["env"] = env
    env_from = node.take_list("envFrom")
    if env_from:
        entry["envFrom"] = env_from
    resources(node.child("resources"), spec)
    node.drop("ports", "the operator sets the worker's ports (metrics 9400+, rendezvous); dropped")
    context = node.child("securityContext")
    caps = context.child("capabilities")
    add = [c for c in caps.take_list("add") if c != "IPC_LOCK"]
    if add:
        caps.report.warn(
            f"{caps.at('add')} ({', '.join(map(str, add))})",
            "no equivalent (the operator adds IPC_LOCK with efaPerNode); dropped",
        )
    caps.done()
    context.done()
    mounts = node.take_list("volumeMounts")
    node.done()
    return mounts


def _shm_volume(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> str | None:
    """Name of the memory-backed emptyDir mounted at /dev/shm, if any."""
    at_shm = {m.get("name") for m in mounts if m.get("mountPath") == SHM_PATH}
    for volume in volumes:
        empty = volume.get("emptyDir")
        if volume.get("name") in at_shm and isinstance(empty, dict) and empty.get("medium") == "Memory":
            return str(volume["name"])
    return None


def _volumes(
    node: Node, mounts: list[dict[str, Any]], spec: dict[str, Any], template: dict[str, Any]
) -> list[dict[str, Any]]:
    """Volumes into the pod template (the /dev/shm one into spec.sharedMemory); returns the trainer's
    mounts that remain, renamed where a volume had a name the operator owns."""
    path = node.at("volumes")
    volumes = node.take_list("volumes")
    for i, volume in enumerate(volumes):
        if not isinstance(volume, dict) or not volume.get("name"):
            raise ConvertError([f"{path}[{i}]: must be a mapping with a name"])
    shm = _shm_volume(volumes, mounts)
    renamed: dict[str, str] = {}
    kept = []
    for volume in volumes:
        name = str(volume["name"])
        if name == shm:
            limit = volume["emptyDir"].get("sizeLimit")
            if limit is not None:
                spec["sharedMemory"] = _quantity(limit)
            continue
        if name in OPERATOR_VOLUMES:
            renamed[name] = f"user-{name}"
            node.report.warn(f"{path} ({name})", f"a name the operator owns; renamed {renamed[name]}")
            volume = {**volume, "name": renamed[name]}
        kept.append(volume)
    if kept:
        template["volumes"] = kept
    remaining = []
    for mount in mounts:
        if mount.get("name") == shm and mount.get("mountPath") == SHM_PATH:
            continue
        if mount.get("mountPath") == TERMINATION_MESSAGE_PATH:
            node.report.warn(
                f"{path} (mount at {TERMINATION_MESSAGE_PATH})", "owned by the operator; dropped"
            )
            continue
        name = str(mount.get("name"))
        remaining.append({**mount, "name": renamed.get(name, name)})
    return remaining


def _containers(node: Node, trainer_name: str) -> tuple[Node, list[tuple[int, dict[str, Any]]]]:
    path = node.at("containers")
    containers = node.take_list("containers")
    if not containers:
        raise ConvertError([f"{path}: required (the training container)"])
    for i, c in enumerate(containers):
        if not isinstance(c, dict):
            raise ConvertError([f"{path}[{i}]: must be a mapping"])
    named = [i for i, c in enumerate(containers) if c.get("name") == trainer_name]
    if named:
        index = named[0]
    elif len(containers) == 1:
        index = 0
    else:
        raise ConvertError([f"{path}: no container named {trainer_name} (the training container)"])
    others = [(i, c) for i, c in enumerate(containers) if i != index]
    return Node(containers[index], f"{path}[{index}]", node.report), others


def convert_pod(
    template: Any, path: str, trainer_name: str, report: Report, entrypoint_launcher: bool = False
) -> dict[str, Any]:
    """The job spec fields a source pod template gives, ``podTemplate`` among them when it has any."""
    root = Node(template, path, report)
    root.ignore("apiVersion", "kind")
    spec: dict[str, Any] = {}
    pod_meta: dict[str, Any] = {}
    _metadata(root.child("metadata"), pod_meta)
    pod = root.child("spec")
    root.done()
    pod_spec: dict[str, Any] = {}
    trainer_node, sidecars = _containers(pod, trainer_name)
    entry: dict[str, Any] = {"name": TRAINER_CONTAINER}
    mounts = _trainer(trainer_node, spec, entry, entrypoint_launcher)
    remaining = _volumes(pod, mounts, spec, pod_spec)
    if remaining:
        entry["volumeMounts"] = remaining
    account = pod.take_str("serviceAccountName") or pod.take_str("serviceAccount")
    pod.take("serviceAccount")
    if account:
        pod_spec["serviceAccountName"] = account
    for key in POD_FIELDS:
        value = pod.take(key)
        if value not in (None, [], {}):
            pod_spec[key] = value
    inits = [dict(c) for c in pod.take_list("initContainers")]
    for index, sidecar in sidecars:
        report.warn(
            f"{pod.at('containers')}[{index}] ({sidecar.get('name')})",
            "a second container: now a native sidecar (spec.podTemplate.spec.initContainers, restartPolicy:"
            " Always), started before the trainer and stopped after it",
        )
        inits.append({**sidecar, "restartPolicy": "Always"})
    if inits:
        pod_spec["initContainers"] = inits
    if len(entry) > 1:
        pod_spec["containers"] = [entry]
    scheduling = {key: pod.take(key) for key in SCHEDULING_FIELDS}
    scheduling = {k: v for k, v in scheduling.items() if v not in (None, [], {}, "")}
    if scheduling:
        spec["scheduling"] = scheduling
    grace = pod.take_int("terminationGracePeriodSeconds")
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    pod.drop("restartPolicy", "the operator replaces failed workers itself (spec.failurePolicy); dropped")
    pod.done()
    template_out: dict[str, Any] = {}
    if pod_meta:
        template_out["metadata"] = pod_meta
    if pod_spec:
        order = list(PodTemplateSpec.model_fields)
        template_out["spec"] = {key: pod_spec[key] for key in sorted(pod_spec, key=order.index)}
    if template_out:
        spec["podTemplate"] = template_out
    return spec
