"""Before training: do this node's snapshots fit in the snapshot folder? (pure arithmetic + a thin caller)

A node's folder holds, for each of its ranks, two slots of the rank's own shard and, with more than one
node, two slots of its buddy's shard (``store.py``). Writing past a tmpfs limit does not fail cleanly: the
mapped payload faults with SIGBUS in the middle of a step. So the trainer checks once, at start, and stops
with one line that names the sizes and the setting to change. A shard is every tensor of the model's state
dict plus AdamW's two moments and step counter per parameter, plus the RNG states, each entry 64-byte
aligned (``store.layout``); the optimizer state does not exist before the first step, so it is predicted
from the parameters. Shard files already in the folder (a restarted worker's, or left from another world)
count as free: they are rewritten in place or removed after the first snapshot.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.optim import Optimizer

from llm_elastic.snapshot.store import ALIGN, FILE, SLOTS
from llm_elastic.staging import local_part, tensor_leaves

PAGE = 4096
"""tmpfs allocates whole pages per file."""
HEADER_BYTES_PER_ENTRY = 256
"""Generous size of one entry in a shard's JSON header."""
ADAMW_MOMENTS = 2
GIB = float(1 << 30)


class SnapshotSpaceError(ValueError):
    """The snapshot folder cannot hold this node's snapshots."""


def _round_up(value: int, unit: int) -> int:
    return (value + unit - 1) // unit * unit


def payload_bytes(entry_bytes: Iterable[int]) -> int:
    """Size of a payload of entries of these sizes, each 64-byte aligned (as ``store.layout`` packs them)."""
    return sum(_round_up(size, ALIGN) for size in entry_bytes)


def shard_bytes(entry_bytes: Iterable[int]) -> int:
    """Memory one shard takes in the folder: its payload and its header, each rounded up to whole pages."""
    sizes = list(entry_bytes)
    return _round_up(payload_bytes(sizes), PAGE) + _round_up(HEADER_BYTES_PER_ENTRY * len(sizes), PAGE)


def human(nbytes: float) -> str:
    """``1.50 GiB`` / ``3.1 MiB``."""
    if nbytes >= GIB:
        return f"{nbytes / GIB:.2f} GiB"
    return f"{nbytes / (1 << 20):.1f} MiB"


def node_bytes(shard: int, local_ranks: int, with_buddy: bool) -> int:
    """What a node's folder holds: per local rank, both slots of its own shard and, with more than one node,
    both slots of the buddy shard it keeps for the previous node."""
    return local_ranks * len(SLOTS) * shard * (2 if with_buddy else 1)


def space_problem(need: int, free: int, folder: str) -> str | None:
    """The one-line error when ``need`` bytes do not fit in ``free``, else None."""
    if need <= free:
        return None
    return (
        f"--snapshot-every: this node's snapshots need {human(need)} in {folder} but only "
        f"{human(free)} is free there; raise the LLMTrainingJob's spec.sharedMemory (and "
        "resources.memory, which the memory-backed /dev/shm counts against) or turn snapshots off with "
        "--snapshot-every 0"
    )


def state_entry_bytes(model: nn.Module, optimizer: Optimizer) -> list[int]:
    """Sizes of the entries of this rank's shard: the model's state dict (tied weights appear under each
    name), AdamW's moments and step per parameter (predicted: they appear at the first step), the RNGs."""
    sizes = [
        local_part(tensor).numel() * tensor.element_size()
        for _, tensor in tensor_leaves(get_model_state_dict(model))
    ]
    step_bytes = torch.zeros((), dtype=torch.get_default_dtype()).element_size()
    for group in optimizer.param_groups:
        for param in group["params"]:
            local = local_part(param)
            sizes += [local.numel() * local.element_size()] * ADAMW_MOMENTS + [step_bytes]
    sizes.append(torch.get_rng_state().numel())
    if torch.cuda.is_available():
        sizes.append(torch.cuda.get_rng_state().numel())
    return sizes


def free_bytes(folder: Path) -> int:
    """Free bytes of the file system that holds ``folder`` (its nearest existing ancestor when it does not
    exist yet) plus the shard files already in it."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    reusable = 0
    if folder.is_dir():
        for path in folder.iterdir():
            name = path.with_suffix(".json").name
            if FILE.match(name) and path.is_file():
                reusable += _round_up(path.stat().st_size, PAGE)
    return shutil.disk_usage(existing).free + reusable


def check_snapshot_space(
    folder: Path, model: nn.Module, optimizer: Optimizer, world_size: int, local_world_size: int
) -> int:
    """Raise :class:`SnapshotSpaceError` when this node's snapshots do not fit in ``folder``; returns the
    bytes they need. Every local rank checks the same total (FSDP shards differ by at most a row per tensor
    between ranks; the own shard stands for all)."""
    need = node_bytes(
        shard_bytes(state_entry_bytes(model, optimizer)),
        max(1, local_world_size),
        with_buddy=0 < local_world_size < world_size,
    )
    problem = space_problem(need, free_bytes(folder), str(folder))
    if problem is not None:
        raise SnapshotSpaceError(problem)
    return need
