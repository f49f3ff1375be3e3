"""The metrics table of docs/operations.md, from the metrics the operator and a worker really export.

The operator's come from the metric objects of :mod:`llm_operator.metrics` (name, type, labels, help); a
worker's from the endpoint of a real :class:`llm_elastic.metrics.Exporter` started on a free loopback port
and scraped once, so the table lists what Prometheus finds there. Label values come from the constants the
operator itself iterates, so a new signal or phase shows up here too.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

WORKER_LABELS = {"rank": "0"}
"""The exporter's label here: restart mode labels a worker's series ``rank``, inProcess ``member``."""
SUFFIX = {"counter": "_total", "gauge": "", "histogram": ""}


def _label_values() -> dict[tuple[str, str], Sequence[str]]:
    """(metric, label) -> every value the operator exports for it."""
    from llm_operator import metrics as m
    from llm_operator.api.models import PHASES
    from llm_operator.policy.health import SIGNALS
    from llm_operator.policy.nodehealth import KINDS
    from llm_operator.readiness import STATES

    return {
        ("llmjob_jobs", "phase"): PHASES,
        ("llmjob_job_phase", "phase"): PHASES,
        ("llmjob_job_replicas", "kind"): m.REPLICA_KINDS,
        ("llmjob_failures_detected_total", "signal"): SIGNALS,
        ("llmjob_resizes_total", "direction"): m.RESIZE_DIRECTIONS,
        ("llmjob_progress_probes_total", "result"): m.PROBE_RESULTS,
        ("llmjob_unhealthy_nodes_total", "reason_kind"): KINDS,
        ("llmjob_reaction_stage_seconds", "stage"): m.REACTION_STAGE_NAMES,
        ("llmjob_operator_gc_pause_seconds", "generation"): m.GC_GENERATIONS,
        ("llmjob_operator_state", "state"): STATES,
    }


def operator_metrics() -> Iterator[tuple[str, str, tuple[str, ...], str]]:
    """(exported name, type, label names, help) of every metric object of ``llm_operator.metrics``."""
    from llm_operator import metrics

    seen: set[str] = set()
    for value in vars(metrics).values():
        if not isinstance(value, MetricWrapperBase) or value._name in seen:
            continue
        seen.add(value._name)
        kind = str(value._type)
        yield str(value._name) + SUFFIX.get(kind, ""), kind, tuple(value._labelnames), value._documentation


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_metrics() -> Iterator[tuple[str, str, tuple[str, ...], str]]:
    """The same for a worker: a real exporter's endpoint, scraped once (its counters counted once so that
    their labels show)."""
    from llm_elastic.metrics import Exporter

    port = _free_port()
    exporter = Exporter(port, dict(WORKER_LABELS))
    if not exporter.port:
        raise RuntimeError(f"the worker's metrics exporter did not start on port {port}")
    exporter.step_skipped()
    exporter.rule_fired("rule", "action")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):  # prometheus_client's creation time of each counter
            continue
        labels = sorted({k for s in family.samples for k in s.labels if k not in WORKER_LABELS})
        name = family.name + SUFFIX.get(family.type, "")
        yield name, family.type, ("rank|member", *labels), family.documentation


def _labels(name: str, labels: Sequence[str], values: Mapping[tuple[str, str], Sequence[str]]) -> str:
    out = []
    for label in labels:
        if label == "rank|member":
            out.append("`rank` (restart) or `member` (inProcess)")
        elif (name, label) in values:
            out.append(f"`{label}` = " + ", ".join(values[(name, label)]))
        else:
            out.append(f"`{label}`")
    return "; ".join(out)


def table() -> str:
    """The Markdown table: one row per metric, the operator's first, each group sorted by name."""
    values = _label_values()
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for group in (operator_metrics(), worker_metrics()):
        for name, kind, labels, doc in sorted(group):
            meaning = doc.replace("|", "\\|")
            rows.append(f"| `{name}` | {kind} | {_labels(name, labels, values)} | {meaning} |")
    return "\n".join(rows) + "\n"
