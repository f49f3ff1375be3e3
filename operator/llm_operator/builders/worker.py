"""Worker pods: one per node, running torchrun around the user's training program."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

from llm_elastic import contract

from llm_operator import labels
from llm_operator.api.models import LLMTrainingJob
from llm_operator.api.rules import (
    FSX_VOLUME,
    SHM_PATH,
    SHM_VOLUME,
    TERMINATION_MESSAGE_PATH,
    TRAINER_CONTAINER,
)
from llm_operator.builders import rendezvous
from llm_operator.builders.common import child_metadata, job_uid
from llm_operator.builders.pod_template import merge_pod_template
from llm_operator.policy.topology import Placement
from llm_operator.settings import TRAINER_METRICS_PORT

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HOSTNAME_LABEL = "kubernetes.io/hostname"
NODE_NAME_FIELD = "metadata.name"
DIST_PORT = 29500

# libfabric / aws-ofi-nccl settings for p4d/p5 with EFA (user env overrides them).
EFA_ENV: dict[str, str] = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_FORK_SAFE": "1",
    "NCCL_SOCKET_IFNAME": "^lo,docker",
    "NCCL_DEBUG": "WARN",
}


def rdzv_conf(job: LLMTrainingJob) -> str:
    """PET_RDZV_CONF: torchrun's rendezvous timing, tuned for fast re-rendezvous after a loss."""
    r = job.spec.rendezvous
    parts = {
        "join_timeout": r.timeoutSeconds,
        "last_call_timeout": r.lastCallSeconds,
        "close_timeout": r.closeTimeoutSeconds,
        "heartbeat_timeout": r.heartbeatTimeoutSeconds,
        "keep_alive_interval": r.heartbeatSeconds,
        "keep_alive_max_attempt": r.heartbeatMisses,
    }
    conf = ",".join(f"{k}={v}" for k, v in parts.items())
    if r.backend == "c10d":
        conf += ",is_host=false"  # the store lives in the rendezvous pod, never on a worker
    return conf


