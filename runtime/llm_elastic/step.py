"""One step of the loop: :class:`Step`, the context manager a training loop enters once per step.

The step's one collective of the runtime is :meth:`Step.commit` (packed and read by
:mod:`llm_elastic.commit`); its result is the frozen :attr:`Step.verdict` the session acts on
at the step boundary. A step is discarded in one place, :meth:`Step.__exit__`: when a peer is lost
mid-step, and when the members agreed in the commit to drop it (a loss rule, :mod:`llm_elastic.loss_rules`).
"""

from __future__ import annotations

import logging
import math
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from llm_elastic import commit as wire
from llm_elastic.commit import Signals, Verdict
from llm_elastic.errors import Evicted, StepDropped, UsageError
from llm_elastic.loss_rules import Firing

if TYPE_CHECKING:
    from llm_elastic.session import Elastic

log = logging.getLogger("llm_elastic")


class Step:
    """One training step: a context manager that discards the step when a peer is lost mid-step."""

    def __init__(self, session: Elastic, index: int) -> None:
        self._session = session
        self.index = index
        """0-based index of this step (the number of steps completed before it)."""
        self.committed = False
        self.loss = math.nan
        """The committed value (mean over the members unless ``mean=False``)."""
        self.peer_lost = False
        self.firing: Firing | None = None
        """The loss rule that fired in this step's commit (None: none)."""
        self.dropped = False
        """The members agreed not to apply this step (a loss rule): it counts as skipped."""
        self.verdict: Verdict | None = None
        """What the members agreed on in :meth:`commit` (None before it)."""
        self.evicted: Evicted | None = None
        """Set when this member found itself evicted during the commit: it leaves at the step boundary."""
        self.fields: dict[str, Any] = {}
        """The fields :meth:`record` added for the step log."""
        self.started = time.monotonic()

    # -- what the loop reads -----------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's rank in the current generation."""
        return self._session.rank

    @property
    def world_size(self) -> int:
        """Members (processes) training this step."""
        return self._session.world_size

    @property
    def model(self) -> nn.Module:
        """The model to call this step (wrapped for the generation: DDP, HSDP, or as given)."""
        return self._session.wrapped.module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The (first) optimizer; a new object per generation only under HSDP."""
        return self._session.optimizers[0]

    @property
    def device(self) -> torch.device:
        """This process's device (its GPU, or the CPU)."""
        return self._session.device

    @property
    def generation(self) -> int:
        """The generation number (restart mode: torchelastic's restart count)."""
        return self._session.generation

    def record(self, **fields: Any) -> None:
        """Add JSON-serialisable fields to this step's line in the step log."""
        self.fields.update(fields)

    # -- the commit ---------------------------------------------------------------------------------------

    def commit(self, value: torch.Tensor | float = 0.0, *, mean: bool = True) -> float:
        """End the step's collective work: one all-reduce of ``value`` (the loss, say) together with the
        runtime's flags (membership changed, a member stopping, a snapshot copy busy, a non-finite value).
        Returns the mean of ``value`` over the members (the sum with ``mean=False``). Call it after the
        backward and before the optimizer's update; once it returns the step is complete on every member.

        When a loss rule drops the step (``value`` was not finite on some member), it does not return: the
        code after it in ``with step:`` does not run on any member, and the step counts as skipped."""
        if self.committed:
            raise UsageError("step.commit() was called twice in one step")
        s = self._session
        changed = False
        try:
            changed = s.recovery.membership_changed()
        except Evicted as exc:  # leave at this step boundary, after the others summed this step with us
            self.evicted = exc
        stopping = s.stop.requested
        leaving = self.evicted is not None or s.health.unhealthy is not None
        signals = Signals(
            changed=changed or stopping or leaving,
            stopping=stopping,
            busy=s.persistence.busy,
            restart_announced=s.restart_announced,
            compute_seconds=s.health.compute_seconds(self.started),
            process_restarts=s.job_process_restarts,
        )
        reduced = s.wire.reduce(value, signals, s.rank, s.world_size)
        s.persistence.before_update()  # staging copies must have read the parameters
        verdict = s.wire.read(wire.host_values(reduced), signals, s.world_size, mean)
        self.verdict = verdict
        s.agreed(verdict)
        self.loss = verdict.value
        self.committed = True
        self.firing = s.judge_loss(verdict, self.index + 1)
        if self.firing is not None and self.firing.drops:
            raise StepDropped(f"rule {self.firing.rule!r}: step {self.index + 1} is dropped by every member")
        return self.loss

    # -- the context --------------------------------------------------------------------------------------

    def __enter__(self) -> Step:
        self.started = time.monotonic()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        s = self._session
        if exc is None:
            if not self.committed:
                s.leave_now()
                raise UsageError("a step ended without step.commit(): call it after backward()")
            s.complete(self)
            return False
        if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            s.leave_now()
            return False
        if isinstance(exc, StepDropped) and self.firing is not None:
            self.dropped = True
            self._discard()
            s.complete(self)
            return True
        if s.recovery.peer_lost(exc):
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning(
                "generation %d: a peer is gone during step %d (%s)", s.generation, self.index + 1, first
            )
            self.peer_lost = True
            self._discard()
            return True
        # A local failure: leave at once so that the others re-form without waiting for the lease.
        log.error("step %d failed in this process (%s): leaving the job", self.index + 1, type(exc).__name__)
        s.leave_now()
        return False

    def _discard(self) -> None:
        """Nothing of this step reaches the weights: its gradients go."""
        self._session.state.zero_grad()
