"""Probes of the workers' metrics endpoints (async, bounded): one scrape serves hang detection (the step
and its time) and ``status.progress`` (every ``llm_trainer_*`` gauge in ``GAUGES``).

Cost for 1,000s of workers: synchronous training advances every rank together, so a job's progress is
read from ``PROBES_PER_JOB`` running workers (lowest indices: stable, and more than one so that one
slow endpoint is not mistaken for a hang), local rank 0 only, once per ``probe_interval`` (a quarter of
progressTimeoutSeconds, 5-30 s) or half the progress interval (LLMJOB_PROGRESS_SECONDS, 30 s: every 15 s),
whichever is shorter. That is O(jobs) small HTTP GETs, each bounded by ``PROBE_TIMEOUT``;
a worker whose trainer is stopped (SIGSTOP, hung process) does not answer, which counts as no progress.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Iterable

import aiohttp
from llm_elastic import contract
from prometheus_client.parser import text_string_to_metric_families

from llm_operator.control.endpoints import Endpoints, session_of
from llm_operator.observe import PodView
from llm_operator.policy.membership import LiveGeneration, track_outside
from llm_operator.policy.progress import Progress, Sample
from llm_operator.policy.unschedulable import SchedulingEvent
from llm_operator.settings import TRAINER_METRICS_PORT

__all__ = [
    "ProgressTracker",
    "Sample",
    "fetch_sample",
    "metrics_url",
    "parse_sample",
    "probe",
    "probe_targets",
]

PREFIX = contract.METRIC_PREFIX
STEP_METRIC = PREFIX + "step"
TIMESTAMP_METRIC = PREFIX + "last_step_timestamp_seconds"
GAUGES = contract.SCRAPED_GAUGES
"""The runtime's gauges one scrape reads (``llm_elastic.contract``, served by ``llm_elastic.metrics``)."""
RULE_FIRED_METRIC = contract.RULE_FIRED_METRIC
"""The runtime's counter of loss rules that fired, labels rule and action (docs/CONTRACTS.md)."""
PROBES_PER_JOB = 2
PROBE_TIMEOUT = 2.0


def parse_sample(text: str) -> Sample | None:
    """The trainer's gauges from Prometheus text exposition; None when neither the step nor the last-step
    time is served (a program without these metrics)."""
    wanted = {PREFIX + name for name in GAUGES}
    values: dict[str, float] = {}
    fired: dict[tuple[str, str], int] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == RULE_FIRED_METRIC and math.isfinite(sample.value):
                    pair = (str(sample.labels.get("rule", "")), str(sample.labels.get("action", "")))
                    fired[pair] = fired.get(pair, 0) + int(sample.value)
                elif sample.name in wanted and math.isfinite(sample.value):
                    key = sample.name.removeprefix(PREFIX)
                    values[key] = max(values.get(key, -math.inf), sample.value)
    except ValueError:
        return None
    if "step" not in values and "last_step_timestamp_seconds" not in values:
        return None

    def integer(name: str) -> int | None:
        return int(values[name]) if name in values else None

    return Sample(
        step=int(values.get("step", 0)),
        timestamp=values.get("last_step_timestamp_seconds", 0.0),
        total_steps=integer("total_steps"),
        loss=values.get("loss"),
        tokens_per_second=values.get("tokens_per_second"),
        step_time_sum=values.get("step_time_seconds_sum"),
        step_time_count=integer("step_time_seconds_count"),
        last_saved_step=integer("last_saved_step"),
        last_saved_timestamp=values.get("last_saved_timestamp_seconds"),
        job_process_restarts=integer("job_process_restarts"),
        world_size=integer("world_size"),
        contract_version=integer("contract_version") or contract.UNANNOUNCED_VERSION,
        rules_fired=tuple((rule, action, count) for (rule, action), count in sorted(fired.items())),
    )


def merged_rules(samples: Iterable[Sample]) -> tuple[tuple[str, str, int], ...]:
    """The highest count of each (rule, action) among one round's answers (a member that joined later has
    seen fewer firings: the highest is the job's)."""
    best: dict[tuple[str, str], int] = {}
    for sample in samples:
        for rule, action, count in sample.rules_fired:
            best[(rule, action)] = max(best.get((rule, action), 0), count)
    return tuple((rule, action, count) for (rule, action), count in sorted(best.items()))


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


async def probe(
    urls: list[str], timeout: float = PROBE_TIMEOUT, endpoints: Endpoints | None = None
) -> list[Sample]:
    """Probe endpoints concurrently; the answers that came back."""
    if not urls:
        return []
    async with session_of(endpoints) as session:
        found = await asyncio.gather(*(fetch_sample(session, url, timeout) for url in urls))
    return [s for s in found if s is not None]


def probe_interval(progress_timeout: int) -> float:
    """How often to probe a job: a quarter of its timeout, between 5 and 30 s."""
    return min(30.0, max(5.0, progress_timeout / 4))


class ProgressTracker:
    """Per job: the last step seen and when (operator clock) it was last seen to advance."""

    def __init__(self, report_every: float = 0.0) -> None:
        self.step: int | None = None
        self.timestamp: float | None = None
        self.advanced_at: float | None = None
        self.latest: Sample | None = None
        self.latest_at: float | None = None
        self.report_every = report_every
        self.live: LiveGeneration | None = None
        self.scheduling: tuple[SchedulingEvent, ...] = ()
        self.contracts: frozenset[int] = frozenset()

    def record(self, samples: Iterable[Sample], now: float) -> None:
        """Fold one round of answers in: any change of step or last-step time counts as progress
        (a restart that reloads an older checkpoint changes it too). A round with no answer, or only
        workers that have not completed a step yet, changes nothing."""
        answers = list(samples)
        if answers:  # status.progress: the newest answer, even before a first step (it marks the start)
            newest = max(answers, key=lambda s: (s.timestamp, s.step))
            self.latest = dataclasses.replace(newest, rules_fired=merged_rules(answers))
            self.latest_at = now
            self.contracts = frozenset(s.contract_version for s in answers if s.contract_version is not None)
        done = [s for s in answers if s.step > 0 or s.timestamp > 0]
        if not done:
            return
        best = max(done, key=lambda s: (s.timestamp, s.step))
        if (best.step, best.timestamp) != (self.step, self.timestamp):
            self.step, self.timestamp, self.advanced_at = best.step, best.timestamp, now

    def record_members(self, members: frozenset[str] | None, ready: Iterable[str], now: float) -> None:
        """Fold in one read of the live generation (None: unreadable, what was known stays)."""
        if members is None:
            return
        previous = self.live.outside_since if self.live is not None else {}
        self.live = LiveGeneration(members, track_outside(previous, ready, members, now))

    def progress(self) -> Progress:
        return Progress(
            self.step,
            self.advanced_at,
            self.latest,
            self.latest_at,
            self.report_every,
            self.live,
            self.scheduling,
            self.contracts,
        )
