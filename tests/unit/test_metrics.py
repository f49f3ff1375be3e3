"""The operator's labelled counters with a fixed list of label values exist at 0 from the start."""

from __future__ import annotations

from llm_operator import metrics
from llm_operator.policy import health, nodehealth
from prometheus_client import REGISTRY


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_fixed_label_values_are_exported_before_the_first_event() -> None:
    for signal in health.SIGNALS:
        assert _value("llmjob_failures_detected_total", signal=signal) is not None, signal
    for kind in nodehealth.KINDS:
        assert _value("llmjob_unhealthy_nodes_total", reason_kind=kind) is not None, kind
    for result in metrics.PROBE_RESULTS:
        assert _value("llmjob_progress_probes_total", result=result) is not None, result


def test_a_resize_counts_by_direction_and_probes_by_result() -> None:
    up, down = (_value("llmjob_resizes_total", direction=d) or 0.0 for d in ("up", "down"))
    metrics.count_resize(2, 4)
    metrics.count_resize(4, 3)
    metrics.count_resize(3, 1)
    assert _value("llmjob_resizes_total", direction="up") == up + 1
    assert _value("llmjob_resizes_total", direction="down") == down + 2
    probes = ("llmjob_progress_probes_total", "answered", "failed")
    answered, failed = (_value(probes[0], result=r) or 0.0 for r in probes[1:])
    metrics.count_probes(3, 1)
    assert _value("llmjob_progress_probes_total", result="answered") == answered + 3
    assert _value("llmjob_progress_probes_total", result="failed") == failed + 1


def test_every_signal_a_lost_worker_carries_is_listed() -> None:
    named = {v for k, v in vars(health).items() if k.isupper() and isinstance(v, str) and v[:1].isupper()}
    assert named == set(health.SIGNALS)
