"""Where the training state goes and comes back from: the generation's checkpointer and snapshotter, when to
save (:meth:`Persistence.at_step_end` decides itself), the final save, and the restore with fallback (the
newest in-memory snapshot every rank can get, else the newest complete checkpoint that loads).

Extras (the program's ``Stateful`` objects) travel as one blob (:mod:`llm_elastic.extras`).
"""

from __future__ import annotations

import base64
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch import nn

from llm_elastic import extras
from llm_elastic.config import ElasticConfig
from llm_elastic.data import ElasticSampler
from llm_elastic.errors import StateLost
from llm_elastic.leave import Leave
from llm_elastic.position import Position, Progress
from llm_elastic.state import TrainState

if TYPE_CHECKING:  # imported when first used: DCP and DTensor cost a joiner ~1.3 s of start-up
    from llm_elastic.checkpoint import Checkpointer
    from llm_elastic.snapshot.manager import Snapshotter

log = logging.getLogger("llm_elastic")


@dataclass(frozen=True)
class Loaded:
    """What a restore from storage brought back (the caller moves the run's position to it)."""

    progress: Progress
    source: str
    """``"memory"`` (a snapshot) or ``"checkpoint"``."""
    peers: int | None
    """Ranks that received their snapshot shard from another node (None for a checkpoint)."""
    job_process_restarts: int
    """Layer-2 restarts of the job's programs, as saved with the state."""

    def at(self, position: Position) -> Position:
        """``position`` moved to what was loaded (its progress, source and peers)."""
        return position.loaded(self.progress, self.source, self.peers)


@dataclass(frozen=True)
class SavePoint:
    """What a save records of the run besides the state, read when it saves."""

    progress: Progress
    world_size: int
    job_process_restarts: int
    """Layer-2 restarts of the job's programs, as the members agreed at the last commit."""


