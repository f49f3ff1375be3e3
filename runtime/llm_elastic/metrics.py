"""Observability: one JSON line per step in ``<checkpoint-dir>/metrics.jsonl`` (rank 0) and a Prometheus
endpoint on every worker (port base + LOCAL_RANK; prometheus-client is an optional import)."""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from llm_elastic.contract import CONTRACT_VERSION, METRIC_PREFIX, RULE_FIRED_METRIC

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def process_start_time() -> float | None:
    """Unix time this process was started (Linux ``/proc``), or None elsewhere."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def last_record(path: Path) -> dict[str, Any] | None:
    """The last complete JSON line of ``path`` (None when there is none)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            tail = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            return record
    return None


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of ``path``."""
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by a kill
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


class StepLog:
    """Appends one JSON object per line and flushes it (rank 0 only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        previous = last_record(path)
        self.restart = int(previous.get("restart", -1)) + 1 if previous else 0
        """How many times training started before, in this checkpoint dir (from the log itself)."""

        self._needs_newline = _ends_mid_line(path)

    def append(self, record: dict[str, Any]) -> None:
        """Write one line (a single write call, so a kill leaves at most one cut-off line)."""
        line = json.dumps(record, sort_keys=True) + "\n"
        if self._needs_newline:  # a previous writer was killed mid-line: do not glue onto its fragment
            line = "\n" + line
            self._needs_newline = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(line)


def _ends_mid_line(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            if handle.tell() == 0:
                return False
            handle.seek(-1, 2)
            return handle.read(1) != b"\n"
    except OSError:
        return False


class Exporter:
    """Prometheus gauges of this worker; does nothing when prometheus-client is missing or port is 0."""

    def __init__(self, port: int, labels: dict[str, str]) -> None:
        self._gauges: dict[str, Any] = {}
        self._skipped: Any = None
        self._fired: Any = None
        self._labels: dict[str, str] = {}
        self.port = 0
        if port <= 0:
            return
        try:
            prom: Any = importlib.import_module("prometheus_client")
        except ImportError:
            log.info("prometheus-client is not installed: no metrics endpoint")
            return
        registry = prom.CollectorRegistry()
        names = list(labels)
        specs = {
            "step": "Last completed optimizer step",
            "loss": "Training loss of the last step",
            "tokens_per_second": "Global training throughput of the last step",
            "last_step_timestamp_seconds": "Unix time the last step completed",
            "world_size": "Number of ranks in the current process group",
            "samples_seen": "Global samples consumed so far",
            "total_steps": "Steps the run trains in total (0: unknown)",
            "step_time_seconds_sum": "Wall seconds of the steps this process completed (resets at its start)",
            "step_time_seconds_count": "Steps this process completed (resets at its start)",
            "last_saved_step": "Step of the newest checkpoint this job saved (0: none)",
            "last_saved_timestamp_seconds": "Unix time that checkpoint was saved (0: none)",
            "process_restarts": "Times the pod's supervisor restarted this program (recovery layer 2)",
            "job_process_restarts": "Programs of this job restarted in their pods so far (layer 2)",
            "standby": "1 while this member waits as a standby spare (a full generation trains without it)",
            "outside_seconds": "Seconds this member has waited outside a generation that should take it in",
            "contract_version": "The runtime/operator contract this runtime speaks (llm_elastic.contract)",
        }
        for name, doc in specs.items():
            gauge = prom.Gauge(f"{METRIC_PREFIX}{name}", doc, names, registry=registry)
            self._gauges[name] = gauge.labels(**labels)
        self._labels = labels
        self._gauges["contract_version"].set(CONTRACT_VERSION)
        self._skipped = prom.Counter(
            f"{METRIC_PREFIX}skipped_steps",
            "Steps a loss rule dropped on every member",
            names,
            registry=registry,
        ).labels(**labels)
        self._fired = prom.Counter(
            RULE_FIRED_METRIC.removesuffix("_total"),
            "Loss rules that fired, by rule and action",
            [*names, "rule", "action"],
            registry=registry,
        )
        try:
            prom.start_http_server(port, registry=registry)
            self.port = port
        except OSError as exc:
            log.warning("metrics endpoint on port %d unavailable: %s", port, exc)

    def update(self, **values: float) -> None:
        """Set gauges by name (unknown names are ignored)."""
        for name, value in values.items():
            gauge = self._gauges.get(name)
            if gauge is not None:
                gauge.set(value)

    def step_skipped(self) -> None:
        """``llm_trainer_skipped_steps_total`` + 1."""
        if self._skipped is not None:
            self._skipped.inc()

    def rule_fired(self, rule: str, action: str) -> None:
        """``llm_trainer_rule_fired_total{rule,action}`` + 1."""
        if self._fired is not None:
            self._fired.labels(**self._labels, rule=rule, action=action).inc()
