"""This member's health while it trains: the pre-flight checks before it joins, the periodic re-checks,
and the straggler verdict from the commit's compute times (the checks themselves: :mod:`llm_elastic.health`).

A failed re-check or a straggler verdict sets :attr:`HealthWatch.unhealthy`; the member then leaves at the
next step boundary (exit 78), after the commit that told the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from llm_elastic.config import ElasticConfig
from llm_elastic.health import EXIT_UNHEALTHY, Checks, Finding, StragglerWatch, read_policy, report_unhealthy
from llm_elastic.leave import Leave
from llm_elastic.wrap import DDP, StepClock, WrapPolicy

log = logging.getLogger("llm_elastic")


class HealthWatch:
    """Pre-flight, re-checks and stragglers of one member (``watch_stragglers``: in process only)."""

    def __init__(
        self,
        env: Mapping[str, str] | None,
        config: ElasticConfig,
        local_world_size: int,
        watch_stragglers: bool,
        wrap: WrapPolicy,
    ) -> None:
        self.policy = read_policy(env)
        self.checks = Checks(
            self.policy,
            config.checkpoint_dir,
            "/dev/shm" if config.snapshot_every else "",
            0,
            local_world_size,
        )
        self.straggler = StragglerWatch(self.policy.stragglerFactor, self.policy.stragglerWindowSteps)
        self.in_process = watch_stragglers
        watching = watch_stragglers and self.policy.enabled and self.policy.stragglerWindowSteps > 0
        self.unhealthy: Finding | None = None
        """A failed periodic check or a straggler verdict: this member leaves at the next step boundary."""
        self.clock = StepClock()
        timed = watching and isinstance(wrap, DDP) and not wrap.compile
        self.wrap_clock: StepClock | None = self.clock if timed else None
        """The clock a DDP wrapping marks the first gradient bucket on (only when stragglers are watched)."""
        self._stopped = threading.Event()

    def preflight(self) -> None:
        """Before this worker becomes a member: the node's checks (leave with 78 on a failure); then the
        periodic re-checks in a thread until :meth:`stop`."""
        finding = self.checks.run()
        if finding is not None:
            report_unhealthy(finding)
            raise Leave(EXIT_UNHEALTHY)
        interval = self.policy.intervalSeconds
        if self.policy.enabled and interval > 0:
            threading.Thread(
                target=self._recheck, args=(interval,), name="llm-elastic-health", daemon=True
            ).start()

    def stop(self) -> None:
        """This process left the job: no more re-checks."""
        self._stopped.set()

    def _recheck(self, interval: float) -> None:
        while self.unhealthy is None and not self._stopped.wait(interval):
            try:
                finding = self.checks.run(periodic=True)
            except Exception:  # a check that breaks is logged, not fatal
                log.exception("periodic health check failed to run")
                continue
            if finding is not None:
                log.error("health check failed: %s (leaving at the next step boundary)", finding.line())
                self.unhealthy = finding

    def leave_if_unhealthy(self) -> None:
        """At a step boundary: leave (78) when a re-check or the straggler watch found this member unfit."""
        if self.unhealthy is not None:
            report_unhealthy(self.unhealthy)
            raise Leave(EXIT_UNHEALTHY)

    def compute_seconds(self, started: float) -> float:
        """This step's local compute time: to the first gradient bucket (DDP, before any wait for a peer),
        else to the commit."""
        first = self.clock.first_bucket
        self.clock.first_bucket = None
        end = first if first is not None and first >= started else time.monotonic()
        return max(0.0, end - started)

    def observe(self, times: tuple[float, ...], rank: int) -> None:
        """Straggler detection: this member against the others' median (in process, two members or more)."""
        if not self.in_process or len(times) < 2 or self.unhealthy is not None:
            return
        mine = times[rank]
        others = [t for r, t in enumerate(times) if r != rank]
        finding = self.straggler.observe(mine, others)
        if finding is not None:
            self.unhealthy = finding
