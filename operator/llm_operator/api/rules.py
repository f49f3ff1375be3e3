"""Cross-field rules of the API as CEL, attached to the schema nodes they check.

The same expressions run in the apiserver (``x-kubernetes-validations``) and in ``llmjob render``
(``llm_operator.api.validate`` evaluates them with cel-python), so both reject the same manifests
with the same messages. ``messageExpression`` carries the offending values.
"""

from __future__ import annotations

from typing import Any

from llm_elastic.contract import LOG_FORMAT_ENV

# Names the operator sets itself; user env with these names would break the torchrun contract.
RESERVED_ENV_NAMES: tuple[str, ...] = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
)
RESERVED_ENV_PREFIXES: tuple[str, ...] = ("PET_", "TORCHELASTIC_", "LLMJOB_")
USER_ENV_NAMES: tuple[str, ...] = (LOG_FORMAT_ENV,)
"""Names under a reserved prefix that belong to the user: knobs of the runtime library in the worker that
the operator never sets (``LLMJOB_LOG_FORMAT``: text or JSON log lines). Jobs and runtimes may set them."""


def reserved_env(name: str) -> bool:
    """Whether the operator owns the environment variable ``name`` (a job or runtime may not set it)."""
    if name in USER_ENV_NAMES:
        return False
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


# ------------------------------------------------------------------------------------ spec.podTemplate
# What the operator owns in a worker pod (docs/api.md, "Pod template"): a pod template that names one of
# these is refused at admission with the field named, never silently overwritten.
TRAINER_CONTAINER = "trainer"
"""The training container's name in every worker pod (and its entry in podTemplate.spec.containers)."""
SHM_VOLUME = "dshm"
FSX_VOLUME = "fsx"
OPERATOR_VOLUMES: tuple[str, ...] = (SHM_VOLUME, FSX_VOLUME)
SHM_PATH = "/dev/shm"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
OPERATOR_MOUNT_PATHS: tuple[str, ...] = (SHM_PATH, TERMINATION_MESSAGE_PATH)
OPERATOR_LABEL_PREFIXES: tuple[str, ...] = ("elasticllm.dev/", "kueue.x-k8s.io/")
OPERATOR_LABELS: tuple[str, ...] = ("app.kubernetes.io/managed-by", "scheduling.x-k8s.io/pod-group")
OPERATOR_ANNOTATION_PREFIXES: tuple[str, ...] = ("elasticllm.dev/",)


ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# A qualified label key: optional DNS-subdomain prefix and '/', then a name (what Kueue's TopologyLevel
# nodeLabel allows).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
TOPOLOGY_KEY = rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
HOSTNAME_KEY = "kubernetes.io/hostname"
ABSOLUTE_PATH = r"^/"
# The pattern apiserver-generated schemas use for resource.Quantity.
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^(\+|-)?{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUMBER}))?$"
QUANTITY_SCHEMA: dict[str, Any] = {"x-llmjob-quantity": True}
# Longest job name: pod hostnames `<job>-worker-<index>` must stay a 63-character DNS label.
MAX_JOB_NAME = 47


# Render-only messages with the offending numbers. The apiserver's CEL cost estimator treats
# string(int) as unbounded, so a messageExpression that concatenates one exceeds the CRD's cost budget;
# those rules carry a static message in the CRD and this richer one in `llmjob render`.
DETAILS: dict[str, str] = {}


def _rule(
    rule: str, message: str, field_path: str = "", reason: str = "FieldValueInvalid", static: str = ""
) -> dict[str, str]:
    """A CEL rule. ``message`` is a CEL messageExpression; with ``static``, the CRD gets ``static`` as its
    plain message and ``message`` is only evaluated by `llmjob render` (see DETAILS)."""
    out = {"rule": rule, "reason": reason}
    if static:
        out["message"] = static
        DETAILS[rule] = message
    else:
        out["messageExpression"] = message
    if field_path:
        out["fieldPath"] = field_path
    return out


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


RULES_JOB: list[dict[str, str]] = [
    _rule(
        f"self.metadata.name.size() <= {MAX_JOB_NAME}",
        f"'metadata.name (' + self.metadata.name + ') must be at most {MAX_JOB_NAME} characters:"
        " worker hostnames <name>-worker-<index> must fit a 63-character DNS label'",
    ),
    _rule(
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "'metadata.name (' + self.metadata.name + ') must be a DNS-1035 label: lower-case letters,"
        " digits and -, starting with a letter'",
    ),
]