def _identity_env(job: LLMTrainingJob, index: int, attempt: int) -> list[dict[str, Any]]:
    """What every worker is told about itself (LLMJOB_*), whatever runs in it."""
    return [
        {"name": contract.POD_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": contract.NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": contract.POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": contract.JOB_ENV, "value": job.metadata.name},
        {"name": contract.INDEX_ENV, "value": str(index)},
        {"name": contract.ATTEMPT_ENV, "value": str(attempt)},
        # The mode the program must run in (llm_elastic refuses a mode the program was not written for).
        {"name": contract.RECOVERY_ENV, "value": job.spec.failurePolicy.recovery},
    ]


def health_check_json(job: LLMTrainingJob) -> str:
    """LLMJOB_HEALTH_CHECK: spec.healthCheck with every default filled, as compact JSON (sorted keys).

    ``minSharedMemory`` is a string quantity, or "" when unset (the runtime derives it)."""
    check = job.spec.healthCheck.model_dump(mode="json")
    shm = job.spec.healthCheck.minSharedMemory
    check["minSharedMemory"] = "" if shm is None else str(shm)
    return json.dumps(check, separators=(",", ":"), sort_keys=True)


def _tail_env(job: LLMTrainingJob) -> list[dict[str, Any]]:
    env = [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": contract.HEALTH_ENV, "value": health_check_json(job)},
    ]
    if job.spec.checkpointDir:
        env.append({"name": contract.CHECKPOINT_ENV, "value": job.spec.checkpointDir})
    return env + rules_env(job)


def rules_env(job: LLMTrainingJob) -> list[dict[str, str]]:
    """LLMJOB_LOSS_RULES (``[{"name", "action", "after"}]``, for the runtime's step commit) and
    LLMJOB_LOG_RULES (every field a log rule sets, for the supervisor): compact JSON, each only when the
    job has such rules."""
    loss: list[dict[str, Any]] = []
    log: list[dict[str, Any]] = []
    for rule in job.spec.monitoring.rules if job.spec.monitoring else []:
        data = rule.model_dump(mode="json", exclude_none=True)
        if rule.loss is not None:
            loss.append({"name": rule.name, "action": rule.action, "after": rule.after})
        else:
            log.append(data)
    return [
        {"name": name, "value": json.dumps(items, separators=(",", ":"), sort_keys=True)}
        for name, items in ((contract.LOSS_RULES_ENV, loss), (contract.LOG_RULES_ENV, log))
        if items
    ]


def log_rules(job: LLMTrainingJob) -> bool:
    """Whether the job has log rules (the supervisor reads the program's output only then)."""
    return job.spec.monitoring is not None and any(r.logPattern for r in job.spec.monitoring.rules)


def torchrun_env(job: LLMTrainingJob, index: int, attempt: int) -> list[dict[str, Any]]:
    """The torchrun contract (PET_*) plus what the trainer reads (LLMJOB_*)."""
    return [
        *_identity_env(job, index, attempt),
        {"name": "PET_NNODES", "value": f"{job.spec.minReplicas}:{job.spec.maxReplicas}"},
        {"name": "PET_NPROC_PER_NODE", "value": str(job.nproc_per_node)},
        {"name": "PET_RDZV_BACKEND", "value": job.spec.rendezvous.backend},
        {"name": "PET_RDZV_ENDPOINT", "value": rendezvous.endpoint(job)},
        {"name": "PET_RDZV_ID", "value": job_uid(job)},
        {"name": "PET_RDZV_CONF", "value": rdzv_conf(job)},
        {"name": "PET_MAX_RESTARTS", "value": str(job.spec.failurePolicy.maxRestarts)},
        {"name": "PET_LOCAL_ADDR", "value": f"$({contract.POD_IP_ENV})"},
        # Without it torch (2.5+) reuses the first round's master address after a re-rendezvous, so a
        # replacement node waits for ever (measured in bench/trainer_recovery.py, docs/trainer.md).
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
        *_tail_env(job),
    ]


def live_prefix(job: LLMTrainingJob) -> str:
    """Key prefix of the job's live membership in its etcd (failurePolicy.recovery inProcess)."""
    return f"/llmjob/{job_uid(job)}/live/"


def live_env(job: LLMTrainingJob, index: int, attempt: int) -> list[dict[str, Any]]:
    """The live-membership contract (failurePolicy.recovery inProcess): no PET_*, no torchrun across
    nodes; members are ``<pod>.<pid>`` under the job's prefix in its etcd."""
    return [
        *_identity_env(job, index, attempt),
        {"name": contract.ETCD_ENV, "value": rendezvous.endpoint(job)},
        {"name": contract.PREFIX_ENV, "value": live_prefix(job)},
        {"name": contract.MIN_MEMBERS_ENV, "value": str(job.spec.minReplicas * job.nproc_per_node)},
        # Generations hold at most this many members; registered members beyond it wait as warm spares.
        {"name": contract.TARGET_MEMBERS_ENV, "value": str(job.desired_replicas * job.nproc_per_node)},
        *_tail_env(job),
    ]


def in_process(job: LLMTrainingJob) -> bool:
    """Whether the job recovers in process (live membership) instead of restarting."""
    return job.spec.failurePolicy.recovery == "inProcess"


def launcher(job: LLMTrainingJob) -> list[str]:
    """What runs the user's command: torchrun across nodes; for inProcess a supervisor that restarts a
    failed program inside its pod (recovery layer 2): ``llm_elastic.supervise`` for one process per pod,
    torchrun as a local supervisor only for several (``--standalone``: never a rendezvous across nodes).
    With log rules (spec.monitoring), the supervisor also runs torchrun (recovery restart) and torchrun
    --standalone (in process, several processes per pod): it restarts them only when a rule says so."""
    supervise = ["python", "-m", "llm_elastic.supervise"]
    max_restarts = job.spec.failurePolicy.maxRestarts
    rules = (
        [f"--rules-env={contract.LOG_RULES_ENV}", f"--max-rule-restarts={max_restarts}"]
        if log_rules(job)
        else []
    )
    if not in_process(job):
        torchrun = ["torchrun", "--no-python"]
        return [*supervise, *rules, "--max-restarts=0", "--", *torchrun] if rules else torchrun
    if job.nproc_per_node == 1:  # recovery layer 2: the program restarted inside its pod (llm_elastic)
        return [*supervise, *rules, f"--max-restarts={max_restarts}", "--"]
    return [
        *([*supervise, *rules, "--max-restarts=0", "--"] if rules else []),
        "torchrun",
        "--standalone",
        f"--nproc-per-node={job.nproc_per_node}",
        f"--max-restarts={max_restarts}",
        "--no-python",
    ]


def container_env(job: LLMTrainingJob, index: int, attempt: int) -> list[dict[str, Any]]:
    """Operator env, then EFA defaults and user env merged by name (user wins over defaults)."""
    own = live_env(job, index, attempt) if in_process(job) else torchrun_env(job, index, attempt)
    tunables: dict[str, dict[str, Any]] = {}
    if job.spec.efaPerNode > 0:
        tunables = {name: {"name": name, "value": value} for name, value in EFA_ENV.items()}
    for var in job.spec.env:
        tunables[var.name] = var.model_dump(by_alias=True, exclude_none=True)
    return own + list(tunables.values())


def _resources(job: LLMTrainingJob) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    res = job.spec.resources
    for key, value in (("cpu", res.cpu), ("memory", res.memory), ("ephemeral-storage", res.ephemeralStorage)):
        if value is not None:
            limits[key] = requests[key] = str(value)
    if job.spec.gpusPerNode > 0:
        limits[GPU_RESOURCE] = str(job.spec.gpusPerNode)
    if job.spec.efaPerNode > 0:
        limits[EFA_RESOURCE] = str(job.spec.efaPerNode)
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def tolerations(job: LLMTrainingJob) -> list[dict[str, Any]]:
    out = [copy.deepcopy(t) for t in job.spec.scheduling.tolerations]
    wanted = []
    if job.spec.gpusPerNode > 0:
        wanted.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    if job.spec.efaPerNode > 0:
        wanted.append({"key": EFA_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    out += [t for t in wanted if t not in out]
    return out


def _and_into_required(affinity: dict[str, Any], kind: str, requirement: dict[str, Any]) -> None:
    """AND one node selector requirement into every required nodeSelectorTerm (terms are ORed)."""
    node = affinity.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault(kind, []).append(copy.deepcopy(requirement))


TOPOLOGY_WEIGHT = 100
"""Weight of a preferred topology term: the most a term can weigh, so it outweighs the spread term."""
TARGET_WEIGHT = 50
"""Weight of the first placement's preference for the roomiest domain (pod affinity decides first)."""


def _topology_terms(job: LLMTrainingJob, affinity: dict[str, Any], placement: Placement) -> None:
    """Topology terms of ``placement`` (policy.topology): node affinity to the survivors' domain, or pod
    affinity on the key for the first workers; Kueue's assigned domains as a requirement."""
    key, required = placement.key, placement.mode == "required"
    if placement.allowed:
        _and_into_required(affinity, "matchExpressions", _in(key, placement.allowed))
    node = affinity.setdefault("nodeAffinity", {})
    if placement.home:
        if required:
            _and_into_required(affinity, "matchExpressions", _in(key, [placement.home]))
        else:
            node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
                {"weight": TOPOLOGY_WEIGHT, "preference": {"matchExpressions": [_in(key, [placement.home])]}}
            )
        return
    if placement.target:
        node.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
            {"weight": TARGET_WEIGHT, "preference": {"matchExpressions": [_in(key, [placement.target])]}}
        )
    term = {"topologyKey": key, "labelSelector": {"matchLabels": labels.selector(job.metadata.name)}}
    pod = affinity.setdefault("podAffinity", {})
    if required:
        pod.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
    else:
        pod.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
            {"weight": TOPOLOGY_WEIGHT, "podAffinityTerm": term}
        )


