"""One reconcile pass as a pure function: desired vs observed -> pods to create/delete + the new status.

``plan()`` does no I/O: the caller (``llm_operator.control.controller``) gathers the observed pods and nodes
from kopf's indexes, applies the plan and writes the status once. The pass is the pipeline ``STEPS``
over one ``PassState`` record; each rule lives in its own module of ``llm_operator.steps``:

| rule | step |
|---|---|
| nodes new pods avoid, grace-period wake-ups | ``steps.placement.observe_nodes`` |
| workers per topology domain, the survivors' domain | ``steps.topology.observe_topology`` |
| exit 78: node recorded unhealthy and avoided | ``steps.nodehealth.record_unhealthy`` |
| pending worker avoiding a node usable again: re-created | ``steps.placement.renew_stale_avoidance`` |
| stuck Terminating pods force-deleted | ``steps.failures.force_stuck_terminating`` |
| a rule ended a worker: Event, status, restartJob / failJob | ``steps.rules.record_rule_firings`` |
| loss rules that fired in the workers (their metrics) | ``steps.rules.count_worker_rules`` |
| workers run a runtime contract not served: Failed | ``steps.skew.refuse_unsupported_runtime`` |
| non-retryable exit fails, exit 0 succeeds | ``steps.failures.terminal_outcome`` |
| lost/failed workers replaced (or maxRestarts) | ``steps.failures.replace_lost`` |
| target size: user, shrink, grow back | ``steps.sizing.resize`` |
| a resize is a restart (maxRestarts: ``steps.restarts``) | ``steps.restarts.count_restart`` |
| programs restarted in their pods count too | ``steps.restarts.count_process_restarts`` |
| scale up/down to the target | ``steps.sizing.scale`` |
| below minReplicas for too long | ``steps.below_min.below_min`` |
| no training step for too long (hang) | ``steps.progress.detect_stall`` |
| suspend | ``steps.suspend.suspend`` |
| Kueue: no workers until admitted | ``steps.admission.hold_until_admitted`` |
| finished: stop workers, TTL | ``steps.finish.finish`` |
| topology terms of new workers (survivors' domain) | ``steps.topology.place_workers`` |
| who trains; a ready worker left out of the generation | ``steps.membership.report_members`` |
| a Pending worker no NodePool can ever place (Karpenter) | ``steps.capacity.report_unschedulable`` |
| inProcess: failed workers leave the live membership | ``steps.live.evict_live_members`` |
| checkpointDir not on a shared volume (warning) | ``steps.storage.checkpoint_sharing`` |
| Kueue's verdict as condition + Event | ``steps.admission.admission_verdict`` |
| a straggler replaced (condition) | ``steps.nodehealth.straggler_condition`` |
| status.topology, TopologySpread Event | ``steps.topology.topology_status`` |
| phase, conditions, status record | ``steps.status.status`` |
| training progress and goodput (bounded rate) | ``steps.progress.report_progress`` |
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from llm_operator.api.models import LLMTrainingJob
from llm_operator.observe import NodeView, PodView
from llm_operator.policy.admission import Admission
from llm_operator.policy.progress import Progress
from llm_operator.steps.admission import admission_verdict, hold_until_admitted
from llm_operator.steps.below_min import below_min
from llm_operator.steps.capacity import report_unschedulable
from llm_operator.steps.failures import force_stuck_terminating, replace_lost, terminal_outcome
from llm_operator.steps.finish import finish
from llm_operator.steps.live import evict_live_members
from llm_operator.steps.membership import report_members
from llm_operator.steps.nodehealth import record_unhealthy, straggler_condition
from llm_operator.steps.placement import observe_nodes, renew_stale_avoidance
from llm_operator.steps.progress import detect_stall, report_progress
from llm_operator.steps.restarts import count_process_restarts, count_restart
from llm_operator.steps.rules import count_worker_rules, record_rule_firings
from llm_operator.steps.sizing import resize, scale
from llm_operator.steps.skew import refuse_unsupported_runtime
from llm_operator.steps.state import TERMINAL, Deletion, PassState, Plan
from llm_operator.steps.status import status
from llm_operator.steps.storage import checkpoint_sharing
from llm_operator.steps.suspend import suspend
from llm_operator.steps.topology import observe_topology, place_workers, topology_status

__all__ = ["STEPS", "TERMINAL", "Deletion", "Plan", "plan"]

Step = Callable[[PassState], None]

STEPS: tuple[Step, ...] = (
    observe_nodes,
    observe_topology,
    record_unhealthy,
    renew_stale_avoidance,
    force_stuck_terminating,
    record_rule_firings,
    count_worker_rules,
    refuse_unsupported_runtime,
    terminal_outcome,
    replace_lost,
    resize,
    count_restart,
    count_process_restarts,
    scale,
    below_min,
    detect_stall,
    suspend,
    hold_until_admitted,
    finish,
    place_workers,
    report_members,
    report_unschedulable,
    evict_live_members,
    checkpoint_sharing,
    admission_verdict,
    straggler_condition,
    topology_status,
    status,
    report_progress,
)
"""The order matters: failures before sizing (a replacement is a restart), sizing before scaling,
everything before the status; progress after it (it needs the phase)."""


def plan(
    job: LLMTrainingJob,
    pods: list[PodView],
    nodes: Mapping[str, NodeView],
    all_workers: Iterable[PodView],
    now: float,
    progress: Progress | None = None,
    admission: Admission | None = None,
) -> Plan:
    """Decide one pass. ``pods`` are this job's workers; ``all_workers`` every job's (for capacity);
    ``progress`` what the metrics probes saw (hang detection); ``admission`` Kueue's verdict for a queued
    job (None: not managed by Kueue; until admitted no workers run, once admitted at most that many)."""
    state = PassState.start(job, pods, nodes, all_workers, now, progress, admission)
    for step in STEPS:
        step(state)
    return state.out
