"""The record one reconcile pass works on: observed facts in, decisions accumulated step by step.

Every step (the other modules of this package) is a function ``step(state) -> None`` that reads the
record and updates its decision fields. Steps do no I/O; ``llm_operator.reconcile.plan`` runs them in
order and returns ``state.out``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_operator.api.models import LLMTrainingJob
from llm_operator.observe import NodeView, PodView, parse_time
from llm_operator.policy.admission import Admission
from llm_operator.policy.deletion import DeletionReason
from llm_operator.policy.health import Health, assess
from llm_operator.policy.progress import Progress
from llm_operator.policy.topology import Placement

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Deletion:
    """A worker pod to delete, and why."""

    pod: PodView
    force: bool
    why: DeletionReason
    since: float | None = None
    said: str = ""
    """The word the Events show when it is not ``why`` itself (Kueue's reason for holding the job back)."""

    @property
    def reason(self) -> str:
        """The word the ``DeletedWorkers`` Event shows beside the pod."""
        return self.said or self.why.value


@dataclass
class Plan:
    """What one pass decided."""

    create: list[int] = field(default_factory=list)
    attempt: int = 0
    delete: list[Deletion] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message) for Kubernetes Events on the job."""
    starting: bool = False
    """The job has not run yet and lost no worker: its first start, which the status records
    (``startTime``, the conditions' times), posts no Event (``docs/decisions.md``, SW6)."""
    lost: list[tuple[str, float | None]] = field(default_factory=list)
    """(signal, since) of workers found lost this pass, for metrics."""
    resize: tuple[int, int, str] | None = None
    evict: list[str] = field(default_factory=list)
    """Workers (pod names) whose live members leave the job's etcd before the pods are deleted."""
    avoid_nodes: tuple[str, ...] = ()
    """Nodes new workers must not land on (lost, terminating, cordoned, just deleted, or found
    unhealthy by a worker's health check)."""
    avoid_hard: tuple[str, ...] = ()
    """Of ``avoid_nodes``, those only a required term keeps new workers off (``placement.needs_term``):
    where Karpenter serves the cluster the others become preferred terms, which it accepts."""
    avoid_failing: tuple[str, ...] = ()
    """Of ``avoid_nodes``, those a platform node condition reports unhealthy: with node marking on, the
    operator taints them itself (``control.node_marking.condition_mark``), so they repel pods by
    themselves."""
    unhealthy: list[tuple[str, str]] = field(default_factory=list)
    """(node, check) of nodes found unhealthy this pass, for metrics and node marking."""
    rules_fired: list[tuple[str, str]] = field(default_factory=list)
    """(rule, action) of monitoring rules found fired this pass, for llmjob_rule_fired_total."""
    requeue_at: float | None = None
    placement: Placement | None = None
    """Topology terms of the workers in ``create`` (jobs with spec.scheduling.topology)."""

    def wake_at(self, when: float | None) -> None:
        """Ask for another pass no later than ``when``."""
        if when is not None and (self.requeue_at is None or when < self.requeue_at):
            self.requeue_at = when


Verdict = tuple[PodView, Health]


@dataclass
class PassState:
    """Inputs of one pass (never changed by a step) and the decisions the steps build up."""

    job: LLMTrainingJob
    verdicts: list[Verdict]
    nodes: Mapping[str, NodeView]
    all_workers: Iterable[PodView]
    """Every job's workers (capacity); iterated only when a job could grow, so it may be a lazy view."""
    now: float
    progress: Progress | None
    """What the metrics probes saw (hang detection); None when not probed."""
    admission: Admission | None
    """Kueue's verdict; None when the job is not queued through Kueue."""
    # Decisions, seeded from the job's last status.
    terminal_phase: str | None
    """Succeeded/Failed: sticky once reached; a step that reaches it sets it."""
    reason: str
    message: str
    restarts: int
    process_restarts: int
    """Layer-2 restarts counted so far (status.processRestarts)."""
    target: int
    spares: int
    """Spare workers aimed at beside ``target`` (status.spareReplicas)."""
    health_failures: int
    """Pre-flight health failures so far (status.healthFailures)."""
    unhealthy_nodes: list[dict[str, Any]]
    """status.unhealthyNodes, newest last."""
    last_resize: float | None
    below_min_since: float | None
    rules_fired: int
    """Monitoring rule firings recorded so far (status.rulesFired)."""
    last_rule_fired: dict[str, Any] | None
    """status.lastRuleFired."""
    worker_rules: list[dict[str, Any]]
    """status.workerRules: the rule counts the workers' metrics reported last."""
    completion: str | None
    replacing: bool = False
    """Lost or failed workers are being replaced this pass (a restart)."""
    renewing: set[str] = field(default_factory=set)
    """Pending workers deleted this pass to be re-created without stale avoid terms (not stuck)."""
    occupied: dict[str, int] = field(default_factory=dict)
    """Active bound workers per topology domain, most first (jobs with spec.scheduling.topology)."""
    home: str = ""
    """The survivors' domain: where most active workers are bound ("" when none is, or no topology)."""
    topology: dict[str, Any] | None = None
    """status.topology as decided this pass (jobs with spec.scheduling.topology)."""
    demand: int = 0
    """Workers kept Pending beyond target and spares to ask for capacity (status.waitingForCapacity
    counts those not bound yet): the job is below its desired size and an autoscaler launches nodes for
    Pending pods only."""
    members: int | None = None
    """Workers in the training generation as the workers report it (status.members; None: not known)."""
    extra_conditions: list[dict[str, Any]] = field(default_factory=list)
    """Conditions beyond the phase-derived ones (CheckpointNotShared, Stalled), merged by the status step."""
    out: Plan = field(default_factory=Plan)

    @classmethod
    def start(
        cls,
        job: LLMTrainingJob,
        pods: Iterable[PodView],
        nodes: Mapping[str, NodeView],
        all_workers: Iterable[PodView],
        now: float,
        progress: Progress | None = None,
        admission: Admission | None = None,
    ) -> PassState:
        """Assess every worker and seed the decisions from ``job.status``."""
        policy, old = job.spec.failurePolicy, job.status
        verdicts = [
            (
                p,
                assess(
                    p, nodes.get(p.node), now, policy.nodeFailureGraceSeconds, policy.nonRetryableExitCodes
                ),
            )
            for p in pods
        ]
        return cls(
            job=job,
            verdicts=verdicts,
            nodes=nodes,
            all_workers=all_workers,
            now=now,
            progress=progress,
            admission=admission,
            terminal_phase=old.phase if old.phase in TERMINAL else None,
            reason=old.reason,
            message=old.message,
            restarts=old.restarts,
            process_restarts=old.processRestarts,
            target=old.targetReplicas,
            spares=old.spareReplicas,
            health_failures=old.healthFailures,
            unhealthy_nodes=[n.model_dump() for n in old.unhealthyNodes],
            last_resize=parse_time(old.lastResizeTime),
            below_min_since=parse_time(old.belowMinSince),
            rules_fired=old.rulesFired,
            last_rule_fired=old.lastRuleFired.model_dump() if old.lastRuleFired else None,
            worker_rules=[r.model_dump() for r in old.workerRules],
            completion=old.completionTime,
        )

    # Views of the verdicts (computed from the inputs, so always current).
    def in_state(self, *states: str) -> list[Verdict]:
        """Workers whose verdict is one of ``states``."""
        return [(p, h) for p, h in self.verdicts if h.state in states]

    @property
    def active(self) -> list[Verdict]:
        """Running or waiting to run: healthy or pending."""
        return self.in_state("healthy", "pending")

    @property
    def lost(self) -> list[Verdict]:
        """Lost or failed retryably: to be replaced."""
        return self.in_state("lost")

    @property
    def fatal(self) -> list[PodView]:
        """Exited with a non-retryable code."""
        return [p for p, _ in self.in_state("fatal")]

    @property
    def succeeded(self) -> list[PodView]:
        """Exited 0 (or a code counted as success)."""
        return [p for p, _ in self.in_state("succeeded")]

    @property
    def gated(self) -> bool:
        """Queued through Kueue and not (or no longer) admitted: no workers may run."""
        return self.admission is not None and not self.admission.admitted

    @property
    def desired(self) -> int:
        """The size the user asks for (0 while suspended or not admitted; at most Kueue's admitted count)."""
        if self.job.spec.suspend or self.gated:
            return 0
        if self.admission is not None:
            return min(self.job.desired_replicas, self.admission.count)
        return self.job.desired_replicas

    @property
    def desired_spares(self) -> int:
        """spec.spareReplicas (inProcess only; 0 while suspended or not admitted; with Kueue, what the
        admitted count leaves after the training workers)."""
        if self.job.spec.suspend or self.gated:
            return 0
        if self.admission is not None:
            return min(self.job.spare_replicas, max(0, self.admission.count - self.desired))
        return self.job.spare_replicas

    @property
    def live(self) -> bool:
        """Not finished, suspended or waiting for admission: the steps that keep workers running apply."""
        return self.terminal_phase is None and not self.job.spec.suspend and not self.gated

    def had_condition(self, ctype: str) -> str | None:
        """The status ("True"/"False") of a condition in the job's last status, None when absent."""
        return next((c.status for c in self.job.status.conditions if c.type == ctype), None)

    def finish(self, phase: str, reason: str, message: str) -> None:
        """Reach a terminal phase this pass."""
        self.terminal_phase, self.reason, self.message = phase, reason, message
