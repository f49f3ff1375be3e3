"""One job's progress prober: samples the trainer metrics of one or two running workers, beside the job's
reconcile loop, so that a slow endpoint never delays a pass; passes read what it saw (``tracker``) as an
input of ``plan()``. The probes themselves are ``llm_operator.control.scrape`` (docs/decisions.md, "Hang
detection probes two workers per job")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import kopf

from llm_operator import metrics
from llm_operator.api.models import LLMTrainingJob
from llm_operator.control.endpoints import Endpoints
from llm_operator.control.scrape import ProgressTracker, metrics_url, probe, probe_interval, probe_targets
from llm_operator.control.status_writer import StatusWriter
from llm_operator.kube import KubeError
from llm_operator.observe import PodView
from llm_operator.policy.unschedulable import SchedulingEvent, newest_per_pod
from llm_operator.runtime_resolution import RuntimeResolver

PROBE_IDLE_SECONDS = 10.0
"""How often a job without hang detection re-reads its spec (progressTimeoutSeconds may be set later)."""

LiveReader = Callable[[LLMTrainingJob], Awaitable[frozenset[str] | None]]
"""Reads the workers of an inProcess job's training generation (None: unreadable now)."""
EventReader = Callable[[str], Awaitable[list[SchedulingEvent]]]
"""Lists a namespace's FailedScheduling events of pods (``Kube.failed_scheduling``)."""


class ProgressProber:
    """Samples one job's progress every interval: for hang detection (a quarter of
    progressTimeoutSeconds, 5-30 s) and for status.progress (half its update interval, so every update
    has a sample at most that old)."""

    def __init__(
        self,
        key: tuple[str, str],
        progress_seconds: float,
        resolver: RuntimeResolver,
        status: StatusWriter,
        wake: asyncio.Event,
        live: LiveReader | None = None,
        scheduling: EventReader | None = None,
        endpoints: Endpoints | None = None,
    ) -> None:
        self.key = key
        self.endpoints = endpoints
        """The operator's one HTTP client for pods (None: a session per round)."""
        self.live = live
        self.scheduling = scheduling
        """Reads why Pending workers get no node, while some are Pending (``policy.unschedulable``)."""
        """Reads the live generation of inProcess jobs at every round
        (``llm_operator.control.live_evict``)."""
        self.progress_seconds = progress_seconds
        """``LLMJOB_PROGRESS_SECONDS``: the status.progress update interval (0: off)."""
        self.resolver = resolver
        self.status = status
        self.wake = wake
        """Set on the first progress seen: the pass need not wait for its next turn."""
        self.tracker = ProgressTracker(progress_seconds)
        """What the probes saw (hang detection and status.progress)."""
        self._job: tuple[Any, LLMTrainingJob] | None = None

    def job(self, body: kopf.Body) -> LLMTrainingJob:
        """The job as it runs (runtime merged), validated once per spec generation and runtime copy: the
        prober asks every few seconds (bench/scale.py)."""
        key = ((body.get("metadata") or {}).get("generation"), self.resolver.version())
        if self._job is None or self._job[0] != key:
            self._job = (key, self.resolver.job(body, self.status.current(body)))
        return self._job[1]

    def timeout(self, body: kopf.Body) -> int:
        """failurePolicy.progressTimeoutSeconds of the job as it runs."""
        return self.job(body).spec.failurePolicy.progressTimeoutSeconds

    async def run(
        self,
        body: kopf.Body,
        pods_index: Mapping[Any, Iterable[PodView]],
        stopped: kopf.DaemonStopped,
        deleted: Callable[[], bool],
        logger: kopf.Logger,
    ) -> None:
        """Probe until the daemon is stopped or the job deleted."""
        while not stopped and not deleted():
            interval = PROBE_IDLE_SECONDS
            try:
                runnable = self.resolver.runnable(body)
                timeout = self.timeout(body) if runnable else 0
                every = [probe_interval(timeout)] if timeout > 0 else []
                if self.progress_seconds > 0 and runnable:
                    every.append(self.progress_seconds / 2)
                in_process = runnable and self.job(body).spec.failurePolicy.recovery == "inProcess"
                if in_process and self.live is not None:
                    every.append(PROBE_IDLE_SECONDS)
                workers = list(pods_index.get(self.key, ()))
                if every:
                    interval = min(every)
                    await self.sample(workers)
                    if in_process:
                        await self.read_live(self.job(body), workers)
                if runnable:
                    await self.read_scheduling(workers)
            except Exception as exc:  # never let the prober die silently: the pass would see stale data
                namespace, name = self.key
                logger.warning(f"progress probe of {namespace}/{name} failed: {exc}")
            await asyncio.sleep(interval)

    async def sample(self, workers: Iterable[PodView]) -> None:
        """One round: probe the targets among ``workers`` and fold the answers in."""
        targets = probe_targets(workers)
        samples = await probe([metrics_url(p) for p in targets], endpoints=self.endpoints)
        metrics.count_probes(len(samples), len(targets) - len(samples))
        first, contracts = self.tracker.latest is None, self.tracker.contracts
        self.tracker.record(samples, time.time())
        if (first and self.tracker.latest is not None) or contracts != self.tracker.contracts:
            self.wake.set()  # the first progress, or another runtime contract: no need to wait for a pass

    async def read_scheduling(self, workers: list[PodView]) -> None:
        """Why the Pending workers get no node (one LIST of the namespace's FailedScheduling events, only
        while some worker is Pending unbound); a changed verdict wakes the pass."""
        pending = [p.name for p in workers if not p.node and not p.deleting and p.phase == "Pending"]
        if self.scheduling is None or not pending:
            if self.tracker.scheduling:
                self.tracker.scheduling = ()
                self.wake.set()
            return
        try:
            events = await self.scheduling(self.key[0])
        except KubeError:
            return
        found = tuple(sorted(newest_per_pod(events, pending).values(), key=lambda e: e.pod))
        changed = [(e.pod, e.source, e.message) for e in found] != [
            (e.pod, e.source, e.message) for e in self.tracker.scheduling
        ]
        self.tracker.scheduling = found
        if changed:  # a repeat of the same verdict (a newer event time only) wakes nobody
            self.wake.set()

    async def read_live(self, job: LLMTrainingJob, workers: list[PodView]) -> None:
        """One read of the live generation (inProcess): who trains, and since when a ready worker is out."""
        if self.live is None:
            return
        members = await self.live(job)
        ready = [p.name for p in probe_targets(workers, count=len(workers))]
        before = self.tracker.live
        self.tracker.record_members(members, ready, time.time())
        after = self.tracker.live
        if after is not None and (before is None or before.pods != after.pods):
            self.wake.set()  # the generation changed: the status shows it at once
