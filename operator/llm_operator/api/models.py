"""Typed models of the LLMTrainingJob API (v1alpha1): the one source of truth.

The CRD's openAPIV3Schema is generated from these models (``llm_operator.api.crd``); every field's
docstring becomes its description. Cross-field rules are CEL expressions attached with ``cel()`` and
are evaluated both by the apiserver and, through ``llm_operator.api.validate``, by ``llmjob render``.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from llm_operator.api.monitoring import groups, pattern_problem
from llm_operator.api.rules import (
    ABSOLUTE_PATH,
    ENV_NAME,
    QUANTITY_SCHEMA,
    RULES_ENV_VAR,
    RULES_FSX,
    RULES_INIT_CONTAINER,
    RULES_JOB,
    RULES_LOG_PATTERN,
    RULES_MONITORING_RULE,
    RULES_POD_METADATA,
    RULES_POD_VOLUME,
    RULES_SPEC,
    RULES_TOPOLOGY,
    RULES_TRAINER_ENTRY,
    TOPOLOGY_KEY,
)

GROUP = "elasticllm.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LLMTrainingJob"
PLURAL = "llmtrainingjobs"
SINGULAR = "llmtrainingjob"
SHORT_NAMES = ["llmjob", "llmjobs"]
CATEGORIES = ["all", "elasticllm"]
RUNTIME_KIND = "LLMTrainingRuntime"
RUNTIME_PLURAL = "llmtrainingruntimes"
CLUSTER_RUNTIME_KIND = "ClusterLLMTrainingRuntime"
CLUSTER_RUNTIME_PLURAL = "clusterllmtrainingruntimes"
RUNTIME_KINDS = (RUNTIME_KIND, CLUSTER_RUNTIME_KIND)

Quantity = int | str
PHASES = ("Pending", "Queued", "Running", "Scaling", "Restarting", "Suspended", "Succeeded", "Failed")
Phase = Literal["Pending", "Queued", "Running", "Scaling", "Restarting", "Suspended", "Succeeded", "Failed"]


def _cel(rules: list[dict[str, str]]) -> dict[str, JsonValue]:
    """Attach CEL rules to a model's schema node."""
    return {"x-kubernetes-validations": cast(list[JsonValue], rules)}


def _quantity(description: str, default: Any = None) -> Any:
    return Field(default=default, description=description, json_schema_extra=QUANTITY_SCHEMA)


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        use_attribute_docstrings=True,
        validate_default=True,
    )


class EnvVar(_Model):
    """An environment variable for the training container (same shape as a core/v1 EnvVar)."""

    model_config = ConfigDict(json_schema_extra=_cel(RULES_ENV_VAR))

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME)
    """Variable name. Names the operator owns (PET_*, RANK, WORLD_SIZE, MASTER_*, ...) are rejected."""
    value: str | None = Field(default=None, max_length=32768)
    """Literal value."""
    valueFrom: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """A source for the value (configMapKeyRef, fieldRef, resourceFieldRef, secretKeyRef), as in core/v1."""


class Resources(_Model):
    """CPU and memory for each worker; used as both request and limit (Guaranteed QoS)."""

    cpu: Quantity | None = _quantity('CPU per worker pod, e.g. "180" on a p5.48xlarge.')
    memory: Quantity | None = _quantity("Memory per worker pod, e.g. 1800Gi on a p5.48xlarge.")
    ephemeralStorage: Quantity | None = _quantity(
        "Local ephemeral storage per worker pod (container scratch, logs)."
    )


class Fsx(_Model):
    """An FSx for Lustre volume (through an existing PersistentVolumeClaim) mounted in every worker."""

    model_config = ConfigDict(json_schema_extra=_cel(RULES_FSX))

    claimName: str = Field(min_length=1, max_length=253)
    """Name of the PersistentVolumeClaim (ReadWriteMany, fsx.csi.aws.com) in the job's namespace."""
    mountPath: str = Field(default="/fsx", min_length=1, max_length=1024)
    """Absolute path where the volume is mounted in the worker container."""
    readOnly: bool = False
    """Mount the volume read-only (checkpoints then need another writable path)."""


class Rendezvous(_Model):
    """How torchrun agents find each other."""

    backend: Literal["etcd-v3", "c10d"] = "etcd-v3"
    """etcd-v3 (our etcd v3 plugin, survives any worker's loss) or c10d (torch's TCPStore)."""
    endpoint: str = Field(default="", max_length=512)
    """host:port of an existing rendezvous server; empty: the operator runs one, off the workers."""
    timeoutSeconds: int = Field(default=900, ge=1, le=86400)
    """How long agents wait for enough members to form a round (torchrun join_timeout)."""
    lastCallSeconds: int = Field(default=2, ge=0, le=3600)
    """Extra wait after the minimum is reached, for more members to join the round (last_call_timeout)."""
    closeTimeoutSeconds: int = Field(default=10, ge=1, le=3600)
    """How long agents wait for a closed round to be acknowledged (close_timeout)."""
    heartbeatSeconds: int = Field(default=1, ge=1, le=600)
    """Keep-alive interval of each agent in the rendezvous state (keep_alive_interval)."""
    heartbeatTimeoutSeconds: int = Field(default=5, ge=1, le=3600)
    """Seconds without a keep-alive after which torch treats an agent as dead (heartbeat_timeout)."""
    heartbeatMisses: int = Field(default=3, ge=1, le=100)
    """Missed keep-alives before a member counts as dead (keep_alive_max_attempt)."""


