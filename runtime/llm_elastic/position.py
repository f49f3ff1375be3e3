"""Where this process stands in the run, as one value: :class:`Position` holds its place in the generation
(:class:`World`), the training's progress (:class:`Progress`) and where its state came from
(:class:`RestoreFacts`).

A position never changes in place. Each method returns the position after one kind of move; a restore and
a state transfer return the position they reached, and ``Elastic.move`` is the one place that adopts a new
one. Nothing here imports another runtime module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class World:
    """This process in the current generation."""

    rank: int = 0
    world_size: int = 1
    generation: int = 0
    """The generation number (restart mode: torchelastic's restart count)."""


@dataclass(frozen=True)
class Progress:
    """What a member knows beyond the tensors: completed steps, loss of its last step."""

    step: int
    last_loss: float
    fresh: bool
    """True for a member that holds no trained state yet (a joiner)."""
    restarts: int = 0
    """How many times the job's state had to come back from a checkpoint (every member held none)."""


@dataclass(frozen=True)
class RestoreFacts:
    """Where this process's state came from at its start (``Elastic.restored``)."""

    resumed_from: int | None = None
    """The step training resumed at (in process: the step the generation agreed on); None: from scratch."""
    source: str | None = None
    """``"memory"`` (a snapshot), ``"checkpoint"``, or None (nothing restored from storage)."""
    seconds: float = 0.0
    """Restart mode and standalone: wall seconds the restore took."""
    peers: int = 0
    """Ranks that received their snapshot shard from another node."""


@dataclass(frozen=True)
class Position:
    """Where this process stands: its generation, its progress, where its state came from."""

    world: World = World()
    progress: Progress = Progress(0, math.nan, fresh=True)
    restored: RestoreFacts = RestoreFacts()

    def joined(self, world: World) -> Position:
        """This process's place in a new generation (the progress is the one it brings)."""
        return replace(self, world=world)

    def from_scratch(self) -> Position:
        """Nothing was restored and no peer sends state: this member's own state is the job's."""
        return replace(self, progress=replace(self.progress, fresh=False))

    def agreed(self, progress: Progress) -> Position:
        """The members agreed on ``progress`` (a state transfer) and this member now holds its state."""
        return replace(self, progress=replace(progress, fresh=False))

    def loaded(self, progress: Progress, source: str, peers: int | None) -> Position:
        """The state came back from storage (``source``: ``"memory"`` or ``"checkpoint"``) at ``progress``;
        ``peers``: ranks whose snapshot shard came from another node (None, a checkpoint: the count stays)."""
        r = self.restored
        facts = RestoreFacts(r.resumed_from, source, r.seconds, r.peers if peers is None else peers)
        return replace(self, progress=replace(progress, fresh=False), restored=facts)

    def resumed(self, seconds: float | None = None) -> Position:
        """Training goes on from this position's step; ``seconds``: how long the restore took, when timed."""
        took = self.restored.seconds if seconds is None else seconds
        return replace(self, restored=replace(self.restored, resumed_from=self.progress.step, seconds=took))

    def trained(self, step: int, loss: float | None) -> Position:
        """``step`` steps are complete. ``loss``: the last step's; None when it was dropped (the state is
        the step before's, and so is the loss)."""
        last = self.progress.last_loss if loss is None else loss
        return replace(self, progress=Progress(step, last, False, self.progress.restarts))