def _in(key: str, values: Iterable[str]) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": sorted(set(values))}


AVOID_WEIGHT = 100
"""Weight of a preferred term against an avoided node (``hard`` given: the node repels pods by itself)."""


def _affinity(
    job: LLMTrainingJob,
    avoid_nodes: Iterable[str] = (),
    placement: Placement | None = None,
    hard: Iterable[str] | None = None,
) -> dict[str, Any]:
    """User affinity + instance types + nodes to avoid (ANDed into every required term) + topology
    (``placement``) + spread over hosts. With ``hard`` given (an autoscaler such as Karpenter serves the
    cluster) only those avoided nodes are required terms, the others preferred: Karpenter launches no node
    for a pod with a ``matchFields`` term (its scheduling refuses them), and those others repel pods with a
    taint or a cordon anyway."""
    affinity = copy.deepcopy(job.spec.scheduling.affinity)
    types = job.spec.scheduling.instanceTypes
    if types:
        expr = {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": list(types)}
        _and_into_required(affinity, "matchExpressions", expr)
    # By node name (matchFields), not the hostname label, which need not equal the name. The scheduler
    # honours it even before its cache has seen the node's taint or cordon. The API allows one value per
    # metadata.name requirement: one NotIn per node, ANDed.
    required = set(avoid_nodes) if hard is None else set(avoid_nodes) & set(hard)
    for name in sorted(set(avoid_nodes)):
        field = {"key": NODE_NAME_FIELD, "operator": "NotIn", "values": [name]}
        if name in required:
            _and_into_required(affinity, "matchFields", field)
        else:
            preferred = affinity.setdefault("nodeAffinity", {})
            preferred.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
                {"weight": AVOID_WEIGHT, "preference": {"matchFields": [field]}}
            )
    if placement is not None:
        _topology_terms(job, affinity, placement)
    anti = affinity.setdefault("podAntiAffinity", {})
    anti.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
        {
            "weight": 100,
            "podAffinityTerm": {
                "topologyKey": HOSTNAME_LABEL,
                "labelSelector": {"matchLabels": labels.selector(job.metadata.name)},
            },
        }
    )
    return affinity