class FailurePolicy(_Model):
    """When a lost worker is replaced, when the job shrinks, and when it gives up."""

    maxRestarts: int = Field(default=20, ge=0, le=100000)
    """Membership changes (restarts) allowed before the job fails."""
    nodeFailureGraceSeconds: int = Field(default=30, ge=0, le=86400)
    """Seconds a worker's node may be NotReady/unreachable before the worker is replaced (0 = at once)."""
    pendingTimeoutSeconds: int = Field(default=300, ge=1, le=86400)
    """Seconds a replacement may stay unschedulable before the job shrinks to what runs."""
    belowMinTimeoutSeconds: int = Field(default=1800, ge=1, le=604800)
    """Seconds the job may run below minReplicas before it fails."""
    resizeCooldownSeconds: int = Field(default=30, ge=0, le=86400)
    """Minimum seconds between two resizes (grow after a shrink), to avoid flapping."""
    nonRetryableExitCodes: list[int] = Field(default_factory=list, max_length=64)
    """Worker exit codes that fail the job at once instead of being retried."""
    progressTimeoutSeconds: int = Field(default=0, ge=0, le=604800)
    """Seconds without a completed training step after which the workers are restarted (a restart,
    counted against maxRestarts; condition Stalled). 0 (default) turns hang detection off. The signal is
    the trainer's `llm_trainer_last_step_timestamp_seconds`/`llm_trainer_step` on port 9400 of the
    workers: enable it only for programs that serve it (llm_trainer does)."""
    progressStartupSeconds: int = Field(default=1800, ge=1, le=86400)
    """Allowance for the first step after the workers (re)start (rendezvous, checkpoint load,
    compilation), used instead of progressTimeoutSeconds until a step completes."""
    recovery: Literal["restart", "inProcess"] = "restart"
    """restart (default): each worker runs under torchrun, and a membership change restarts every
    training process from the newest checkpoint. inProcess: the workers run the program directly as
    members of the job's live membership in its etcd (rendezvous.backend etcd-v3 only); survivors keep
    their processes and state, joiners get the state from a peer, and the operator evicts a lost
    worker's members at once. The program must use the llm_elastic runtime (python -m llm_trainer does;
    docs/byo-training.md)."""


class HealthCheck(_Model):
    """Node health checks the runtime (llm_elastic) runs in every worker: before it becomes a member
    (pre-flight) and then periodically. A worker that fails one exits with code 78 and one line in its
    termination message; the operator records the node, avoids it and replaces the worker
    (docs/elasticity.md, "Node health")."""

    enabled: bool = True
    """Run the checks (false: none, and no straggler detection)."""
    checkpointWriteMaxSeconds: float = Field(default=2.0, ge=0.01, le=3600)
    """Most seconds a write + fsync of a 4 MiB probe file in checkpointDir may take."""
    minSharedMemory: Quantity | None = _quantity(
        "Least free space /dev/shm must have, e.g. 8Gi; unset: derived by the runtime (what its"
        " in-memory snapshots need)."
    )
    intervalSeconds: int = Field(default=300, ge=0, le=86400)
    """Seconds between periodic re-checks while the worker runs (0 = pre-flight only)."""
    stragglerFactor: float = Field(default=1.5, ge=1.0, le=100)
    """A worker whose step compute time is above this factor x the job's median over the window is a
    straggler: it exits 78 and is replaced (by a spare when there is one)."""
    stragglerWindowSteps: int = Field(default=20, ge=0, le=100000)
    """Steps the straggler median is taken over (0 = no straggler detection)."""
    command: list[str] = Field(default_factory=list, max_length=64)
    """A check of your own: argv run in the worker container (never a shell string); a non-zero exit
    marks the node unhealthy. Empty: none."""
    gpu: bool = True
    """GPU checks: device count, matmul rate, NCCL all-reduce, EFA devices visible (run only where the
    worker has a GPU)."""


