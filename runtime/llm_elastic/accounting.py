"""Sample accounting: prove from ``metrics.jsonl`` that no sample was skipped or repeated beyond a replay.

The trainer writes one record per completed step (rank 0, see ``llm_elastic.metrics``). ``audit()`` reads
those records back and checks the promise the trainer makes across every interruption:

- each step trained exactly its own global batch: stream positions ``[(s-1)B, sB)`` and, when the data order
  is given, exactly those sample ids (CRC-32 of the ids);
- a trainer run (one ``restart`` value) continues right after the checkpoint or snapshot it resumed from (or
  from step 1 when none existed yet), and that step is never past what the previous run completed (nothing
  skipped); steps after it are replayed;
- every step from 1 to the last appears;
- a step a loss rule dropped (``skipped``) consumed its samples without training them: it is listed in
  :attr:`Audit.skipped`, and a rollback after it (the next record goes back to the step after the
  snapshot's) is an interruption like a new run: the steps after the snapshot are replayed.

It also measures each interruption (a new run, or a world-size change inside one): how long training paused
and how many completed steps were trained again. Pure: no I/O beyond what the caller passes in.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm_elastic.order import GlobalOrder


@dataclass(frozen=True)
class Interruption:
    """One membership change as training saw it."""

    last_step: int
    """The last step completed before it."""
    resumed_from: int
    """The step whose state training continued from (== last_step when nothing was replayed)."""
    world_before: int
    world_after: int
    paused_s: float
    """Wall time from the last step before to the first step after."""

    @property
    def replayed(self) -> int:
        """Completed steps trained again."""
        return self.last_step - self.resumed_from

    @property
    def grew(self) -> bool:
        """The job came back larger (a join), not after a loss. A loss in restart mode can keep the world
        size: the survivors and a replacement re-rendezvous together."""
        return self.world_after > self.world_before


@dataclass
class Audit:
    """What ``audit()`` found."""

    steps: int = 0
    interruptions: list[Interruption] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    """Steps a loss rule dropped on every member (their samples moved on untrained), in log order."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def replayed(self) -> int:
        """Completed steps trained again, over every interruption."""
        return sum(i.replayed for i in self.interruptions)

    @property
    def replayed_per_loss(self) -> list[int]:
        """Steps replayed at each interruption that was a loss (every one but the joins)."""
        return [i.replayed for i in self.interruptions if not i.grew]

    def summary(self) -> str:
        """One line for people: what the interruptions cost."""
        verdict = "no sample lost or repeated" if self.ok else f"{len(self.problems)} problem(s)"
        if self.skipped:
            verdict += f", {len(self.skipped)} step(s) skipped by a loss rule"
        if not self.interruptions:
            return f"{self.steps} steps, no interruption, {verdict}"
        paused = sum(i.paused_s for i in self.interruptions)
        replayed = self.replayed
        return (
            f"{self.steps} steps, {len(self.interruptions)} interruption(s): training paused {paused:.1f}s,"
            f" {replayed} step(s) replayed, {verdict}"
        )


def _runs(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    runs: list[list[dict[str, Any]]] = []
    for record in records:
        previous = runs[-1][-1] if runs else None
        if (
            previous is None
            or record.get("restart") != previous.get("restart")
            or (previous.get("skipped") and int(record["step"]) != int(previous["step"]) + 1)
        ):  # a new trainer run, or a rollback after a dropped step
            runs.append([])
        runs[-1].append(record)
    return runs


def _check_batches(records: Sequence[dict[str, Any]], order: GlobalOrder | None, out: Audit) -> None:
    for record in records:
        step, batch = int(record["step"]), int(record["global_batch"])
        span = (int(record["sample_start"]), int(record["sample_end"]))
        if span != ((step - 1) * batch, step * batch):
            out.problems.append(
                f"step {step} trained positions {span}, expected {((step - 1) * batch, step * batch)}"
            )
            continue
        if order is not None:
            ids = np.asarray(order.sample_ids(*span), dtype="<i8")
            if int(record["samples_crc32"]) != zlib.crc32(ids.tobytes()):
                out.problems.append(f"step {step} trained other samples than positions {span} hold")


def audit(records: Sequence[dict[str, Any]], order: GlobalOrder | None = None) -> Audit:
    """Check the records of one job's ``metrics.jsonl`` (in file order) and measure its interruptions."""
    out = Audit()
    if not records:
        out.problems.append("no step was recorded")
        return out
    _check_batches(records, order, out)
    out.skipped = [int(r["step"]) for r in records if r.get("skipped")]
    runs = _runs(records)
    for index, run in enumerate(runs):
        steps = [int(r["step"]) for r in run]
        if steps != list(range(steps[0], steps[0] + len(steps))):
            out.problems.append(f"run {index}: steps are not consecutive: {steps[:3]}...{steps[-3:]}")
        for before, after in itertools.pairwise(run):  # a live membership change: same processes
            if before["world_size"] != after["world_size"]:
                out.interruptions.append(
                    Interruption(
                        last_step=int(before["step"]),
                        resumed_from=int(before["step"]),
                        world_before=int(before["world_size"]),
                        world_after=int(after["world_size"]),
                        paused_s=float(after["time"]) - float(before["time"]),
                    )
                )
        if index == 0:
            continue
        previous, first = runs[index - 1][-1], run[0]
        # No checkpoint yet: the run starts over from the initial state, i.e. it resumed from "step 0".
        resumed = first.get("resumed_from") or 0
        if int(first["step"]) != int(resumed) + 1:
            out.problems.append(
                f"run {index} resumed from step {resumed} but trained step {first['step']} first"
            )
        if int(resumed) > int(previous["step"]):
            out.problems.append(f"run {index} resumed from step {resumed}, past step {previous['step']}")
        out.interruptions.append(
            Interruption(
                last_step=int(previous["step"]),
                resumed_from=int(resumed),
                world_before=int(previous["world_size"]),
                world_after=int(first["world_size"]),
                paused_s=float(first["time"]) - float(previous["time"]),
            )
        )
    done = sorted({int(r["step"]) for r in records})
    out.steps = done[-1]
    if done != list(range(1, done[-1] + 1)):
        missing = sorted(set(range(1, done[-1] + 1)) - set(done))
        out.problems.append(f"steps never trained: {missing[:10]}")
    return out
