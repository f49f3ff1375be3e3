"""Hang-detection probes: read the trainer's step from a worker's metrics endpoint (async, bounded).

Cost for 1,000s of workers: synchronous training advances every rank together, so a job's progress is
read from ``PROBES_PER_JOB`` running workers (lowest indices: stable, and more than one so that one
slow endpoint is not mistaken for a hang), local rank 0 only, once per ``probe_interval`` (a quarter of
progressTimeoutSeconds, 5-30 s). That is O(jobs) small HTTP GETs, each bounded by ``PROBE_TIMEOUT``;
a worker whose trainer is stopped (SIGSTOP, hung process) does not answer, which counts as no progress.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from llm_operator.observe import PodView
from llm_operator.policy.progress import Progress
from llm_operator.settings import TRAINER_METRICS_PORT

STEP_METRIC = "llm_trainer_step"
TIMESTAMP_METRIC = "llm_trainer_last_step_timestamp_seconds"
PROBES_PER_JOB = 2
PROBE_TIMEOUT = 2.0


@dataclass(frozen=True)
class Sample:
    """One worker's answer: its last completed step and when (trainer clock); 0/0 before the first."""

    step: int
    timestamp: float


def parse_sample(text: str) -> Sample | None:
    """The step and last-step time from Prometheus text exposition; None when the metrics are absent."""
    values: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in (STEP_METRIC, TIMESTAMP_METRIC) and math.isfinite(sample.value):
                    values[sample.name] = max(values.get(sample.name, -math.inf), sample.value)
    except ValueError:
        return None
    if STEP_METRIC not in values and TIMESTAMP_METRIC not in values:
        return None
    return Sample(int(values.get(STEP_METRIC, 0)), values.get(TIMESTAMP_METRIC, 0.0))


def probe_targets(pods: Iterable[PodView], count: int = PROBES_PER_JOB) -> list[PodView]:
    """Running, ready workers with an IP, lowest indices first."""
    ready = [p for p in pods if p.phase == "Running" and p.ready and p.ip and not p.deleting]
    return sorted(ready, key=lambda p: p.index)[:count]


def metrics_url(pod: PodView, port: int = TRAINER_METRICS_PORT) -> str:
    host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
    return f"http://{host}:{port}/metrics"


async def fetch_sample(
    session: aiohttp.ClientSession, url: str, timeout: float = PROBE_TIMEOUT
) -> Sample | None:
    """GET one endpoint; None on any failure (refused, timeout, non-200, no metric)."""
    try:
        async with asyncio.timeout(timeout):
            async with session.get(url) as response:
                if response.status != 200:
                    return None
                text = await response.text()
    except (TimeoutError, aiohttp.ClientError, OSError, UnicodeDecodeError):
        return None
    return parse_sample(text)


async def probe(urls: list[str], timeout: float = PROBE_TIMEOUT) -> list[Sample]:
    """Probe endpoints concurrently; the answers that came back."""
    if not urls:
        return []
    async with aiohttp.ClientSession() as session:
        found = await asyncio.gather(*(fetch_sample(session, url, timeout) for url in urls))
    return [s for s in found if s is not None]


def probe_interval(progress_timeout: int) -> float:
    """How often to probe a job: a quarter of its timeout, between 5 and 30 s."""
    return min(30.0, max(5.0, progress_timeout / 4))


class ProgressTracker:
    """Per job: the last step seen and when (operator clock) it was last seen to advance."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.timestamp: float | None = None
        self.advanced_at: float | None = None

    def record(self, samples: Iterable[Sample], now: float) -> None:
        """Fold one round of answers in: any change of step or last-step time counts as progress
        (a restart that reloads an older checkpoint changes it too). A round with no answer, or only
        workers that have not completed a step yet, changes nothing."""
        done = [s for s in samples if s.step > 0 or s.timestamp > 0]
        if not done:
            return
        best = max(done, key=lambda s: (s.timestamp, s.step))
        if (best.step, best.timestamp) != (self.step, self.timestamp):
            self.step, self.timestamp, self.advanced_at = best.step, best.timestamp, now

    def progress(self) -> Progress:
        return Progress(self.step, self.advanced_at)
