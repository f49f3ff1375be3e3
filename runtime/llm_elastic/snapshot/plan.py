"""Which in-memory snapshot to restore, and which rank serves each shard (pure: no I/O).

Every rank reports the shards it holds in its node's shared memory (its own ``local`` ones and the
``buddy`` copies it keeps for another node). All ranks then run :func:`choose` on the same gathered lists
and get the same answer: the newest step for which *every* rank of the new world can get a shard saved at
that step, or None (restore from the newest complete checkpoint instead). Steps are never mixed.

- Replicated state (DDP: every rank holds the whole model and optimizer): any shard of the step serves
  every new rank, whatever the new world size.
- Sharded state (FSDP): the new world size must equal the one that saved the step, and new rank r loads
  the shard that rank r saved.
A rank serves itself when it can (its own node's memory, ``local`` before ``buddy``), else the lowest
rank that holds the shard sends it over the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Held:
    """A complete shard in some rank's node memory."""

    holder: int
    """Current rank whose node holds it."""
    step: int
    source_rank: int
    """Rank that saved it."""
    source_world: int
    """World size when it was saved."""
    layout: str
    """What the shard's tensors mean (model, parallelism, data): only equal layouts are compatible."""
    kind: str
    """``local`` or ``buddy``."""
    slot: int = 0


@dataclass(frozen=True)
class Source:
    """Where one new rank gets its shard."""

    holder: int
    source_rank: int
    kind: str
    slot: int = 0


@dataclass(frozen=True)
class RestorePlan:
    """The step to restore and, per new rank, its shard's source."""

    step: int
    sources: tuple[Source, ...]

    def peers_used(self) -> int:
        """How many ranks receive their shard from another rank."""
        return sum(1 for rank, src in enumerate(self.sources) if src.holder != rank)


def held_from_headers(holder: int, headers: list[dict[str, Any]]) -> list[Held]:
    """Shards described by the headers one rank found (``store.inventory``)."""
    return [
        Held(
            holder,
            int(h["step"]),
            int(h["rank"]),
            int(h["world_size"]),
            str(h["layout"]),
            str(h["kind"]),
            int(h.get("slot", 0)),
        )
        for h in headers
    ]


def _pick(candidates: list[Held], rank: int) -> Held:
    own = [h for h in candidates if h.holder == rank]
    if own:
        return min(own, key=lambda h: (h.kind != "local", h.source_rank != rank, h.source_rank))
    return min(candidates, key=lambda h: (h.holder, h.kind != "local", h.source_rank))


def choose(
    held: list[Held], world_size: int, layout: str, replicated: bool, not_before: int = 0
) -> RestorePlan | None:
    """The newest step (>= ``not_before``) every rank of ``world_size`` can restore, or None."""
    usable = [h for h in held if h.layout == layout and h.step >= not_before]
    for step in sorted({h.step for h in usable}, reverse=True):
        at_step = [h for h in usable if h.step == step]
        sources = []
        for rank in range(world_size):
            if replicated:
                candidates = at_step
            else:
                candidates = [h for h in at_step if h.source_world == world_size and h.source_rank == rank]
            if not candidates:
                break
            best = _pick(candidates, rank)
            sources.append(Source(best.holder, best.source_rank, best.kind, best.slot))
        else:
            return RestorePlan(step, tuple(sources))
    return None


def buddy_of(rank: int, world_size: int, local_world_size: int) -> tuple[int, int] | None:
    """``(send to, receive from)``: the same local rank on the next and on the previous node; None with a
    single node."""
    if not 0 < local_world_size < world_size:
        return None
    return (rank + local_world_size) % world_size, (rank - local_world_size) % world_size


def node_files(rank: int, world_size: int, local_world_size: int) -> set[str]:
    """Header names the ranks of this rank's node write (torchrun numbers ranks node by node); any other
    shard in the node's folder is stale."""
    per_node = max(1, local_world_size)
    first = rank - rank % per_node
    names = set()
    for member in range(first, min(world_size, first + per_node)):
        for slot in (0, 1):
            names.add(f"local-r{member}.s{slot}.json")
            pair = buddy_of(member, world_size, local_world_size)
            if pair is not None:
                names.add(f"buddy-r{pair[1]}.s{slot}.json")
    return names
