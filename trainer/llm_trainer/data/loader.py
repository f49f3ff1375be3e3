"""Per-rank batches of one optimizer step, drawn from the global order at the current data position.

Step ``s`` consumes stream positions ``s*B .. s*B+B-1`` (``B`` = global batch) whatever the world size:
rank ``r`` of ``W`` takes every ``W``-th of them starting at ``r``, split into the same number of
micro-batches on every rank (gradient accumulation adapts to ``W``). The data position is the only state,
so saving it with the model and restoring it replays exactly the samples an uninterrupted run would use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from llm_elastic import ElasticSampler

from llm_trainer.data.shards import TokenShards


@dataclass(frozen=True)
class MicroBatch:
    """Inputs and next-token targets ``[b, seq_len]``; ``weight`` 0 marks a padding micro-batch."""

    inputs: torch.Tensor
    targets: torch.Tensor
    weight: float


@dataclass(frozen=True)
class StepBatch:
    """What one rank trains on in one optimizer step."""

    start: int
    """First stream position of the step (global, same on every rank)."""
    stop: int
    """One past the last stream position of the step."""
    sample_ids: list[int]
    """Sample ids this rank trains on, in order."""
    micro_batches: list[MicroBatch]
    """The rank's samples split into the step's micro-batches."""


class DistributedBatches:
    """Deterministic, world-size independent batches with a checkpointable position."""

    def __init__(
        self,
        shards: TokenShards,
        seed: int,
        global_batch: int,
        micro_batch: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if global_batch < world_size:
            raise ValueError(
                f"global batch {global_batch} is smaller than the world size {world_size}: "
                "raise --global-batch or use fewer ranks"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of size {world_size}")
        self.shards = shards
        self.sampler = ElasticSampler(shards.num_samples, global_batch, seed)
        """The runtime's cut of the global order into steps and ranks (the same one the step log records)."""
        self.seed = seed
        self.global_batch = global_batch
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.position = 0
        most_per_rank = math.ceil(global_batch / world_size)
        self.micro_steps = math.ceil(most_per_rank / micro_batch)

    def state_dict(self) -> dict[str, int | str]:
        """The data position and what it refers to."""
        return {"position": self.position, "seed": self.seed, "fingerprint": self.shards.fingerprint}

    def load_state_dict(self, state: dict[str, int | str]) -> None:
        """Continue at a saved position; refuses a position saved for other data or another seed."""
        if state.get("fingerprint") != self.shards.fingerprint:
            raise ValueError(
                "the checkpoint's data position refers to different shards or seq_len "
                f"({state.get('fingerprint')} != {self.shards.fingerprint})"
            )
        if int(state.get("seed", -1)) != self.seed:
            raise ValueError(f"the checkpoint was trained with --seed {state.get('seed')}, not {self.seed}")
        self.position = int(state["position"])

    def next_step(self) -> StepBatch:
        """The next step's batches; advances the position by one global batch."""
        start = self.position
        step, offset = divmod(start, self.global_batch)
        if offset:
            raise ValueError(
                f"data position {start} is not at a step boundary (global batch {self.global_batch})"
            )
        ids = self.sampler.indices(step, self.rank, self.world_size)
        chunks = [list(c) for c in np.array_split(np.asarray(ids, dtype=np.int64), self.micro_steps)]
        micro: list[MicroBatch] = []
        for chunk in chunks:
            weight = 1.0
            if not chunk:  # fewer samples than micro-steps: a zero-weight stand-in keeps ranks in lockstep
                chunk, weight = [ids[0]], 0.0
            tokens = torch.from_numpy(np.stack([self.shards.sample(int(i)) for i in chunk]))
            micro.append(MicroBatch(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), weight))
        self.position = start + self.global_batch
        return StepBatch(start, self.position, ids, micro)
