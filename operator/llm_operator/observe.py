"""Compact, immutable views of the pods and nodes the operator watches (what the kopf indexes hold)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llm_operator import labels

TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
# A node that is about to go away: Karpenter disruption, AWS Node Termination Handler (spot, rebalance,
# scheduled maintenance, ASG lifecycle), a cordon during a drain.
TERMINATION_TAINTS = (
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/rebalance-recommendation",
    "aws-node-termination-handler/scheduled-maintenance",
    "aws-node-termination-handler/asg-lifecycle-termination",
)


def parse_time(value: Any) -> float | None:
    """RFC 3339 (or datetime) to epoch seconds; None stays None."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    text = str(value).replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def format_time(epoch: float) -> str:
    """Epoch seconds to the RFC 3339 form Kubernetes writes."""
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class PodView:
    """A worker pod as the operator sees it."""

    name: str
    uid: str
    index: int
    attempt: int
    phase: str
    ready: bool
    node: str
    created: float
    deleting: bool
    exit_code: int | None
    reason: str
    unschedulable: bool
    gpus: int = 0
    ip: str = ""
    """status.podIP (where the trainer's metrics endpoint is), empty until assigned."""
    started: float | None = None
    """When the container last started running (epoch seconds), None while it has not."""
    message: str = ""
    """The terminated container's termination message (a health failure's reason, exit code 78)."""
    finished: float | None = None
    """When the container terminated (epoch seconds), None while it has not."""
    avoided: tuple[str, ...] = ()
    """Nodes the pod was created to stay off (its ``metadata.name NotIn`` terms), sorted."""

    @property
    def terminal(self) -> bool:
        """Succeeded or Failed: the container will not run again (restartPolicy Never)."""
        return self.phase in ("Succeeded", "Failed")


def pod_view(body: dict[str, Any]) -> PodView | None:
    """Parse a worker pod body; None when it is not one of ours."""
    meta = body.get("metadata", {})
    lbl = meta.get("labels") or {}
    try:
        index = int(lbl.get(labels.REPLICA_INDEX, ""))
    except ValueError:
        return None
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    unschedulable = any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )
    exit_code: int | None = None
    started: float | None = None
    message = ""
    finished: float | None = None
    for cs in status.get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated is not None and terminated.get("exitCode") is not None:
            exit_code = int(terminated["exitCode"])
            message = str(terminated.get("message") or "")[:1024]
            finished = parse_time(terminated.get("finishedAt"))
        running = (cs.get("state") or {}).get("running")
        if running is not None:
            started = parse_time(running.get("startedAt")) or started
    gpus = 0
    for container in spec.get("containers") or []:
        limit = ((container.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
        if limit is not None:
            gpus += int(str(limit))
    try:
        attempt = int(lbl.get(labels.ATTEMPT, "0"))
    except ValueError:
        attempt = 0
    return PodView(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        index=index,
        attempt=attempt,
        phase=status.get("phase") or "Pending",
        ready=ready,
        node=spec.get("nodeName") or "",
        created=parse_time(meta.get("creationTimestamp")) or 0.0,
        deleting=meta.get("deletionTimestamp") is not None,
        exit_code=exit_code,
        reason=status.get("reason") or "",
        unschedulable=unschedulable,
        gpus=gpus,
        ip=status.get("podIP") or "",
        started=started,
        message=message,
        finished=finished,
        avoided=_avoided(meta),
    )


def _avoided(meta: dict[str, Any]) -> tuple[str, ...]:
    text = str((meta.get("annotations") or {}).get(labels.AVOIDED_NODES) or "")
    return tuple(sorted({name for name in text.split(",") if name}))


@dataclass(frozen=True)
class NodeView:
    """A node's health and placement facts."""

    name: str
    ready: bool
    not_ready_since: float | None
    unschedulable: bool
    taints: tuple[tuple[str, str, float | None], ...]  # (key, effect, timeAdded)
    labels: tuple[tuple[str, str], ...]
    allocatable_gpus: int
    failing: tuple[tuple[str, float | None], ...] = ()
    """(type, since) of the node conditions the platform reports unhealthy (the operator's
    nodeHealth.conditions: the EKS node monitoring agent's by default), by type."""

    def taint(self, key: str) -> tuple[str, str, float | None] | None:
        """The first taint with this key, if any."""
        return next((t for t in self.taints if t[0] == key), None)

    def label(self, key: str) -> str | None:
        """A label's value, if set."""
        return next((v for k, v in self.labels if k == key), None)


def node_view(body: dict[str, Any], unhealthy: Mapping[str, str] | None = None) -> NodeView:
    """Parse a node body; ``unhealthy`` maps a condition type to the status that means the node is
    unhealthy (``Settings.node_conditions``)."""
    meta = body.get("metadata", {})
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    watched = unhealthy or {}
    failing = tuple(
        sorted(
            (str(c["type"]), parse_time(c.get("lastTransitionTime")))
            for c in status.get("conditions") or []
            if c.get("type") in watched and c.get("status") == watched[c["type"]]
        )
    )
    ready_cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    ready = ready_cond is not None and ready_cond.get("status") == "True"
    since = None if ready or ready_cond is None else parse_time(ready_cond.get("lastTransitionTime"))
    taints = tuple(
        (t.get("key", ""), t.get("effect", ""), parse_time(t.get("timeAdded")))
        for t in spec.get("taints") or []
    )
    gpus = (status.get("allocatable") or {}).get("nvidia.com/gpu", "0")
    try:
        allocatable = int(str(gpus))
    except ValueError:
        allocatable = 0
    return NodeView(
        name=meta.get("name", ""),
        ready=ready,
        not_ready_since=since,
        unschedulable=bool(spec.get("unschedulable")),
        taints=taints,
        labels=tuple(sorted((meta.get("labels") or {}).items())),
        allocatable_gpus=allocatable,
        failing=failing,
    )
