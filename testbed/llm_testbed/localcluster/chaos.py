"""Failure injection on the local cluster: what EKS does to GPU nodes and pods, on demand.

Every function talks to the cluster of ``kube`` (default: our kubectl against ``$KUBECONFIG``) and, with
``wait=True``, returns only once the cluster shows the resulting state, so callers never sleep.

- :func:`node_not_ready` / :func:`node_ready`: the node's kubelet dies / comes back. The node's Lease is
  handed to a foreign holder, so kwok (which manages every node, always) stops renewing it and treats
  the node as read-only: no status, its pods frozen; the node reports NotReady and its pods not ready,
  and a pod deleted there stays Terminating until it is force-deleted, as on a dead node. Deleting the
  foreign Lease gives the node back to kwok. (Switching kwok's management off and on instead races its
  lease queue and stalls other nodes' renewals: docs/decisions.md, "Dead fake nodes".)
- :func:`delete_node` / :func:`add_node`: capacity leaves / comes back.
- :func:`taint_for_termination`: the taint Karpenter, the AWS Node Termination Handler (spot
  interruption) or a cordon puts on a node that is about to go; :func:`clear_termination` undoes it.
- :func:`fail_pod`: the pod's containers exit with a given code (kwok Stage keyed on a pod annotation).
- :func:`node_fault` / :func:`clear_node_fault`: a node whose pods see read-only volumes, a CPU quota or a
  tiny /dev/shm (real for their processes; only with the pod runner, ``cluster up --run-pods``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, get_args

from llm_testbed.kubeletnodes import chaos as kubelet_chaos
from llm_testbed.localcluster import marks, nodes
from llm_testbed.localcluster.errors import LocalClusterError
from llm_testbed.localcluster.kubectl import Kubectl, KubectlError
from llm_testbed.localcluster.waiting import poll

if TYPE_CHECKING:
    from llm_testbed.kubeletnodes.tier import KubeletTier

TerminationKind = Literal["karpenter", "spot", "cordon"]
TERMINATION_KINDS: tuple[str, ...] = get_args(TerminationKind)
NOT_READY_TAINT = "node.kubernetes.io/not-ready"  # kube-controller-manager: Ready=False
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"  # kube-controller-manager: Ready=Unknown
LOST_NODE_TAINTS = (NOT_READY_TAINT, UNREACHABLE_TAINT)
LOST_MESSAGE = "Kubelet stopped posting node status."
SPOT_EVENT_ID = "spot-itn-llmjob-local"  # NTH puts the interruption event's id in the taint value
FaultKind = Literal["readonly-volumes", "cpu", "shm"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
FAULT_DEFAULTS: dict[str, str] = {"readonly-volumes": "true", "cpu": "0.1", "shm": "1Mi"}
DEFAULT_TIMEOUT_S = 30.0
CONFLICT_RETRIES = 10
LEASE_NAMESPACE = "kube-node-lease"
DEAD_HOLDER = "llmjob-chaos/dead-kubelet"
"""Holder of a dead node's Lease: kwok never renews a Lease another holder has not let expire."""
DEAD_LEASE_SECONDS = 7 * 24 * 3600
KARPENTER_FINALIZER = "karpenter.sh/termination"  # on the nodes Karpenter launched
KUBELET_JOIN_S = 90.0  # a new kubelet node: containerd and kubelet start, register, report Ready


