"""Training progress and goodput in the job's status (pure; decision G1 in docs/decisions.md).

Goodput is the share of the job's wall time spent on training steps that were kept: not on restarts,
re-rendezvous, checkpoint stalls, steps replayed after a restart, or waiting below minReplicas.

The operator folds what the workers' metrics say (``Sample``: the trainer's ``llm_trainer_*`` gauges)
into ``status.progress`` at most once per ``every`` seconds. Everything the next fold needs is in that
record, so an operator restart loses nothing:

- ``highWaterStep``: the highest step ever seen. Steps beyond it are new kept work; steps at or below it
  (replays after a restart from an older checkpoint) count nothing.
- kept work is worth (new steps) x (mean step time over the interval), from the deltas of the worker's
  ``step_time_seconds_sum``/``_count`` counters since the last fold. Within one process both counters
  and the step advance together (``step`` delta == ``count`` delta); when they do not (the process
  restarted, the counters reset, or another worker answered), the interval is the new process's own
  life: its counters as they are. That process resumed at ``step - count``; steps between the
  high-water mark and that point were done (and saved) by the process before it, after the last look,
  and are worth that process's last mean step time (``stepTimeSeconds``). On the first look at a job,
  new steps never exceed the steps the process completed, so work done before the job existed (a
  checkpoint of another run) is not counted.
- ``wallSeconds`` runs from ``status.startTime`` while the job is neither suspended, queued nor finished.
- the last hour: ``window``, at most 12 buckets of 5 minutes (productive and wall seconds each).

``step_log_goodput`` computes the same figure from the trainer's step log (``metrics.jsonl``), for
tests and benchmarks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llm_operator.observe import parse_time
from llm_operator.policy.progress import Sample
from llm_operator.policy.status import IDLE_PHASES

DEFAULT_EVERY = 30.0
"""Seconds between two progress updates of a job's status (LLMJOB_PROGRESS_SECONDS)."""
BUCKET_SECONDS = 300
WINDOW_SECONDS = 3600
NOT_TRAINING = IDLE_PHASES
"""Phases whose time is not the job's wall time (the user stopped it, or it waits for quota, or it ended)."""