# The spec rules hold on a job's spec as written (no defaults: a field the job leaves out may come from
# its runtime, so the apiserver cannot fill it in), on a runtime's spec, and on the merged spec that
# `llmjob render` and the operator check: every rule tolerates an absent field and uses the API default
# (gpusPerNode 8, fsx.mountPath /fsx, rendezvous.backend etcd-v3) where the rule needs one.
_MOUNT = "(has(self.fsx.mountPath) ? self.fsx.mountPath : '/fsx')"
_HAS_FP = "has(self.failurePolicy)"

_PT_MOUNTS = (
    "!has(self.podTemplate) || !has(self.podTemplate.spec) || !has(self.podTemplate.spec.containers)"
    " || self.podTemplate.spec.containers.all(c, !has(c.volumeMounts) || c.volumeMounts.all(m, "
)

SPARES_MESSAGE = (
    "'spec.spareReplicas needs spec.failurePolicy.recovery inProcess: a spare is a warm standby member of"
    " the live membership (with restart recovery every membership change restarts all workers anyway)'"
)

RULES_SPEC: list[dict[str, str]] = [
    _rule(
        "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
        "'spec.minReplicas (' + string(self.minReplicas) + ') must be <= spec.maxReplicas ('"
        " + string(self.maxReplicas) + ')'",
        ".minReplicas",
        static="spec.minReplicas must be <= spec.maxReplicas",
    ),
    _rule(
        "!has(self.replicas) || ((!has(self.minReplicas) || self.replicas >= self.minReplicas)"
        " && (!has(self.maxReplicas) || self.replicas <= self.maxReplicas))",
        "'spec.replicas (' + string(self.replicas) + ') must be within [spec.minReplicas,"
        " spec.maxReplicas] = [' + string(self.minReplicas) + ', ' + string(self.maxReplicas) + ']'",
        ".replicas",
        static="spec.replicas must be within [spec.minReplicas, spec.maxReplicas]",
    ),
    _rule(
        "!has(self.fsx) || !has(self.checkpointDir) || (has(self.fsx.mountPath)"
        " ? (self.checkpointDir == self.fsx.mountPath || self.checkpointDir.startsWith("
        "self.fsx.mountPath.endsWith('/') ? self.fsx.mountPath : self.fsx.mountPath + '/'))"
        " : (self.checkpointDir == '/fsx' || self.checkpointDir.startsWith('/fsx/')))",
        "'spec.checkpointDir (' + self.checkpointDir + ') must be under spec.fsx.mountPath ('"
        f" + {_MOUNT} + ') so every worker sees the same checkpoints'",
        ".checkpointDir",
    ),
    _rule(
        "!has(self.rendezvous) || !has(self.rendezvous.backend)"
        " || self.rendezvous.backend in ['etcd-v3', 'c10d']",
        "'spec.rendezvous.backend (' + self.rendezvous.backend + ') must be one of etcd-v3, c10d'",
        ".rendezvous.backend",
        "FieldValueInvalid",
    ),
    _rule(
        "!has(self.rendezvous) || !has(self.rendezvous.endpoint) || self.rendezvous.endpoint == ''"
        " || self.rendezvous.endpoint.matches('^[A-Za-z0-9.-]+:[0-9]{1,5}$')",
        "'spec.rendezvous.endpoint (' + self.rendezvous.endpoint + ') must be host:port, or empty for an"
        " operator-managed rendezvous server'",
        ".rendezvous.endpoint",
    ),
    _rule(
        "!has(self.nprocPerNode) || (has(self.gpusPerNode)"
        " ? (self.gpusPerNode == 0 || self.nprocPerNode <= self.gpusPerNode) : self.nprocPerNode <= 8)",
        "'spec.nprocPerNode (' + string(self.nprocPerNode) + ') must be <= spec.gpusPerNode ('"
        " + string(has(self.gpusPerNode) ? self.gpusPerNode : 8) + '): one process per GPU at most'",
        ".nprocPerNode",
        static="spec.nprocPerNode must be <= spec.gpusPerNode: one process per GPU at most",
    ),
    _rule(
        f"!{_HAS_FP} || !has(self.failurePolicy.recovery) || self.failurePolicy.recovery != 'inProcess'"
        " || !has(self.rendezvous) || !has(self.rendezvous.backend) || self.rendezvous.backend == 'etcd-v3'",
        "'spec.failurePolicy.recovery inProcess needs spec.rendezvous.backend etcd-v3 (live membership"
        " uses etcd leases and watches, which the c10d store lacks)'",
        ".failurePolicy.recovery",
    ),
    _rule(
        f"!has(self.spareReplicas) || self.spareReplicas == 0 || !{_HAS_FP}"
        " || !has(self.failurePolicy.recovery) || self.failurePolicy.recovery == 'inProcess'",
        SPARES_MESSAGE,
        ".spareReplicas",
    ),
    _rule(
        f"!{_HAS_FP} || !has(self.failurePolicy.nonRetryableExitCodes)"
        " || self.failurePolicy.nonRetryableExitCodes.all(c, c >= 1 && c <= 255)",
        "'spec.failurePolicy.nonRetryableExitCodes must be exit codes in [1, 255]'",
        ".failurePolicy.nonRetryableExitCodes",
    ),
    _rule(
        _PT_MOUNTS + f"!(m.mountPath in {_cel_list(OPERATOR_MOUNT_PATHS)})"
        f" && (!has(self.fsx) || m.mountPath != {_MOUNT})))",
        "'spec.podTemplate.spec.containers[trainer].volumeMounts: the mount paths "
        + ", ".join(OPERATOR_MOUNT_PATHS)
        + " and spec.fsx.mountPath are owned by the operator'",
        ".podTemplate.spec.containers",
        "FieldValueForbidden",
    ),
]


