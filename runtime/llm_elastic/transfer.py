"""Hand the training state from one member to the others over the new process group (no checkpoint).

Every member first shares its completed step; the lowest rank among those with the highest step is the
source (a survivor can be one step ahead when a peer died between the step's commit and the end of its
step: that step is complete, so the others adopt it). When some member is behind or new, the source
broadcasts a header (progress, the non-tensor parts of the model and optimizer state dicts, the extras'
state dicts) and then every tensor of the model and optimizer state in place, device to device on the
process group's backend (NCCL on GPUs). Receivers then load the result through ``set_state_dict`` and the
extras' ``load_state_dict``: nothing here knows an optimizer's keys.

With HSDP (``shard_size`` > 1, ranks of a host contiguous) the tensors of each shard index travel in
``replica_group`` (the members with this process's shard index) from the source replica's member.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.distributed as dist

from llm_elastic.errors import StateLost
from llm_elastic.position import Position, Progress
from llm_elastic.staging import local_part, map_tensors, tensor_leaves
from llm_elastic.state import TrainState

if TYPE_CHECKING:
    from llm_elastic.persistence import Loaded

Source = int | Literal["checkpoint"] | None
"""Where the agreed state came from: a member's rank, storage, or nowhere (all agreed already)."""


@dataclass(frozen=True)
class Agreement:
    """What the members agreed on at a generation's start: the position this member stands at, where the
    state came from, and what a restore from storage brought back (None: no restore)."""

    position: Position
    source: Source
    loaded: Loaded | None = None


def _skeleton(state: dict[str, Any]) -> Any:
    """The state with its tensors left out (what the header carries)."""
    return map_tensors(state, lambda _path, _t: None)  # type: ignore[arg-type, return-value]


def _fill(skeleton: Any, state: Any) -> Any:
    """``skeleton``'s non-tensor values with ``state``'s tensors (same structure)."""
    if isinstance(state, torch.Tensor):
        return state
    if isinstance(state, dict) and isinstance(skeleton, dict):
        return {k: _fill(skeleton.get(k), v) for k, v in state.items()}
    if isinstance(state, (list, tuple)) and isinstance(skeleton, (list, tuple)):
        return type(state)(_fill(s, v) for s, v in zip(skeleton, state, strict=True))
    return skeleton


def synchronise(
    state: TrainState,
    position: Position,
    group: dist.ProcessGroup | None = None,
    job_step: int = 0,
    restore: Callable[[], Loaded | None] | None = None,
    replica_group: dist.ProcessGroup | None = None,
    shard_size: int = 1,
) -> Agreement:
    """Make every member hold the most advanced state; returns this member's position once they agree (the
    caller adopts it) and where the state came from.

    When every member is new, ``restore`` (collective: called on every member) loads the newest snapshot
    or complete checkpoint, or returns None when there is none. ``job_step`` is the step the job had
    reached (from etcd): if every member is new, nothing was restored and it is above 0, the state is gone
    with the old members and :class:`StateLost` is raised. A receiving member's state is marked torn
    (:attr:`TrainState.torn`) before anything is overwritten and whole again once all of it arrived, so
    that a member whose transfer breaks halfway counts as new in the next agreement.
    """
    world, progress = dist.get_world_size(group), position.progress
    fresh_here = progress.fresh or state.torn
    mine = torch.tensor([progress.step, 1 if fresh_here else 0], dtype=torch.int64)
    gathered = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    _all_gather_cpu(gathered, mine, group)
    steps = [int(t[0]) for t in gathered]
    fresh = [bool(t[1]) for t in gathered]
    if all(fresh):
        loaded = restore() if restore is not None else None
        if loaded is not None:
            return Agreement(loaded.at(position), "checkpoint", loaded)
        if job_step > 0:
            raise StateLost(f"every member is new but the job had reached step {job_step}")
    best = max(s for s, f in zip(steps, fresh, strict=True) if not f) if not all(fresh) else 0
    if all(s == best and not f for s, f in zip(steps, fresh, strict=True)):
        return Agreement(position, None)
    source = _source(steps, fresh, best, shard_size)
    me = dist.get_rank(group)
    # The member of the source's host with my shard index (itself with one process per host).
    sender = source - source % shard_size + me % shard_size
    tensor_group = replica_group if shard_size > 1 else group
    agreed = _transfer(state, progress, source, sender, group, tensor_group)
    return Agreement(position.agreed(agreed), source)


def _transfer(
    state: TrainState,
    progress: Progress,
    source: int,
    sender: int,
    group: dist.ProcessGroup | None,
    tensor_group: dist.ProcessGroup | None,
) -> Progress:
    """Collective: the source's progress, tensor layout and extras to all, each tensor from ``sender`` (the
    source's host member with this rank's shard); the receivers load them. Returns the agreed progress."""
    me = dist.get_rank(group)
    receiving = me != sender
    header: list[Any] = [None]
    if me == source:
        with_optimizer = state.has_optimizer_state()  # a source that never stepped sends none
        header[0] = {
            "progress": progress,
            "with_optimizer": with_optimizer,
            "skeleton": _skeleton(state.tensors_state(with_optimizer)),
            "extras": state.extras_state(),
        }
    if receiving:
        state.torn = True  # until every tensor and extra arrived: a break halfway leaves a new member
    dist.broadcast_object_list(header, src=_global_rank(source, group), group=group)
    sent = header[0]
    tensors = state.tensors_state(sent["with_optimizer"])
    with torch.no_grad():
        for _path, tensor in tensor_leaves(tensors):
            part = local_part(tensor)
            dist.broadcast(part, src=_global_rank(sender, group), group=tensor_group)
    if receiving:
        state.load_tensors_state(_fill(sent["skeleton"], tensors))
        state.load_extras_state(sent["extras"])
        state.torn = False
    elif me != source:  # a source replica's other shard: same tensors, but take the source's extras
        state.load_extras_state(sent["extras"])
    agreed: Progress = sent["progress"]
    return Progress(agreed.step, agreed.last_loss, fresh=False, restarts=agreed.restarts)


def _source(steps: list[int], fresh: list[bool], best: int, shard_size: int) -> int:
    """The lowest rank holding step ``best`` (any, when every member is new); with shards, on a host whose
    every shard holds that step (:class:`StateLost` when no host does)."""
    world = len(steps)
    candidates = [r for r in range(world) if steps[r] == best and (not fresh[r] or all(fresh))]
    if shard_size > 1:
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
    return min(candidates)


def _global_rank(rank: int, group: dist.ProcessGroup | None) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _all_gather_cpu(out: list[torch.Tensor], tensor: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """All-gather small CPU tensors on any backend (NCCL needs them on the device)."""
    backend = dist.get_backend(group)
    if "nccl" in str(backend) and "gloo" not in str(backend):
        device = torch.device("cuda", torch.cuda.current_device())
        moved = [t.to(device) for t in out]
        dist.all_gather(moved, tensor.to(device), group=group)
        for dst, src in zip(out, moved, strict=True):
            dst.copy_(src.cpu())
        return
    dist.all_gather(out, tensor, group=group)