class Topology(_Model):
    """Keep the job's workers in one network domain: the nodes that share a value of a node label, e.g.
    `topology.k8s.aws/network-node-layer-3` on EKS (docs/platform.md, "Topology"). The first workers go
    to one domain; every replacement and grown worker goes to the domain most of the running workers
    are in (the survivors' domain). When it has no room, `mode` decides."""

    model_config = ConfigDict(json_schema_extra=_cel(RULES_TOPOLOGY))

    key: str = Field(min_length=1, max_length=316, pattern=TOPOLOGY_KEY)
    """The node label whose value names a domain (a topology level), e.g.
    topology.k8s.aws/network-node-layer-3. Not kubernetes.io/hostname: workers take a node each."""
    mode: Literal["preferred", "required"] = "preferred"
    """preferred (default): a worker that does not fit in the survivors' domain runs in another one (the
    job spreads: Warning Event TopologySpread, status.topology.spread). required: it waits for room in
    that domain; after failurePolicy.pendingTimeoutSeconds the job shrinks to what runs there (never
    below minReplicas; below it, belowMinTimeoutSeconds applies), and grows back only into that domain.
    With Kueue, the Workload's podSet asks for this level (topologyRequest) in the same mode."""


class Scheduling(_Model):
    """Where worker pods may run."""

    nodeSelector: dict[str, str] = Field(default_factory=dict)
    """Node labels every worker's node must have."""
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        json_schema_extra={"items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    )
    """Extra tolerations (core/v1 shape); GPU and EFA NoSchedule tolerations are added automatically."""
    affinity: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """Affinity (core/v1 shape), merged with the instance-type node affinity."""
    priorityClassName: str = Field(default="", max_length=253)
    """PriorityClass of the worker pods."""
    schedulerName: str = Field(default="", max_length=253)
    """Scheduler of the worker pods (e.g. a gang scheduler); empty = default scheduler."""
    instanceTypes: list[str] = Field(default_factory=list, max_length=32)
    """Allowed EC2 instance types (node.kubernetes.io/instance-type), e.g. [p5.48xlarge]."""
    gangScheduling: bool = False
    """Create a PodGroup (scheduling.x-k8s.io, minMember = minReplicas) for gang-aware schedulers."""
    topology: Topology | None = None
    """Place the workers in one network domain (unset: anywhere the scheduler likes)."""


_FREE: dict[str, JsonValue] = {"x-kubernetes-preserve-unknown-fields": True}
_FREE_ITEMS: dict[str, JsonValue] = {
    "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
}
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def _by_name(max_items: int) -> dict[str, JsonValue]:
    """A list of named items: the apiserver refuses two items with one name."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"], "maxItems": max_items}


class _Open(_Model):
    """A core/v1 object of which only some fields are typed here; the others are kept as written."""

    model_config = ConfigDict(extra="allow")


class PodTemplateMetadata(_Model):
    """Labels and annotations added to every worker pod."""

    model_config = ConfigDict(json_schema_extra=_cel(RULES_POD_METADATA))

    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    """Pod labels (cost allocation, a service mesh opt-out, ...). Keys under elasticllm.dev/ and
    kueue.x-k8s.io/, app.kubernetes.io/managed-by and scheduling.x-k8s.io/pod-group are the operator's and
    refused."""
    annotations: dict[str, str] = Field(default_factory=dict, max_length=64)
    """Pod annotations (e.g. sidecar.istio.io/inject: "false"). Keys under elasticllm.dev/ are refused."""


class VolumeMount(_Open):
    """A core/v1 VolumeMount (name, mountPath, readOnly, subPath, ...)."""

    name: str = Field(min_length=1, max_length=63)
    """The volume's name: one of spec.podTemplate.spec.volumes, or dshm / fsx (the operator's)."""
    mountPath: str = Field(min_length=1, max_length=1024, pattern=ABSOLUTE_PATH)
    """Absolute path in the container; /dev/shm, /dev/termination-log and spec.fsx.mountPath are refused."""


class TrainerContainer(_Model):
    """What a pod template adds to the training container: nothing else of it is the template's
    (image, command, args, env, resources and ports come from the job's spec)."""

    model_config = ConfigDict(json_schema_extra=_cel(RULES_TRAINER_ENTRY))

    name: str = Field(min_length=1, max_length=63)
    """Must be trainer: the training container."""
    volumeMounts: list[VolumeMount] = Field(default_factory=list, max_length=64)
    """Mounts of spec.podTemplate.spec.volumes in the training container, after the operator's."""
    envFrom: list[dict[str, Any]] = Field(default_factory=list, max_length=32, json_schema_extra=_FREE_ITEMS)
    """ConfigMaps and Secrets whose keys become environment variables (core/v1 EnvFromSource). Variables the
    operator and spec.env set explicitly win over them, as in any pod."""


class Container(_Open):
    """An init container or a native sidecar (restartPolicy: Always): a core/v1 Container."""

    model_config = ConfigDict(json_schema_extra=_cel(RULES_INIT_CONTAINER))

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    """Container name (trainer is the training container's)."""
    image: str = Field(min_length=1, max_length=1024)
    """Container image."""
    restartPolicy: Literal["Always"] | None = None
    """Always: a native sidecar (Kubernetes 1.29+), started before the trainer, kept running beside it and
    stopped after it; unset: an init container that runs to completion before the trainer starts."""


class Volume(_Open):
    """A core/v1 Volume (configMap, secret, persistentVolumeClaim, csi, emptyDir, projected, ...)."""

    model_config = ConfigDict(json_schema_extra=_cel(RULES_POD_VOLUME))

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    """Volume name; dshm and fsx are the operator's."""


class LocalObjectReference(_Model):
    """A reference to an object in the job's namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Name of the object (a Secret of type kubernetes.io/dockerconfigjson for imagePullSecrets)."""


class PodTemplateSpec(_Model):
    """Pod fields merged into every worker pod. The operator's own fields (containers' resources, the
    rendezvous env, /dev/shm, FSx, affinity, tolerations, restart policy, hostname) are not here: they come
    from the job's spec (scheduling.*, resources, env, ...)."""

    serviceAccountName: str | None = Field(default=None, max_length=253, pattern=DNS_SUBDOMAIN)
    """ServiceAccount of the workers (EKS Pod Identity: the association names it; IRSA: its
    eks.amazonaws.com/role-arn annotation)."""
    automountServiceAccountToken: bool | None = None
    """Mount the ServiceAccount's token (unset: the ServiceAccount's setting, true by default)."""
    imagePullSecrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, json_schema_extra=_by_name(16)
    )
    """Secrets to pull the images of the trainer and of the init and sidecar containers."""
    volumes: list[Volume] = Field(default_factory=list, max_length=32, json_schema_extra=_by_name(32))
    """Volumes besides the operator's (dshm, fsx): a dataset through the Mountpoint for S3 CSI driver, a
    ConfigMap, a Secret, a PVC, ..."""
    initContainers: list[Container] = Field(
        default_factory=list, max_length=16, json_schema_extra=_by_name(16)
    )
    """Init containers and native sidecars (restartPolicy: Always), in order, before the trainer."""
    containers: list[TrainerContainer] = Field(
        default_factory=list, max_length=1, json_schema_extra=_by_name(1)
    )
    """At most one entry, named trainer: volumeMounts and envFrom added to the training container."""
    securityContext: dict[str, Any] = Field(default_factory=dict, json_schema_extra=_FREE)
    """Pod-level security context (core/v1 PodSecurityContext: fsGroup, runAsUser, runAsNonRoot, ...)."""
    dnsPolicy: Literal["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"] | None = None
    """DNS policy of the workers (unset: ClusterFirst)."""
    dnsConfig: dict[str, Any] = Field(default_factory=dict, json_schema_extra=_FREE)
    """Extra DNS settings (core/v1 PodDNSConfig: nameservers, searches, options)."""
    hostAliases: list[dict[str, Any]] = Field(
        default_factory=list, max_length=32, json_schema_extra=_FREE_ITEMS
    )
    """Entries added to /etc/hosts (core/v1 HostAlias: ip, hostnames)."""
    runtimeClassName: str | None = Field(default=None, max_length=253)
    """RuntimeClass of the workers (e.g. nvidia)."""