class Persistence:
    """Checkpoints and snapshots of one process's ``state`` (``live``: in process, where every generation
    has new groups, and a restore from a checkpoint counts as a restart of the job's state).

    ``point`` reads where the run stands when a save happens; ``on_saved`` hears of each checkpointed step."""

    def __init__(
        self,
        config: ElasticConfig,
        state: TrainState,
        point: Callable[[], SavePoint],
        on_saved: Callable[[int], None],
        *,
        live: bool,
        sampler: ElasticSampler | None = None,
    ) -> None:
        self.config = config
        self.state = state
        self.point = point
        self.on_saved = on_saved
        self.sampler = sampler
        self.live = live
        self.checkpointer: Checkpointer | None = None
        self.snapshots: Snapshotter | None = None
        self.saved_step = -1

    # -- a generation's parts ------------------------------------------------------------------------------

    def open(
        self, rank: int, world_size: int, local_world_size: int, layout_key: str, replicated: bool
    ) -> None:
        """Make the generation's checkpointer and snapshotter (leave with 1 when snapshots cannot fit)."""
        cfg, state = self.config, self.state
        if cfg.checkpoint_dir:
            from llm_elastic.checkpoint import Checkpointer

            persist_group = _cpu_group() if cfg.async_checkpoint else None
            self.checkpointer = Checkpointer(
                Path(cfg.checkpoint_dir),
                cfg.keep_checkpoints,
                rank,
                persist_group,
                cache_plans=not self.live,  # the group changes with every generation
            )
        if cfg.snapshot_every:
            from llm_elastic.snapshot.manager import Snapshotter
            from llm_elastic.snapshot.space import SnapshotSpaceError, check_snapshot_space, human

            try:
                need = check_snapshot_space(
                    Path(cfg.snapshot_dir), state.model, state.optimizers[0], world_size, local_world_size
                )
            except SnapshotSpaceError as exc:  # one line now, rather than SIGBUS at the first snapshot
                log.error("%s", exc)
                raise Leave(1) from None
            log.info("snapshots need %s per node in %s", human(need), cfg.snapshot_dir)
            self.snapshots = Snapshotter(
                Path(cfg.snapshot_dir),
                rank,
                world_size,
                local_world_size,
                _cpu_group(),
                layout_key,
                replicated=replicated,
            )

    def close(self) -> None:
        """The generation ended: its checkpointer and snapshotter go with its groups."""
        self.checkpointer = None
        self.snapshots = None

    @property
    def busy(self) -> bool:
        """A snapshot copy is still in flight."""
        return self.snapshots is not None and self.snapshots.busy

    def before_update(self) -> None:
        """Order the optimizer's update after the checkpoint's staging copies (a no-op on CPU)."""
        if self.checkpointer is not None:
            self.checkpointer.before_update()

    def wait(self) -> None:
        """Wait for a checkpoint persisting in the background (a failure is logged)."""
        if self.checkpointer is not None:
            try:
                self.checkpointer.wait()
            except RuntimeError as exc:
                log.warning("%s", exc)

    # -- saving --------------------------------------------------------------------------------------------

    def meta(self) -> dict[str, Any]:
        """The JSON facts saved with the current step (checkpoint marker, snapshot header)."""
        point, sampler = self.point(), self.sampler
        progress = point.progress
        out: dict[str, Any] = {
            **self.config.meta,
            "step": progress.step,
            "world_size": point.world_size,
            "last_loss": progress.last_loss if math.isfinite(progress.last_loss) else None,
            "restarts": progress.restarts,
            "job_process_restarts": point.job_process_restarts,
        }
        if sampler is not None:
            out["samples_seen"] = progress.step * sampler.global_batch
            out["data"] = {**sampler.state_dict(), "position": out["samples_seen"]}
        return out

    def extras_blob(self) -> bytes:
        """The extras' state dicts as one blob (:func:`llm_elastic.extras.pack`)."""
        return extras.pack(self.state)

    def save(self) -> None:
        """Collective checkpoint of the current step (unless saved already, or checkpoints are off)."""
        step, state = self.point().progress.step, self.state
        if self.checkpointer is None or self.saved_step == step or step == 0:
            return
        save = self.checkpointer.save_async if self.config.async_checkpoint else self.checkpointer.save
        save(step, state.model, state.optims, self.meta(), self.extras_blob())
        self.saved_step = step
        self.on_saved(step)

    def snapshot(self) -> None:
        """Take an in-memory snapshot of the current step (collective; none without a snapshotter)."""
        if self.snapshots is not None:
            meta = {**self.meta(), "extras": base64.b64encode(self.extras_blob()).decode()}
            state = self.state
            self.snapshots.take(self.point().progress.step, state.model, state.optims, meta)

    def at_step_end(self, busy: bool) -> None:
        """The cadence: a snapshot every ``snapshot_every`` steps (skipped by all while a copy is ``busy``),
        a checkpoint every ``checkpoint_every``; the last step is left to :meth:`final_save`."""
        cfg, at = self.config, self.point().progress.step
        if cfg.snapshot_every and at % cfg.snapshot_every == 0 and not busy and at < cfg.total_steps:
            self.snapshot()
        if cfg.checkpoint_every and at % cfg.checkpoint_every == 0 and at < cfg.total_steps:
            self.save()

    def final_save(self) -> None:
        """Stop or end: snapshot and checkpoint the last step and wait for both to be complete."""
        if self.snapshots is not None and self.snapshots.taken_step != self.point().progress.step:
            self.snapshots.wait()
            self.snapshot()
        self.save()
        if self.checkpointer is not None:
            self.checkpointer.wait()
        if self.snapshots is not None:
            self.snapshots.wait()

    # -- restoring -----------------------------------------------------------------------------------------

    def restore(self, rank: int) -> Loaded | None:
        """Collective: the newest in-memory snapshot every rank can get, else the newest complete checkpoint
        (rank 0 picks it for all). None when neither exists."""
        from llm_elastic.checkpoint import CheckpointInfo, complete_checkpoints, read_extras

        cfg, state = self.config, self.state
        candidates: list[CheckpointInfo] = []
        if cfg.checkpoint_dir:
            choice: list[list[CheckpointInfo] | None] = [
                complete_checkpoints(Path(cfg.checkpoint_dir))[::-1] if rank == 0 else None
            ]
            dist.broadcast_object_list(choice, src=0)
            candidates = choice[0] or []
        info = candidates[0] if candidates else None
        from_memory = self._from_snapshot(rank, info.step if info else 0)
        if from_memory is not None:
            return from_memory
        if info is None or self.checkpointer is None:
            return None
        loaded: dict[str, Any] | None = None
        for info in candidates:  # newest first; a checkpoint that will not load falls back to the one before
            try:
                loaded = self.checkpointer.load(info, state.model, state.optims)
                break
            except (KeyError, ValueError, RuntimeError) as exc:  # DCP raises on every rank alike
                log.error("checkpoint %s does not load (%s): trying the one before", info.path, exc)
        if loaded is None:
            raise StateLost(f"no complete checkpoint under {cfg.checkpoint_dir} loads")
        extras.unpack(self.state, read_extras(info))
        self.saved_step = info.step
        restarts = int(loaded.get("restarts", 0))
        if self.live:  # every member was new: the job's state came back from storage
            restarts += 1
            log.info("every member was new: resumed from checkpoint step-%d", info.step)
        progress = Progress(info.step, float(loaded.get("last_loss", math.nan)), False, restarts)
        return Loaded(progress, "checkpoint", None, int(loaded.get("job_process_restarts", 0)))

    def _from_snapshot(self, rank: int, not_before: int) -> Loaded | None:
        """Collective: load the newest snapshot every rank can get (>= ``not_before``); None without one."""
        if self.snapshots is None:
            return None
        state = self.state
        found = self.snapshots.restore(state.model, state.optims, not_before)
        if found is None:
            return None
        meta, where, peers = found
        encoded = meta.get("extras")
        extras.unpack(self.state, base64.b64decode(encoded) if encoded else None)
        log.info("rank %d: snapshot shard from %s", rank, where)
        progress = Progress(
            int(meta["step"]), float(meta.get("last_loss", math.nan)), False, int(meta.get("restarts", 0))
        )
        return Loaded(progress, "memory", peers, int(meta.get("job_process_restarts", 0)))

    def rollback(self, rank: int) -> Loaded | None:
        """Collective (a loss rule's ``rollback``): load the newest in-memory snapshot once any copy in flight
        ended; None (logged: the step stays skipped) when no snapshot serves every rank."""
        if self.snapshots is not None:
            self.snapshots.wait()  # its copy uses the group the restore gathers on
        found = self._from_snapshot(rank, 0)
        if found is None:
            log.warning("rollback: no in-memory snapshot serves every member yet; the step is skipped only")
        return found


def layout_key(model: nn.Module, shard_size: int, meta: dict[str, Any]) -> str:
    """What a snapshot must match to be loaded: the model's type and size, the shard size, the meta."""
    params = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__}|{params}|{shard_size}|{json.dumps(meta, sort_keys=True)}"


def _cpu_group() -> dist.ProcessGroup:
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)
    return group