def _volumes(job: LLMTrainingJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    shm: dict[str, Any] = {"medium": "Memory"}
    if job.spec.sharedMemory is not None:
        shm["sizeLimit"] = str(job.spec.sharedMemory)
    volumes: list[dict[str, Any]] = [{"name": SHM_VOLUME, "emptyDir": shm}]
    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": SHM_PATH}]
    if job.spec.fsx is not None:
        fsx = job.spec.fsx
        volumes.append(
            {
                "name": FSX_VOLUME,
                "persistentVolumeClaim": {"claimName": fsx.claimName, "readOnly": fsx.readOnly},
            }
        )
        mounts.append({"name": FSX_VOLUME, "mountPath": fsx.mountPath, "readOnly": fsx.readOnly})
    return volumes, mounts


def metrics_ports(nproc: int) -> list[dict[str, Any]]:
    """Each local rank serves Prometheus metrics on 9400 + rank: `metrics`, `metrics-1`, ..."""
    return [
        {"name": "metrics" if rank == 0 else f"metrics-{rank}", "containerPort": TRAINER_METRICS_PORT + rank}
        for rank in range(nproc)
    ]


def worker_pod(
    job: LLMTrainingJob,
    index: int,
    attempt: int,
    avoid_nodes: Iterable[str] = (),
    placement: Placement | None = None,
    hard: Iterable[str] | None = None,
) -> dict[str, Any]:
    """The worker pod for replica ``index`` made in restart ``attempt``.

    ``avoid_nodes``: nodes the operator judged lost, terminating or cordoned; the pod must not land there
    (a required ``metadata.name NotIn`` term, ANDed with the user's affinity and the instance types),
    listed in the ``elasticllm.dev/avoided-nodes`` annotation. ``placement``: the topology terms of a
    job with spec.scheduling.topology (``policy.topology``); the pod's domain is in the
    ``elasticllm.dev/topology-domain`` annotation when it is pinned to one. ``spec.podTemplate`` is
    merged in last (``builders.pod_template``), under the fields the operator owns.
    """
    name = labels.worker_name(job.metadata.name, index)
    extra = {labels.REPLICA_INDEX: str(index), labels.ATTEMPT: str(attempt)}
    if job.spec.scheduling.gangScheduling:
        extra[labels.POD_GROUP_LABEL] = job.metadata.name
    volumes, mounts = _volumes(job)
    wrapper = launcher(job)
    # Under a launcher the user's command becomes its arguments.
    command = wrapper or list(job.spec.command)
    args = [*job.spec.command, *job.spec.args] if wrapper else list(job.spec.args)
    container: dict[str, Any] = {
        "name": TRAINER_CONTAINER,
        "image": job.spec.image,
        "imagePullPolicy": job.spec.imagePullPolicy,
        "command": command,
        "args": args,
        "env": container_env(job, index, attempt),
        "ports": metrics_ports(job.nproc_per_node),
        "volumeMounts": mounts,
        # The runtime writes one line there when a health check fails (exit code 78); the operator
        # reads it from the container's terminated state.
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = _resources(job)
    if resources:
        container["resources"] = resources
    if job.spec.efaPerNode > 0:
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": name,
        "subdomain": labels.workers_service_name(job.metadata.name),
        "terminationGracePeriodSeconds": job.spec.terminationGracePeriodSeconds,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": volumes,
        "tolerations": tolerations(job),
        "affinity": _affinity(job, avoid_nodes, placement, hard),
    }
    sched = job.spec.scheduling
    if sched.nodeSelector:
        spec["nodeSelector"] = dict(sched.nodeSelector)
    if sched.priorityClassName:
        spec["priorityClassName"] = sched.priorityClassName
    if sched.schedulerName:
        spec["schedulerName"] = sched.schedulerName
    metadata = child_metadata(job, name, labels.ROLE_WORKER, extra)
    avoided = sorted(set(avoid_nodes))
    if avoided:
        metadata.setdefault("annotations", {})[labels.AVOIDED_NODES] = ",".join(avoided)
    if placement is not None and placement.home:
        metadata.setdefault("annotations", {})[labels.TOPOLOGY_DOMAIN] = placement.home
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    merged = merge_pod_template(pod, job.spec.podTemplate)
    # A default, not a field the operator owns: a runtime's or the job's podTemplate may set "false".
    merged["metadata"].setdefault("annotations", {}).setdefault(labels.DO_NOT_DISRUPT, "true")
    return merged


def workers_service(job: LLMTrainingJob) -> dict[str, Any]:
    """Headless Service: stable DNS `<job>-worker-<i>.<job>-workers` even before pods are Ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(job, labels.workers_service_name(job.metadata.name), labels.ROLE_WORKER),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": labels.selector(job.metadata.name),
            "ports": [{"name": "dist", "port": DIST_PORT, "targetPort": DIST_PORT}],
        },
    }


def pod_group(job: LLMTrainingJob) -> dict[str, Any]:
    """PodGroup (scheduler-plugins coscheduling) so a gang scheduler starts at least minReplicas together."""
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": child_metadata(job, job.metadata.name, labels.ROLE_WORKER),
        "spec": {
            "minMember": job.spec.minReplicas,
            "scheduleTimeoutSeconds": job.spec.failurePolicy.pendingTimeoutSeconds,
        },
    }