class PodTemplate(_Model):
    """The user's pod settings, merged by the operator into every worker pod (docs/api.md, "Pod template")."""

    metadata: PodTemplateMetadata = Field(default_factory=PodTemplateMetadata)
    """Labels and annotations of the worker pods."""
    spec: PodTemplateSpec = Field(default_factory=PodTemplateSpec)
    """Pod fields of the worker pods."""


class RuntimeRef(_Model):
    """The runtime (platform defaults) a job starts from."""

    kind: Literal["LLMTrainingRuntime", "ClusterLLMTrainingRuntime"] = "LLMTrainingRuntime"
    """LLMTrainingRuntime (in the job's namespace) or ClusterLLMTrainingRuntime (cluster-wide)."""
    name: str = Field(min_length=1, max_length=253)
    """Name of the runtime."""


class MonitoringRule(_Model):
    """A rule the job follows (docs/elasticity.md, "Monitoring rules"). A log rule (logPattern) is checked
    by the supervisor in every worker against each line the program writes; a loss rule (loss) by the
    runtime's step commit. A rule breaks; on its `after`-th consecutive break it fires: its action is taken,
    an Event names it, llmjob_rule_fired_total counts it and status.lastRuleFired records it."""

    model_config = ConfigDict(json_schema_extra=_cel(RULES_MONITORING_RULE))

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Name of the rule (a DNS label); rules from a runtime merge with the job's by name."""
    logPattern: str | None = Field(
        default=None, min_length=1, max_length=1024, json_schema_extra=_cel(RULES_LOG_PATTERN)
    )
    """RE2 pattern matched against each output line (stdout and stderr) of the program. Alone: every
    matching line is a break (e.g. 'CUDA error'). With metricThreshold, its first group is the number."""
    expectedStartCutOffSeconds: int | None = Field(default=None, ge=1, le=604800)
    """The first matching line must come within this long of the program's start."""
    expectedRecurringSeconds: int | None = Field(default=None, ge=1, le=604800)
    """Then a matching line must come at least this often (before the first one, measured from the start
    when expectedStartCutOffSeconds is unset)."""
    metricThreshold: float | None = None
    """A number captured from matching lines (the first group) breaks the rule when `operator` holds
    between it and this threshold for all of the last dataPoints numbers."""
    operator: Literal["lt", "lte", "gt", "gte"] | None = None
    """lt, lte, gt or gte: number <op> metricThreshold is a break (with metricThreshold)."""
    dataPoints: int | None = Field(default=None, ge=1, le=10000)
    """How many consecutive numbers must all break (default 1; with metricThreshold)."""
    loss: Literal["nonFinite"] | None = None
    """nonFinite: a loss rule, broken by a step whose loss (all-reduced by step.commit) is NaN or
    infinite. llm_elastic programs only (failurePolicy.recovery inProcess)."""
    action: Literal["event", "restartWorker", "replaceNode", "restartJob", "failJob", "skipStep", "rollback"]
    """event: record only. restartWorker: the program restarts in its pod. replaceNode: the pod is
    replaced and its node avoided. restartJob: every worker restarts. failJob: the job fails. Loss rules
    only: skipStep (no member applies the step) and rollback (the members load the newest in-memory
    snapshot). Log rules take event, restartWorker, replaceNode, restartJob, failJob; loss rules event,
    skipStep, rollback, restartJob, failJob."""
    after: int = Field(default=1, ge=1, le=100000)
    """Fire on the after-th consecutive break (a good line, value or step resets the count)."""

    @field_validator("logPattern")
    @classmethod
    def _re2(cls, pattern: str | None) -> str | None:
        problem = pattern_problem(pattern) if pattern is not None else ""
        if problem:
            raise ValueError(problem)
        return pattern

    @model_validator(mode="after")
    def _group(self) -> MonitoringRule:
        if self.logPattern is not None and self.metricThreshold is not None and groups(self.logPattern) < 1:
            raise ValueError(
                f"logPattern {self.logPattern!r}: metricThreshold needs a capture group (its first group is"
                " the number compared)"
            )
        return self


