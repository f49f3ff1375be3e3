"""The commit: the step's one all-reduce, packed from this member's signals and read into a frozen
:class:`Verdict` that :class:`~llm_elastic.step.Step` exposes.

Layout of the reduced tensor: the committed value, :data:`FLAGS` flags (a non-finite value, membership
changed, members stopping, a snapshot copy busy, restarted programs not yet counted), then per rank its
local compute time, then per rank the job's layer-2 restart count as it knows it (a joiner knows 0: the
maximum is the job's).

The non-finite flag is ``0 * value``, computed with the value slot itself in one multiplication on the
value's device (``value * [1, 0]``, no host sync): exactly 0 for a finite value and NaN for a NaN or an
infinity, so the reduced slot is NaN exactly when some member's
value was not finite (a sum of zeros cannot overflow), whatever ``mean`` says and whatever the other
members' values are. ``torch.isfinite`` would give a count but costs several operations per step on a CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

FLAGS = 5
"""Flags on a commit's all-reduce: a non-finite value, membership changed, members stopping, a snapshot
copy busy, restarted programs not yet counted."""
HOST_FLAGS = FLAGS - 1
"""The flags this member knows on the host (all but the non-finite one, read from the value itself)."""


def host_values(reduced: torch.Tensor) -> list[float]:
    """The step's reduced values on the host: the runtime's one device-to-host sync per step."""
    values: list[float] = reduced.tolist()
    return values


@dataclass(frozen=True)
class Signals:
    """What this member puts on the step's all-reduce beside the value."""

    changed: bool
    """This member saw the membership change, is stopping, or leaves (evicted, unhealthy)."""
    stopping: bool
    busy: bool
    """This member's snapshot copy is still in flight."""
    restart_announced: bool
    """This program's own restart (if it is one) was counted in an earlier commit."""
    compute_seconds: float
    process_restarts: int
    """The job's layer-2 restarts as this member knows them."""


@dataclass(frozen=True)
class Verdict:
    """What every member agreed on in a step's commit (the same on every member)."""

    value: float
    """The committed value: the mean over the members, or the sum with ``mean=False``."""
    changed: bool
    """Some member saw a membership change, stops or leaves: the generation ends after this step."""
    stopping: int
    """Members that are stopping."""
    stop_announced: bool
    """This member's own stop rode this commit (the others know it)."""
    busy: bool
    """Some member's snapshot copy is still in flight (the next snapshot is skipped by all)."""
    compute_seconds: tuple[float, ...]
    """Each rank's local compute time of this step."""
    process_restarts: int
    """The job's layer-2 restarts of programs, as the members agree on it."""
    nonfinite: bool = False
    """Some member's value was not finite (NaN or infinite)."""


class CommitWire:
    """Packs and reads the commit's tensor; keeps one host buffer (pinned on a GPU) across steps."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffer: torch.Tensor | None = None
        self._head: torch.Tensor | None = None

    def _flags(self, size: int) -> torch.Tensor:
        buf = self._buffer
        if buf is None or buf.numel() != size:
            buf = torch.zeros(size, dtype=torch.float32)
            if self.device.type == "cuda":
                buf = buf.pin_memory()
            self._buffer = buf
        return buf

    def reduce(self, value: torch.Tensor | float, signals: Signals, rank: int, world: int) -> torch.Tensor:
        """Start the all-reduce of ``value`` with ``signals`` (the result stays on the device)."""
        base = value.detach().float().reshape(()) if isinstance(value, torch.Tensor) else None
        if base is None:
            base = torch.tensor(float(value), device=self.device)
        elif base.device != self.device:
            base = base.to(self.device)
        flags = self._flags(HOST_FLAGS + 2 * world)
        flags.zero_()
        flags[0] = 1.0 if signals.changed else 0.0
        flags[1] = 1.0 if signals.stopping else 0.0
        flags[2] = 1.0 if signals.busy else 0.0
        flags[3] = 0.0 if signals.restart_announced else 1.0
        flags[HOST_FLAGS + rank] = signals.compute_seconds
        flags[HOST_FLAGS + world + rank] = signals.process_restarts
        extra = flags.to(self.device, non_blocking=True) if self.device.type != "cpu" else flags.clone()
        if self._head is None:
            self._head = torch.tensor([1.0, 0.0], device=self.device)
        head = base.reshape(1) * self._head  # [value, 0 * value]: the flag is NaN when value is not finite
        reduced = torch.cat([head, extra])
        dist.all_reduce(reduced)
        return reduced

    @staticmethod
    def read(values: list[float], signals: Signals, world: int, mean: bool) -> Verdict:
        """The verdict from the reduced values (read back to the host once)."""
        total, nonfinite, changed_any, stopping_members, busy_any, announced = values[: 1 + FLAGS]
        restarts = max(values[1 + FLAGS + world : 1 + FLAGS + 2 * world]) + announced
        return Verdict(
            value=total / world if mean else total,
            changed=changed_any > 0,
            stopping=round(stopping_members),
            stop_announced=signals.stopping,
            busy=busy_any > 0,
            compute_seconds=tuple(values[1 + FLAGS : 1 + FLAGS + world]),
            process_restarts=round(restarts),
            nonfinite=not math.isfinite(nonfinite),
        )
