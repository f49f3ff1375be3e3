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
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from llm_elastic.config import ElasticConfig
from llm_elastic.contract import IN_PROCESS, RESTART, STANDALONE
from llm_elastic.errors import EXIT_PEER_STOPPED
from llm_elastic.leave import Leave
from llm_elastic.position import Position, World
from llm_elastic.recovery import ModeHost, RecoveryMode
from llm_elastic.step import Step

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
    """One process group for the life of the process."""

    def __init__(self, config: ElasticConfig) -> None:
        self.config = config
        self.runs_before = 0
        """Runs of this job before this one (from the step log), for the step records."""

    def open_group(self, backend: str, timeout: timedelta) -> None:
        raise NotImplementedError

    def run(self, s: ModeHost) -> Iterator[Step]:
        self.open_group(s.backend, timedelta(seconds=self.config.collective_timeout))
        s.move(s.position.joined(World(dist.get_rank(), dist.get_world_size(), s.contract.agent_restarts)))
        s.open_generation()
        s.move(self._restore(s))
        self.runs_before = s.reporter.runs_before(s.rank)
        while s.position.progress.step < self.config.total_steps:
            step = Step(s, s.position.progress.step)
            yield step
            s.after_step(step)  # a fixed group outlives every boundary
        s.persistence.final_save()

    def _restore(self, s: ModeHost) -> Position:
        """Collective: the position after the restore at start (from scratch when nothing was saved)."""
        started = time.monotonic()
        restored = s.restore_collective()
        if restored is None:
            return s.position.from_scratch()
        resumed = restored.resumed(seconds=time.monotonic() - started)
        if s.rank == 0:
            r = resumed.restored
            log.info("resumed from step %d from %s in %.2fs", resumed.progress.step, r.source, r.seconds)
        return resumed

    def at_boundary(self, s: ModeHost, step: Step) -> bool:
        assert step.verdict is not None
        if step.verdict.stopping:
            s.persistence.final_save()
            raise Leave(self._stop_exit_code(s))
        return False

    def _stop_exit_code(self, s: ModeHost) -> int:
        if s.stop.requested or s.stop.wait(self.config.peer_stop_grace):
            log.info("stopped by %s at step %d after saving", s.stop.signal_name, s.position.progress.step)
            return 0
        log.warning("another rank stopped at step %d; exiting for a re-rendezvous", s.position.progress.step)
        return EXIT_PEER_STOPPED

    def record(self, s: ModeHost) -> tuple[int, dict[str, Any]]:
        r = s.position.restored
        fields = {
            "agent_restart": s.contract.agent_restarts,
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