class Monitoring(_Model):
    """Rules the job follows, evaluated in its pods (docs/elasticity.md, "Monitoring rules")."""

    rules: list[MonitoringRule] = Field(default_factory=list, max_length=32, json_schema_extra=_by_name(32))
    """Log and loss rules, at most 32, names unique. A runtime's rules merge with the job's by name."""


class LLMTrainingJobSpec(_Model):
    """The desired state of an elastic training job."""

    model_config = ConfigDict(json_schema_extra=_cel(RULES_SPEC))

    runtimeRef: RuntimeRef | None = None
    """A runtime whose spec gives this job's defaults: the job's own fields win, env and tolerations
    merge by name, job last (docs/platform.md). The operator copies the runtime into status.runtime
    when it first resolves it: later edits of the runtime do not change this job."""

    minReplicas: int = Field(ge=1, le=4096)
    """Fewest worker nodes the job may run on."""
    maxReplicas: int = Field(ge=1, le=4096)
    """Most worker nodes the job may run on."""
    replicas: int | None = Field(default=None, ge=1, le=4096)
    """Desired worker count (scale subresource); unset means maxReplicas."""
    spareReplicas: int = Field(default=0, ge=0, le=1024)
    """Warm standby workers run beside the training ones (failurePolicy.recovery inProcess only): they
    start, pass the health checks and wait; when a member is lost one takes its place at the next step
    boundary. They use nodes and quota like any worker, never count toward minReplicas, and are the first
    to go when nodes are short."""
    image: str = Field(min_length=1, max_length=1024)
    """Trainer container image."""
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Image pull policy of the worker container."""
    command: list[str] = Field(
        default_factory=lambda: ["python", "-m", "llm_trainer"], min_length=1, max_length=64
    )
    """Training program argv that torchrun starts in every process (never a shell string)."""
    args: list[str] = Field(default_factory=list, max_length=1024)
    """Arguments appended to command."""
    env: list[EnvVar] = Field(default_factory=list, max_length=256)
    """User environment; overrides the operator's EFA/NCCL defaults, never its reserved names."""
    gpusPerNode: int = Field(default=8, ge=0, le=64)
    """nvidia.com/gpu limit of each worker (0 = CPU only)."""
    nprocPerNode: int | None = Field(default=None, ge=1, le=256)
    """Processes per worker; unset means gpusPerNode (1 when gpusPerNode is 0)."""
    efaPerNode: int = Field(default=0, ge=0, le=64)
    """vpc.amazonaws.com/efa devices per worker (32 on p5.48xlarge, 4 on p4d.24xlarge; 0 = no EFA)."""
    resources: Resources = Field(default_factory=Resources)
    """CPU and memory of each worker."""
    sharedMemory: Quantity | None = _quantity("Size limit of /dev/shm (a memory-backed emptyDir).")
    fsx: Fsx | None = None
    """FSx for Lustre volume for data and checkpoints."""
    checkpointDir: str | None = Field(default=None, max_length=1024, pattern=ABSOLUTE_PATH)
    """Where the trainer writes checkpoints (under fsx.mountPath when fsx is set)."""
    rendezvous: Rendezvous = Field(default_factory=Rendezvous)
    """Rendezvous of the torchrun agents."""
    failurePolicy: FailurePolicy = Field(default_factory=FailurePolicy)
    """Failure handling and elasticity timing."""
    scheduling: Scheduling = Field(default_factory=Scheduling)
    """Placement of the worker pods."""
    healthCheck: HealthCheck = Field(default_factory=HealthCheck)
    """Node health checks and straggler detection (run by the runtime in every worker)."""
    monitoring: Monitoring | None = None
    """Log and loss rules with actions, evaluated in the pods (docs/elasticity.md, "Monitoring rules")."""
    terminationGracePeriodSeconds: int = Field(default=300, ge=0, le=3600)
    """Seconds a stopping worker gets to finish its step and write a checkpoint."""
    ttlSecondsAfterFinished: int | None = Field(default=None, ge=0, le=31536000)
    """Delete the finished pods this long after Succeeded/Failed (the job object stays)."""
    suspend: bool = False
    """True deletes the workers and keeps the job Suspended until set back to false."""
    podTemplate: PodTemplate | None = None
    """Pod settings merged into every worker pod: labels, annotations, serviceAccountName,
    imagePullSecrets, volumes, init and sidecar containers, mounts and envFrom of the training container.
    Fields the operator owns are refused, never overwritten (docs/api.md, "Pod template")."""


