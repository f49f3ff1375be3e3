"""A member outside a generation (waiting for its start file, for a generation to form, or as a spare):
a stop signal leaves at once, and the standby and outside gauges and events say where it waits."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from llm_elastic.config import ElasticConfig
from llm_elastic.leave import Leave
from llm_elastic.live.membership import Membership
from llm_elastic.reporting import Reporter
from llm_elastic.signals import StopRequest

log = logging.getLogger("llm_elastic")


class Waiting:
    """What a member reports while no generation takes it in."""

    def __init__(
        self, membership: Membership, config: ElasticConfig, reporter: Reporter, stop: StopRequest
    ) -> None:
        self.membership = membership
        self.config = config
        self.reporter = reporter
        self.stop = stop
        self.standby = False
        self.outside_warned = False

    def check_stop(self) -> None:
        """A stop signal while no step runs (waiting, forming): leave at once."""
        if self.stop.requested:
            log.info("stopped by %s while not training; left the job", self.stop.signal_name)
            raise Leave(0)

    def for_start_file(self, path: str) -> None:
        """Hold the start until ``path`` exists (benchmarks release every member at once)."""
        self.reporter.event("waiting", time=time.time(), pid=os.getpid())
        while not Path(path).exists():
            self.check_stop()
            time.sleep(0.02)
        self.reporter.event("released", time=time.time(), pid=os.getpid())

    def tick(self, step: int) -> None:
        """Called while a generation forms: stop signals, the standby state of a spare, and a member left
        outside a generation that should have taken it in."""
        self.check_stop()
        membership = self.membership
        if membership.standby != self.standby:
            self.standby = membership.standby
            self.reporter.update(standby=1.0 if self.standby else 0.0)
            if self.standby:
                self.reporter.event("standby", time=time.time(), pid=os.getpid(), step=step)
        self._report_outside()

    def taken_in(self) -> None:
        """A generation formed with this member: neither standby nor outside any more."""
        if self.standby:
            self.standby = False
            self.reporter.update(standby=0.0)
        self.reporter.update(outside_seconds=0.0)
        self.outside_warned = False

    def _report_outside(self) -> None:
        """The guard for what no test foresaw: a gauge of the wait, and one warning past the bound."""
        membership = self.membership
        since = membership.outside_since
        waited = 0.0 if since is None else time.monotonic() - since
        self.reporter.update(outside_seconds=waited)
        if since is None:
            self.outside_warned = False
        elif waited >= self.config.outside_warn_seconds and not self.outside_warned:
            self.outside_warned = True
            log.warning(
                "member %s has waited %.0fs outside a running generation that is not full "
                "(it should be taken in at the next step boundary)",
                membership.member,
                waited,
            )
            self.reporter.event("outside", time=time.time(), pid=os.getpid(), waited=round(waited, 1))