def termination_taint(kind: TerminationKind) -> dict[str, str]:
    """The taint a node carries once it is marked for termination by ``kind``."""
    if kind == "karpenter":
        return {"key": marks.KARPENTER_DISRUPTED_TAINT, "effect": "NoSchedule"}
    if kind == "spot":
        return {"key": marks.SPOT_INTERRUPTION_TAINT, "value": SPOT_EVENT_ID, "effect": "NoSchedule"}
    if kind == "cordon":
        return {"key": marks.UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    raise LocalClusterError(f"unknown termination kind {kind!r}; use one of {', '.join(TERMINATION_KINDS)}")


def _kubelet_tier(kube: Kubectl, node: str) -> KubeletTier | None:
    """The kubelet tier of ``node``'s cluster when ``node`` is one of its kubelet nodes (real processes)."""
    tier = kubelet_chaos.tier_of(kube)
    return tier if kubelet_chaos.owns(tier, node) else None


def _kube(kube: Kubectl | None) -> Kubectl:
    return kube if kube is not None else Kubectl.from_env()


def _node(kube: Kubectl, node: str) -> dict[str, Any]:
    obj = kube.get("node", node)
    if obj is None:
        raise LocalClusterError(f"node {node} does not exist")
    return obj


def condition(obj: dict[str, Any], kind: str) -> str | None:
    """Status ("True"/"False"/"Unknown") of condition ``kind`` of a node or pod, ``None`` if absent."""
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            status: str = cond.get("status", "")
            return status
    return None


def _taint_keys(node: dict[str, Any]) -> set[str]:
    return {t["key"] for t in node.get("spec", {}).get("taints", []) or []}


def is_ready(node: dict[str, Any]) -> bool:
    """Ready=True and free of the not-ready/unreachable taints: pods can land there."""
    return condition(node, "Ready") == "True" and not _taint_keys(node) & set(LOST_NODE_TAINTS)


def pods_on_node(kube: Kubectl, node: str) -> list[dict[str, Any]]:
    return kube.items("pods", all_namespaces=True, fields=f"spec.nodeName={node}")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------------------------- node health
def node_not_ready(
    node: str, *, kube: Kubectl | None = None, wait: bool = True, timeout: float = DEFAULT_TIMEOUT_S
) -> float:
    """The node's kubelet dies: kwok stops acting for it (no status, no Lease; its pods are frozen).

    What kube-controller-manager would do once its grace period ran out happens at once: the node's
    conditions turn Unknown (``NodeStatusUnknown``, as a lost node shows on EKS) and its pods are marked
    not ready, with a ``NodeNotReady`` event each. A pod deleted there stays Terminating until it is
    force-deleted. With ``wait``, returns once kube-controller-manager has tainted the node unreachable.

    Returns the moment the node died (``time.time()`` once the apiserver holds the node's mark, just before
    the pod runner stops its pods), which is where a measurement of recovery starts: the bookkeeping before
    it is the test bed's, not the loss.
    """
    k = _kube(kube)
    _node(k, node)
    tier = _kubelet_tier(k, node)
    if tier is not None:
        return kubelet_chaos.node_not_ready(tier, node, wait=wait, timeout=timeout)
    # The pods' own mark goes first, while they still run: it keeps every kwok pod Stage off them until
    # kwok has learnt from its watch that the node's Lease is no longer its own (no "ready again", no
    # finished deletion). Marking them before the kill keeps these calls out of the time between the
    # loss and the status below, which is what wakes the operator (and so ends a survivor's wait).
    for pod in pods_on_node(k, node):
        _mark_on_dead_node(k, pod, on=True)
    # The Lease, also before the loss: from then on kwok leaves the node alone, so nothing "repairs" the
    # status written below (its pods keep running: the pod runner runs them). Then the node's mark (no node
    # Stage matches a marked node, and the pod runner stops its pods): the loss. Between it and the status
    # that signals it, one request: the Lease's two (read, patch) would add ~250 ms of test bed to every
    # measured recovery (docs/benchmarks.md, "The test bed's share of a loss"). The loss starts once the
    # apiserver holds the mark (the pod runner's watch sees it, then stops the pods), not when ``kubectl``
    # starts: its own start-up (~0.1 s here) is the test bed's, so the moment is taken after it returns.
    hold_lease(k, node)
    k.run("label", "node", node, f"{marks.NODE_NOT_READY_LABEL}=true", "--overwrite")
    died_at = time.time()
    now = _now()
    lost = [
        {"type": kind, "status": "Unknown", "reason": "NodeStatusUnknown", "message": LOST_MESSAGE,
         "lastTransitionTime": now}
        for kind in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
    ]  # fmt: skip
    k.patch("node", node, {"status": {"conditions": lost}}, patch_type="strategic", subresource="status")
    for pod in pods_on_node(k, node):
        # A pod bound there after the first listing is marked now.
        unmarked = marks.POD_ON_DEAD_NODE_LABEL not in (pod["metadata"].get("labels") or {})
        if unmarked and not _mark_on_dead_node(k, pod, on=True):
            continue
        if condition(pod, "Ready") == "True":
            _mark_pod_not_ready(k, pod, node, now)
    if wait:
        poll(
            lambda: UNREACHABLE_TAINT in _taint_keys(_node(k, node)),
            timeout=timeout,
            what=f"kube-controller-manager to taint node {node} {UNREACHABLE_TAINT}",
        )
    return died_at


def _mark_on_dead_node(kube: Kubectl, pod: dict[str, Any], on: bool) -> bool:
    """Set or remove the pod's "on a dead node" label, of that pod only; False when it is gone or another
    pod took its name (:func:`_patch_pod`)."""
    label = {marks.POD_ON_DEAD_NODE_LABEL: "true" if on else None}  # None: a merge patch removes it
    return _patch_pod(kube, pod, {"metadata": {"labels": label}}, patch_type="merge")


def _patch_pod(
    kube: Kubectl,
    pod: dict[str, Any],
    patch: dict[str, Any],
    *,
    patch_type: str,
    subresource: str | None = None,
) -> bool:
    """Patch the pod as it was listed, conditioned on its uid: False when it is gone or replaced.

    Never by name alone: an operator replaces a lost worker under the same name within milliseconds, and a
    patch meant for the pod on a dead node (not ready, "on a dead node") landed on its replacement, which
    nothing ever reported ready again (CI 2026-12-07: the job stayed Restarting, ready 3 of 4)."""
    meta = pod["metadata"]
    body = {**patch, "metadata": {**patch.get("metadata", {}), "uid": meta["uid"]}}
    try:
        kube.patch("pod", meta["name"], body, namespace=meta["namespace"], patch_type=patch_type,
                   subresource=subresource)  # fmt: skip
    except KubectlError as exc:
        if exc.not_found or exc.replaced:
            return False
        raise
    return True


def _mark_pod_not_ready(kube: Kubectl, pod: dict[str, Any], node: str, now: str) -> None:
    meta = pod["metadata"]
    ready = {"status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}]}}
    if not _patch_pod(kube, pod, ready, patch_type="strategic", subresource="status"):
        return  # deleted or replaced meanwhile: nothing left to mark
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta["uid"]},
        "reason": "NodeNotReady",
        "message": "Node is not ready",
        "type": "Warning",
        "source": {"component": "node-controller", "host": node},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }  # fmt: skip
    kube.run("create", "-f", "-", input=json.dumps(event))


