"""Checkpoints with ``torch.distributed.checkpoint`` (DCP) that count only when complete.

Layout under ``--checkpoint-dir``: ``step-N/`` holds DCP's shard files and ``.metadata``; the marker
``step-N/COMPLETE`` (JSON: step, data position, world size, time) is written by rank 0 after every rank's
shards are on disk, atomically and last. Loading picks the newest ``step-N`` with a marker, so a save that
was killed half-way is ignored and the previous checkpoint loads. DCP stores each tensor with its global
shape and reshards on load, so a checkpoint saved by W ranks loads on any other number of ranks.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim import Optimizer

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
STEP_DIR = re.compile(r"^step-(\d+)$")
# Fault injection for tests: "STEP:SECONDS" pauses every save of step >= STEP for SECONDS between writing
# the shards and writing the marker, so a test can kill the process in the middle of a save.
SAVE_STALL_ENV = "LLM_TRAINER_FAULT_SAVE_STALL"


@dataclass(frozen=True)
class CheckpointInfo:
    """One complete checkpoint."""

    step: int
    path: Path
    meta: dict[str, Any]


def step_dir(root: Path, step: int) -> Path:
    """``root/step-N``."""
    return root / f"step-{step}"


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = STEP_DIR.match(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def read_marker(path: Path) -> dict[str, Any] | None:
    """The marker's contents, or None when the checkpoint is incomplete (no or unreadable marker)."""
    try:
        meta = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def complete_checkpoints(root: Path) -> list[CheckpointInfo]:
    """Complete checkpoints under ``root``, oldest first."""
    out = []
    for step, path in _step_dirs(root):
        meta = read_marker(path)
        if meta is not None:
            out.append(CheckpointInfo(step, path, meta))
    return out


def latest_checkpoint(root: Path) -> CheckpointInfo | None:
    """The newest complete checkpoint, if any."""
    done = complete_checkpoints(root)
    return done[-1] if done else None


def _write_marker(path: Path, meta: dict[str, Any]) -> None:
    tmp = path / (MARKER + ".tmp")
    with tmp.open("w") as handle:
        json.dump(meta, handle, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path / MARKER)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stall_seconds(step: int) -> float:
    spec = os.environ.get(SAVE_STALL_ENV, "")
    if not spec:
        return 0.0
    first, _, seconds = spec.partition(":")
    return float(seconds or 0) if step >= int(first) else 0.0


class Checkpointer:
    """Saves and loads model + optimizer state collectively; rank 0 manages markers and retention."""

    def __init__(self, root: Path, keep: int, rank: int) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.root = root
        self.keep = keep
        self.rank = rank

    def save(self, step: int, model: nn.Module, optimizer: Optimizer, meta: dict[str, Any]) -> Path:
        """Collective: every rank writes its shards; rank 0 then writes the marker and prunes."""
        path = step_dir(self.root, step)
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if path.exists():  # leftovers of a save that was killed at this step
                shutil.rmtree(path)
        dist.barrier()
        started = time.monotonic()
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp_save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path))
        stall = _stall_seconds(step)
        if stall > 0:
            log.warning("%s: pausing %gs before the completion marker", SAVE_STALL_ENV, stall)
            time.sleep(stall)
        if self.rank == 0:
            _write_marker(path, {**meta, "step": step, "saved_at": time.time()})
            self.prune(step)
        dist.barrier()
        log.info("checkpoint step-%d saved in %.2fs", step, time.monotonic() - started)
        return path

    def prune(self, newest: int) -> None:
        """Rank 0: drop complete checkpoints beyond the newest ``keep`` and dead partial saves."""
        complete = [info.step for info in complete_checkpoints(self.root)]
        keep = set(complete[-self.keep :])
        for step, path in _step_dirs(self.root):
            if step in keep or step > newest:
                continue
            if step in complete or read_marker(path) is None:
                shutil.rmtree(path, ignore_errors=True)

    def load(self, info: CheckpointInfo, model: nn.Module, optimizer: Optimizer | None) -> dict[str, Any]:
        """Collective: load ``info`` into the (possibly differently sharded) model and optimizer."""
        started = time.monotonic()
        if optimizer is None:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

            model_only = {"model": get_model_state_dict(model)}
            dcp_load(model_only, checkpoint_id=str(info.path))
            set_model_state_dict(model, model_only["model"])
        else:
            model_state, optim_state = get_state_dict(model, optimizer)
            # dcp_load fills the tensors of these dicts in place.
            dcp_load({"model": model_state, "optim": optim_state}, checkpoint_id=str(info.path))
            set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
        log.info("loaded checkpoint step-%d in %.2fs", info.step, time.monotonic() - started)
        return info.meta