class Condition(_Model):
    """A metav1.Condition."""

    model_config = ConfigDict(extra="ignore")

    type: str
    """Condition type: Ready, Degraded, Suspended, Complete, Failed, Admitted (Kueue), CheckpointNotShared,
    Stalled, Straggler, Members, WaitingForCapacity, Unschedulable, WorkersRefused, RuntimeResolved,
    RuntimeUnsupported (a runtime whose contract version the operator does not serve)."""
    status: Literal["True", "False", "Unknown"]
    """Condition status."""
    reason: str = ""
    """CamelCase reason of the last transition."""
    message: str = ""
    """Human-readable detail."""
    lastTransitionTime: str = ""
    """When the status last changed (RFC 3339)."""
    observedGeneration: int = 0
    """The spec generation the condition was computed from."""


class RuntimeSnapshot(_Model):
    """The runtime a job resolved, as it was then (the job keeps using this copy)."""

    model_config = ConfigDict(extra="ignore")

    kind: str = ""
    """LLMTrainingRuntime or ClusterLLMTrainingRuntime."""
    name: str = ""
    """Name of the runtime."""
    resourceVersion: str = ""
    """The runtime's resourceVersion when the job copied it."""
    spec: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    """The runtime's spec as copied; merged under the job's own spec on every pass."""


class GoodputBucket(_Model):
    """Five minutes of the job's last hour."""

    model_config = ConfigDict(extra="ignore")

    start: int = 0
    """Unix time the bucket starts (a multiple of 300)."""
    productiveSeconds: float = 0.0
    """Seconds of kept training steps in the bucket."""
    wallSeconds: float = 0.0
    """Wall seconds of the bucket the job ran (or tried to)."""


class TrainingProgress(_Model):
    """How far training is, how fast, and how much of the wall time was kept work (goodput).

    Read from the trainer's metrics on port 9400 of the workers (`llm_trainer_*`), at most one status
    update per job every 30 s (operator setting LLMJOB_PROGRESS_SECONDS). Absent for a program that
    serves no such metrics."""

    model_config = ConfigDict(extra="ignore")

    step: int = 0
    """Last completed training step (lower than highWaterStep while steps are replayed after a restart)."""
    totalSteps: int | None = None
    """Steps the run trains in total; unset when the program does not say."""
    tokensPerSecond: float | None = None
    """Global training throughput of the last step."""
    loss: float | None = None
    """Training loss of the last step."""
    lastSavedStep: int | None = None
    """Step of the newest checkpoint the workers saved."""
    lastSavedTime: str | None = None
    """When that checkpoint was saved (RFC 3339)."""
    eta: str | None = None
    """Time left at the current step time if nothing fails, e.g. 1h3m; unset when totalSteps is unknown."""
    estimatedCompletionTime: str | None = None
    """When training ends at that pace (RFC 3339)."""
    goodput: float | None = None
    """Share of the job's wall time spent on training steps that were kept (0..1), over the job's life:
    restarts, re-rendezvous, checkpoint stalls, replayed steps and waiting below minReplicas count
    against it. Wall time runs from startTime, except while Suspended or Queued."""
    goodputLastHour: float | None = None
    """The same over the last hour (55 to 60 minutes, in 5-minute buckets)."""
    stepTimeSeconds: float | None = None
    """Mean step time between the last two updates."""
    highWaterStep: int = 0
    """Highest step seen: steps beyond it are new work, steps up to it replays."""
    productiveSeconds: float = 0.0
    """Seconds of kept training steps so far (goodput's numerator)."""
    wallSeconds: float = 0.0
    """The job's wall time so far (goodput's denominator)."""
    stepTimeSum: float | None = None
    """The probed worker's llm_trainer_step_time_seconds_sum at the last update."""
    stepTimeCount: int | None = None
    """The probed worker's llm_trainer_step_time_seconds_count at the last update."""
    updateTime: str | None = None
    """When this progress was last updated (RFC 3339, milliseconds)."""
    window: list[GoodputBucket] = Field(default_factory=list, max_length=13)
    """The last hour's productive and wall seconds, in 5-minute buckets (goodputLastHour)."""