def node_ready(
    node: str, *, kube: Kubectl | None = None, wait: bool = True, timeout: float = DEFAULT_TIMEOUT_S
) -> None:
    """Undo :func:`node_not_ready`: the kubelet is back and kwok manages the node again.

    kwok's Stages report the node Ready, its running pods ready again, and finish the deletions that
    waited; kube-controller-manager lifts the taints. With ``wait``, returns once all that is visible.
    """
    k = _kube(kube)
    _node(k, node)
    tier = _kubelet_tier(k, node)
    if tier is not None:
        kubelet_chaos.node_ready(tier, node, wait=wait, timeout=timeout)
        return
    k.run("label", "node", node, f"{marks.NODE_NOT_READY_LABEL}-")
    release_lease(k, node)  # kwok creates a new one at its next try (within a quarter lease) and acts again
    # The pods' marks go once kwok holds the node again: kwok drops a pod event of a node it does not hold,
    # and a pod unmarked before kwok took the node back stayed not ready (seen under load).
    poll(lambda: _kwok_holds(k, node), timeout=timeout, what=f"kwok to take node {node}'s Lease back")
    for pod in pods_on_node(k, node):
        if marks.POD_ON_DEAD_NODE_LABEL in (pod["metadata"].get("labels") or {}):
            _mark_on_dead_node(k, pod, on=False)
    if not wait:
        return
    poll(lambda: is_ready(_node(k, node)), timeout=timeout, what=f"node {node} to be Ready and untainted")

    def pods_settled() -> bool:
        for pod in pods_on_node(k, node):
            meta, phase = pod["metadata"], pod["status"].get("phase")
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                return False  # kwok finishes the deletion
            exiting = marks.POD_EXIT_CODE_ANNOTATION in meta.get("annotations", {})
            if phase == "Running" and condition(pod, "Ready") != "True" and not exiting:
                return False  # kwok reports it ready again
        return True

    poll(pods_settled, timeout=timeout, what=f"the pods on node {node} to be ready again")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def hold_lease(kube: Kubectl, node: str) -> None:
    """Take ``node``'s Lease from kwok: a foreign holder with a week-long lease. kwok then neither renews
    it nor acts for the node or its pods (it acts only for nodes whose Lease it holds). ``renewTime``
    stays as kwok last wrote it, so kube-controller-manager sees no heartbeat in the hand-over."""
    spec = {"holderIdentity": DEAD_HOLDER, "leaseDurationSeconds": DEAD_LEASE_SECONDS}
    for _ in range(CONFLICT_RETRIES):
        if kube.get("lease", node, LEASE_NAMESPACE) is not None:
            try:
                kube.patch("lease", node, {"spec": spec}, namespace=LEASE_NAMESPACE)
                return
            except KubectlError as exc:
                if not exc.not_found:
                    raise
                continue  # deleted meanwhile: create it
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node, "namespace": LEASE_NAMESPACE},
            "spec": {**spec, "renewTime": _micro_now()},
        }
        if kube.create(lease):
            return
    raise LocalClusterError(f"the Lease of node {node} kept changing under us: gave up")


