"""The recovery modes as objects (the operator's contract names one, :mod:`llm_elastic.contract`): each opens
and closes the process groups of its generations and decides what a step boundary and a failure mean.

* :class:`Restart` (under torchrun) and :class:`Standalone` (one process, a group of its own): one process
  group for the life of the process; the state comes from the newest snapshot or checkpoint at start; a
  stop saves and ends the process (:class:`Fixed`).
* ``InProcess`` (:mod:`llm_elastic.inprocess`): a fresh group per generation of the live membership.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from llm_elastic.commit import Verdict
from llm_elastic.config import ElasticConfig
from llm_elastic.contract import IN_PROCESS, RESTART, STANDALONE
from llm_elastic.errors import EXIT_PEER_STOPPED, Evicted
from llm_elastic.leave import Leave
from llm_elastic.position import Position, World
from llm_elastic.recovery import Parts, RecoveryMode, Restore
from llm_elastic.signals import StopRequest
from llm_elastic.state import TrainState
from llm_elastic.transfer import Agreement
from llm_elastic.wrap import Wrapped

log = logging.getLogger("llm_elastic")


def pick_device(local_rank: int) -> torch.device:
    """This process's GPU (by local rank), or the CPU; the current CUDA device is set."""
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    """gloo on CPU; NCCL for device tensors with gloo beside it for CPU collectives."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


class Fixed(RecoveryMode):
    """One process group for the life of the process: one generation, restored from storage at start."""

    def __init__(self, config: ElasticConfig) -> None:
        self.config = config
        self.parts: Parts | None = None
        self.world: World | None = None
        self.runs_before = 0
        """Runs of this job before this one (from the step log), for the step records."""

    def open_group(self, backend: str, timeout: timedelta) -> None:
        raise NotImplementedError

    def start(self, parts: Parts, backend: str) -> None:
        self.parts = parts
        self.open_group(backend, timedelta(seconds=self.config.collective_timeout))

    def next_world(self, step: int) -> World | None:
        if self.world is not None:
            return None  # one generation only: the loop asks again only when it ended
        assert self.parts is not None
        self.world = World(dist.get_rank(), dist.get_world_size(), self.parts.contract.agent_restarts)
        return self.world

    def agree(
        self, state: TrainState, position: Position, restore: Restore, wrapped: Wrapped, job_step: int
    ) -> Agreement:
        """Collective: the state from the newest snapshot or checkpoint (from scratch when none)."""
        started = time.monotonic()
        loaded = restore()
        if loaded is None:
            return Agreement(position.from_scratch(), None)
        resumed = loaded.at(position).resumed(seconds=time.monotonic() - started)
        if position.world.rank == 0:
            r = resumed.restored
            log.info("resumed from step %d from %s in %.2fs", resumed.progress.step, r.source, r.seconds)
        return Agreement(resumed, "checkpoint", loaded)

    def formed(self, position: Position, agreement: Agreement, formed_at: float) -> None:
        assert self.parts is not None
        self.runs_before = self.parts.reporter.runs_before(position.world.rank)

    def at_boundary(self, verdict: Verdict, evicted: Evicted | None, world_size: int, step: int) -> bool:
        if verdict.stopping:
            assert self.parts is not None
            self.parts.persistence.final_save()
            raise Leave(self._stop_exit_code(self.parts.stop, step))
        return False  # a fixed group outlives every boundary

    def _stop_exit_code(self, stop: StopRequest, step: int) -> int:
        if stop.requested or stop.wait(self.config.peer_stop_grace):
            log.info("stopped by %s at step %d after saving", stop.signal_name, step)
            return 0
        log.warning("another rank stopped at step %d; exiting for a re-rendezvous", step)
        return EXIT_PEER_STOPPED

    def record(self, position: Position) -> tuple[int, dict[str, Any]]:
        assert self.parts is not None
        r = position.restored
        fields = {
            "agent_restart": self.parts.contract.agent_restarts,
            "restore_seconds": round(r.seconds, 3),
            "restore_peers": r.peers,
        }
        return self.runs_before, fields


class Restart(Fixed):
    """Under torchrun: torchelastic's group; a failure ends the process and torchrun restarts every worker."""

    name = RESTART

    def open_group(self, backend: str, timeout: timedelta) -> None:
        dist.init_process_group(backend, timeout=timeout)


class Standalone(Fixed):
    """One process outside any launcher: a one-rank group on an in-memory store."""

    name = STANDALONE

    def open_group(self, backend: str, timeout: timedelta) -> None:
        from torch._C._distributed_c10d import HashStore

        dist.init_process_group(backend, store=HashStore(), rank=0, world_size=1, timeout=timeout)


def make_mode(name: str, config: ElasticConfig) -> RecoveryMode:
    """The mode object for the contract's mode name."""
    if name == IN_PROCESS:
        from llm_elastic.inprocess import InProcess

        return InProcess(config)
    return Restart(config) if name == RESTART else Standalone(config)
