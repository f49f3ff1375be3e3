"""What a recovery mode is (the modes themselves: :mod:`llm_elastic.modes`, :mod:`llm_elastic.inprocess`):
:class:`RecoveryMode`, the decisions a mode makes, and :class:`ModeHost`, what a mode needs of the loop it
runs (``Elastic``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from llm_elastic.contract import Contract
from llm_elastic.health_watch import HealthWatch
from llm_elastic.persistence import Persistence
from llm_elastic.position import Position
from llm_elastic.reporting import Reporter
from llm_elastic.signals import StopRequest
from llm_elastic.state import TrainState
from llm_elastic.step import Step, StepHost
from llm_elastic.wrap import Wrapped, WrapPolicy


class ModeHost(StepHost, Protocol):
    """What a mode needs of the loop it runs (``Elastic``): the parts it drives, where the run stands (read
    here, moved only through :meth:`move`), and the generation's open, close and restore."""

    contract: Contract
    stop: StopRequest
    reporter: Reporter
    health: HealthWatch
    persistence: Persistence
    state: TrainState
    wrapped: Wrapped
    wrap_policy: WrapPolicy
    left: bool

    @property
    def backend(self) -> str: ...
    @property
    def position(self) -> Position: ...

    def move(self, to: Position) -> None:
        """Adopt ``to`` as where the run stands (a new generation, a restore, a state transfer)."""
        ...

    def open_generation(self) -> None:
        """Wrap the model and make the generation's checkpointer, snapshotter and step log."""
        ...

    def close_generation(self) -> None:
        """Drop the generation's groups and parts."""
        ...

    def restore_collective(self) -> Position | None:
        """Collective: the state from the newest snapshot or checkpoint, and the position it reached (None
        when neither exists); the host's position is left as it was."""
        ...

    def after_step(self, step: Step) -> bool:
        """The step boundary; True when the generation ends after this step."""
        ...


class RecoveryMode:
    """What a mode decides; the base is a fixed group with no membership."""

    name = ""
    live = False
    """Generations of a live membership (in process): groups change, a lost peer is survived."""

    def check(self, wrap: WrapPolicy) -> None:
        """Refuse (exit 2) a wrap policy this mode cannot use."""

    def labels(self, contract: Contract) -> dict[str, str]:
        """The metrics' labels."""
        return {"rank": str(contract.rank)}

    def run(self, s: ModeHost) -> Iterator[Step]:
        """Yield the steps still to train (groups, restore, step boundaries); ends when all are done."""
        raise NotImplementedError

    def membership_changed(self) -> bool:
        """At a commit: whether this member saw the membership change (raises ``Evicted``)."""
        return False

    def peer_lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` in a step means a lost peer (the step is discarded), not a local failure."""
        return False

    def at_boundary(self, s: ModeHost, step: Step) -> bool:
        """Act on the step's verdict (stops, evictions); True when the generation ends after this step."""
        raise NotImplementedError

    def completed(self, s: ModeHost) -> None:
        """A step completed (after its metrics, before its step log line)."""

    def record(self, s: ModeHost) -> tuple[int, dict[str, Any]]:
        """The step log's ``restart`` value and this mode's own fields."""
        raise NotImplementedError

    def leave(self) -> None:
        """Leave the job at once (best effort)."""

    def close(self) -> None:
        """The loop ended: let go of what the mode holds."""
