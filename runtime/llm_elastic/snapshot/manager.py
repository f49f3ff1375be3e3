"""In-memory snapshots: stage this rank's shard into host shared memory, copy it to a buddy node in the
background, and restore from memory at start.

Take (training thread, at a step boundary): the local part of every tensor of the model, the optimizer and
the RNG goes into ``local-r<rank>.bin`` in the snapshot folder (``/dev/shm/...``), then the header.
Replicate (background thread, over a gloo group of its own): rank r sends that shard to rank
``(r + local_world_size) % world_size`` -- the same local rank on the next node -- and receives the shard of
``(r - local_world_size) % world_size`` into ``buddy-r<that rank>.bin``. A node therefore holds its own
shards plus one other node's: losing any one node loses no shard. With a single node there is no buddy.
At most one replication is in flight; whether a rank is still busy travels with the step's all-reduce, so
every rank skips the same snapshot (training never waits for the network).
Restore: every rank lists its node's complete shards, the lists are gathered, ``plan.choose`` picks one
step every rank can restore, holders send shards to ranks that lack them, every rank loads its shard.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.optim import Optimizer

from llm_elastic.background import Background
from llm_elastic.snapshot import plan as planner
from llm_elastic.snapshot.store import (
    SLOTS,
    ShardFile,
    encode_header,
    entries_json,
    entries_of,
    entry_view,
    inventory,
    layout,
    older_slot,
)
from llm_elastic.staging import local_part, tensor_leaves

log = logging.getLogger(__name__)

Optimizers = Optimizer | tuple[Optimizer, ...]

RNG_CPU = "rng/cpu"
RNG_CUDA = "rng/cuda"


def _rng_tensors() -> list[tuple[str, torch.Tensor]]:
    out = [(RNG_CPU, torch.get_rng_state())]
    if torch.cuda.is_available():
        out.append((RNG_CUDA, torch.cuda.get_rng_state()))
    return out


class Snapshotter:
    """Takes, replicates and restores this rank's in-memory snapshots."""

    def __init__(
        self,
        folder: Path,
        rank: int,
        world_size: int,
        local_world_size: int,
        group: dist.ProcessGroup,
        layout_key: str,
        replicated: bool,
    ) -> None:
        self.folder = folder
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.layout_key = layout_key
        self.replicated = replicated
        pair = planner.buddy_of(rank, world_size, local_world_size)
        self.buddy_to = pair[0] if pair else None
        self.buddy_from = pair[1] if pair else None
        self.node_files = planner.node_files(rank, world_size, local_world_size)
        pin = torch.cuda.is_available()
        self.local_slots = [ShardFile(folder, "local", rank, slot, pin) for slot in SLOTS]
        self.local = self.local_slots[0]
        """The slot written last."""
        self.buddy_slots = (
            [ShardFile(folder, "buddy", self.buddy_from, slot) for slot in SLOTS]
            if self.buddy_from is not None
            else []
        )
        self._copying = Background("snapshot replication")
        self.last_stall = 0.0
        """Seconds the training thread spent in the last :meth:`take`."""
        self.last_replicate = 0.0
        """Seconds the last buddy copy took."""
        self.taken_step = -1

    # -- take and replicate ---------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a buddy copy is still in flight."""
        return self._copying.busy

    def wait(self) -> None:
        """Wait for the buddy copy in flight; raise if it failed."""
        self._copying.wait()

    def take(self, step: int, model: nn.Module, optimizer: Optimizers, meta: dict[str, Any]) -> None:
        """Stage the state of ``step`` into shared memory, then start the buddy copy (collective; every rank
        calls it at the same step, after the previous copy ended)."""
        self.wait()
        started = time.monotonic()
        model_state, optim_state = get_state_dict(model, optimizer)
        leaves = [
            (p, local_part(t).detach())
            for p, t in tensor_leaves({"model": model_state, "optim": optim_state})
        ]
        leaves += _rng_tensors()
        entries, size = layout(leaves)
        self.local = older_slot(self.local_slots)
        self.local.invalidate()
        payload = self.local.payload(size)
        asynchronous = self.local.pinned  # pinned: device-to-host copies overlap, one sync at the end
        with torch.no_grad():
            for entry, (_, tensor) in zip(entries, leaves, strict=True):
                entry_view(payload, entry).copy_(tensor, non_blocking=asynchronous)
        if asynchronous:
            torch.cuda.current_stream().synchronize()
        header = {
            "step": step,
            "rank": self.rank,
            "world_size": self.world_size,
            "layout": self.layout_key,
            "entries": entries_json(entries),
            "meta": meta,
            "payload_bytes": size,
            "saved_at": time.time(),
        }
        self.local.commit(header)
        self.taken_step = step
        self.last_stall = time.monotonic() - started
        if self.buddy_to is None:
            self._drop_stale()
        else:
            self._copying.start(f"snapshot-buddy-{step}", self._replicate, header, payload)

    def _replicate(self, header: dict[str, Any], payload: torch.Tensor) -> None:
        started = time.monotonic()
        assert self.buddy_to is not None and self.buddy_from is not None
        into = older_slot(self.buddy_slots)
        received = _exchange(self.group, header, payload, self.buddy_to, self.buddy_from, into)
        self._drop_stale()
        log.debug("snapshot step %s copied to rank %d", received, self.buddy_to)
        self.last_replicate = time.monotonic() - started

    def _drop_stale(self) -> None:
        """Remove shards that no rank of this node writes any more (left from another world): the memory
        bound is one local and one buddy shard per rank."""
        for path in self.folder.glob("*-r*.s*.json"):
            if path.name not in self.node_files:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                with contextlib.suppress(FileNotFoundError):
                    path.with_suffix(".bin").unlink()

    # -- restore --------------------------------------------------------------------------------------------

    def restore(
        self, model: nn.Module, optimizer: Optimizers, not_before: int
    ) -> tuple[dict[str, Any], str, int] | None:
        """Collective: load the newest snapshot every rank can get (>= ``not_before``); returns its meta,
        where this rank's shard came from (``local``, ``buddy`` or ``peer``) and how many ranks received
        theirs from a peer; None when memory cannot serve every rank."""
        mine = [
            {k: h[k] for k in ("step", "rank", "world_size", "layout", "kind", "slot")}
            for h in inventory(self.folder)
        ]
        gathered: list[list[dict[str, Any]] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, mine, group=self.group)
        held = [
            h for rank, found in enumerate(gathered) for h in planner.held_from_headers(rank, found or [])
        ]
        choice = planner.choose(held, self.world_size, self.layout_key, self.replicated, not_before)
        if choice is None:
            return None
        header, payload = self._fetch(choice)
        self._load(header, payload, model, optimizer)
        src = choice.sources[self.rank]
        where = src.kind if src.holder == self.rank else "peer"
        if self.rank == 0:
            log.info(
                "restored step %d from memory (%d of %d ranks received their shard from a peer)",
                choice.step,
                choice.peers_used(),
                self.world_size,
            )
        return dict(header["meta"]), where, choice.peers_used()

    def _fetch(self, choice: planner.RestorePlan) -> tuple[dict[str, Any], torch.Tensor]:
        mine: tuple[dict[str, Any], torch.Tensor] | None = None
        for rank, src in enumerate(choice.sources):
            if src.holder == rank == self.rank:
                shard = ShardFile(self.folder, src.kind, src.source_rank, src.slot)
                header = shard.read_header()
                assert header is not None, f"snapshot {shard.header_path} vanished"
                mine = (header, shard.payload(int(header["payload_bytes"])))  # unmapped when dropped
            elif src.holder == self.rank:
                shard = ShardFile(self.folder, src.kind, src.source_rank, src.slot)
                header = shard.read_header()
                assert header is not None, f"snapshot {shard.header_path} vanished"
                _send(self.group, header, shard.payload(int(header["payload_bytes"])), rank)
                shard.close()
            elif rank == self.rank:
                mine = _recv(self.group, src.holder)
        assert mine is not None
        return mine

    def _load(
        self, header: dict[str, Any], payload: torch.Tensor, model: nn.Module, optimizer: Optimizers
    ) -> None:
        entries = {e.path: e for e in entries_of(header)}
        model_state, optim_state = get_state_dict(model, optimizer)
        with torch.no_grad():
            for path, tensor in tensor_leaves({"model": model_state, "optim": optim_state}):
                entry = entries.get(path)
                target = local_part(tensor)
                if entry is None or tuple(target.shape) != entry.shape:
                    raise RuntimeError(f"snapshot does not match this model at {path}")
                target.copy_(entry_view(payload, entry))
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
        if RNG_CPU in entries:
            torch.set_rng_state(entry_view(payload, entries[RNG_CPU]).clone())
        if RNG_CUDA in entries and torch.cuda.is_available():
            torch.cuda.set_rng_state(entry_view(payload, entries[RNG_CUDA]).clone())


