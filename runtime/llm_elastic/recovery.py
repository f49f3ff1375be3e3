"""What a recovery mode is (the modes themselves: :mod:`llm_elastic.modes`, :mod:`llm_elastic.inprocess`).

``Elastic`` (session.py) runs the loop and asks its mode; a mode decides from narrow inputs and never calls
back into the loop (decision LM4). One generation, as the loop runs it:

1. :meth:`RecoveryMode.next_world`: this member's place in the next generation (None: the run is over);
2. :meth:`~RecoveryMode.form`: join its process group; the loop wraps the model;
3. :meth:`~RecoveryMode.agree`: the state every member trains on (:class:`~llm_elastic.transfer.Agreement`);
4. the steps: per step the mode judges a failure (:meth:`~RecoveryMode.peer_lost`) and the boundary
   (:meth:`~RecoveryMode.at_boundary`: go on, re-form, or leave with a code by raising ``Leave``);
5. :meth:`~RecoveryMode.close_generation` and :meth:`~RecoveryMode.ended` (the :class:`Outcome`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from llm_elastic.commit import Verdict
from llm_elastic.contract import Contract
from llm_elastic.errors import Evicted
from llm_elastic.health_watch import HealthWatch
from llm_elastic.persistence import Loaded, Persistence
from llm_elastic.position import Position, World
from llm_elastic.reporting import Reporter
from llm_elastic.signals import StopRequest
from llm_elastic.state import TrainState
from llm_elastic.transfer import Agreement
from llm_elastic.wrap import Wrapped, WrapPolicy


class Outcome(enum.Enum):
    """How a generation ended."""

    DONE = "done"
    """Every step is trained."""
    CHANGED = "changed"
    """The members agreed at a step boundary that the membership changed (a joiner, a leaver)."""
    PEER_LOST = "peer lost"
    """A peer vanished: the step in flight was discarded (a failed generation)."""


@dataclass(frozen=True)
class Parts:
    """The parts a mode drives (given once, at :meth:`RecoveryMode.start`); never the loop itself."""

    contract: Contract
    reporter: Reporter
    health: HealthWatch
    persistence: Persistence
    stop: StopRequest
    wrap: WrapPolicy


Restore = Callable[[], Loaded | None]
"""Collective: the newest snapshot's or checkpoint's state (None when neither exists)."""


class RecoveryMode:
    """What a mode decides; the base is a fixed group with no membership."""

    name = ""
    live = False
    """Generations of a live membership (in process): groups change, a lost peer is survived; the loop
    closes each generation when it ends."""

    def check(self, wrap: WrapPolicy) -> None:
        """Refuse (exit 2) a wrap policy this mode cannot use."""

    def labels(self, contract: Contract) -> dict[str, str]:
        """The metrics' labels."""
        return {"rank": str(contract.rank)}

    def start(self, parts: Parts, backend: str) -> None:
        """Before the first generation: what the mode needs to take part (a group, a membership)."""
        raise NotImplementedError

    def next_world(self, step: int) -> World | None:
        """This member's place in the next generation (``step``: steps it holds); None: the run is over."""
        raise NotImplementedError

    def form(self, backend: str) -> int:
        """Join the generation's process group; returns the step the job had reached (0: unknown)."""
        return 0

    def watch(self, device: torch.device) -> None:
        """The generation's model is wrapped: watch its groups (NCCL)."""

    def agree(
        self, state: TrainState, position: Position, restore: Restore, wrapped: Wrapped, job_step: int
    ) -> Agreement:
        """Collective: the state every member trains on from here, and the position it stands at."""
        raise NotImplementedError

    def formed(self, position: Position, agreement: Agreement, formed_at: float) -> None:
        """The generation trains from ``position`` (reports, logs)."""

    def peer_lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` in a step means a lost peer (the step is discarded), not a local failure."""
        return False

    def membership_changed(self) -> bool:
        """At a commit: whether this member saw the membership change (raises ``Evicted``)."""
        return False

    def at_boundary(self, verdict: Verdict, evicted: Evicted | None, world_size: int, step: int) -> bool:
        """The step boundary's decision from the step's verdict: go on (False), re-form (True), or leave
        with a code (raises ``Leave``)."""
        raise NotImplementedError

    def completed(self, rank: int, step: int) -> None:
        """A step completed (after its metrics, before its step log line)."""

    def record(self, position: Position) -> tuple[int, dict[str, Any]]:
        """The step log's ``restart`` value and this mode's own fields."""
        raise NotImplementedError

    def finished(self, rank: int) -> None:
        """Every step is trained (and the final checkpoint saved)."""

    def close_generation(self) -> None:
        """A live generation ends: let go of its membership parts (the loop drops the groups)."""

    def ended(self, outcome: Outcome, step: int) -> None:
        """A generation ended early (changed, peer lost): count it (raises ``Leave`` when the budget of
        failed generations is spent)."""

    def leave(self) -> None:
        """Leave the job at once (best effort)."""

    def close(self) -> None:
        """The loop ended: let go of what the mode holds."""