def format_precise(epoch: float) -> str:
    """RFC 3339 with milliseconds (wall time accumulates from these: whole seconds would drift)."""
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def format_duration(seconds: float) -> str:
    """The two largest units: 2d3h, 1h3m, 4m10s, 45s (1h, not 1h0m)."""
    total = max(0, round(seconds))
    minutes, secs = divmod(total, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    units = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    first = next((i for i, (value, _) in enumerate(units) if value), len(units) - 1)
    return "".join(f"{value}{unit}" for value, unit in units[first : first + 2] if value) or "0s"


@dataclass(frozen=True)
class KeptWork:
    """What one interval added."""

    steps: int
    """New steps beyond the high-water mark (kept work)."""
    seconds: float
    """Their worth in wall seconds."""
    step_time: float | None
    """Mean step time over the interval (None: no step completed in it)."""


def kept_work(
    previous_step: int,
    high_water: int,
    previous_sum: float | None,
    previous_count: int | None,
    sample: Sample,
    previous_step_time: float | None = None,
) -> KeptWork:
    """New kept work between the last fold and ``sample`` (see the module docstring).

    ``previous_step_time`` values steps that a process completed before it stopped and after the last
    look (a graceful stop checkpoints them), when the new process has not completed a step yet."""
    total, count = sample.step_time_sum, sample.step_time_count
    new_steps = max(0, sample.step - high_water)
    if total is None or count is None:
        return KeptWork(new_steps, 0.0, None)
    same_process = (
        previous_sum is not None
        and previous_count is not None
        and count >= previous_count
        and total >= previous_sum
        and sample.step - previous_step == count - previous_count
    )
    if same_process:
        assert previous_sum is not None and previous_count is not None
        d_count, d_sum = count - previous_count, total - previous_sum
    else:
        d_count, d_sum = count, total
    first_look = previous_count is None
    if first_look:  # only this process's own steps are surely this job's work (it may resume another run)
        new_steps = min(new_steps, count)
    mean = d_sum / d_count if d_count > 0 else None
    if same_process or first_look:
        worth = new_steps * mean if mean is not None else 0.0
        return KeptWork(new_steps, worth, mean)
    # A new process resumed at step - count. Steps from the high-water mark up to there were done by the
    # process before it (after the last look, then saved): they are worth its step time, the rest this one's.
    resumed = sample.step - count
    gap = max(0, min(resumed, sample.step) - high_water)
    own = new_steps - gap
    gap_time = previous_step_time if previous_step_time is not None else mean
    worth = gap * (gap_time or 0.0) + own * (mean or 0.0)
    return KeptWork(new_steps, worth, mean)


def _window(
    buckets: Iterable[Mapping[str, Any]], now: float, productive: float, wall: float
) -> list[dict[str, Any]]:
    """Add this interval to the bucket of ``now``; keep the buckets that start within the last hour."""
    start = int(now // BUCKET_SECONDS * BUCKET_SECONDS)
    kept = [dict(b) for b in buckets if b["start"] > now - WINDOW_SECONDS and b["start"] != start]
    current = next((dict(b) for b in buckets if b["start"] == start), None)
    current = current or {"start": start, "productiveSeconds": 0.0, "wallSeconds": 0.0}
    current["productiveSeconds"] = round(current["productiveSeconds"] + productive, 3)
    current["wallSeconds"] = round(current["wallSeconds"] + wall, 3)
    return sorted([*kept, current], key=lambda b: int(b["start"]))


def _fraction(productive: float, wall: float) -> float | None:
    if wall <= 0:
        return None
    return round(min(1.0, max(0.0, productive / wall)), 4)


def due(previous: Mapping[str, Any] | None, now: float, every: float) -> float | None:
    """When the next update of a job's progress is due (None: now, it never had one)."""
    if previous is None:
        return None
    last = parse_time(previous.get("updateTime"))
    return None if last is None else last + every


def fold(
    previous: Mapping[str, Any] | None,
    sample: Sample | None,
    now: float,
    *,
    start_time: float | None,
    counting: bool,
    finished: bool = False,
) -> dict[str, Any] | None:
    """The new ``status.progress`` from the previous one and the newest sample (None: no new sample).

    ``counting``: the time since the last update was the job's wall time (it ran, or tried to).
    ``finished``: the job is Succeeded or Failed (no ETA). No metrics ever seen: progress stays None.
    """
    if previous is None:
        if sample is None:
            return None
        since = start_time if start_time is not None and start_time <= now else now
        prev: dict[str, Any] = {"step": 0, "highWaterStep": 0, "productiveSeconds": 0.0, "wallSeconds": 0.0}
        elapsed = now - since
    else:
        prev = dict(previous)
        last = parse_time(prev.get("updateTime"))
        elapsed = max(0.0, now - last) if last is not None and counting else 0.0
    out = dict(prev)
    productive = 0.0
    if sample is not None:
        work = kept_work(
            int(prev.get("step", 0)),
            int(prev.get("highWaterStep", 0)),
            prev.get("stepTimeSum"),
            prev.get("stepTimeCount"),
            sample,
            prev.get("stepTimeSeconds"),
        )
        productive = work.seconds
        out["step"] = sample.step
        out["highWaterStep"] = max(int(prev.get("highWaterStep", 0)), sample.step)
        for key, value in (
            ("totalSteps", sample.total_steps or None),
            ("loss", _finite(sample.loss)),
            ("tokensPerSecond", _finite(sample.tokens_per_second, 1)),
            ("lastSavedStep", sample.last_saved_step or None),
            ("lastSavedTime", _time(sample.last_saved_timestamp)),
            ("stepTimeSum", _finite(sample.step_time_sum)),
            ("stepTimeCount", sample.step_time_count),
        ):
            out[key] = value if value is not None else prev.get(key)
        if work.step_time is not None:
            out["stepTimeSeconds"] = round(work.step_time, 4)
    out["productiveSeconds"] = round(float(prev.get("productiveSeconds", 0.0)) + productive, 3)
    # Goodput once the step-time counters have shown a step (a program that serves them but never sets
    # them, like the live driver today, has no goodput rather than 0).
    timed = out["productiveSeconds"] > 0 or bool(out.get("stepTimeCount"))
    out["wallSeconds"] = round(float(prev.get("wallSeconds", 0.0)) + elapsed, 3)
    out["window"] = _window(prev.get("window") or [], now, productive, elapsed)
    if timed:
        out["goodput"] = _fraction(out["productiveSeconds"], out["wallSeconds"])
        out["goodputLastHour"] = _fraction(
            sum(b["productiveSeconds"] for b in out["window"]), sum(b["wallSeconds"] for b in out["window"])
        )
    out["updateTime"] = format_precise(now)
    out["eta"], out["estimatedCompletionTime"] = _eta(out, now, finished)
    return {k: v for k, v in out.items() if v is not None}


def _eta(progress: Mapping[str, Any], now: float, finished: bool) -> tuple[str | None, str | None]:
    """Remaining steps at the current step time, assuming no further interruption."""
    total, step, step_time = (
        progress.get("totalSteps"),
        progress.get("step", 0),
        progress.get("stepTimeSeconds"),
    )
    if finished or not total or step_time is None:
        return None, None
    remaining = max(0, int(total) - int(step)) * float(step_time)
    return format_duration(remaining), format_precise(now + remaining)


def _finite(value: float | None, digits: int = 6) -> float | None:
    return round(value, digits) if value is not None and math.isfinite(value) else None


def _time(epoch: float | None) -> str | None:
    return format_precise(epoch) if epoch else None


def counts_wall_time(phase: str, started: bool) -> bool:
    """Whether time in ``phase`` is the job's wall time."""
    return started and phase not in NOT_TRAINING


# -- the same figure from the trainer's step log ------------------------------------------------------------


@dataclass(frozen=True)
class StepLogGoodput:
    """Goodput from ``metrics.jsonl`` records between ``start`` and ``end``."""

    productive: float
    """Seconds of the first run of every distinct step completed in [start, end]."""
    wall: float
    steps: int
    """Distinct steps (kept work)."""
    replayed: int
    """Step records that repeated a step already logged (work lost to a restart)."""

    @property
    def goodput(self) -> float:
        return min(1.0, self.productive / self.wall) if self.wall > 0 else 0.0


def step_log_goodput(
    records: Iterable[Mapping[str, Any]], start: float, end: float, *, up_to_step: int | None = None
) -> StepLogGoodput:
    """Goodput from step records (``time``: when the step completed, ``step``, ``step_time``: its seconds).

    Each distinct step counts once, at its first run (what the operator's high-water mark counts; a
    replay's own time is the same work done again). ``up_to_step`` limits it to steps the operator had
    seen (the status's ``highWaterStep``), for a like-for-like comparison."""
    seen: set[int] = set()
    productive = 0.0
    replayed = 0
    for r in records:
        step, when = int(r["step"]), float(r["time"])
        if when < start or when > end or (up_to_step is not None and step > up_to_step):
            continue
        if step in seen:
            replayed += 1
            continue
        seen.add(step)
        productive += float(r.get("step_time", 0.0))
    return StepLogGoodput(productive, end - start, len(seen), replayed)
