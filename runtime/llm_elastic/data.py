"""The global sample order, cut into steps and ranks the same way whatever the world size.

Step ``s`` (0-based) trains stream positions ``s*B .. s*B+B-1`` (``B`` = global batch); rank ``r`` of ``W``
takes every ``W``-th position starting at ``r``. The position is a function of the step, so a program that
resumes (from a checkpoint, a snapshot or a peer) at step ``s`` with any number of members trains exactly
the samples an uninterrupted run would: the audit in :mod:`llm_elastic.accounting` checks it from the step
log. ``ElasticSampler`` is a ``Stateful``: its state names the order (size, batch, seed), and loading a
state made for another order is refused.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from llm_elastic.order import GlobalOrder


class ElasticSampler:
    """Which sample ids each rank trains at each step."""

    def __init__(self, num_samples: int, global_batch: int, seed: int = 0) -> None:
        if global_batch < 1:
            raise ValueError(f"global_batch must be at least 1, got {global_batch}")
        self.order = GlobalOrder(num_samples, seed)
        self.global_batch = global_batch
        self.seed = seed

    @property
    def num_samples(self) -> int:
        """Samples in one epoch."""
        return self.order.num_samples

    def step_range(self, step: int) -> tuple[int, int]:
        """Stream positions ``[start, stop)`` of step ``step`` (0-based)."""
        start = step * self.global_batch
        return start, start + self.global_batch

    def positions(self, step: int, rank: int, world_size: int) -> list[int]:
        """Stream positions rank ``rank`` of ``world_size`` trains in step ``step``."""
        if world_size > self.global_batch:
            raise ValueError(
                f"global batch {self.global_batch} is smaller than the world size {world_size}: "
                "raise the global batch or use fewer ranks"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of size {world_size}")
        start, stop = self.step_range(step)
        return list(range(start + rank, stop, world_size))

    def indices(self, step: int, rank: int, world_size: int) -> list[int]:
        """Sample ids rank ``rank`` of ``world_size`` trains in step ``step``, in order."""
        return [self.order.sample_id(p) for p in self.positions(step, rank, world_size)]

    def crc32(self, step: int) -> int:
        """CRC-32 of the step's global sample ids (little-endian int64): what the step log records."""
        start, stop = self.step_range(step)
        return zlib.crc32(np.asarray(self.order.sample_ids(start, stop), dtype="<i8").tobytes())

    def state_dict(self) -> dict[str, Any]:
        """What the order is (the position itself is the step, kept by the runtime)."""
        return {"num_samples": self.num_samples, "global_batch": self.global_batch, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Refuse a state saved for another order (other data, batch or seed)."""
        mine = self.state_dict()
        if {k: state.get(k) for k in mine} != mine:
            raise ValueError(f"the saved data order {state} does not match this run's {mine}")