class UnhealthyNode(_Model):
    """A node where a worker failed a health check (exit code 78)."""

    model_config = ConfigDict(extra="ignore")

    node: str = ""
    """Node name."""
    check: str = ""
    """The check that failed (checkpoint-write, shared-memory, gpu, nccl, efa, command, straggler, other)."""
    reason: str = ""
    """The worker's termination message (one line)."""
    pod: str = ""
    """The worker pod that found it."""
    time: str = ""
    """When the worker exited (RFC 3339)."""


class TopologyDomain(_Model):
    """One domain (a value of spec.scheduling.topology.key) and how many of the job's workers run there."""

    model_config = ConfigDict(extra="ignore")

    name: str = ""
    """The label's value on the nodes of the domain."""
    workers: int = 0
    """The job's workers bound to nodes of the domain."""


class TopologyStatus(_Model):
    """Where the job's workers are, by spec.scheduling.topology.key."""

    model_config = ConfigDict(extra="ignore")

    key: str = ""
    """The node label the domains are values of."""
    domain: str = ""
    """The survivors' domain: where most workers run (new workers go there); empty before the first is
    bound."""
    domains: list[TopologyDomain] = Field(default_factory=list, max_length=64)
    """Every domain the job's bound workers occupy, most workers first."""
    spread: bool = False
    """The workers occupy more than one domain."""


class RuleFired(_Model):
    """The last firing of a monitoring rule the operator saw (spec.monitoring.rules)."""

    model_config = ConfigDict(extra="ignore")

    rule: str = ""
    """The rule's name."""
    action: str = ""
    """The action taken (replaceNode, restartJob, failJob, restartWorker past its restarts)."""
    worker: str = ""
    """The worker pod whose supervisor fired it (empty: reported by the workers' metrics)."""
    detail: str = ""
    """Why, in one line (from the worker's termination message)."""
    time: str = ""
    """When the worker exited (RFC 3339)."""


class RuleCount(_Model):
    """How often a rule fired in the workers, as their metrics report it (llm_trainer_rule_fired_total)."""

    model_config = ConfigDict(extra="ignore")

    rule: str = ""
    """The rule's name."""
    action: str = ""
    """Its action."""
    count: int = 0
    """Firings the probed workers counted (the highest of them)."""


