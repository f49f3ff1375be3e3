"""Release a survivor stuck in an NCCL collective when a peer is gone (recovery in process on GPUs).

On GPUs a lost peer raises nothing: the survivors' collective waits inside a CUDA kernel until NCCL's
watchdog tears the process down, often minutes later. While a generation trains on NCCL, a
:class:`Watchdog` thread waits for the membership's watch to fire; when a member of the generation is gone
(a departure, never a joiner: a joiner is taken in at the next step boundary), it aborts every NCCL
communicator of the generation at once, each in a thread of its own (an abort can block on its own
communicator). The collective then fails in the training thread, the step is discarded, the generation is
destroyed and the next one is formed on a fresh store prefix with new communicators. Gloo has no abort
(pytorch issue 130345): there the survivors' collective fails when the dead peer's connections close.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from llm_elastic.live.changes import Changes

log = logging.getLogger(__name__)

ABORT_TIMEOUT = 10.0
"""Seconds to wait for the aborts; an abort that does not return hands over to the next layer."""


def abort_group(group: Any) -> None:
    """Abort every backend of ``group`` (torch's own helper where it exists, else the NCCL backend's)."""
    import torch
    import torch.distributed as dist

    helper = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if helper is not None:
        helper(group)
        return
    backend = group._get_backend(torch.device("cuda"))
    backend.abort()


def every_group() -> list[Any]:
    """Every process group of the generation (the default one and those made from it): what to abort."""
    import torch.distributed as dist

    groups = [dist.group.WORLD]
    groups += [g for g in dist.distributed_c10d._world.pg_map if g is not dist.group.WORLD]
    return groups


class Watchdog:
    """Aborts the generation's communicators when one of its members leaves the membership."""

    def __init__(
        self,
        gone: Callable[[], bool],
        changes: Changes,
        groups: Callable[[], Sequence[Any]],
        abort: Callable[[Any], None] = abort_group,
    ) -> None:
        self._gone = gone
        self._changes = changes
        self._groups = groups
        self._abort = abort
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.aborted_at: float | None = None
        """When the communicators were aborted (monotonic), or None."""
        self.stuck = False
        """An abort did not return within ABORT_TIMEOUT (the process must hand over to layer 2)."""

    def start(self) -> Watchdog:
        self._thread = threading.Thread(target=self._run, name="llm-elastic-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._changes.nudge()
        if self._thread is not None:
            self._thread.join(timeout=ABORT_TIMEOUT)

    def _run(self) -> None:
        while not self._stop.is_set():
            mark = self._changes.mark()  # before the read: an event during it is waited for below
            try:
                gone = self._gone()
            except Exception:  # the store is out: no verdict; the next watch event asks again
                log.debug("membership unreadable in the watchdog", exc_info=True)
                gone = False
            if gone:
                self._abort_all()
                return
            self._changes.wait(mark, None)

    def _abort_all(self) -> None:
        groups = list(self._groups())
        log.warning("a member is gone: aborting %d communicator(s) of this generation", len(groups))
        self.aborted_at = time.monotonic()
        threads = [
            threading.Thread(target=self._abort_one, args=(g,), name="llm-elastic-abort", daemon=True)
            for g in groups
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + ABORT_TIMEOUT
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.stuck = any(t.is_alive() for t in threads)
        if self.stuck:
            log.error("an NCCL abort did not return within %gs", ABORT_TIMEOUT)

    def _abort_one(self, group: Any) -> None:
        try:
            self._abort(group)
        except Exception:  # an abort of a communicator that already failed may raise: it is down either way
            log.debug("abort raised", exc_info=True)
