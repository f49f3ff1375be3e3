"""One job's progress prober: samples the trainer metrics of one or two running workers, beside the job's
reconcile loop, so that a slow endpoint never delays a pass; passes read what it saw (``tracker``) as an
input of ``plan()``. The probes themselves are ``llm_operator.progress`` (docs/decisions.md, "Hang
detection probes two workers per job")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import kopf

from llm_operator import metrics
from llm_operator.observe import PodView
from llm_operator.progress import ProgressTracker, metrics_url, probe, probe_interval, probe_targets
from llm_operator.runtime_resolution import RuntimeResolver
from llm_operator.status_writer import StatusWriter

PROBE_IDLE_SECONDS = 10.0
"""How often a job without hang detection re-reads its spec (progressTimeoutSeconds may be set later)."""


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
    ) -> None:
        self.key = key
        self.progress_seconds = progress_seconds
        """``LLMJOB_PROGRESS_SECONDS``: the status.progress update interval (0: off)."""
        self.resolver = resolver
        self.status = status
        self.wake = wake
        """Set on the first progress seen: the pass need not wait for its next turn."""
        self.tracker = ProgressTracker(progress_seconds)
        """What the probes saw (hang detection and status.progress)."""
        self._timeout: tuple[Any, int] | None = None

    def timeout(self, body: kopf.Body) -> int:
        """failurePolicy.progressTimeoutSeconds of the job as it runs (runtime merged), validated once per
        spec generation and runtime copy: the prober asks every few seconds (bench/scale.py)."""
        key = ((body.get("metadata") or {}).get("generation"), self.resolver.version())
        if self._timeout is None or self._timeout[0] != key:
            job = self.resolver.job(body, self.status.current(body))
            self._timeout = (key, job.spec.failurePolicy.progressTimeoutSeconds)
        return self._timeout[1]

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
                if every:
                    interval = min(every)
                    await self.sample(pods_index.get(self.key, ()))
            except Exception as exc:  # never let the prober die silently: the pass would see stale data
                namespace, name = self.key
                logger.warning(f"progress probe of {namespace}/{name} failed: {exc}")
            await asyncio.sleep(interval)

    async def sample(self, workers: Iterable[PodView]) -> None:
        """One round: probe the targets among ``workers`` and fold the answers in."""
        targets = probe_targets(workers)
        samples = await probe([metrics_url(p) for p in targets])
        metrics.PROGRESS_PROBES.labels("answered").inc(len(samples))
        metrics.PROGRESS_PROBES.labels("failed").inc(len(targets) - len(samples))
        first = self.tracker.latest is None
        self.tracker.record(samples, time.time())
        if first and self.tracker.latest is not None:
            self.wake.set()  # the first progress: no need to wait for the next pass