class LLMTrainingJobStatus(_Model):
    """What the operator observed and decided (written once per reconcile pass)."""

    model_config = ConfigDict(extra="ignore")

    phase: Phase = "Pending"
    """Pending, Queued (waiting for Kueue), Running, Scaling, Restarting, Suspended, Succeeded or Failed."""
    replicas: int = 0
    """Worker pods that exist and are not terminating (scale subresource). A change of this count or of
    readyReplicas alone is written up to 5 s late, 120 s while the job first starts (with the next status
    change, whichever comes first: Running carries the final counts)."""
    readyReplicas: int = 0
    """Worker pods that are Running and Ready (late like replicas: up to 5 s, up to 120 s during the first
    start)."""
    targetReplicas: int = 0
    """The size the operator currently aims at (desired, or smaller after a shrink)."""
    desiredReplicas: int = 0
    """spec.replicas (or maxReplicas) as last seen: a change is a user resize."""
    spareReplicas: int = 0
    """Spare workers the operator aims at beside targetReplicas (spec.spareReplicas, fewer while nodes
    are short)."""
    runningSpares: int = 0
    """Running workers beyond targetReplicas: warm standby, promoted when a member is lost."""
    waitingForCapacity: int = 0
    """Workers Pending beyond the size the job trains at, kept to ask for capacity (an autoscaler such as
    Karpenter launches nodes only for Pending pods); condition WaitingForCapacity."""
    members: int | None = None
    """Workers (pods) in the generation that trains now, as the workers report it: the live membership's
    generation record (recovery inProcess) or the world size in their metrics (restart); unset until
    known. Fewer than readyReplicas minus runningSpares means a running worker is left out."""
    restarts: int = 0
    """Membership changes so far (each one bumps the attempt label of new pods), programs restarted inside
    their pods included."""
    processRestarts: int = 0
    """Programs restarted inside their pods by the runtime's supervisor (recovery layer 2), as the
    workers' metrics report them; each one counts in restarts too."""
    healthFailures: int = 0
    """Workers that failed a pre-flight health check (not restarts; more than maxRestarts fails the job)."""
    unhealthyNodes: list[UnhealthyNode] = Field(default_factory=list, max_length=64)
    """Nodes found unhealthy, newest last (at most 16 kept); new workers of this job avoid them."""
    selector: str = ""
    """Label selector of the worker pods (scale subresource)."""
    observedGeneration: int = 0
    """The spec generation this status reflects."""
    conditions: list[Condition] = Field(default_factory=list)
    """Standard conditions."""
    reason: str = ""
    """Reason of the last phase change."""
    message: str = ""
    """Detail of the last phase change."""
    startTime: str | None = None
    """When the job first ran (RFC 3339)."""
    completionTime: str | None = None
    """When the job Succeeded or Failed (RFC 3339)."""
    lastResizeTime: str | None = None
    """When the target size last changed (RFC 3339)."""
    belowMinSince: str | None = None
    """Since when fewer than minReplicas workers run (RFC 3339); unset when at or above."""
    rendezvousEndpoint: str = ""
    """The endpoint the workers use."""
    runtime: RuntimeSnapshot | None = None
    """The runtime named by spec.runtimeRef, copied when the job first resolved it."""
    progress: TrainingProgress | None = None
    """Training progress and goodput from the workers' metrics; unset when they serve none."""
    topology: TopologyStatus | None = None
    """The domains the workers occupy (jobs with spec.scheduling.topology only)."""
    rulesFired: int = 0
    """Monitoring rule firings seen so far: log rules that ended a worker (termination message) and loss
    rules the workers' metrics report; each also an Event RuleFired. A log rule's event and restartWorker
    firings are in the pod log only (a restart counts in processRestarts)."""
    lastRuleFired: RuleFired | None = None
    """The last firing (of a worker's log rule, or of a loss rule the workers' metrics report)."""
    workerRules: list[RuleCount] = Field(default_factory=list, max_length=64)
    """Loss rules' firings as the workers' metrics last reported them (the base for new Events)."""


class ObjectMeta(_Model):
    """The part of metav1.ObjectMeta the operator reads."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=253)
    """Job name."""
    namespace: str = "default"
    """Namespace."""
    uid: str = ""
    """UID assigned by the apiserver."""
    generation: int = 0
    """Spec generation."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels (a Kueue queue-name label is passed on to the workers)."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations."""


class LLMTrainingJob(_Model):
    """An elastic multi-node LLM training job."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=_cel(RULES_JOB))

    apiVersion: Literal["elasticllm.dev/v1alpha1"] = "elasticllm.dev/v1alpha1"
    """elasticllm.dev/v1alpha1"""
    kind: Literal["LLMTrainingJob"] = "LLMTrainingJob"
    """LLMTrainingJob"""
    metadata: ObjectMeta
    """Standard object metadata."""
    spec: LLMTrainingJobSpec
    """Desired state."""
    status: LLMTrainingJobStatus = Field(default_factory=LLMTrainingJobStatus)
    """Observed state."""

    @property
    def desired_replicas(self) -> int:
        """spec.replicas, or maxReplicas when unset."""
        return self.spec.replicas if self.spec.replicas is not None else self.spec.maxReplicas

    @property
    def spare_replicas(self) -> int:
        """spec.spareReplicas where it applies (inProcess recovery), else 0."""
        return self.spec.spareReplicas if self.spec.failurePolicy.recovery == "inProcess" else 0

    @property
    def nproc_per_node(self) -> int:
        """spec.nprocPerNode, or gpusPerNode, or 1 for CPU-only jobs."""
        if self.spec.nprocPerNode is not None:
            return self.spec.nprocPerNode
        return self.spec.gpusPerNode or 1


class RuntimeMeta(_Model):
    """The part of a runtime's metadata that render and the operator read."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=253)
    """Runtime name."""
    namespace: str = ""
    """Namespace (LLMTrainingRuntime only)."""
    resourceVersion: str = ""
    """Set by the apiserver."""


class LLMTrainingRuntime(_Model):
    """Platform defaults that jobs name in spec.runtimeRef (LLMTrainingRuntime or ClusterLLMTrainingRuntime).

    ``spec`` takes the fields of a job's spec, all optional; it is kept as data here and checked by
    ``llm_operator.api.runtime`` (types, and the CEL rules once merged with a job).
    """

    model_config = ConfigDict(extra="ignore")

    apiVersion: Literal["elasticllm.dev/v1alpha1"] = "elasticllm.dev/v1alpha1"
    """elasticllm.dev/v1alpha1"""
    kind: Literal["LLMTrainingRuntime", "ClusterLLMTrainingRuntime"]
    """LLMTrainingRuntime (namespaced) or ClusterLLMTrainingRuntime (cluster-scoped)."""
    metadata: RuntimeMeta
    """Standard object metadata."""
    spec: dict[str, Any] = Field(default_factory=dict)
    """The job fields this runtime supplies."""
