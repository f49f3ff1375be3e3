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
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

import torch
from torch import nn

from llm_elastic.commit import Signals, Verdict
from llm_elastic.errors import Evicted, StepDropped, UsageError, first_line
from llm_elastic.loss_rules import Firing

log = logging.getLogger("llm_elastic")


class StepHost(Protocol):
    """What a step needs of the loop that runs it (``Elastic``): the facts it shows, the signals it reports,
    the commit, and the step's ends."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def optimizers(self) -> list[torch.optim.Optimizer]: ...
    @property
    def step_module(self) -> nn.Module:
        """The model as wrapped for the generation."""
        ...

    def signals(self, started: float) -> tuple[Signals, Evicted | None]:
        """This member's flags for the commit (and the eviction it found, to act on at the boundary)."""
        ...

    def commit(self, value: torch.Tensor | float, signals: Signals, mean: bool) -> Verdict:
        """The step's one collective: what the members agreed on."""
        ...

    def judge_loss(self, verdict: Verdict, step: int) -> Firing | None:
        """The loss rule the verdict fires, or None."""
        ...

    def complete(self, step: Step) -> None:
        """The step ended (applied, or dropped by a loss rule): count it, report it."""
        ...

    def abandon(self) -> None:
        """The loop's own code ended the step with an error (or an exit): the process leaves the job."""
        ...


class Step:
    """One training step: a context manager that discards the step when a peer is lost mid-step.

    ``peer_lost`` (the mode's judgement) says whether a failure in the step means a lost peer; ``discard``
    drops the step's gradients. Neither reaches back into the loop: a node loss goes from here to the mode
    and the membership, and the loop sees :attr:`peer_lost` when the step has ended."""

    def __init__(
        self,
        host: StepHost,
        index: int,
        peer_lost: Callable[[BaseException], bool],
        discard: Callable[[], None],
    ) -> None:
        self._host = host
        self._judge = peer_lost
        self._discard = discard
        self.index = index
        """0-based index of this step (the number of steps completed before it)."""
        self.committed = False
        self.loss = math.nan
        """The committed value (mean over the members unless ``mean=False``)."""
        self.peer_lost = ""
        """Why the step was discarded when a peer was lost in it (the failure's first line); empty: none."""
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
        return self._host.rank

    @property
    def world_size(self) -> int:
        """Members (processes) training this step."""
        return self._host.world_size

    @property
    def model(self) -> nn.Module:
        """The model to call this step (wrapped for the generation: DDP, HSDP, or as given)."""
        return self._host.step_module

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The (first) optimizer; a new object per generation only under HSDP."""
        return self._host.optimizers[0]

    @property
    def device(self) -> torch.device:
        """This process's device (its GPU, or the CPU)."""
        return self._host.device

    @property
    def generation(self) -> int:
        """The generation number (restart mode: torchelastic's restart count)."""
        return self._host.generation

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
        signals, self.evicted = self._host.signals(self.started)
        verdict = self._host.commit(value, signals, mean)
        self.verdict = verdict
        self.loss = verdict.value
        self.committed = True
        self.firing = self._host.judge_loss(verdict, self.index + 1)
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
        s = self._host
        if exc is None:
            if not self.committed:
                s.abandon()
                raise UsageError("a step ended without step.commit(): call it after backward()")
            s.complete(self)
            return False
        if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            s.abandon()
            return False
        if isinstance(exc, StepDropped) and self.firing is not None:
            self.dropped = True
            self._discard()
            s.complete(self)
            return True
        if self._judge(exc):
            self.peer_lost = first_line(exc)
            self._discard()
            return True
        # A local failure: leave at once so that the others re-form without waiting for the lease.
        log.error("step %d failed in this process (%s): leaving the job", self.index + 1, type(exc).__name__)
        s.abandon()
        return False
