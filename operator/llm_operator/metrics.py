"""Prometheus metrics of the operator (names documented in docs/operations.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from llm_operator.api.models import PHASES
from llm_operator.observe import parse_time
from llm_operator.policy.health import SIGNALS
from llm_operator.policy.nodehealth import KINDS

RECONCILES = Counter("llmjob_reconcile_total", "Reconcile passes")
RECONCILE_ERRORS = Counter("llmjob_reconcile_errors_total", "Reconcile passes that raised")
RECONCILE_SECONDS = Histogram(
    "llmjob_reconcile_duration_seconds",
    "Duration of one reconcile pass",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
JOBS = Gauge("llmjob_jobs", "Jobs by phase", ["phase"])
JOB_REPLICAS = Gauge("llmjob_job_replicas", "Workers per job", ["namespace", "llmjob", "kind"])
JOB_PHASE = Gauge(
    "llmjob_job_phase", "1 on the job's current phase (one series per job)", ["namespace", "llmjob", "phase"]
)
FAILURES = Counter("llmjob_failures_detected_total", "Lost workers by detection signal", ["signal"])
REPLACEMENTS = Counter("llmjob_replacements_total", "Lost workers deleted for replacement")
RESIZES = Counter("llmjob_resizes_total", "Target size changes", ["direction"])
PODS_CREATED = Counter("llmjob_pods_created_total", "Worker pods created")
INDEX_GHOSTS = Counter(
    "llmjob_index_ghosts_total",
    "Worker pods the operator's index still held after they were deleted (watch gap)",
)
PROGRESS_PROBES = Counter(
    "llmjob_progress_probes_total", "Hang-detection probes of worker metrics endpoints", ["result"]
)
STALLS = Counter("llmjob_stalls_detected_total", "Jobs restarted because no training step completed")
LIVE_EVICTIONS = Counter(
    "llmjob_live_members_evicted_total", "Live members (inProcess recovery) removed from a job's etcd"
)
JOB_STEP = Gauge(
    "llmjob_job_step", "Last completed training step per job (status.progress.step)", ["namespace", "llmjob"]
)
JOB_GOODPUT = Gauge(
    "llmjob_job_goodput",
    "Share of the job's wall time spent on kept training steps (window: life or hour)",
    ["namespace", "llmjob", "window"],
)
JOB_TOKENS = Gauge(
    "llmjob_job_tokens_per_second", "Global training throughput per job (last step)", ["namespace", "llmjob"]
)
JOB_ETA = Gauge(
    "llmjob_job_eta_seconds",
    "Seconds until training ends at the current step time (jobs with a known total)",
    ["namespace", "llmjob"],
)
UNHEALTHY_NODES = Counter(
    "llmjob_unhealthy_nodes_total",
    "Workers that exited 78: a node health check failed, or a straggler (reason_kind: the check)",
    ["reason_kind"],
)
RULE_FIRED = Counter(
    "llmjob_rule_fired_total",
    "Monitoring rules (spec.monitoring.rules) that fired and ended a worker, by rule and action",
    ["namespace", "llmjob", "rule", "action"],
)
NODES_MARKED = Counter(
    "llmjob_nodes_marked_total", "Unhealthy nodes labelled and tainted (LLMJOB_MARK_UNHEALTHY_NODES)"
)
NODE_HEALTH_BRAKED = Counter(
    "llmjob_node_health_braked_total",
    "Unhealthy-node reports the brake held back (limit: share of nodes marked, or rate of replacements)",
    ["limit"],
)
REACTION = Histogram(
    "llmjob_reaction_seconds",
    "From the failure signal's API timestamp to the lost worker's deletion (1 s timestamp resolution)",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)
REACTION_STAGE_METRIC = "llmjob_reaction_stage_seconds"
REACTION_STAGES = Histogram(
    REACTION_STAGE_METRIC,
    "Where a pass that replaced a lost worker spent its time, on the operator's clock, by stage",
    ["stage"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
)

LOOP_LAG = Histogram(
    "llmjob_operator_loop_lag_seconds",
    "How much later than asked a 0.1 s sleep on the operator's event loop came back (a busy loop)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
)
GC_PAUSE = Histogram(
    "llmjob_operator_gc_pause_seconds",
    "How long each garbage collection stopped the operator, by generation",
    ["generation"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2),
)
GC_GENERATIONS = ("0", "1", "2")

OPERATOR_STATE = Gauge(
    "llmjob_operator_state",
    "1 on this replica's peering state (active: it reconciles; docs/operations.md, the probe states)",
    ["state"],
)

TOPOLOGY_SPREAD = Gauge(
    "llmjob_topology_spread_jobs",
    "Jobs with spec.scheduling.topology whose workers span more than one domain (status.topology.spread)",
)

RESIZE_DIRECTIONS = ("up", "down")
PROBE_RESULTS = ("answered", "failed")
REACTION_STAGE_NAMES = ("queued", "planned", "deleted", "replaced", "created")
"""The ``stage`` label of ``llmjob_reaction_stage_seconds``: queued (the first event since the job's last
pass woke it -> its pass starts), planned (-> the lost worker's deletion is sent), deleted (-> answered),
replaced (-> the replacement's creation is sent, in the same pass or the next), created (-> answered)."""


def _zeroed(metric: Counter | Histogram, values: Iterable[str]) -> None:
    """Create the metric's series at 0 for every value of its one label: ``increase()`` over a window then
    has data (0) before the first event, and the first event counts as an increase of 1."""
    for value in values:
        metric.labels(value)


_zeroed(FAILURES, SIGNALS)
_zeroed(RESIZES, RESIZE_DIRECTIONS)
_zeroed(PROGRESS_PROBES, PROBE_RESULTS)
_zeroed(UNHEALTHY_NODES, KINDS)
_zeroed(NODE_HEALTH_BRAKED, ("share", "rate"))
_zeroed(REACTION_STAGES, REACTION_STAGE_NAMES)
_zeroed(GC_PAUSE, GC_GENERATIONS)


def count_resize(old: int, new: int) -> None:
    """One change of a job's target size."""
    RESIZES.labels(RESIZE_DIRECTIONS[0] if new > old else RESIZE_DIRECTIONS[1]).inc()


def observe_reaction(stages: Iterable[tuple[str, float]]) -> None:
    """One pass's reaction to a lost worker: (stage, seconds) in ``REACTION_STAGE_NAMES``."""
    for stage, seconds in stages:
        REACTION_STAGES.labels(stage).observe(max(0.0, seconds))


def count_probes(answered: int, failed: int) -> None:
    """One round of progress probes."""
    for result, count in zip(PROBE_RESULTS, (answered, failed), strict=True):
        PROGRESS_PROBES.labels(result).inc(count)


_phases: dict[tuple[str, str], str] = {}
_spread: set[tuple[str, str]] = set()
_recording = True
"""False while this replica stands by (kopf paused it): no per-job series, so only the active replica's
count (``observe_operator_state``)."""
PAUSED_STATES = frozenset({"standby", "conflict", "missing"})
"""Peering states in which kopf pauses this replica (``llm_operator.readiness``): it drops its per-job series
at once and records none until it is active again (its passes bring them back)."""
PER_JOB = (JOB_REPLICAS, JOB_PHASE, JOB_STEP, JOB_GOODPUT, JOB_TOKENS, JOB_ETA, RULE_FIRED)


REPLICA_KINDS = ("desired", "target", "ready", "members", "waiting")
"""The ``kind`` label of ``llmjob_job_replicas``: members train in the live generation (absent until the
workers report it); waiting are Pending for capacity the cluster does not have yet."""


def observe_job(namespace: str, job: str, phase: str, sizes: Mapping[str, int | None]) -> None:
    """Record a job's phase and sizes (by ``REPLICA_KINDS``; None: no series) after a pass."""
    if not _recording:
        return
    _set_phase(namespace, job, phase)
    for kind in REPLICA_KINDS:
        value = sizes.get(kind)
        if value is None:
            with contextlib.suppress(KeyError):
                JOB_REPLICAS.remove(namespace, job, kind)
        else:
            JOB_REPLICAS.labels(namespace, job, kind).set(value)
    _refresh_phases()


def observe_progress(namespace: str, job: str, progress: Mapping[str, Any] | None, now: float) -> None:
    """Record a job's status.progress after a pass (series absent while the job has none)."""
    if not _recording:
        return
    progress = progress or {}
    values: list[tuple[Gauge, tuple[str, ...], Any]] = [
        (JOB_STEP, (), progress.get("step")),
        (JOB_GOODPUT, ("life",), progress.get("goodput")),
        (JOB_GOODPUT, ("hour",), progress.get("goodputLastHour")),
        (JOB_TOKENS, (), progress.get("tokensPerSecond")),
    ]
    end = parse_time(progress.get("estimatedCompletionTime"))
    values.append((JOB_ETA, (), None if end is None else max(0.0, end - now)))
    for gauge, extra, value in values:
        if value is None:
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, job, *extra)
        else:
            gauge.labels(namespace, job, *extra).set(value)


def observe_topology(namespace: str, job: str, spread: bool) -> None:
    """Record whether a job's workers span several topology domains after a pass."""
    if not _recording:
        return
    if spread:
        _spread.add((namespace, job))
    else:
        _spread.discard((namespace, job))
    TOPOLOGY_SPREAD.set(len(_spread))


def forget_job(namespace: str, job: str) -> None:
    """Drop a deleted job's series."""
    _set_phase(namespace, job, None)
    observe_topology(namespace, job, False)
    for kind in REPLICA_KINDS:
        with contextlib.suppress(KeyError):
            JOB_REPLICAS.remove(namespace, job, kind)
    observe_progress(namespace, job, None, 0.0)
    _refresh_phases()


def observe_operator_state(state: str, states: Iterable[str]) -> None:
    """Record this replica's peering state: 1 on ``state``, 0 on the other ``states``. Entering a paused
    state (``PAUSED_STATES``) drops every per-job series at once (``forget_jobs``)."""
    global _recording
    for name in {*states, state}:
        OPERATOR_STATE.labels(name).set(1 if name == state else 0)
    recording = state not in PAUSED_STATES
    if _recording and not recording:
        forget_jobs()
    _recording = recording


def forget_jobs() -> None:
    """Drop every per-job series (this replica stopped being active): a stale ``ready`` must not hide a job
    below its size, nor a deleted job's ``waiting`` keep an alert firing (``max`` across replicas)."""
    for metric in PER_JOB:
        metric.clear()
    _phases.clear()
    _spread.clear()
    TOPOLOGY_SPREAD.set(0)
    _refresh_phases()


def _set_phase(namespace: str, job: str, phase: str | None) -> None:
    """The job's phase in ``_phases`` and ``llmjob_job_phase`` (None: the job is gone)."""
    old = _phases.pop((namespace, job), None)
    if old is not None and old != phase:
        with contextlib.suppress(KeyError):
            JOB_PHASE.remove(namespace, job, old)
    if phase is not None:
        _phases[(namespace, job)] = phase
        JOB_PHASE.labels(namespace, job, phase).set(1)


def _refresh_phases() -> None:
    counts: dict[str, int] = dict.fromkeys(PHASES, 0)  # every phase: a phase no job is in any more reads 0
    for phase in _phases.values():
        counts[phase] = counts.get(phase, 0) + 1
    for phase, count in counts.items():
        JOBS.labels(phase).set(count)


def serve(port: int) -> None:
    """Expose /metrics on this port (0 disables)."""
    if port:
        start_http_server(port)