def _required(field: str, check: str = "") -> dict[str, str]:
    return _rule(
        f"has(self.runtimeRef) || {check or f'has(self.{field})'}",
        f"'spec.{field} is required (or spec.runtimeRef naming a runtime that sets it)'",
        f".{field}",
        "FieldValueRequired",
    )


# A job's spec only (not a runtime's): what a job without spec.runtimeRef must set itself. With a
# runtimeRef the apiserver cannot know what the runtime supplies; the operator and `llmjob render`
# check the merged spec (docs/decisions.md, R2).
RULES_JOB_SPEC: list[dict[str, str]] = [
    _required("minReplicas"),
    _required("maxReplicas"),
    _required("image"),
    _required("fsx.claimName", "!has(self.fsx) || has(self.fsx.claimName)"),
    # Spares without recovery inProcess in the job itself: the runtime may set it (RULES_SPEC then checks
    # the merged spec, where recovery defaults to restart).
    _required(
        "scheduling.topology.key",
        "!has(self.scheduling) || !has(self.scheduling.topology) || has(self.scheduling.topology.key)",
    ),
    _rule(
        "has(self.runtimeRef) || !has(self.spareReplicas) || self.spareReplicas == 0"
        f" || ({_HAS_FP} && has(self.failurePolicy.recovery) && self.failurePolicy.recovery == 'inProcess')",
        SPARES_MESSAGE,
        ".spareReplicas",
    ),
]