def _send(group: dist.ProcessGroup, header: dict[str, Any], payload: torch.Tensor, dst: int) -> None:
    raw = torch.frombuffer(bytearray(encode_header(header)), dtype=torch.uint8)
    dist.send(torch.tensor([raw.numel(), payload.numel()], dtype=torch.int64), dst, group=group)
    dist.send(raw, dst, group=group)
    if payload.numel():
        dist.send(payload, dst, group=group)


def _recv(group: dist.ProcessGroup, src: int) -> tuple[dict[str, Any], torch.Tensor]:
    sizes = torch.empty(2, dtype=torch.int64)
    dist.recv(sizes, src, group=group)
    raw = torch.empty(int(sizes[0]), dtype=torch.uint8)
    dist.recv(raw, src, group=group)
    payload = torch.empty(int(sizes[1]), dtype=torch.uint8)
    if payload.numel():
        dist.recv(payload, src, group=group)
    return json.loads(bytes(raw.numpy())), payload


def _exchange(
    group: dist.ProcessGroup,
    header: dict[str, Any],
    payload: torch.Tensor,
    dst: int,
    src: int,
    into: ShardFile,
) -> int:
    """Send our shard to ``dst`` while receiving ``src``'s into ``into``; returns the received step."""
    raw = torch.frombuffer(bytearray(encode_header(header)), dtype=torch.uint8)
    out_sizes = torch.tensor([raw.numel(), payload.numel()], dtype=torch.int64)
    in_sizes = torch.empty(2, dtype=torch.int64)
    _pair(group, out_sizes, dst, in_sizes, src)
    in_raw = torch.empty(int(in_sizes[0]), dtype=torch.uint8)
    _pair(group, raw, dst, in_raw, src)
    received = json.loads(bytes(in_raw.numpy()))
    into.invalidate()
    buffer = into.payload(int(in_sizes[1]))
    _pair(group, payload, dst, buffer, src)
    into.commit(received)
    return int(received["step"])


def _pair(group: dist.ProcessGroup, out: torch.Tensor, dst: int, into: torch.Tensor, src: int) -> None:
    ops = [dist.P2POp(dist.isend, out, dst, group), dist.P2POp(dist.irecv, into, src, group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
