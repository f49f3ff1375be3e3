"""This member's side of the step's commit (:mod:`llm_elastic.commit` packs and reads the wire): the signals
it reports, gathered from the parts; the all-reduce; and what the verdict updates (straggler times, the
job's count of restarted programs).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from llm_elastic import commit as wire
from llm_elastic.commit import CommitWire, Signals, Verdict
from llm_elastic.errors import Evicted
from llm_elastic.health_watch import HealthWatch
from llm_elastic.persistence import Persistence
from llm_elastic.reporting import Reporter
from llm_elastic.signals import StopRequest


class Committer:
    """The commit as one member makes it (``membership_changed``: the mode's check, may raise ``Evicted``)."""

    def __init__(
        self,
        device: torch.device,
        health: HealthWatch,
        persistence: Persistence,
        reporter: Reporter,
        stop: StopRequest,
        membership_changed: Callable[[], bool],
        *,
        restarted: bool,
    ) -> None:
        self.wire = CommitWire(device)
        self.health = health
        self.persistence = persistence
        self.reporter = reporter
        self.stop = stop
        self.membership_changed = membership_changed
        self.job_process_restarts = 0
        """Layer-2 restarts of the job's programs so far, as the members agree on it at each commit."""
        self.restart_announced = not restarted
        """This program's own restart (if it is one) was counted in a commit."""

    def signals(self, started: float) -> tuple[Signals, Evicted | None]:
        """This member's flags for a commit, and the eviction it found (acted on at the boundary)."""
        changed, evicted = False, None
        try:
            changed = self.membership_changed()
        except Evicted as exc:  # leave at this step boundary, after the others summed this step with us
            evicted = exc
        stopping = self.stop.requested
        leaving = evicted is not None or self.health.unhealthy is not None
        signals = Signals(
            changed=changed or stopping or leaving,
            stopping=stopping,
            busy=self.persistence.busy,
            restart_announced=self.restart_announced,
            compute_seconds=self.health.compute_seconds(started),
            process_restarts=self.job_process_restarts,
        )
        return signals, evicted

    def commit(
        self, value: torch.Tensor | float, signals: Signals, mean: bool, rank: int, world_size: int
    ) -> Verdict:
        """The step's one collective; the verdict feeds straggler detection and the restart count."""
        reduced = self.wire.reduce(value, signals, rank, world_size)
        self.persistence.before_update()  # staging copies must have read the parameters
        verdict = self.wire.read(wire.host_values(reduced), signals, world_size, mean)
        self.health.observe(verdict.compute_seconds, rank)
        self.restart_announced = True
        self.job_process_restarts = verdict.process_restarts
        self.reporter.update(job_process_restarts=self.job_process_restarts)
        return verdict