RULES_ENV_VAR: list[dict[str, str]] = [
    _rule(
        f"self.name in {_cel_list(USER_ENV_NAMES)} || (!(self.name in {_cel_list(RESERVED_ENV_NAMES)})"
        + "".join(f" && !self.name.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES)
        + ")",
        "'spec.env ' + self.name + ' is reserved: the operator sets it for torchrun (names "
        + ", ".join(RESERVED_ENV_NAMES[:4])
        + ", ..., and prefixes "
        + ", ".join(p + "*" for p in RESERVED_ENV_PREFIXES)
        + " are owned by the operator, except "
        + ", ".join(USER_ENV_NAMES)
        + ")'",
        ".name",
        "FieldValueForbidden",
    ),
    _rule(
        "!(has(self.value) && has(self.valueFrom))",
        "'spec.env ' + self.name + ' sets both value and valueFrom; use one'",
    ),
]

RULES_FSX: list[dict[str, str]] = [
    _rule(
        "!has(self.mountPath) || (self.mountPath.startsWith('/') && self.mountPath != '/'"
        " && !self.mountPath.contains('..'))",
        "'spec.fsx.mountPath (' + self.mountPath + ') must be an absolute path other than / without ..'",
        ".mountPath",
    ),
]


def _no_prefix(var: str, prefixes: tuple[str, ...]) -> str:
    return " && ".join(f"!{var}.startsWith('{p}')" for p in prefixes)


RULES_POD_METADATA: list[dict[str, str]] = [
    _rule(
        f"!has(self.labels) || self.labels.all(k, {_no_prefix('k', OPERATOR_LABEL_PREFIXES)}"
        f" && !(k in {_cel_list(OPERATOR_LABELS)}))",
        "'spec.podTemplate.metadata.labels: keys under "
        + ", ".join(p + "*" for p in OPERATOR_LABEL_PREFIXES)
        + " and "
        + ", ".join(OPERATOR_LABELS)
        + " are owned by the operator (it selects its workers on them; Kueue labels go on the job"
        " metadata)'",
        ".labels",
        "FieldValueForbidden",
    ),
    _rule(
        f"!has(self.annotations) || self.annotations.all(k, {_no_prefix('k', OPERATOR_ANNOTATION_PREFIXES)})",
        "'spec.podTemplate.metadata.annotations: keys under "
        + ", ".join(p + "*" for p in OPERATOR_ANNOTATION_PREFIXES)
        + " are owned by the operator'",
        ".annotations",
        "FieldValueForbidden",
    ),
]

RULES_POD_VOLUME: list[dict[str, str]] = [
    _rule(
        f"!(self.name in {_cel_list(OPERATOR_VOLUMES)})",
        "'spec.podTemplate.spec.volumes: the names "
        + " and ".join(OPERATOR_VOLUMES)
        + " are owned by the operator (/dev/shm from spec.sharedMemory, the FSx volume from spec.fsx)'",
        ".name",
        "FieldValueForbidden",
    ),
]

RULES_TRAINER_ENTRY: list[dict[str, str]] = [
    _rule(
        f"self.name == '{TRAINER_CONTAINER}'",
        f"'spec.podTemplate.spec.containers: only the training container (name: {TRAINER_CONTAINER}) can be"
        " listed, to add volumeMounts and envFrom; a sidecar goes in spec.podTemplate.spec.initContainers"
        " with restartPolicy: Always (a second regular container would keep a worker running after its"
        " trainer exits)'",
        ".name",
        "FieldValueInvalid",
    ),
]

RULES_INIT_CONTAINER: list[dict[str, str]] = [
    _rule(
        f"self.name != '{TRAINER_CONTAINER}'",
        f"'spec.podTemplate.spec.initContainers: the name {TRAINER_CONTAINER} is the training container'",
        ".name",
        "FieldValueForbidden",
    ),
]

RULES_TOPOLOGY: list[dict[str, str]] = [
    _rule(
        f"!has(self.key) || self.key != '{HOSTNAME_KEY}'",
        f"'spec.scheduling.topology.key {HOSTNAME_KEY} would put every worker on one node (a worker"
        " takes a node): name a network level, e.g. topology.k8s.aws/network-node-layer-3'",
        ".key",
    ),
]

# ------------------------------------------------------------------------------------ spec.monitoring
# Rules the job follows (docs/elasticity.md, "Monitoring rules"): log rules run in the worker's supervisor
# (llm_elastic.supervise), loss rules in the runtime's step commit. Actions by kind of rule:
LOG_RULE_ACTIONS: tuple[str, ...] = ("event", "restartWorker", "replaceNode", "restartJob", "failJob")
LOSS_RULE_ACTIONS: tuple[str, ...] = ("event", "skipStep", "rollback", "restartJob", "failJob")
RULE_ACTIONS: tuple[str, ...] = (*LOG_RULE_ACTIONS, "skipStep", "rollback")
RULE_OPERATORS: tuple[str, ...] = ("lt", "lte", "gt", "gte")
# An RE2 pattern with a capturing group: an unescaped '(' that is not '(?...' or is a named group '(?P<'.
# The apiserver's approximation (a '(' inside a character class counts too); the operator and `llmjob
# render` count the groups exactly with RE2 (``llm_operator.api.monitoring``).
CAPTURE_GROUP = r"(^|[^\\])(\\\\)*\((\?P?<|[^?*])"

_R = "'spec.monitoring.rules[' + self.name + ']"
# On the logPattern string itself: it must compile as RE2 (CEL's matches() is RE2). An invalid pattern makes
# the rule an evaluation error, which the apiserver reports on this field with RE2's reason (a ternary,
# because || and && would absorb the error).
RULES_LOG_PATTERN: list[dict[str, str]] = [
    _rule("''.matches(self) ? true : true", "'spec.monitoring.rules[].logPattern: not a valid RE2 pattern'"),
]
RULES_MONITORING_RULE: list[dict[str, str]] = [
    _rule(
        "has(self.logPattern) != has(self.loss)",
        _R + ": set logPattern (a log rule) or loss (a loss rule), exactly one'",
        ".logPattern",
        "FieldValueRequired",
    ),
    _rule(
        f"!has(self.logPattern) || self.action in {_cel_list(LOG_RULE_ACTIONS)}",
        _R
        + ".action: ' + self.action + ' is not an action of a log rule (one of "
        + ", ".join(LOG_RULE_ACTIONS)
        + ")'",
        ".action",
        "FieldValueInvalid",
    ),
    _rule(
        f"!has(self.loss) || self.action in {_cel_list(LOSS_RULE_ACTIONS)}",
        _R
        + ".action: ' + self.action + ' is not an action of a loss rule (one of "
        + ", ".join(LOSS_RULE_ACTIONS)
        + ")'",
        ".action",
        "FieldValueInvalid",
    ),
    _rule(
        "!has(self.loss) || !(has(self.expectedStartCutOffSeconds) || has(self.expectedRecurringSeconds)"
        " || has(self.metricThreshold) || has(self.operator) || has(self.dataPoints))",
        _R + ": a loss rule takes no expectedStartCutOffSeconds, expectedRecurringSeconds,"
        " metricThreshold, operator or dataPoints (they belong to log rules)'",
        ".loss",
        "FieldValueForbidden",
    ),
    _rule(
        "has(self.metricThreshold) == has(self.operator)",
        _R + ": metricThreshold and operator go together (the number is compared with the threshold by"
        " the operator: lt, lte, gt or gte)'",
        ".metricThreshold",
        "FieldValueRequired",
    ),
    _rule(
        "!has(self.dataPoints) || has(self.metricThreshold)",
        _R + ".dataPoints: only a rule with metricThreshold takes dataPoints'",
        ".dataPoints",
        "FieldValueForbidden",
    ),
    _rule(
        f"!has(self.metricThreshold) || !has(self.logPattern) || self.logPattern.matches(r'{CAPTURE_GROUP}')",
        _R + ".logPattern: metricThreshold needs a capture group in logPattern (its first group is the"
        " number compared), e.g. tokens/s (\\\\d+)'",
        ".logPattern",
    ),
]

# A loss rule needs a program known to run the llm_elastic runtime (its step commit evaluates the rule):
# with recovery inProcess the program must be one (docs/byo-training.md); under torchrun (recovery
# restart) it may be any program. On any spec (tolerant of an unset recovery: a runtime's, or the merged
# spec with defaults), and on a job's own spec without runtimeRef (recovery must be set there).
_LOSS_RULES = (
    "has(self.monitoring) && has(self.monitoring.rules) && self.monitoring.rules.exists(r, has(r.loss))"
)
_LOSS_MESSAGE = (
    "'spec.monitoring.rules: a loss rule needs spec.failurePolicy.recovery inProcess (the step commit of"
    " the llm_elastic runtime evaluates it; under torchrun the program may be any program)'"
)
RULES_SPEC.append(
    _rule(
        f"!({_LOSS_RULES}) || !{_HAS_FP} || !has(self.failurePolicy.recovery)"
        " || self.failurePolicy.recovery == 'inProcess'",
        _LOSS_MESSAGE,
        ".monitoring.rules",
        "FieldValueForbidden",
    )
)
RULES_JOB_SPEC.append(
    _rule(
        f"has(self.runtimeRef) || !({_LOSS_RULES}) || ({_HAS_FP} && has(self.failurePolicy.recovery)"
        " && self.failurePolicy.recovery == 'inProcess')",
        _LOSS_MESSAGE,
        ".monitoring.rules",
        "FieldValueForbidden",
    )
)
