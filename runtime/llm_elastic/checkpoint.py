"""Checkpoints with ``torch.distributed.checkpoint`` (DCP) that count only when complete.

Layout under ``--checkpoint-dir``: ``step-N/`` holds DCP's shard files and ``.metadata``; the marker
``step-N/COMPLETE`` (JSON: step, data position, world size, time) is written by rank 0 after every rank's
shards are on disk, atomically and last. Loading picks the newest ``step-N`` with a marker, so a save that
was killed half-way is ignored and the previous checkpoint loads. DCP stores each tensor with its global
shape and reshards on load, so a checkpoint saved by W ranks loads on any other number of ranks.

Asynchronous saves (:meth:`Checkpointer.save_async`): the training thread only stages the state into
reused host buffers (``llm_elastic.staging``); a background thread writes the staged copy with DCP over a
CPU (gloo) process group of its own, and rank 0 writes the marker after DCP's final gather, i.e. after every
rank's shards and ``.metadata`` are written and fsynced. At most one save is in flight: a new save first
waits for the previous one to finish (a checkpoint every N steps is a promise; the wait shows up as stall
only when persisting takes longer than N steps).
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
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim import Optimizer

from llm_elastic.background import Background
from llm_elastic.staging import HostStage

log = logging.getLogger(__name__)

Optimizers = Optimizer | tuple[Optimizer, ...]

MARKER = "COMPLETE"
EXTRAS = "extras.pt"
"""The program's replicated ``Stateful`` extras (``torch.save`` of their state dicts), written by rank 0
before the marker."""
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


def _caching_planner() -> DefaultSavePlanner:
    """DCP's default planner, caching the save plans between saves where this torch supports it."""
    try:
        return DefaultSavePlanner(enable_plan_caching=True)  # type: ignore[call-arg, unused-ignore]
    except TypeError:
        return DefaultSavePlanner()


def _stall_seconds(step: int) -> float:
    spec = os.environ.get(SAVE_STALL_ENV, "")
    if not spec:
        return 0.0
    first, _, seconds = spec.partition(":")
    return float(seconds or 0) if step >= int(first) else 0.0


class Checkpointer:
    """Saves and loads model + optimizer state collectively; rank 0 manages markers and retention."""

    def __init__(
        self,
        root: Path,
        keep: int,
        rank: int,
        persist_group: dist.ProcessGroup | None = None,
        cache_plans: bool = True,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.root = root
        self.keep = keep
        self.rank = rank
        self.persist_group = persist_group
        """CPU (gloo) group that background persists use (None: the default group)."""
        self.stage = HostStage()
        self.last_stall = 0.0
        """Seconds the training thread spent in the last save (staging, or the whole save when sync)."""
        self.last_persist = 0.0
        """Seconds the last background persist took (staged copy to marker)."""
        self._persisting = Background("background checkpoint persist")
        self.persisted_step = 0
        """The newest step whose checkpoint is complete (marker written) by this checkpointer."""
        self._planner: DefaultSavePlanner | None = None
        self.cache_plans = cache_plans
        """DCP's save-plan caching (class-wide in torch): only where the group never changes in a process.
        In process a joiner has no cached plan while a survivor has, and a survivor's cached plan is for
        the old world: a save across a membership change failed, and could write a marker-complete
        checkpoint whose metadata does not match its files (found by bench/e2e_recovery.py)."""

    def _prepare(self, path: Path) -> None:
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if path.exists():  # leftovers of a save that was killed at this step
                shutil.rmtree(path)
        dist.barrier()

    def _finish(self, step: int, path: Path, meta: dict[str, Any], extras: bytes = b"") -> None:
        stall = _stall_seconds(step)
        if stall > 0:
            log.warning("%s: pausing %gs before the completion marker", SAVE_STALL_ENV, stall)
            time.sleep(stall)
        if self.rank == 0:
            if extras:
                (path / EXTRAS).write_bytes(extras)
            _write_marker(path, {**meta, "step": step, "saved_at": time.time()})
            self.prune(step)

    def save(
        self, step: int, model: nn.Module, optimizer: Optimizers, meta: dict[str, Any], extras: bytes = b""
    ) -> Path:
        """Collective, synchronous: every rank writes its shards; rank 0 then writes the marker and prunes."""
        self.wait()
        path = step_dir(self.root, step)
        started = time.monotonic()
        self._prepare(path)
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp_save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path))
        self._finish(step, path, meta, extras)
        dist.barrier()
        self.persisted_step = step
        self.last_stall = self.last_persist = time.monotonic() - started
        log.info("checkpoint step-%d saved in %.2fs", step, self.last_stall)
        return path

    def save_async(
        self, step: int, model: nn.Module, optimizer: Optimizers, meta: dict[str, Any], extras: bytes = b""
    ) -> Path:
        """Collective: stage the state and persist it in the background (after the previous save ended).

        On a GPU the caller must call :meth:`before_update` before the optimizer next changes parameters.
        """
        self.wait()
        path = step_dir(self.root, step)
        started = time.monotonic()
        self._prepare(path)
        model_state, optim_state = get_state_dict(model, optimizer)
        staged = self.stage.stage({"model": model_state, "optim": optim_state})
        self.last_stall = time.monotonic() - started
        self._persisting.start(f"persist-step-{step}", self._persist, step, path, staged, meta, extras)
        return path

    def _persist(
        self, step: int, path: Path, staged: dict[str, Any], meta: dict[str, Any], extras: bytes
    ) -> None:
        started = time.monotonic()
        self.stage.wait_copied()
        if self._planner is None:
            self._planner = _caching_planner() if self.cache_plans else DefaultSavePlanner()
        dcp_save(staged, checkpoint_id=str(path), process_group=self.persist_group, planner=self._planner)
        self._finish(step, path, meta, extras)
        self.persisted_step = step
        self.last_persist = time.monotonic() - started
        log.info(
            "checkpoint step-%d persisted in %.2fs (training stalled %.3fs to stage %.0f MB)",
            step,
            self.last_persist,
            self.last_stall,
            self.stage.nbytes / 1e6,
        )

    def before_update(self) -> None:
        """Order the next optimizer update after the staging copies (a no-op on CPU)."""
        self.stage.before_update()

    @property
    def in_flight(self) -> bool:
        """Whether a background persist is running."""
        return self._persisting.busy

    def wait(self) -> None:
        """Wait for the background persist (if any); raise if it failed."""
        self._persisting.wait()

    def prune(self, newest: int) -> None:
        """Rank 0: drop complete checkpoints beyond the newest ``keep`` and dead partial saves."""
        complete = [info.step for info in complete_checkpoints(self.root)]
        keep = set(complete[-self.keep :])
        for step, path in _step_dirs(self.root):
            if step in keep or step > newest:
                continue
            if step in complete or read_marker(path) is None:
                shutil.rmtree(path, ignore_errors=True)

    def load(self, info: CheckpointInfo, model: nn.Module, optimizer: Optimizers | None) -> dict[str, Any]:
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


def read_extras(info: CheckpointInfo) -> bytes | None:
    """The extras saved with a checkpoint (None for a checkpoint without)."""
    try:
        return (info.path / EXTRAS).read_bytes()
    except OSError:
        return None
