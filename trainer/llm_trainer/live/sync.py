"""Hand the training state from one member to the others over the new process group (no checkpoint).

Every member first shares its completed step; the lowest rank among those with the highest step is the
source (a survivor can be one step ahead when a peer died between the gradient all-reduce and the end of
its step: that step is complete, so the others adopt it). Parameters, AdamW moments and a small header
(step, data position, last loss) are broadcast from the source only when some member is behind or new.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class Progress:
    """What a member knows beyond the tensors: completed steps, data position, loss of its last step."""

    step: int
    position: int
    last_loss: float
    fresh: bool
    """True for a member that holds no trained state yet (a joiner)."""
    restarts: int = 0
    """How many times the job's state had to come back from a checkpoint (every member held none)."""


def ensure_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create AdamW's per-parameter state (zeros) where it is missing, so it can be received in place."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state[param]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of a tensor: the local shard of a DTensor (FSDP2), else the tensor's data.

    DTensor's module is not imported here (about a second of a joiner's start-up): no DTensor can exist
    before something imported it."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and isinstance(tensor, dtensor.DTensor):
        result: torch.Tensor = tensor.to_local()
        return result
    return tensor.data


def state_tensors(module: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every local tensor of the training state, in the same order on every member (of a shard index)."""
    ensure_optimizer_state(optimizer)
    tensors: list[torch.Tensor] = [local(p) for p in module.parameters()]
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state[param]
            tensors += [local(state["step"]), local(state["exp_avg"]), local(state["exp_avg_sq"])]
    return tensors


class StateLost(RuntimeError):
    """Every member of the generation is new although the job had trained, and no checkpoint exists."""


Source = int | Literal["checkpoint"] | None
"""Where the agreed state came from: a member's rank, the checkpoint, or nowhere (all agreed already)."""


def synchronise(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    progress: Progress,
    group: dist.ProcessGroup | None,
    job_step: int = 0,
    on_receive: Callable[[], None] | None = None,
    restore: Callable[[], Progress | None] | None = None,
    replica_group: dist.ProcessGroup | None = None,
    shard_size: int = 1,
) -> tuple[Progress, Source]:
    """Make every member hold the most advanced state; returns the agreed progress and its source.

    When every member is new, ``restore`` (collective: called on every member) loads the newest complete
    checkpoint and returns its progress, or None when there is none: the restart path under the live one.
    ``job_step`` is the step the job had reached (from etcd): if every member is new, nothing was restored
    and it is above 0, the state is gone with the old members and :class:`StateLost` is raised.
    ``on_receive`` is called on the receiving members before anything is overwritten, so that a member
    whose transfer breaks halfway marks itself new (a half-received state must never become a source).

    With HSDP (``shard_size`` > 1, ranks of a host contiguous) the state of each shard index travels in
    ``replica_group`` (the members with this process's shard index) from the source replica's member.
    """
    world = dist.get_world_size(group)
    mine = torch.tensor([progress.step, 1 if progress.fresh else 0], dtype=torch.int64)
    gathered = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    steps = [int(t[0]) for t in gathered]
    fresh = [bool(t[1]) for t in gathered]
    if all(fresh):
        restored = restore() if restore is not None else None
        if restored is not None:
            return restored, "checkpoint"
        if job_step > 0:
            raise StateLost(f"every member is new but the job had reached step {job_step}")
    best = max(s for s, f in zip(steps, fresh, strict=True) if not f) if not all(fresh) else 0
    if all(s == best and not f for s, f in zip(steps, fresh, strict=True)):
        return progress, None
    candidates = [r for r in range(world) if steps[r] == best and (not fresh[r] or all(fresh))]
    if shard_size > 1:  # the source must be a host whose every shard holds that step
        candidates = [
            r
            for r in candidates
            if all(
                steps[q] == best and not fresh[q]
                for q in range(r - r % shard_size, r - r % shard_size + shard_size)
            )
            or all(fresh)
        ]
        if not candidates:
            raise StateLost(f"no host holds every shard of step {best}")
    source = min(candidates)
    me = dist.get_rank(group)
    # The member of the source's host with my shard index (itself with one process per host).
    sender = source - source % shard_size + me % shard_size
    if on_receive is not None and me != sender:
        on_receive()
    header = torch.tensor(
        [progress.step, progress.position, progress.last_loss, progress.restarts], dtype=torch.float64
    )
    dist.broadcast(header, src=source, group=group)
    for tensor in state_tensors(module, optimizer):
        dist.broadcast(tensor, src=sender, group=replica_group if shard_size > 1 else group)
    agreed = Progress(int(header[0]), int(header[1]), float(header[2]), fresh=False, restarts=int(header[3]))
    return agreed, source