def _kwok_holds(kube: Kubectl, node: str) -> bool:
    """Whether the node's Lease exists and is held by kwok (not by :func:`hold_lease`)."""
    lease = kube.get("lease", node, LEASE_NAMESPACE)
    holder = (lease or {}).get("spec", {}).get("holderIdentity")
    return lease is not None and bool(holder) and holder != DEAD_HOLDER


def release_lease(kube: Kubectl, node: str) -> None:
    """Undo :func:`hold_lease`: delete the Lease if we hold it (kwok makes a new one and acts again)."""
    lease = kube.get("lease", node, LEASE_NAMESPACE)
    if lease is None or lease.get("spec", {}).get("holderIdentity") != DEAD_HOLDER:
        return
    kube.run("delete", "lease", node, "--namespace", LEASE_NAMESPACE, "--ignore-not-found")


# ---------------------------------------------------------------------------------------- capacity
def delete_node(
    node: str, *, kube: Kubectl | None = None, wait: bool = True, timeout: float = DEFAULT_TIMEOUT_S
) -> None:
    """Remove the Node object (the instance is gone). Its pods are left to the pod garbage collector.

    Its Lease is taken from kwok first and deleted after, so kwok's lease worker is never mid-renewal
    when the node goes, and a node added later under the same name starts with a Lease of its own.

    A node that Karpenter launched carries its termination finalizer: Karpenter would drain a Ready node
    gracefully before letting it go. An instance that is gone has no kubelet, so the node dies first
    (:func:`node_not_ready`); Karpenter then sees a NotReady node whose instance no longer exists and
    lets it go at once, as it does on EKS, and deletes its NodeClaim."""
    k = _kube(kube)
    obj = _node(k, node)
    tier = _kubelet_tier(k, node)
    if tier is not None:
        kubelet_chaos.delete_node(tier, node, wait=wait, timeout=timeout)
        return
    if KARPENTER_FINALIZER in (obj["metadata"].get("finalizers") or []) and is_ready(obj):
        node_not_ready(node, kube=k, wait=False)
    hold_lease(k, node)
    k.run(
        "delete",
        "node",
        node,
        f"--wait={'true' if wait else 'false'}",
        f"--timeout={int(timeout)}s",
        timeout=timeout + 10,
    )
    release_lease(k, node)


def add_node(
    name: str | None = None,
    *,
    kind: nodes.NodeKind = "gpu",
    zone: str | None = None,
    kube: Kubectl | None = None,
    wait: bool = True,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> str:
    """Add a fake node shaped like the others of ``kind`` (default: the next free ``<kind>-node-<i>``)."""
    if kind not in nodes.SHAPES:
        raise LocalClusterError(f"unknown node kind {kind!r}; use gpu or cpu")
    k = _kube(kube)
    existing = {n["metadata"]["name"] for n in k.items("nodes")}
    index = 0
    if name is None:
        while nodes.node_name(kind, index) in existing:
            index += 1
        name = nodes.node_name(kind, index)
    elif name in existing:
        raise LocalClusterError(f"node {name} already exists")
    tier = kubelet_chaos.tier_of(k)
    if tier is not None:
        zone = zone or nodes.default_zone(kind, index)
        return kubelet_chaos.add_node(tier, name, kind, zone, wait=wait, timeout=max(timeout, KUBELET_JOIN_S))
    k.create(nodes.node_manifest(name, kind, zone or nodes.default_zone(kind, index)))
    if wait:
        poll(lambda: is_ready(_node(k, name)), timeout=timeout, what=f"new node {name} to be Ready")
    return name


# ------------------------------------------------------------------------------------ termination taints
def _update_node_spec(kube: Kubectl, node: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Read-modify-write of ``spec`` with the resourceVersion as precondition (retried on conflict)."""
    for _ in range(CONFLICT_RETRIES):
        obj = _node(kube, node)
        patch = {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "spec": change(obj.get("spec", {})),
        }
        try:
            kube.run("patch", "node", node, "--type=merge", "-p", json.dumps(patch))
            return
        except KubectlError as exc:
            if not exc.conflict:
                raise
    raise LocalClusterError(f"node {node} kept changing under us: gave up after {CONFLICT_RETRIES} conflicts")


def taint_for_termination(node: str, kind: TerminationKind, *, kube: Kubectl | None = None) -> None:
    """Mark ``node`` as about to be terminated by ``kind`` (karpenter | spot | cordon)."""
    taint = termination_taint(kind)

    def change(spec: dict[str, Any]) -> dict[str, Any]:
        taints = [t for t in spec.get("taints", []) or [] if t["key"] != taint["key"]]
        new: dict[str, Any] = {"taints": [*taints, taint]}
        if kind == "cordon":
            new["unschedulable"] = True
        return new

    _update_node_spec(_kube(kube), node, change)


def clear_termination(node: str, kind: TerminationKind, *, kube: Kubectl | None = None) -> None:
    """Undo :func:`taint_for_termination` (for ``cordon``: uncordon)."""
    key = termination_taint(kind)["key"]

    def change(spec: dict[str, Any]) -> dict[str, Any]:
        new: dict[str, Any] = {"taints": [t for t in spec.get("taints", []) or [] if t["key"] != key]}
        if kind == "cordon":
            new["unschedulable"] = None
        return new

    _update_node_spec(_kube(kube), node, change)


# ------------------------------------------------------------------------------- platform node conditions
PLATFORM_CONDITIONS = (
    "AcceleratedHardwareReady",
    "NetworkingReady",
    "StorageReady",
    "KernelReady",
    "ContainerRuntimeReady",
)
"""The node conditions the EKS node monitoring agent sets on GPU nodes (the operator reads them)."""


def set_node_condition(
    node: str, kind: str, status: str, reason: str = "", *, kube: Kubectl | None = None, wait: bool = True
) -> None:
    """Set a node condition through the status subresource, as a node agent does (the EKS node monitoring
    agent's ``AcceleratedHardwareReady=False``, say). kwok keeps it: its node Stages only ever refresh the
    heartbeat of the conditions they find, merged by type. ``status`` is True, False or Unknown."""
    if status not in ("True", "False", "Unknown"):
        raise LocalClusterError(f"condition status must be True, False or Unknown, not {status!r}")
    k = _kube(kube)
    _node(k, node)
    now = _now()
    entry = {
        "type": kind,
        "status": status,
        "reason": reason or f"{kind}{'Healthy' if status == 'True' else 'Unhealthy'}",
        "message": f"set by llmjob chaos at {now}",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    patch = json.dumps({"status": {"conditions": [entry]}})
    k.run("patch", "node", node, "--subresource=status", "--type=strategic", "-p", patch)
    if wait:
        poll(lambda: condition(_node(k, node), kind) == status, timeout=DEFAULT_TIMEOUT_S,
             what=f"node {node} to show {kind}={status}")  # fmt: skip


def _platform_unhealthy(node: dict[str, Any]) -> list[str]:
    return [kind for kind in PLATFORM_CONDITIONS if condition(node, kind) == "False"]


# ---------------------------------------------------------------------------------------- node faults
def fault_annotation(kind: str) -> str:
    """The node annotation the pod runner reads for a fault kind."""
    try:
        return marks.NODE_FAULTS[kind]
    except KeyError:
        raise LocalClusterError(f"unknown fault {kind!r}; use one of {', '.join(FAULT_KINDS)}") from None


def node_fault(node: str, kind: FaultKind, value: str | None = None, *, kube: Kubectl | None = None) -> str:
    """Make ``node`` faulty for the pods the runner starts there from now on (``cpu``: its running pods
    too): ``readonly-volumes`` (value ignored), ``cpu`` (cores, default 0.1), ``shm`` (size, default
    1Mi). Returns the value set."""
    key = fault_annotation(kind)
    text = FAULT_DEFAULTS[kind] if kind == "readonly-volumes" or value is None else str(value)
    k = _kube(kube)
    _node(k, node)
    k.run("annotate", "node", node, f"{key}={text}", "--overwrite")
    return text


def clear_node_fault(node: str, kind: FaultKind | None = None, *, kube: Kubectl | None = None) -> None:
    """Remove one fault mark (``kind``) or all of them from ``node``."""
    keys = [fault_annotation(kind)] if kind else list(marks.NODE_FAULTS.values())
    k = _kube(kube)
    _node(k, node)
    k.run("annotate", "node", node, *[f"{key}-" for key in keys])


def _fault_marks(node: dict[str, Any]) -> list[str]:
    notes = node.get("metadata", {}).get("annotations") or {}
    return [key for key in marks.NODE_FAULTS.values() if key in notes]


# ----------------------------------------------------------------------------------------------- pods
def fail_pod(
    namespace: str,
    pod: str,
    exit_code: int,
    *,
    kube: Kubectl | None = None,
    wait: bool = True,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Make the pod's main containers exit with ``exit_code`` (0: phase Succeeded, else Failed)."""
    if not 0 <= exit_code <= 255:
        raise LocalClusterError(f"exit code must be within 0..255, got {exit_code}")
    k = _kube(kube)
    if k.get("pod", pod, namespace) is None:
        raise LocalClusterError(f"pod {namespace}/{pod} does not exist")
    k.run(
        "annotate",
        "pod",
        pod,
        "--namespace",
        namespace,
        f"{marks.POD_EXIT_CODE_ANNOTATION}={exit_code}",
        "--overwrite",
    )
    if not wait:
        return
    phase = "Succeeded" if exit_code == 0 else "Failed"

    def exited() -> bool:
        obj = k.get("pod", pod, namespace)
        if obj is None:
            raise LocalClusterError(f"pod {namespace}/{pod} was deleted before it exited")
        codes = [
            s.get("state", {}).get("terminated", {}).get("exitCode")
            for s in obj["status"].get("containerStatuses", [])
        ]
        return obj["status"].get("phase") == phase and bool(codes) and all(c == exit_code for c in codes)

    poll(exited, timeout=timeout, what=f"pod {namespace}/{pod} to be {phase} with exit code {exit_code}")


# -------------------------------------------------------------------------------------------- restore
def restore_nodes(
    baseline: list[dict[str, Any]], *, kube: Kubectl | None = None, timeout: float = DEFAULT_TIMEOUT_S
) -> list[str]:
    """Bring the node set back to ``baseline`` (Node manifests) after fault injection.

    Extra nodes are deleted, missing ones created, not-ready marks, fault marks and termination taints
    cleared; returns
    the names of the nodes that had to change (empty when nothing had been touched).
    """
    k = _kube(kube)
    wanted = {m["metadata"]["name"]: m for m in baseline}
    current = {n["metadata"]["name"]: n for n in k.items("nodes")}
    changed: list[str] = []
    for name in sorted(current.keys() - wanted.keys()):
        delete_node(name, kube=k, wait=False)
        changed.append(name)
    for name in sorted(current.keys() & wanted.keys()):
        obj = current[name]
        touched = False
        if marks.NODE_NOT_READY_LABEL in obj["metadata"].get("labels", {}):
            node_ready(name, kube=k, timeout=timeout)
            touched = True
        keys = _taint_keys(obj)
        for kind in get_args(TerminationKind):
            cordoned = kind == "cordon" and obj.get("spec", {}).get("unschedulable", False)
            if termination_taint(kind)["key"] in keys or cordoned:
                clear_termination(name, kind, kube=k)
                touched = True
        if _fault_marks(obj):
            clear_node_fault(name, kube=k)
            touched = True
        for kind in _platform_unhealthy(obj):
            set_node_condition(name, kind, "True", kube=k)
            touched = True
        if touched:
            changed.append(name)
    for name in sorted(wanted.keys() - current.keys()):
        k.create(wanted[name])
        changed.append(name)

    def all_ready() -> bool | list[str]:
        ready = {n["metadata"]["name"] for n in k.items("nodes") if is_ready(n)}
        return wanted.keys() <= ready or False

    poll(all_ready, timeout=timeout, what=f"baseline nodes {', '.join(sorted(wanted))} to be Ready")
    return changed
